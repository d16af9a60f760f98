package producer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// Delayed and ordinary messages of one queue, interleaved, go out with a
// schedule only when delayed (DeliverAfter from the producer's clock when
// Send is called, DeliverAt as given, to the millisecond, Ref -1), and
// each kind has its own sequence space, both from 0 without a gap: the
// broker checks a delayed message's stamp in its queue's internal queue.
// Every result has the handle of the record stored; a delayed one says so
// and when it is due.
func TestDelayedSendStampsAndHandles(t *testing.T) {
	c, fakes := fakeCluster(t, "d", "g1")
	f := fakes["g1"]
	clk := clockwork.NewFakeClockAt(time.Date(2026, 12, 6, 18, 0, 0, 0, time.UTC))
	p := newProducer(t, c, withClock(clk), Linger(0))
	at := time.Date(2026, 12, 7, 9, 0, 0, 123_456_789, time.UTC)
	msgs := []*Message{
		{Topic: "d", Body: []byte("m0")},
		{Topic: "d", Body: []byte("d0"), DeliverAfter: 200 * time.Millisecond},
		{Topic: "d", Body: []byte("m1")},
		{Topic: "d", Body: []byte("d1"), DeliverAt: at},
		{Topic: "d", Body: []byte("d2"), DeliverAt: clk.Now().Add(-time.Hour)}, // in the past: due at once, still delayed
		{Topic: "d", Body: []byte("m2")},
	}
	// d0 is sent a second after the start (the clock moves a second per
	// send): DeliverAfter counts from its Send.
	wantAt := map[string]int64{
		"d0": clk.Now().Add(time.Second + 200*time.Millisecond).UnixMilli(),
		"d1": at.UnixMilli(),
		"d2": clk.Now().Add(-time.Hour).UnixMilli(),
	}
	results := map[string]Result{}
	for _, m := range msgs {
		r, err := p.Send(context.Background(), m)
		if err != nil {
			t.Fatalf("send %s: %v", m.Body, err)
		}
		results[string(m.Body)] = r
		clk.Advance(time.Second)
	}
	seqs := map[bool]int64{}
	for _, m := range f.receivedCopy() {
		body := string(m.Body)
		due, delayed := wantAt[body]
		want := protocol.Schedule{}
		if delayed {
			want = protocol.Schedule{Kind: protocol.ScheduleDelayed, At: due, Ref: -1}
		}
		if m.Schedule != want {
			t.Errorf("%s went with schedule %+v, want %+v", body, m.Schedule, want)
		}
		if m.Producer.Seq != seqs[delayed] {
			t.Errorf("%s (delayed %v) went with seq %d, want %d: delayed and ordinary messages have separate sequences", body, delayed, m.Producer.Seq, seqs[delayed])
		}
		seqs[delayed]++
		r := results[body]
		wantDue := int64(0)
		if delayed {
			wantDue = due
		}
		if r.Handle != (protocol.Handle{Group: "g1", Offset: r.LogOffset, DueAt: wantDue}) || r.LogOffset <= 0 {
			t.Errorf("%s: handle %v, log offset %d", body, r.Handle, r.LogOffset)
		}
		if r.Delayed != delayed || delayed && !r.DueAt.Equal(time.UnixMilli(due)) || !delayed && !r.DueAt.IsZero() {
			t.Errorf("%s: result Delayed %v DueAt %v, want %v %v", body, r.Delayed, r.DueAt, delayed, time.UnixMilli(due))
		}
		if r.Seq != m.Producer.Seq {
			t.Errorf("%s: result seq %d, sent %d", body, r.Seq, m.Producer.Seq)
		}
	}
	if seqs[true] != 3 || seqs[false] != 3 {
		t.Fatalf("received %d delayed and %d ordinary messages, want 3 and 3", seqs[true], seqs[false])
	}
	if n, d := len(f.storedIn("d", 0)), len(f.pendingIn("d", 0)); n != 3 || d != 3 {
		t.Fatalf("stored %d in the queue and %d pending, want 3 and 3", n, d)
	}
}

// A message that asks for both times, a negative delay or a time before
// 1970 is refused with INVALID before anything is sent; it takes no
// buffer room and leaves nothing behind.
func TestDelayedOptionErrors(t *testing.T) {
	c, fakes := fakeCluster(t, "bad", "g1")
	p := newProducer(t, c)
	for _, tc := range []struct {
		name string
		m    Message
		want string
	}{
		{"both", Message{DeliverAt: time.Now().Add(time.Minute), DeliverAfter: time.Minute}, "not both"},
		{"negative after", Message{DeliverAfter: -time.Second}, "negative"},
		{"before 1970", Message{DeliverAt: time.Unix(-10, 0)}, "1970"},
		{"at 1970", Message{DeliverAt: time.Unix(0, 0)}, "1970"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.m
			m.Topic, m.Body = "bad", []byte("x")
			_, err := p.Send(context.Background(), &m)
			if !errors.Is(err, protocol.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v: want INVALID saying %q", err, tc.want)
			}
			done := make(chan error, 1)
			p.SendAsync(context.Background(), &m, func(_ Result, err error) { done <- err })
			if err := <-done; !errors.Is(err, protocol.ErrInvalid) {
				t.Fatalf("async: err %v", err)
			}
		})
	}
	if n := len(fakes["g1"].receivedCopy()); n != 0 {
		t.Fatalf("the broker got %d messages", n)
	}
	p.buf.mu.Lock()
	records, bytes := p.buf.records, p.buf.bytes
	p.buf.mu.Unlock()
	if records != 0 || bytes != 0 {
		t.Fatalf("the buffer holds %d records of %d bytes after refused messages", records, bytes)
	}
}

// Keyed delayed messages are stored pending in send order, with
// consecutive sequences of their own, through refusals of the delayed
// space alone (a refused delayed message waits on its queue and the key's
// later ones wait behind it), while the queue's ordinary messages flow:
// the broker releases messages due at the same time in log order, so the
// key's order holds when they are released.
func TestDelayedKeyedOrderThroughRetries(t *testing.T) {
	c, fakes := fakeCluster(t, "kd", "g1", "g2")
	for _, f := range fakes {
		// Under the fake's mu: one fake takes the key's messages.
		d3stored, timedOut := false, false
		f.setInject(func(m *protocol.Message, attempt int) (protocol.Status, injectMode) {
			switch string(m.Body) {
			case "d-3":
				if attempt <= 2 {
					return protocol.StatusBusy, refuse
				}
				d3stored = true
			case "d-7":
				if d3stored && !timedOut {
					// Stored, answered TIMEOUT: an unknown outcome, retried
					// with its stamp and answered DUPLICATE.
					timedOut = true
					return protocol.StatusTimeout, storeThen
				}
			}
			return 0, noInject
		})
	}
	p := newProducer(t, c, RetryBackoff(5*time.Millisecond))
	key := keyFor(1, 2)
	due := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	pr := newPromises(t)
	const n = 20
	for i := range n {
		p.SendAsync(context.Background(), &Message{Topic: "kd", Key: key, Body: []byte(fmt.Sprint("d-", i)), DeliverAt: due}, pr.next(2*i))
		p.SendAsync(context.Background(), &Message{Topic: "kd", Key: key, Body: []byte(fmt.Sprint("m-", i))}, pr.next(2*i+1))
	}
	if err := p.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	pr.wg.Wait()
	if len(pr.errs) != 0 {
		t.Fatal(pr.errs[0])
	}
	var f *fakeBroker
	delayed := 0
	for _, r := range pr.results {
		f = fakes[r.Group]
		if r.Queue != 1 || r.PossibleDuplicate || f != fakes[r.Group] {
			t.Fatalf("result %+v: want queue 1, one group, no possible duplicate", r)
		}
		if r.Delayed {
			delayed++
		}
	}
	if delayed != n {
		t.Fatalf("%d results say delayed, want %d", delayed, n)
	}
	for kind, stored := range map[string][]protocol.Message{"d-": f.pendingIn("kd", 1), "m-": f.storedIn("kd", 1)} {
		if len(stored) != n {
			t.Fatalf("%s: %d stored, want %d", kind, len(stored), n)
		}
		for i, m := range stored {
			if string(m.Body) != fmt.Sprint(kind, i) || m.Producer.Seq != int64(i) {
				t.Fatalf("%s: stored #%d is %q with seq %d", kind, i, m.Body, m.Producer.Seq)
			}
		}
	}
	if st := p.Stats(); st.Retries == 0 || st.OutOfOrder != 0 || st.Duplicates != 1 {
		t.Fatalf("stats %+v: want retries, one duplicate (d-7's retry), no out-of-order answer", st)
	}
}

// Cancel reaches the group's master by the producer's routes, or, for a
// producer that never sent to the group, by the metaserver's groups; the
// answer says whether this call cancelled the message or it was cancelled
// before, and DelayedState reads it. A handle of no pending record is
// NOT_FOUND, of no group NOT_FOUND, a malformed one INVALID; a closed
// producer answers ErrClosed.
func TestCancelAndState(t *testing.T) {
	c, fakes := fakeCluster(t, "cx", "g1")
	p := newProducer(t, c)
	ctx := context.Background()
	r, err := p.Send(ctx, &Message{Topic: "cx", Body: []byte("later"), DeliverAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.DelayedState(ctx, r.Handle)
	if err != nil || st.State != protocol.DelayPending || st.Offset != r.LogOffset || st.ID != r.ID || st.DueAt != r.DueAt.UnixMilli() {
		t.Fatalf("state %+v, %v", st, err)
	}
	st, err = p.Cancel(ctx, r.Handle)
	if err != nil || st.State != protocol.DelayCancelled || st.By != "cancel" {
		t.Fatalf("cancel: %+v, %v: want cancelled by this call", st, err)
	}
	other := newProducer(t, c) // no route cached: the metaserver names the master
	st, err = other.Cancel(ctx, r.Handle)
	if err != nil || st.State != protocol.DelayCancelled || st.By != "" {
		t.Fatalf("second cancel: %+v, %v: want cancelled before", st, err)
	}
	for _, tc := range []struct {
		h    protocol.Handle
		want error
	}{
		{protocol.Handle{Group: "g1", Offset: r.LogOffset + 100}, protocol.ErrNotFound},
		{protocol.Handle{Group: "nope", Offset: 1}, protocol.ErrNotFound},
		{protocol.Handle{Group: "", Offset: 1}, protocol.ErrInvalid},
		{protocol.Handle{Group: "g1", Offset: -1}, protocol.ErrInvalid},
	} {
		if _, err := other.Cancel(ctx, tc.h); !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.h.String()) {
			t.Errorf("cancel %v: %v, want %v naming the handle", tc.h, err, tc.want)
		}
	}
	// A pending record that retention moved is followed to its new offset.
	r2, err := p.Send(ctx, &Message{Topic: "cx", Body: []byte("long"), DeliverAfter: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f := fakes["g1"]
	f.mu.Lock()
	moved := *f.delayed[r2.LogOffset]
	moved.Offset = f.offset.Add(1)
	f.delayed[moved.Offset] = &moved
	f.delayed[r2.LogOffset].State, f.delayed[r2.LogOffset].MovedTo = protocol.DelayMoved, moved.Offset
	f.mu.Unlock()
	st, err = other.Cancel(ctx, r2.Handle)
	if err != nil || st.State != protocol.DelayCancelled || st.By != "cancel" || st.Offset != moved.Offset || st.ID != r2.ID {
		t.Fatalf("cancel of a moved record: %+v, %v: want the record at %d cancelled by this call", st, err, moved.Offset)
	}
	_ = other.Close()
	if _, err := other.DelayedState(ctx, r.Handle); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed producer: %v", err)
	}
}

// A cancel the group cannot answer yet (BUSY) is retried until it is
// answered; one that is never answered ends with the context, wrapping the
// last cause.
func TestCancelRetries(t *testing.T) {
	c, fakes := fakeCluster(t, "cr", "g1")
	f := fakes["g1"]
	p := newProducer(t, c, RetryBackoff(5*time.Millisecond))
	ctx := context.Background()
	r, err := p.Send(ctx, &Message{Topic: "cr", Body: []byte("later"), DeliverAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f.failing.Store(true)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := p.Cancel(short, r.Handle); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, protocol.ErrBusy) {
		t.Fatalf("cancel while busy: %v, want the deadline and BUSY", err)
	}
	done := make(chan error, 1)
	go func() {
		st, err := p.Cancel(ctx, r.Handle)
		if err == nil && (st.State != protocol.DelayCancelled || st.By != "cancel") {
			err = fmt.Errorf("state %+v", st)
		}
		done <- err
	}()
	before := f.delayedCalls.Load()
	testwait.For(t, 10*time.Second, "a cancel answered BUSY again", func() bool { return f.delayedCalls.Load() >= before+2 })
	f.failing.Store(false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A cancel answered NOT_MASTER by the master the producer's routes name
// refreshes those routes and goes to the new master they name (the
// metaserver, unreachable here, is no help).
func TestCancelFollowsNewMaster(t *testing.T) {
	f := startFakeBroker(t, "", "g1")
	promoted := f.listen(t) // shares the log: a slave promoted with everything
	rt := newFakeRoutes()
	rt.set("nm", routing.QueueRoute{Queue: 0, Group: "g1", Master: f.first.addr, Epoch: 1, Writable: true})
	p := newFakeProducer(t, rt, Linger(0), RetryBackoff(5*time.Millisecond), RequestTimeout(300*time.Millisecond))
	ctx := context.Background()
	r, err := p.Send(ctx, &Message{Topic: "nm", Body: []byte("later"), DeliverAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f.first.notMaster.Store(true)
	rt.set("nm", routing.QueueRoute{Queue: 0, Group: "g1", Master: promoted.addr, Epoch: 2, Writable: true})
	st, err := p.Cancel(ctx, r.Handle)
	if err != nil || st.State != protocol.DelayCancelled || st.By != "cancel" {
		t.Fatalf("cancel: %+v, %v", st, err)
	}
	if n, m := f.first.delayedCalls.Load(), promoted.delayedCalls.Load(); n != 1 || m != 1 {
		t.Fatalf("the old master took %d calls and the new one %d, want 1 and 1", n, m)
	}
}
