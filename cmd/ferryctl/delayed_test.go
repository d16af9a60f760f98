package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
)

// Hostile delayed-message command lines are refused before any network
// call, with a usage error (exit 2) that names the problem.
func TestDelayedUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"send", "t", "--body", "b", "--at", "2030-01-01T00:00:00Z", "--after", "1m"}, "only one of --at and --after"},
		{[]string{"send", "t", "--body", "b", "--after", "-5s"}, "--after -5s: want a duration of 0s or more"},
		{[]string{"send", "t", "--body", "b", "--after", "5"}, "--after 5: want"},
		{[]string{"send", "t", "--body", "b", "--at", "tomorrow"}, "--at tomorrow: want a time in RFC 3339"},
		{[]string{"send", "t", "--body", "b", "--at", "2030-01-01 09:00"}, `--at "2030-01-01 09:00": want a time in RFC 3339`},
		{[]string{"send", "t", "--body", "b", "--at", "1969-12-31T23:59:59Z"}, "want a time in RFC 3339"},
		{[]string{"delayed", "get", "g1"}, "want GROUP@OFFSET"},
		{[]string{"delayed", "cancel", "g1@-3"}, "the offset must be a log offset"},
		{[]string{"delayed", "cancel", "g1@x"}, "the offset must be a log offset"},
		{[]string{"delayed", "cancel", "@3"}, "want GROUP@OFFSET"},
		{[]string{"delayed", "cancel", "a b@3"}, "broker group name"},
		{[]string{"delayed", "cancel"}, "accepts 1 arg"},
		{[]string{"delayed", "ls", "--bucket", "10ms"}, "--bucket 10ms: want a duration from 1s"},
		{[]string{"delayed", "ls", "--limit", "0"}, "--limit 0: want 1 to 1000"},
		{[]string{"delayed", "ls", "extra"}, "unknown command"},
		{[]string{"delayed", "frobnicate"}, "unknown command"},
	} {
		code, _, errOut := ctl(append([]string{"--meta", nowhere, "--timeout", "1s"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("ferryctl %q: exit %d, stderr %q; want exit %d saying %q", tc.args, code, errOut, exitUsage, tc.want)
		}
		checkOneErrorLine(t, strings.Join(tc.args, " "), code, errOut)
	}
}

// What delayed get and cancel print of a state: when a pending message is
// due, where and how late a released one went.
func TestDelayedWhere(t *testing.T) {
	now := time.Date(2026, 12, 6, 19, 0, 0, 0, time.UTC)
	due := now.Add(90 * time.Second).UnixMilli()
	for _, tc := range []struct {
		st   protocol.DelayedState
		want string
	}{
		{protocol.DelayedState{State: protocol.DelayPending, DueAt: due}, "in 1m30s"},
		{protocol.DelayedState{State: protocol.DelayPending, DueAt: now.Add(-2 * time.Second).UnixMilli()}, "due 2s ago"},
		{protocol.DelayedState{State: protocol.DelayReleased, DueAt: due, Released: &protocol.DelayedRelease{QueueOffset: 7, LogOffset: 99, At: due + 12}},
			"queue offset 7 (log offset 99) at 2026-12-06T19:01:30.012Z, 12ms after due"},
		{protocol.DelayedState{State: protocol.DelayCancelled, DueAt: due}, "-"},
		{protocol.DelayedState{State: protocol.DelayMoved, MovedTo: 500}, "moved to log offset 500"},
	} {
		if got := where(tc.st, now); got != tc.want {
			t.Errorf("where(%+v) = %q, want %q", tc.st, got, tc.want)
		}
	}
}

// delayedSend runs send with args and returns what --json printed.
func delayedSend(t *testing.T, args ...string) sendJSON {
	t.Helper()
	var out sendJSON
	if err := json.Unmarshal([]byte(mustCtl(t, append(args, "--json")...)), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// delayedGet runs delayed get --json.
func delayedGet(t *testing.T, meta, handle string) delayedJSON {
	t.Helper()
	var out delayedJSON
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "delayed", "get", handle, "--json")), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// End to end: send --after prints a handle; delayed get shows it pending,
// delayed ls counts it (per group, bucket and topic); cancel cancels a
// pending one (and says so again as "cancelled before"); once the first is
// released, get says where and cancel says it was too late (exit 1); a
// time in the past (--at) is due at once; a handle of nothing is
// NOT_FOUND.
func TestDelayedCommands(t *testing.T) {
	meta := "--meta=" + startCluster(t)
	mustCtl(t, meta, "topic", "create", "later", "--queues", "2")

	before := time.Now()
	first := delayedSend(t, meta, "send", "later", "--body", "one", "--after", "3s")
	if !first.Delayed || first.Handle != fmt.Sprintf("%s@%d/%d", first.Group, first.LogOffset, first.DueAt) || first.DueAt < before.Add(3*time.Second).UnixMilli() {
		t.Fatalf("send --after: %+v", first)
	}
	out := mustCtl(t, meta, "send", "later", "--body", "two", "--after", "1h")
	if !strings.Contains(out, "HANDLE") || !strings.Contains(out, "DUE") || !strings.Contains(out, "@") {
		t.Fatalf("send --after table:\n%s", out)
	}
	second := delayedSend(t, meta, "send", "later", "--body", "three", "--after", "1h", "--key", "k")

	if g := delayedGet(t, meta, first.Handle); g.State != protocol.DelayPending || g.DueAt != first.DueAt || g.ID != first.ID || g.Topic != "later" {
		t.Fatalf("get of a pending message: %+v", g)
	}
	if out := mustCtl(t, meta, "delayed", "get", first.Handle); !strings.Contains(out, "pending") || !strings.Contains(out, "in ") {
		t.Fatalf("get table:\n%s", out)
	}

	var lists []protocol.DelayedList
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "delayed", "ls", "--json", "--bucket", "1h")), &lists); err != nil {
		t.Fatal(err)
	}
	var pending int64
	for _, l := range lists {
		pending += l.Pending
		for _, tp := range l.Topics {
			if tp.Topic != "later" || tp.Quota <= 0 {
				t.Fatalf("ls topics %+v", l.Topics)
			}
		}
	}
	if len(lists) != 2 || pending != 3 {
		t.Fatalf("ls: %d groups, %d pending; want 2 groups, 3 pending: %+v", len(lists), pending, lists)
	}
	out = mustCtl(t, meta, "delayed", "ls", "--group", first.Group, "--topic", "later")
	if !strings.Contains(out, "NEXT-DUE") || !strings.Contains(out, "DUE-FROM") || !strings.Contains(out, "QUOTA") || !strings.Contains(out, "later") {
		t.Fatalf("ls table:\n%s", out)
	}
	if code, _, errOut := ctl(meta, "delayed", "ls", "--group", "nope"); code != exitError || !strings.Contains(errOut, "NOT_FOUND") {
		t.Fatalf("ls of no group: exit %d %q", code, errOut)
	}

	var c delayedJSON
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "delayed", "cancel", second.Handle, "--json")), &c); err != nil ||
		c.State != protocol.DelayCancelled || c.Outcome != "cancelled" || c.By != "cancel" {
		t.Fatalf("cancel: %+v %v", c, err)
	}
	if out := mustCtl(t, meta, "delayed", "cancel", second.Handle); !strings.Contains(out, "cancelled before") {
		t.Fatalf("second cancel:\n%s", out)
	}

	testwait.For(t, 15*time.Second, "the first message released", func() bool {
		return delayedGet(t, meta, first.Handle).State == protocol.DelayReleased
	})
	g := delayedGet(t, meta, first.Handle)
	if g.Released == nil || g.Released.At < g.DueAt {
		t.Fatalf("released: %+v", g)
	}
	code, out, errOut := ctl(meta, "delayed", "cancel", first.Handle)
	if code != exitError || !strings.Contains(out, "released before: not cancelled") || !strings.Contains(errOut, "not cancelled") ||
		!strings.Contains(errOut, fmt.Sprintf("queue offset %d", g.Released.QueueOffset)) {
		t.Fatalf("cancel after release: exit %d\n%s%s", code, out, errOut)
	}
	read := mustCtl(t, meta, "read", "later", "--queue", fmt.Sprint(first.Queue), "--from", fmt.Sprint(g.Released.QueueOffset), "--limit", "1")
	if !strings.Contains(read, `"one"`) {
		t.Fatalf("read at the released offset:\n%s", read)
	}

	past := delayedSend(t, meta, "send", "later", "--body", "past", "--at", "2020-01-01T00:00:00Z")
	if !past.Delayed || past.DueAt != time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli() {
		t.Fatalf("send --at in the past: %+v", past)
	}
	testwait.For(t, 15*time.Second, "the message due in the past released", func() bool {
		return delayedGet(t, meta, past.Handle).State == protocol.DelayReleased
	})
	if code, _, errOut := ctl(meta, "delayed", "get", first.Group+"@999999999"); code != exitError || !strings.Contains(errOut, "NOT_FOUND") {
		t.Fatalf("get of nothing: exit %d %q", code, errOut)
	}
}
