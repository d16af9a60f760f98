package main

import (
	"strings"
	"testing"
	"time"

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
