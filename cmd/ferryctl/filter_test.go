package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/internal/testcluster"
)

// TestGroupFilterCommands: send --tag, group set-filter, group describe
// with the messages the group will receive, consume --filter receiving
// only those and passing the rest, and a member asking for another filter
// refused (exit 1) with the group's.
func TestGroupFilterCommands(t *testing.T) {
	c := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1"}})
	meta := "--meta=" + c.MetaAddr()
	mustCtl(t, meta, "topic", "create", "orders", "--queues", "1")
	for i, tag := range []string{"A", "B", "C", "A", "C", "A", "B"} {
		mustCtl(t, meta, "send", "orders", "--tag", tag, "--key", "k", "--body", tag+string(rune('0'+i)))
	}
	out := mustCtl(t, meta, "group", "set-filter", "readers", "A||C")
	if !strings.Contains(out, "A OR C") || !strings.Contains(out, "set-filter") {
		t.Fatalf("set-filter:\n%s", out)
	}
	code, _, errOut := ctl(meta, "consume", "orders", "--group", "readers", "--filter", "B", "--count", "1", "--timeout", "5s")
	if code != exitError || !strings.Contains(errOut, "A OR C") {
		t.Fatalf("consume with another filter than the group's: exit %d %q", code, errOut)
	}
	consume := func(n string) []string {
		out := mustCtl(t, meta, "consume", "orders", "--group", "readers", "--filter", "C || A", "--count", n, "--timeout", "10s", "--json")
		var bodies []string
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var m consumedJSON
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("%v: %q", err, line)
			}
			bodies = append(bodies, m.Body)
		}
		return bodies
	}
	describe := func() groupDescribeJSON {
		var d groupDescribeJSON
		if err := json.Unmarshal([]byte(mustCtl(t, meta, "group", "describe", "readers", "--json")), &d); err != nil {
			t.Fatal(err)
		}
		if d.Filter != "A OR C" || len(d.Queues) != 1 || d.TotalToReceive == nil {
			t.Fatalf("describe of a group of A OR C: %+v", d)
		}
		return d
	}
	if got := consume("2"); strings.Join(got, " ") != "A0 C2" {
		t.Fatalf("consumed %v, want A0 C2", got)
	}
	if d := describe(); d.Queues[0].Committed != 3 || *d.Queues[0].Lag != 4 || *d.TotalToReceive != 3 {
		t.Fatalf("after A0 C2: committed %d, lag %d, %d to receive; want 3, 4 and 3 (A3 C4 A5, not B6)", d.Queues[0].Committed, *d.Queues[0].Lag, *d.TotalToReceive)
	}
	if out := mustCtl(t, meta, "group", "describe", "readers"); !strings.Contains(out, "TO-RECEIVE") || !strings.Contains(out, "filter A OR C") {
		t.Fatalf("describe:\n%s", out)
	}
	if got := consume("3"); strings.Join(got, " ") != "A3 C4 A5" {
		t.Fatalf("consumed %v, want A3 C4 A5", got)
	}
	if d := describe(); d.Queues[0].Committed != 7 || *d.TotalToReceive != 0 {
		t.Fatalf("after every A and C: committed %d, %d to receive; want 7 (past the last B) and 0", d.Queues[0].Committed, *d.TotalToReceive)
	}
	// read --filter reads the same from the queue, without a group.
	out = mustCtl(t, meta, "read", "orders", "--filter", "B", "--json")
	if !strings.Contains(out, `"B1"`) || strings.Contains(out, `"A0"`) {
		t.Fatalf("read --filter B:\n%s", out)
	}
}
