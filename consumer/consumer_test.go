package consumer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// TestGroupSharesQueues: two members consume every message at least once;
// a member joining takes queues from the first, which keeps the rest
// (sticky); Close hands its queues over at once; each queue's offsets are
// handled in order.
func TestGroupSharesQueues(t *testing.T) {
	forEachCoord(t, []string{"g1", "g2"}, func(t *testing.T, e *env) {
		e.cl.Meta.CreateTopic(t, "orders", "g1", "g2", "g1", "g2")
		topics := []string{"orders"}
		rec := newRecorder()
		a := e.consumer(t, "grp", topics, MemberID("a"))
		runIn(t, a, rec.handler("a"))
		send(t, e, "orders", "first", 200)
		waitFor(t, 20*time.Second, "a to handle the first 200", func() bool { return rec.count() == 200 })
		waitFor(t, 5*time.Second, "a to commit everything", func() bool {
			for q := range uint32(4) {
				if e.committed(t, "grp", "orders", q) != 50 {
					return false
				}
			}
			return true
		})
		before := queuesOf(a)
		if len(before) != 4 {
			t.Fatalf("a holds %d queues alone, want 4", len(before))
		}

		b := e.consumer(t, "grp", topics, MemberID("b"))
		stopB := runIn(t, b, rec.handler("b"))
		waitFor(t, 20*time.Second, "b to take two queues", func() bool { return len(queuesOf(b)) == 2 && len(queuesOf(a)) == 2 })
		for k := range queuesOf(a) {
			if !before[k] {
				t.Errorf("a took %v on b's join: not sticky", k)
			}
		}
		send(t, e, "orders", "second", 200)
		waitFor(t, 20*time.Second, "400 handled", func() bool { return rec.count() == 400 })
		rec.mu.Lock()
		byB := 0
		for body, m := range rec.by {
			if strings.HasPrefix(body, "second") && m == "b" {
				byB++
			}
		}
		rec.mu.Unlock()
		if byB == 0 {
			t.Error("b handled none of the second batch")
		}

		// Close hands b's queues to a well within the session (2 s).
		stopB()
		began := time.Now()
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 1500*time.Millisecond, "a to take every queue back", func() bool { return len(queuesOf(a)) == 4 })
		t.Logf("a held every queue %v after b's Close", time.Since(began))
		send(t, e, "orders", "third", 100)
		waitFor(t, 20*time.Second, "500 handled", func() bool { return rec.count() == 500 })

		rec.mu.Lock()
		for k, offs := range rec.order {
			for i := 1; i < len(offs); i++ {
				if offs[i] < offs[i-1] {
					t.Errorf("queue %v handled offset %d after %d", k, offs[i], offs[i-1])
				}
			}
		}
		redelivered := 0
		for _, n := range rec.seen {
			if n > 1 {
				redelivered++
			}
		}
		rec.mu.Unlock()
		if redelivered != 0 {
			// Every offset was committed before each rebalance.
			t.Errorf("redelivered after rebalances: %d of 500", redelivered)
		}
		s := a.Stats()
		if s.Rebalances < 2 || s.Commits == 0 || s.Fetches == 0 {
			t.Errorf("stats %+v", s)
		}
		waitFor(t, 5*time.Second, "a's lag to reach 0", func() bool {
			for _, q := range a.Stats().Queues {
				if q.Lag != 0 || q.Committed != q.MaxOffset {
					return false
				}
			}
			return true
		})
	})
}

// TestResumeAfterRestart: offsets committed by Close are where the next
// consumer of the group starts; nothing handled before is handled again.
func TestResumeAfterRestart(t *testing.T) {
	forEachCoord(t, []string{"g1"}, func(t *testing.T, e *env) {
		e.cl.Meta.CreateTopic(t, "events", "g1", "g1")
		topics := []string{"events"}
		rec := newRecorder()
		c1 := e.consumer(t, "grp", topics)
		stop := runIn(t, c1, rec.handler("c1"))
		send(t, e, "events", "old", 100)
		waitFor(t, 20*time.Second, "100 handled", func() bool { return rec.count() == 100 })
		stop()
		if err := c1.Close(); err != nil {
			t.Fatal(err)
		}
		total := e.committed(t, "grp", "events", 0) + e.committed(t, "grp", "events", 1)
		if total != 100 {
			t.Fatalf("committed offsets sum to %d after Close, want 100", total)
		}

		send(t, e, "events", "new", 50)
		rec2 := newRecorder()
		c2 := e.consumer(t, "grp", topics)
		runIn(t, c2, rec2.handler("c2"))
		// A queue's messages come in offset order: an old one handled again
		// would have come before the new ones of its queue.
		waitFor(t, 20*time.Second, "50 new handled", func() bool { return rec2.count() == 50 })
		rec2.mu.Lock()
		defer rec2.mu.Unlock()
		for body := range rec2.seen {
			if !strings.HasPrefix(body, "new") {
				t.Errorf("the restarted consumer handled %q again", body)
			}
		}
	})
}

// TestRetriesAndDeadLetter: a failing message is delivered MaxRetries+1
// times (its queue waiting), then stored in %DLQ%group with its properties
// and the failure's; a panic counts as a failure.
func TestRetriesAndDeadLetter(t *testing.T) {
	forEachCoord(t, []string{"g1"}, func(t *testing.T, e *env) {
		e.cl.Meta.CreateTopic(t, "jobs", "g1")
		send(t, e, "jobs", "job", 10)
		var order []string
		var panicked atomic.Bool
		deliveries := map[string][]int{}
		c := e.consumer(t, "grp", []string{"jobs"}, MaxRetries(2))
		done := make(chan struct{})
		runIn(t, c, func(ctx context.Context, m *Message) error {
			body := string(m.Body)
			order = append(order, body) // one queue: calls come one at a time
			deliveries[body] = append(deliveries[body], m.Deliveries)
			switch {
			case body == "job-3":
				return errors.New("poison")
			case body == "job-5" && !panicked.Swap(true):
				panic("boom")
			case body == "job-9":
				close(done)
			}
			return nil
		})
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatal("job-9 not handled")
		}
		want := []string{"job-0", "job-1", "job-2", "job-3", "job-3", "job-3", "job-4", "job-5", "job-5", "job-6", "job-7", "job-8", "job-9"}
		if !slices.Equal(order, want) {
			t.Fatalf("order %v, want %v", order, want)
		}
		if !slices.Equal(deliveries["job-3"], []int{1, 2, 3}) || !slices.Equal(deliveries["job-5"], []int{1, 2}) {
			t.Errorf("deliveries %v", deliveries)
		}
		s := c.Stats()
		if s.DeadLetters != 1 || s.Panics != 1 || s.HandlerErrors != 4 || s.Redeliveries != 3 {
			t.Errorf("stats %+v", s)
		}
		// The dead letter.
		r, err := e.meta.RouteExisting(context.Background(), "%DLQ%grp")
		if err != nil {
			t.Fatal(err)
		}
		var dead []protocol.StoredMessage
		for _, q := range r.Queues {
			dead = append(dead, testcluster.PullAll(t, testcluster.Dial(t, q.Master), r.Topic, q.Queue)...)
		}
		if len(dead) != 1 {
			t.Fatalf("%d dead letters, want 1", len(dead))
		}
		props := map[string]string{}
		for _, p := range dead[0].Message.Properties {
			props[p.Key] = p.Value
		}
		wantProps := map[string]string{"key": "k3", PropOriginTopic: "jobs", PropOriginQueue: "0", PropOriginOffset: "3",
			PropError: "poison", PropDeliveries: "3", PropOriginID: props[PropOriginID]}
		if string(dead[0].Message.Body) != "job-3" || !maps.Equal(props, wantProps) || props[PropOriginID] == "" {
			t.Errorf("dead letter %q %v, want properties %v", dead[0].Message.Body, props, wantProps)
		}
		// Stamped (the client core's sender), so a resend after a lost
		// answer is answered DUPLICATE, not stored twice.
		if dead[0].Message.Producer.ID == 0 {
			t.Errorf("the dead letter is not stamped: %+v", dead[0].Message.Producer)
		}
		waitFor(t, 5*time.Second, "offset 10 committed", func() bool { return e.committed(t, "grp", "jobs", 0) == 10 })
	})
}

// TestPollManualCommit: Poll style; only marked messages count, and only
// Commit (or Close) commits them.
func TestPollManualCommit(t *testing.T) {
	forEachCoord(t, []string{"g1"}, func(t *testing.T, e *env) {
		e.cl.Meta.CreateTopic(t, "logs", "g1")
		send(t, e, "logs", "line", 30)
		c := e.consumer(t, "grp", []string{"logs"}, ManualCommit(), MaxPollRecords(7))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var got []*Message
		for len(got) < 30 {
			msgs, err := c.Poll(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(msgs) > 7 {
				t.Fatalf("Poll returned %d messages over MaxPollRecords 7", len(msgs))
			}
			got = append(got, msgs...)
		}
		for i, m := range got {
			if m.Offset != int64(i) || string(m.Body) != fmt.Sprint("line-", i) || m.Key != fmt.Sprint("k", i%16) ||
				m.ProducerID == 0 || m.StoreTime.IsZero() || m.Timestamp.IsZero() || m.Deliveries != 1 {
				t.Fatalf("message %d: %+v", i, m)
			}
		}
		// Marked out of order, with a hole at 12.
		for _, i := range []int{3, 0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14} {
			c.MarkProcessed(got[i])
		}
		// Without ManualCommit a commit goes out before every heartbeat: two
		// heartbeats later, nothing may be committed.
		hb := c.Stats().Heartbeats
		waitFor(t, 10*time.Second, "two heartbeats", func() bool { return c.Stats().Heartbeats >= hb+2 })
		if off := e.committed(t, "grp", "logs", 0); off != -1 {
			t.Fatalf("committed %d with ManualCommit and no Commit", off)
		}
		if err := c.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if off := e.committed(t, "grp", "logs", 0); off != 12 {
			t.Fatalf("committed %d, want 12 (the first unmarked)", off)
		}
		c.MarkProcessed(got[12])
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if off := e.committed(t, "grp", "logs", 0); off != 15 {
			t.Fatalf("committed %d after Close, want 15", off)
		}
		if _, err := c.Poll(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("Poll after Close: %v", err)
		}
		// The next consumer starts at 15.
		c2 := e.consumer(t, "grp", []string{"logs"})
		msgs, err := c2.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if msgs[0].Offset != 15 {
			t.Fatalf("resumed at %d, want 15", msgs[0].Offset)
		}
		if err := c2.Run(ctx, func(context.Context, *Message) error { return nil }); !errors.Is(err, ErrBusy) {
			t.Fatalf("Run after Poll: %v", err)
		}
	})
}

// TestStartLatest: a group with no committed offset and StartFrom(Latest)
// sees only messages stored after it took the queue.
func TestStartLatest(t *testing.T) {
	forEachCoord(t, []string{"g1"}, func(t *testing.T, e *env) {
		e.cl.Meta.CreateTopic(t, "ticks", "g1")
		send(t, e, "ticks", "before", 10)
		rec := newRecorder()
		c := e.consumer(t, "grp", []string{"ticks"}, StartFrom(Latest))
		runIn(t, c, rec.handler("c"))
		waitFor(t, 10*time.Second, "the start to be known", func() bool {
			q := c.Stats().Queues
			return len(q) == 1 && q[0].Processed == 10
		})
		send(t, e, "ticks", "after", 5)
		// One queue, in offset order: the 10 sent before would come first.
		waitFor(t, 10*time.Second, "the 5 sent after", func() bool {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			n := 0
			for body := range rec.seen {
				if strings.HasPrefix(body, "after") {
					n++
				}
			}
			return n == 5
		})
		if n := rec.count(); n != 5 {
			t.Fatalf("handled %d, want the 5 sent after the start", n)
		}
	})
}

// TestUnknownTopic: Run names a topic that does not exist.
func TestUnknownTopic(t *testing.T) {
	e := startEnv(t, []string{"g1"}, false)
	c, err := New("grp", []string{"nope"}, sdk.MetaAddrs(e.cl.MetaAddr()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = c.Run(context.Background(), func(context.Context, *Message) error { return nil })
	if !errors.Is(err, ErrUnknownTopic) || !errors.Is(err, protocol.ErrUnknownTopic) {
		t.Fatalf("Run: %v", err)
	}
}

// TestSessionLost: a member that cannot reach the coordinator for its
// session stops consuming, and takes its queues again when it can.
func TestSessionLost(t *testing.T) {
	e := startEnv(t, []string{"g1"}, true)
	e.cl.Meta.CreateTopic(t, "t", "g1", "g1")
	c := e.consumer(t, "grp", []string{"t"}, Session(time.Second), Heartbeat(100*time.Millisecond))
	runIn(t, c, newRecorder().handler("c"))
	waitFor(t, 10*time.Second, "two queues", func() bool { return len(queuesOf(c)) == 2 })
	f := e.coord(t, "grp", nil)
	f.setDown(true)
	began := time.Now()
	waitFor(t, 3*time.Second, "the queues dropped", func() bool { return len(queuesOf(c)) == 0 })
	if d := time.Since(began); d > 1200*time.Millisecond {
		t.Errorf("queues dropped after %v, later than the 1 s session", d)
	}
	f.setDown(false)
	waitFor(t, 5*time.Second, "the queues back", func() bool { return len(queuesOf(c)) == 2 })
}
