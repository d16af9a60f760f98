package broker

import (
	"fmt"
	"testing"
)

type fakeQueues map[qEnd]int64

func (f fakeQueues) Queues(fn func(topic string, queue uint32, first, next int64)) {
	for k, n := range f {
		fn(k.topic, k.queue, 0, n)
	}
}

// A master reports every queue's end in its first heartbeat and every
// queueEndsFull-th one, and in the others only the ends that moved; a
// broker that was not the master reports everything again when it is.
func TestQueueEndsReport(t *testing.T) {
	log := fakeQueues{{"a", 0}: 5, {"a", 1}: 0, {"b", 0}: 9}
	var r queueEndsReport
	take := func() string { return fmt.Sprint(r.take(log)) }
	if got, want := take(), "[{a 0 5} {b 0 9}]"; got != want {
		t.Fatalf("first report %s, want %s", got, want)
	}
	if got := take(); got != "[]" {
		t.Fatalf("nothing moved: %s", got)
	}
	log[qEnd{"b", 0}] = 12
	log[qEnd{"c", 3}] = 1
	if got, want := take(), "[{b 0 12} {c 3 1}]"; got != want {
		t.Fatalf("moved: %s, want %s", got, want)
	}
	take()
	take()
	if got, want := take(), "[{a 0 5} {b 0 12} {c 3 1}]"; got != want {
		t.Fatalf("the %dth report %s, want everything: %s", queueEndsFull+1, got, want)
	}
	take()
	r.notMaster()
	if got, want := take(), "[{a 0 5} {b 0 12} {c 3 1}]"; got != want {
		t.Fatalf("the first report as master again %s, want everything: %s", got, want)
	}
}
