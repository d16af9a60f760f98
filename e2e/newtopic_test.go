package e2e

import (
	"encoding/json"
	"fmt"
	"testing"
)

// benchJSON is the part of `ferryctl bench --json` these tests read.
type benchJSON struct {
	Sent    int64 `json:"sent"`
	Errors  int64 `json:"errors"`
	Retries int64 `json:"retries"`
}

// A topic is writable as soon as `ferryctl topic create` returns, and new
// queues as soon as `ferryctl topic add-queues` returns: `ferryctl bench`
// run right after sends to every queue without a single retry (before the
// route push, each broker answered its first sends to a new queue
// NO_ROUTE until its route cache had looked the topic up, and the SDK
// retried them).
func TestNewTopicWritableAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	c := startLocalCluster(t)
	bench := func(topic string) benchJSON {
		t.Helper()
		var r benchJSON
		out := c.ctl("bench", "--topic", topic, "--count", "4000", "--producers", "2", "--size", "100", "--json")
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("bench output %q: %v", out, err)
		}
		if r.Sent != 4000 || r.Errors != 0 || r.Retries != 0 {
			t.Fatalf("bench to %s: %+v, want 4000 sent, no errors and no retries", topic, r)
		}
		return r
	}
	c.ctl("topic", "create", "fresh", "--queues", "8")
	bench("fresh")
	c.ctl("topic", "add-queues", "fresh", "--count", "8")
	bench("fresh")
	// The second run used the new queues too.
	for q := range 16 {
		var msgs []json.RawMessage
		out := c.ctl("read", "fresh", "--queue", fmt.Sprint(q), "--limit", "1", "--json")
		if err := json.Unmarshal([]byte(out), &msgs); err != nil || len(msgs) != 1 {
			t.Fatalf("queue %d: %q (%v), want one message", q, out, err)
		}
	}
}
