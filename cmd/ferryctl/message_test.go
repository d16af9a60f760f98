package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/consumer"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/sdk"
)

// TestMessageGet: a send's handle finds its message, with where and when it
// was stored; an offset where no message starts, one past the log and an
// unknown group are NOT_FOUND (exit 1).
func TestMessageGet(t *testing.T) {
	c := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1"}})
	meta := "--meta=" + c.MetaAddr()
	mustCtl(t, meta, "topic", "create", "orders", "--queues", "2")
	mustCtl(t, meta, "send", "orders", "--key", "k0", "--body", "first")
	var s sendJSON
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "send", "orders", "--key", "order-4711", "--tag", "paid", "--prop", "region=eu",
		"--body", "the second", "--json")), &s); err != nil {
		t.Fatalf("send --json: %+v %v", s, err)
	}
	sent, s0 := []sendJSON{s}, s
	var got []foundJSON
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "message", "get", sent[0].Handle, "--json")), &got); err != nil || len(got) != 1 {
		t.Fatalf("message get --json: %+v %v", got, err)
	}
	m := got[0]
	if m.Handle != sent[0].Handle || m.Topic != "orders" || m.Queue != sent[0].Queue || m.QueueOffset != sent[0].QueueOffset || m.ID != sent[0].ID ||
		m.Key != "order-4711" || m.Tag != "paid" || m.Properties["region"] != "eu" || m.Body != "the second" || m.StoreTime == 0 {
		t.Fatalf("message get %s: %+v; sent %+v", sent[0].Handle, m, sent[0])
	}
	if out := mustCtl(t, meta, "message", "get", sent[0].Handle); !strings.Contains(out, "order-4711") || !strings.Contains(out, "the second") {
		t.Fatalf("message get:\n%s", out)
	}
	// Its journey: sent by the ferryctl producer, stored in g1; nobody read
	// it yet; then a group reads and commits it.
	journey := func() journeyJSON {
		var j journeyJSON
		if err := json.Unmarshal([]byte(mustCtl(t, meta, "message", "journey", sent[0].Handle, "--json")), &j); err != nil {
			t.Fatal(err)
		}
		return j
	}
	steps := func(j journeyJSON, name string) (out []journeyStep) {
		for _, s := range j.Steps {
			if s.Step == name {
				out = append(out, s)
			}
		}
		return out
	}
	j := journey()
	if s := steps(j, "sent"); len(s) != 1 || !s[0].Known || !strings.Contains(s[0].What, fmt.Sprint("producer ", s0.ProducerID)) {
		t.Fatalf("journey, sent: %+v (producer %d)", s, s0.ProducerID)
	}
	if s := steps(j, "stored"); len(s) != 1 || !strings.Contains(s[0].What, "broker group g1") {
		t.Fatalf("journey, stored: %+v", s)
	}
	if s := steps(j, "delivered"); len(s) != 1 || s[0].Known {
		t.Fatalf("journey before any read, delivered: %+v", s)
	}
	mustCtl(t, meta, "consume", "orders", "--group", "readers", "--member", "reader-1", "--count", "2", "--timeout", "10s")
	j = journey()
	if s := steps(j, "delivered"); len(s) != 1 || !s[0].Known || !strings.Contains(s[0].What, "member reader-1 of consumer group readers") {
		t.Fatalf("journey after a read, delivered: %+v", s)
	}
	if s := steps(j, "committed"); len(s) != 1 || !strings.Contains(s[0].What, "by consumer group readers (its offset") || strings.Contains(s[0].What, "not yet") {
		t.Fatalf("journey after a read, committed: %+v", s)
	}
	if out := mustCtl(t, meta, "message", "journey", sent[0].Handle); !strings.Contains(out, "STEP") || !strings.Contains(out, "reader-1") {
		t.Fatalf("journey:\n%s", out)
	}

	for _, h := range []string{"g1@1", "g1@999999", "nope@0"} {
		code, _, errOut := ctl(meta, "message", "get", h)
		if code != exitError || !strings.Contains(errOut, "NOT_FOUND") {
			t.Errorf("message get %s: exit %d %q; want NOT_FOUND (1)", h, code, errOut)
		}
	}
}

// TestMessageFind: find by key and by id across the groups, with a cursor
// when a group has more than the limit; a dead letter is found by its
// original's id, and the original's journey shows it.
func TestMessageFind(t *testing.T) {
	c := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1", "g2"}})
	meta := "--meta=" + c.MetaAddr()
	mustCtl(t, meta, "topic", "create", "orders", "--queues", "4")
	mustCtl(t, meta, "topic", "create", "%DLQ%billing", "--queues", "1")
	var handles []string
	for i := range 5 {
		var s sendJSON
		if err := json.Unmarshal([]byte(mustCtl(t, meta, "send", "orders", "--key", "order-4711", "--body", fmt.Sprint("v", i), "--json")), &s); err != nil {
			t.Fatal(err)
		}
		handles = append(handles, s.Handle)
	}
	mustCtl(t, meta, "send", "orders", "--key", "order-1", "--body", "other")
	find := func(args ...string) findJSON {
		t.Helper()
		var f findJSON
		if err := json.Unmarshal([]byte(mustCtl(t, append([]string{meta, "message", "find", "--json"}, args...)...)), &f); err != nil {
			t.Fatal(err)
		}
		return f
	}
	f := find("--key", "order-4711")
	if len(f.Messages) != 5 || f.Cursor != "" {
		t.Fatalf("find --key order-4711: %d messages, cursor %q; want 5, none", len(f.Messages), f.Cursor)
	}
	for i, m := range f.Messages { // newest first
		if m.Handle != handles[4-i] || m.Key != "order-4711" {
			t.Fatalf("find --key: message %d is %s (key %s), want %s", i, m.Handle, m.Key, handles[4-i])
		}
	}
	var pages []string
	for cursor := ""; ; {
		args := []string{"--key", "order-4711", "--limit", "2"}
		if cursor != "" {
			args = append(args, "--cursor", cursor)
		}
		f := find(args...)
		for _, m := range f.Messages {
			pages = append(pages, m.Handle)
		}
		if cursor = f.Cursor; cursor == "" {
			break
		}
	}
	if len(pages) != 5 {
		t.Fatalf("find --key by pages of 2: %v, want the 5", pages)
	}
	if f := find("--key", "order-4711", "--until", "1000"); len(f.Messages) != 0 {
		t.Fatalf("find in a window before anything was stored: %+v", f.Messages)
	}

	// A message that fails in group billing is dead-lettered; finding its
	// id finds both, and its journey says where it went.
	orig := f.Messages[0]
	cons, err := consumer.New("billing", []string{"orders"}, sdk.MetaAddrs(c.MetaAddr()), consumer.MaxRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- cons.Run(ctx, func(context.Context, *consumer.Message) error { return errors.New("no such account") })
	}()
	testwait.For(t, 20*time.Second, "the dead letter", func() bool {
		var f findJSON
		_ = json.Unmarshal([]byte(mustCtl(t, meta, "message", "find", "--json", "--id", orig.ID)), &f)
		return len(f.Messages) == 2
	})
	cancel()
	<-done
	_ = cons.Close()
	var j journeyJSON
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "message", "journey", orig.ID, "--json")), &j); err != nil {
		t.Fatal(err)
	}
	dead := false
	for _, s := range j.Steps {
		dead = dead || s.Step == "dead-lettered" && strings.Contains(s.What, "%DLQ%billing") && strings.Contains(s.What, "no such account")
	}
	if j.Message.Handle != orig.Handle || !dead {
		t.Fatalf("journey of %s: %+v", orig.ID, j)
	}
}
