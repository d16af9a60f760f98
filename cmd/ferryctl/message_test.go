package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/internal/testcluster"
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
