package consumer

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// A member that has had no heartbeat answered for its session, less a
// margin, delivers nothing more, though messages are buffered and its
// handler is free: checked before each delivery, not only when a
// heartbeat fails. It drops its queues, and takes them again from the
// committed offsets once heartbeats are answered.
func TestNoDeliveryAfterTheLease(t *testing.T) {
	fb := newFakeBrokers()
	fb.add("t", 0, "m0", "m1", "m2", "m3")
	co := newFakeCoord(map[string]int{"t": 1})
	clk := clockwork.NewFakeClock()
	c := fakeConsumer(t, fb, co, 1, withClock(clk), Session(2*time.Second), Heartbeat(500*time.Millisecond))
	hold := make(chan struct{})
	var delivered atomic.Int32
	runIn(t, c, func(ctx context.Context, m *Message) error {
		if delivered.Add(1) == 1 {
			<-hold // the first call waits while the lease runs out
		}
		return nil
	})
	waitFor(t, 5*time.Second, "the first delivery", func() bool { return delivered.Load() == 1 })
	co.setDown(true) // heartbeats go unanswered from now on
	clk.Advance(2 * time.Second)
	close(hold)
	waitFor(t, 5*time.Second, "the member to drop its queue", func() bool { return len(c.Stats().Queues) == 0 })
	if n := delivered.Load(); n != 1 {
		t.Fatalf("%d deliveries after the lease ran out; want only the one under way", n)
	}
	// Back: it takes the queue again and goes on.
	co.setDown(false)
	waitFor(t, 5*time.Second, "deliveries again", func() bool {
		clk.Advance(100 * time.Millisecond)
		return delivered.Load() >= 4
	})
}

// A queue the registry gives another member is let go only once its
// handler call under way returned and its offset was committed: until then
// the new owner does not get it.
func TestLetGoWaitsForTheHandler(t *testing.T) {
	fb := newFakeBrokers()
	fb.add("t", 0, "a0")
	fb.add("t", 1, "b0", "b1")
	co := newFakeCoord(map[string]int{"t": 2})
	hold := make(chan struct{})
	var mu sync.Mutex
	var calls []string
	record := func(who string) Handler {
		return func(ctx context.Context, m *Message) error {
			mu.Lock()
			calls = append(calls, who+":"+string(m.Body))
			mu.Unlock()
			if who == "x" && string(m.Body) == "b0" {
				<-hold
			}
			return nil
		}
	}
	count := func(s string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, c := range calls {
			if c == s {
				n++
			}
		}
		return n
	}
	x := fakeConsumer(t, fb, co, 2, MemberID("x"))
	runIn(t, x, record("x"))
	waitFor(t, 5*time.Second, "x's call of b0", func() bool { return count("x:b0") == 1 })
	y := fakeConsumer(t, fb, co, 2, MemberID("y"))
	runIn(t, y, record("y"))
	moved := uint32(99)
	waitFor(t, 5*time.Second, "x to be asked to let a queue go", func() bool {
		co.mu.Lock()
		defer co.mu.Unlock()
		for k, h := range co.releasing {
			if h == "x" {
				moved = k.queue
			}
		}
		return moved != 99
	})
	if moved != 1 {
		t.Fatalf("the rebalance moved queue %d, not queue 1, whose call is held", moved)
	}
	beats := y.Stats().Heartbeats
	waitFor(t, 5*time.Second, "y to heartbeat a few times", func() bool { return y.Stats().Heartbeats >= beats+3 })
	if q := y.Stats().Queues; len(q) != 0 || count("y:b0") != 0 {
		t.Fatalf("y holds %+v (delivered b0 %d times) while x's call of b0 is under way", q, count("y:b0"))
	}
	close(hold)
	waitFor(t, 5*time.Second, "y to take the queue", func() bool { return len(y.Stats().Queues) == 1 })
	if o := co.offset("t", 1); o != 1 {
		t.Fatalf("queue 1 committed at %d when y took it, want 1 (x's call of b0 committed)", o)
	}
	waitFor(t, 5*time.Second, "y to handle b1", func() bool { return count("y:b1") == 1 })
	if count("y:b0") != 0 || count("x:b1") != 0 {
		t.Fatalf("handled twice or by the wrong member: %v", calls)
	}
}
