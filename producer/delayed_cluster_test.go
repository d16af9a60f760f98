package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
)

// released waits until the delayed message h is released and returns its
// state.
func released(t *testing.T, p *Client, h protocol.Handle, within time.Duration) protocol.DelayedState {
	t.Helper()
	var st protocol.DelayedState
	testwait.For(t, within, "the release of "+h.String(), func() bool {
		var err error
		st, err = p.DelayedState(context.Background(), h)
		if err != nil {
			t.Fatalf("state of %v: %v", h, err)
		}
		return st.State == protocol.DelayReleased
	})
	return st
}

// Through a real broker: a delayed message is stored pending at once (its
// handle names it), released into its queue no earlier than due, and read
// there as a released copy naming its pending record; a cancelled one
// never arrives (a later one is released, and the queue holds only that
// one and the ordinary messages); a cancel after the release says where
// the message went; interleaved ordinary and delayed messages of one queue
// are all stored with no out-of-order refusal (separate sequences).
func TestDelayedThroughBroker(t *testing.T) {
	c := start(t, false, "g1")
	c.Meta.CreateTopic(t, "later", "g1")
	p := newProducer(t, c, Linger(0))
	ctx := context.Background()

	if _, err := p.Send(ctx, &Message{Topic: "later", Body: []byte("now-0")}); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	dropped, err := p.Send(ctx, &Message{Topic: "later", Body: []byte("dropped"), DeliverAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !dropped.Delayed || dropped.Handle != (protocol.Handle{Group: "g1", Offset: dropped.LogOffset, DueAt: dropped.DueAt.UnixMilli()}) ||
		dropped.DueAt.Before(sent.Add(time.Second).Truncate(time.Millisecond)) {
		t.Fatalf("delayed result %+v", dropped)
	}
	// Due after the cancelled one: once it is released, the cancelled one
	// would have been (the broker releases in due order).
	soon, err := p.Send(ctx, &Message{Topic: "later", Body: []byte("soon"), DeliverAt: dropped.DueAt.Add(200 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Send(ctx, &Message{Topic: "later", Body: []byte("now-1")}); err != nil {
		t.Fatal(err)
	}
	st, err := p.Cancel(ctx, dropped.Handle)
	if err != nil || st.State != protocol.DelayCancelled || st.By != "cancel" || st.ID != dropped.ID {
		t.Fatalf("cancel: %+v, %v: want cancelled by this call", st, err)
	}

	rel := released(t, p, soon.Handle, 10*time.Second)
	if rel.Released == nil || rel.Released.At < rel.DueAt || rel.DueAt != soon.DueAt.UnixMilli() {
		t.Fatalf("released state %+v: want released at or after due %v", rel, soon.DueAt.UnixMilli())
	}
	t.Logf("released %dms after due", rel.Released.At-rel.DueAt)
	tc := testcluster.Dial(t, c.Master("g1").Addr())
	msgs := testcluster.PullAll(t, tc, "later", 0)
	var bodies []string
	for _, sm := range msgs {
		bodies = append(bodies, string(sm.Message.Body))
		if string(sm.Message.Body) != "soon" {
			continue
		}
		m := sm.Message
		if sm.QueueOffset != rel.Released.QueueOffset || m.Schedule.Kind != protocol.ScheduleReleased ||
			m.Schedule.At != soon.DueAt.UnixMilli() || m.Schedule.Ref != soon.Handle.Offset || sm.StoreTime < m.Schedule.At || m.ID != soon.ID {
			t.Fatalf("released copy at %d: %+v stored %d; want the copy of %v due %d at queue offset %d",
				sm.QueueOffset, m, sm.StoreTime, soon.Handle, soon.DueAt.UnixMilli(), rel.Released.QueueOffset)
		}
	}
	if fmt.Sprint(bodies) != "[now-0 now-1 soon]" {
		t.Fatalf("queue holds %v: want the ordinary messages then the released one, not the cancelled one", bodies)
	}

	st, err = p.Cancel(ctx, soon.Handle)
	if err != nil || st.State != protocol.DelayReleased || st.By != "" || st.Released == nil || *st.Released != *rel.Released {
		t.Fatalf("cancel after release: %+v, %v: want released at %+v", st, err, rel.Released)
	}
	if s := p.Stats(); s.OutOfOrder != 0 || s.Renewals != 0 {
		t.Fatalf("stats %+v: interleaved delayed and ordinary messages were refused out of order", s)
	}
}

// Keyed delayed messages due at the same time are released in send order,
// after ordinary messages of the key sent between them.
func TestDelayedKeyedReleaseOrder(t *testing.T) {
	c := start(t, false, "g1")
	c.Meta.CreateTopic(t, "keyed", "g1", "g1")
	p := newProducer(t, c)
	key := keyFor(1, 2)
	due := time.Now().Add(300 * time.Millisecond)
	pr := newPromises(t)
	const n = 50
	for i := range n {
		p.SendAsync(context.Background(), &Message{Topic: "keyed", Key: key, Body: []byte(fmt.Sprint("d-", i)), DeliverAt: due}, pr.next(2*i))
		p.SendAsync(context.Background(), &Message{Topic: "keyed", Key: key, Body: []byte(fmt.Sprint("m-", i))}, pr.next(2*i+1))
	}
	if err := p.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	pr.wg.Wait()
	if len(pr.errs) != 0 {
		t.Fatal(pr.errs[0])
	}
	tc := testcluster.Dial(t, c.Master("g1").Addr())
	var msgs []protocol.StoredMessage
	testwait.For(t, 10*time.Second, "every message in the queue", func() bool {
		msgs = testcluster.PullAll(t, tc, "keyed", 1)
		return len(msgs) >= 2*n
	})
	var d, m int
	for _, sm := range msgs {
		body := string(sm.Message.Body)
		switch {
		case sm.Message.Schedule.Kind == protocol.ScheduleReleased:
			if body != fmt.Sprint("d-", d) || sm.Message.Schedule.At != due.UnixMilli() {
				t.Fatalf("released #%d is %q due %d", d, body, sm.Message.Schedule.At)
			}
			d++
		default:
			if body != fmt.Sprint("m-", m) {
				t.Fatalf("ordinary #%d is %q", m, body)
			}
			m++
		}
	}
	if d != n || m != n {
		t.Fatalf("%d released and %d ordinary, want %d of each", d, m, n)
	}
}

// Through a real broker: a delay beyond the broker's maximum is refused
// INVALID (not clamped), and past the topic's quota of pending messages
// DELAY_QUOTA, both at once (not retried); ordinary messages still go,
// and a cancel frees room in the quota.
func TestDelayedLimitsThroughBroker(t *testing.T) {
	c := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1"}, MetaEdit: testcluster.SteadyMeta, BrokerEdit: func(cfg *broker.Config) {
		testcluster.SteadyBroker(cfg)
		cfg.DelayQuota = 2
	}})
	c.Meta.CreateTopic(t, "lim", "g1")
	p := newProducer(t, c, Linger(0))
	ctx := context.Background()
	if _, err := p.Send(ctx, &Message{Topic: "lim", Body: []byte("far"), DeliverAfter: 91 * 24 * time.Hour}); !errors.Is(err, protocol.ErrInvalid) {
		t.Fatalf("91 days: %v, want INVALID", err)
	}
	first, err := p.Send(ctx, &Message{Topic: "lim", Body: []byte("a"), DeliverAfter: 89 * 24 * time.Hour})
	if err != nil {
		t.Fatalf("89 days: %v", err)
	}
	if _, err := p.Send(ctx, &Message{Topic: "lim", Body: []byte("b"), DeliverAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// The quota is checked against the pending count as the broker's index
	// last followed its log (within a tick).
	tc := testcluster.Dial(t, c.Master("g1").Addr())
	pending := func() int64 {
		resp, err := tc.Call(ctx, protocol.CodeDelayedList, []byte(`{"topic":"lim"}`))
		if err != nil {
			t.Fatal(err)
		}
		var l protocol.DelayedList
		if err := json.Unmarshal(resp.Body, &l); err != nil {
			t.Fatal(err)
		}
		return l.Pending
	}
	testwait.For(t, 10*time.Second, "the broker to count two pending messages", func() bool { return pending() == 2 })
	if _, err := p.Send(ctx, &Message{Topic: "lim", Body: []byte("c"), DeliverAfter: time.Hour}); !errors.Is(err, protocol.ErrDelayQuota) {
		t.Fatalf("past the quota: %v, want DELAY_QUOTA", err)
	}
	if _, err := p.Send(ctx, &Message{Topic: "lim", Body: []byte("now")}); err != nil {
		t.Fatalf("an ordinary message past the quota: %v", err)
	}
	if st, err := p.Cancel(ctx, first.Handle); err != nil || st.State != protocol.DelayCancelled {
		t.Fatalf("cancel: %+v %v", st, err)
	}
	// The broker's count follows its log: the cancel mark is counted soon
	// after the cancel is answered.
	cancelled := time.Now()
	testwait.For(t, 10*time.Second, "the broker to count one pending message", func() bool { return pending() == 1 })
	t.Logf("the quota counted the cancel %v after its answer", time.Since(cancelled))
	if _, err := p.Send(ctx, &Message{Topic: "lim", Body: []byte("d"), DeliverAfter: time.Hour}); err != nil {
		t.Fatalf("after a cancel freed room: %v", err)
	}
	if s := p.Stats(); s.Retries != 0 || s.OutOfOrder != 0 {
		t.Fatalf("stats %+v: refusals were retried, or a refused delayed message left a gap", s)
	}
}

// A HIGH delayed message in a group with a slave: stored pending once the
// slave has it, cancelled (the cancel answered once the slave holds its
// mark), and a HIGH one released as HIGH.
func TestDelayedHighThroughBroker(t *testing.T) {
	c := start(t, true, "g1")
	c.Meta.CreateTopic(t, "hi", "g1")
	p := newProducer(t, c, Linger(0))
	ctx := context.Background()
	gone, err := p.Send(ctx, &Message{Topic: "hi", Body: []byte("gone"), Reliability: protocol.High, DeliverAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := p.Cancel(ctx, gone.Handle); err != nil || st.State != protocol.DelayCancelled || st.By != "cancel" {
		t.Fatalf("cancel of a HIGH message: %+v %v", st, err)
	}
	kept, err := p.Send(ctx, &Message{Topic: "hi", Body: []byte("kept"), Reliability: protocol.High, DeliverAfter: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rel := released(t, p, kept.Handle, 10*time.Second)
	tc := testcluster.Dial(t, c.Master("g1").Addr())
	m := pull(t, tc, Result{Topic: "hi", Queue: kept.Queue, QueueOffset: rel.Released.QueueOffset})
	if string(m.Body) != "kept" || m.Reliability != protocol.High || m.Schedule.Ref != kept.Handle.Offset {
		t.Fatalf("released %+v", m)
	}
}
