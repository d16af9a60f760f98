package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/internal/loadgen"
)

func TestConsume(t *testing.T) {
	c := startCluster(t)
	meta := "--meta=" + c
	mustCtl(t, meta, "topic", "create", "orders", "--queues", "4")
	per := sendN(t, c, "orders", 30)

	// 10 messages, committed: the group resumes after them.
	out := mustCtl(t, meta, "consume", "orders", "--group", "c1", "--count", "10")
	if strings.Count(out, "\n") != 11 || !strings.Contains(out, "QUEUE") || !strings.Contains(out, `"m`) {
		t.Fatalf("consume --count 10:\n%s", out)
	}
	var d groupDescribeJSON
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "group", "describe", "c1", "--json")), &d); err != nil || d.TotalLag == nil || *d.TotalLag != 20 || len(d.Members) != 0 {
		t.Fatalf("after 10 of 30: %+v %v", d, err)
	}
	out = mustCtl(t, meta, "consume", "orders", "--group", "c1", "--timeout", "1s", "--json")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 20 {
		t.Fatalf("the rest: %d lines\n%s", len(lines), out)
	}
	var m consumedJSON
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil || m.Topic != "orders" || m.ID == "" || m.Key == "" || m.StoreTime.IsZero() || m.Deliveries != 1 {
		t.Fatalf("--json line %q: %+v %v", lines[0], m, err)
	}
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "group", "describe", "c1", "--json")), &d); err != nil || *d.TotalLag != 0 {
		t.Fatalf("after all: %+v %v", d, err)
	}
	for _, q := range d.Queues {
		if q.Committed != per[q.Queue] {
			t.Fatalf("queue %d committed %d, sent %d", q.Queue, q.Committed, per[q.Queue])
		}
	}
	// A tag goes with its message (send --tag), shown by consume.
	mustCtl(t, meta, "send", "orders", "--body", "tagged", "--tag", "paid")
	var tagged consumedJSON
	for _, l := range strings.Split(strings.TrimSpace(mustCtl(t, meta, "consume", "orders", "--group", "tags", "--timeout", "1s", "--json")), "\n") {
		var m consumedJSON // fresh: Unmarshal keeps the fields a line omits
		if err := json.Unmarshal([]byte(l), &m); err == nil && m.Body == "tagged" {
			tagged = m
		} else if err == nil && m.Tag != "" {
			t.Fatalf("an untagged message consumed with tag %q", m.Tag)
		}
	}
	if tagged.Tag != "paid" {
		t.Fatalf("the tagged message consumed as %+v", tagged)
	}
	if code, _, errOut := ctl(meta, "send", "orders", "--body", "x", "--tag", "a b"); code != exitUsage || !strings.Contains(errOut, "tag") {
		t.Fatalf("send --tag 'a b': exit %d %q", code, errOut)
	}
	// A new group from latest sees nothing of what is there.
	if out = mustCtl(t, meta, "consume", "orders", "--group", "c2", "--from", "latest", "--timeout", "500ms"); strings.Contains(out, `"m`) {
		t.Fatalf("--from latest:\n%s", out)
	}
	code, _, errOut := ctl(meta, "consume", "missing", "--group", "c3", "--timeout", "1s")
	if code != exitError || !strings.Contains(errOut, "UNKNOWN_TOPIC") {
		t.Fatalf("unknown topic: exit %d %q", code, errOut)
	}

	var res loadgen.Result
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "bench", "--count", "2000", "--consumers", "2", "--size", "100", "--rate", "4000", "--json")), &res); err != nil ||
		res.Consume == nil || res.Consume.Consumed != 2000 || res.Consume.Missing != 0 || res.Consume.P50Micros <= 0 {
		t.Fatalf("bench --consumers: %+v %+v %v", res, res.Consume, err)
	}
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "bench", "--count", "2000", "--consumers", "2", "--backlog", "--json")), &res); err != nil ||
		res.Consume == nil || res.Consume.Consumed != 2000 || !res.Consume.Backlog {
		t.Fatalf("bench --backlog: %+v %+v %v", res, res.Consume, err)
	}
	out = mustCtl(t, meta, "bench", "--count", "500", "--consumers", "1")
	if !strings.Contains(out, "E2E-P50") {
		t.Fatalf("bench table:\n%s", out)
	}
}

func TestConsumeUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"consume", "t"},
		{"consume", "t", "--group", ""},
		{"consume", "t", "--group", "g", "--from", "middle"},
		{"consume", "t", "--group", "g", "--count", "-1"},
		{"consume", "--group", "g"},
		{"bench", "--backlog"},
		{"bench", "--consumers", "-1"},
		{"bench", "--rate", "-5"},
	} {
		code, _, errOut := ctl(append([]string{"--meta", "127.0.0.1:1"}, args...)...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, %q; want 2", args, code, errOut)
		}
	}
	code, _, errOut := ctl("--meta", "127.0.0.1:1", "consume", "t", "--group", "g", "--timeout", "300ms")
	if code != exitUnreachable {
		t.Errorf("consume against nothing: exit %d, %q", code, errOut)
	}
}
