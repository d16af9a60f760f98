package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/sdk"
)

// fakeBrokers serves PULL from memory: one queue log per (topic, queue),
// the same at every address, except addresses marked down.
type fakeBrokers struct {
	mu       sync.Mutex
	base     map[qkey]int64 // the oldest offset
	logs     map[qkey][]protocol.Message
	down     map[string]bool
	served   map[string]int
	bytes    atomic.Int64 // message bytes answered
	parked   atomic.Int64 // PULLs held now, waiting for a message
	lastWait atomic.Int64 // the WaitMillis of the last PULL held
	changed  chan struct{}
}

func newFakeBrokers() *fakeBrokers {
	return &fakeBrokers{base: map[qkey]int64{}, logs: map[qkey][]protocol.Message{}, down: map[string]bool{},
		served: map[string]int{}, changed: make(chan struct{})}
}

func (f *fakeBrokers) add(topic string, queue uint32, bodies ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := qkey{topic, queue}
	for _, b := range bodies {
		f.logs[k] = append(f.logs[k], protocol.Message{ID: "id-" + b, Topic: topic, Queue: queue, Timestamp: time.Now().UnixMilli(), Body: []byte(b)})
	}
	close(f.changed)
	f.changed = make(chan struct{})
}

// addMessage appends a message as given (a released delayed message, say).
func (f *fakeBrokers) addMessage(m protocol.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := qkey{m.Topic, m.Queue}
	f.logs[k] = append(f.logs[k], m)
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeBrokers) setDown(addr string, down bool) {
	f.mu.Lock()
	f.down[addr] = down
	f.mu.Unlock()
}

func (f *fakeBrokers) Pull(ctx context.Context, addr string, req *protocol.PullRequest, _ *protocol.PullDecoder) (protocol.PullResponse, error) {
	for {
		f.mu.Lock()
		f.served[addr]++
		if f.down[addr] {
			f.mu.Unlock()
			return protocol.PullResponse{}, fmt.Errorf("fake %s: %w", addr, transport.ErrConnLost)
		}
		k := qkey{req.Topic, req.Queue}
		base, log := f.base[k], f.logs[k]
		end := base + int64(len(log))
		off := max(req.Offset, base)
		resp := protocol.PullResponse{NextOffset: off, MinOffset: base, MaxOffset: end}
		size := 0
		for o := off; o < end; o++ {
			m := log[o-base]
			if len(resp.Messages) > 0 && size+m.EncodedSize() > int(req.MaxBytes) {
				break
			}
			size += m.EncodedSize()
			resp.Messages = append(resp.Messages, protocol.StoredMessage{QueueOffset: o, StoreTime: time.Now().UnixMilli(), Message: m})
			resp.NextOffset = o + 1
		}
		changed := f.changed
		f.mu.Unlock()
		if len(resp.Messages) > 0 || req.WaitMillis == 0 {
			f.bytes.Add(int64(size))
			return resp, nil
		}
		f.lastWait.Store(int64(req.WaitMillis))
		f.parked.Add(1)
		select {
		case <-changed:
			f.parked.Add(-1)
		case <-time.After(time.Duration(req.WaitMillis) * time.Millisecond):
			f.parked.Add(-1)
			return resp, nil
		case <-ctx.Done():
			f.parked.Add(-1)
			return protocol.PullResponse{}, ctx.Err()
		}
	}
}

func (f *fakeBrokers) Close() error { return nil }

// fakeRouter routes every topic's n queues to master "m" and slave "s".
type fakeRouter struct{ queues int }

func (r fakeRouter) RouteExisting(ctx context.Context, topic string) (routing.Route, error) {
	if strings.HasPrefix(topic, "unknown") {
		return routing.Route{}, &protocol.Error{Status: protocol.StatusUnknownTopic}
	}
	rt := routing.Route{Topic: topic, Version: 1}
	for q := range r.queues {
		rt.Queues = append(rt.Queues, routing.QueueRoute{Queue: uint32(q), Group: "g", Master: "m", Slave: "s", Epoch: 1, Writable: true})
	}
	return rt, nil
}

// fakeDLQ records dead letters (and retries, NonBlockingRetries's).
type fakeDLQ struct {
	mu   sync.Mutex
	msgs []deadLetter
	// fail, when set, answers an attempt (recorded in tries) instead of
	// storing it, when it returns an error.
	fail  func(m *protocol.Message) error
	tries []deadLetter
}

// deadLetter is a dead letter (or a retry) as sent.
type deadLetter struct {
	ID, Topic, Key, Tag string
	Properties          map[string]string
	Body                []byte
	Timestamp           int64
	Schedule            protocol.Schedule
	msg                 *protocol.Message
}

func (d *fakeDLQ) DeadLetter(ctx context.Context, m *protocol.Message, key string) error {
	props := map[string]string{}
	for _, p := range m.Properties {
		props[p.Key] = p.Value
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	dl := deadLetter{ID: m.ID, Topic: m.Topic, Key: key, Tag: m.Tag, Properties: props, Body: m.Body, Timestamp: m.Timestamp, Schedule: m.Schedule, msg: m}
	d.tries = append(d.tries, dl)
	if d.fail != nil {
		if err := d.fail(m); err != nil {
			return err
		}
	}
	d.msgs = append(d.msgs, dl)
	return nil
}

// sent returns what was stored in topic.
func (d *fakeDLQ) sent(topic string) []deadLetter {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []deadLetter
	for _, m := range d.msgs {
		if m.Topic == topic {
			out = append(out, m)
		}
	}
	return out
}

// fakeConsumer is a consumer of fake brokers and a fake coordinator.
func fakeConsumer(t *testing.T, fb *fakeBrokers, co *fakeCoord, queues int, opts ...Opt) *Consumer {
	t.Helper()
	all := []Opt{withCoordinator(co), withRouter(fakeRouter{queues}), withPuller(fb), withDeadLetterer(&fakeDLQ{}),
		Heartbeat(50 * time.Millisecond), Session(time.Second), AutoCommit(50 * time.Millisecond),
		PollWait(100 * time.Millisecond), RetryBackoff(time.Millisecond, 5*time.Millisecond)}
	c, err := New("grp", []string{"t"}, append(all, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestOptionsValidate(t *testing.T) {
	_, err := New("", nil, Session(time.Second), Heartbeat(time.Second), MaxPrefetchBytes(10), MaxRetries(-1),
		RetryBackoff(time.Minute, time.Second), PollWait(2*time.Minute), MemberID(""), MaxPollRecords(0))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"group", "no topics", "MetaAddrs", "MemberID", "PollWait", "MaxPrefetchBytes",
		"MaxPollRecords", "MaxRetries", "half the Session", "RetryBackoff"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	c, err := New("g", []string{"b", "a", "b"}, sdk.MetaAddrs("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.cfg.deadLetter != "%DLQ%g" || len(c.topics) != 2 || c.cfg.maxRetries != 16 || c.cfg.session != 10*time.Second ||
		c.cfg.heartbeat != time.Second || c.cfg.autoCommit != time.Second || c.cfg.maxPrefetchBytes != 64<<20 ||
		c.cfg.pollWait != time.Second || c.cfg.start != Earliest || c.MemberID() == "" {
		t.Errorf("defaults %+v", c.cfg)
	}
}

// TestOffsetsOutsideTheLog: a committed offset before the queue's oldest
// message starts from the oldest; one past the end goes on from the end.
func TestOffsetsOutsideTheLog(t *testing.T) {
	fb := newFakeBrokers()
	fb.base[qkey{"t", 0}] = 10
	fb.add("t", 0, "a", "b", "c") // offsets 10, 11, 12
	fb.add("t", 1, "x")           // offset 0
	co := newFakeCoord(map[string]int{"t": 2})
	co.committed[qkey{"t", 0}] = 5
	co.committed[qkey{"t", 1}] = 7 // past the end, 1
	c := fakeConsumer(t, fb, co, 2)
	var mu sync.Mutex
	var got []string
	runIn(t, c, func(ctx context.Context, m *Message) error {
		mu.Lock()
		got = append(got, fmt.Sprintf("%d:%d:%s", m.Queue, m.Offset, m.Body))
		mu.Unlock()
		return nil
	})
	waitFor(t, 5*time.Second, "queue 0's three messages", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 3
	})
	waitFor(t, 5*time.Second, "offsets 13 and 1 committed", func() bool { return co.offset("t", 0) == 13 && co.offset("t", 1) == 1 })
	fb.add("t", 1, "y") // offset 1: handled, not skipped
	waitFor(t, 5*time.Second, "y", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 4
	})
	mu.Lock()
	defer mu.Unlock()
	if got[0] != "0:10:a" || got[2] != "0:12:c" || got[3] != "1:1:y" {
		t.Errorf("got %v", got)
	}
}

// TestSlaveFallback: a master that does not answer is read around through
// the slave.
func TestSlaveFallback(t *testing.T) {
	fb := newFakeBrokers()
	fb.setDown("m", true)
	fb.add("t", 0, "a", "b")
	co := newFakeCoord(map[string]int{"t": 1})
	c := fakeConsumer(t, fb, co, 1)
	rec := newRecorder()
	runIn(t, c, rec.handler("c"))
	waitFor(t, 5*time.Second, "both from the slave", func() bool { return rec.count() == 2 })
	if s := c.Stats(); s.FromSlave == 0 || s.FetchErrors != 0 {
		t.Errorf("stats %+v", s)
	}
}

// TestPrefetchBound: a fetcher stops at its share while the handler holds
// messages.
func TestPrefetchBound(t *testing.T) {
	fb := newFakeBrokers()
	body := strings.Repeat("x", 1000)
	var bodies []string
	for i := range 1000 {
		bodies = append(bodies, fmt.Sprint(i, body))
	}
	fb.add("t", 0, bodies...)
	co := newFakeCoord(map[string]int{"t": 1})
	c := fakeConsumer(t, fb, co, 1, MaxPrefetchBytes(minQueueShare))
	release := make(chan struct{})
	runIn(t, c, func(ctx context.Context, m *Message) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	// The fetcher fills its share and then waits for room: once it has
	// fetched the share, it has fetched no more than it (and the message the
	// handler holds).
	waitFor(t, 5*time.Second, "the share to be fetched", func() bool { return fb.bytes.Load() >= minQueueShare })
	if n := fb.bytes.Load(); n > minQueueShare+2*1100 {
		t.Errorf("fetched %d bytes with a %d share", n, minQueueShare)
	}
	if q := c.Stats().Queues[0]; q.Buffered == 0 || q.Buffered > 70 {
		t.Errorf("buffered %d", q.Buffered)
	}
	close(release)
	waitFor(t, 10*time.Second, "everything handled and committed", func() bool { return co.offset("t", 0) == 1000 })
}

// TestRunBatch: batches of one queue, in order, a failed batch delivered
// whole again, then dead-lettered message by message.
func TestRunBatch(t *testing.T) {
	fb := newFakeBrokers()
	for i := range 10 {
		fb.add("t", 0, fmt.Sprint(i))
	}
	co := newFakeCoord(map[string]int{"t": 1})
	dlq := &fakeDLQ{}
	c := fakeConsumer(t, fb, co, 1, MaxPollRecords(4), MaxRetries(1), withDeadLetterer(dlq))
	var calls atomic.Int32
	var next atomic.Int64
	var bad error
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- c.RunBatch(ctx, func(ctx context.Context, msgs []*Message) error {
			calls.Add(1)
			if len(msgs) > 4 {
				bad = fmt.Errorf("batch of %d", len(msgs))
			}
			for _, m := range msgs {
				if string(m.Body) == "5" {
					next.Store(msgs[len(msgs)-1].Offset + 1) // dead-lettered in the end
					return errors.New("no 5")
				}
			}
			if msgs[0].Offset != next.Load() {
				bad = fmt.Errorf("batch from %d, want %d", msgs[0].Offset, next.Load())
			}
			next.Store(msgs[len(msgs)-1].Offset + 1)
			return nil
		})
	}()
	waitFor(t, 5*time.Second, "offset 10 committed", func() bool { return co.offset("t", 0) == 10 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if bad != nil {
		t.Fatal(bad)
	}
	dlq.mu.Lock()
	defer dlq.mu.Unlock()
	if len(dlq.msgs) == 0 || c.Stats().DeadLetters != int64(len(dlq.msgs)) {
		t.Fatalf("%d dead letters, stats %+v", len(dlq.msgs), c.Stats())
	}
	found := false
	for _, m := range dlq.msgs {
		if string(m.Body) == "5" && m.Properties[PropDeliveries] == "2" && m.Topic == "%DLQ%grp" {
			found = true
		}
	}
	if !found {
		t.Errorf("no dead letter of 5 after 2 deliveries")
	}
}

// TestIdleFetchesLongPoll: an idle queue's PULL asks the broker to hold it
// for PollWait, and a message that arrives meanwhile is handed over by that
// PULL.
func TestIdleFetchesLongPoll(t *testing.T) {
	fb := newFakeBrokers()
	co := newFakeCoord(map[string]int{"t": 1})
	c := fakeConsumer(t, fb, co, 1, PollWait(30*time.Second))
	rec := newRecorder()
	runIn(t, c, rec.handler("c"))
	waitFor(t, 5*time.Second, "the idle queue's PULL to be held", func() bool { return fb.parked.Load() == 1 })
	if w := fb.lastWait.Load(); w != 30_000 {
		t.Fatalf("the held PULL asked to wait %d ms, want PollWait (30000)", w)
	}
	before := c.Stats().Fetches
	fb.add("t", 0, "wake")
	waitFor(t, 5*time.Second, "the message", func() bool { return rec.count() == 1 })
	if n := c.Stats().Fetches - before; n != 1 {
		t.Errorf("%d PULLs answered for one message: want the held one", n)
	}
}

func TestUnknownTopicFake(t *testing.T) {
	c, err := New("grp", []string{"unknown-x"}, withCoordinator(newFakeCoord(nil)), withRouter(fakeRouter{1}),
		withPuller(newFakeBrokers()), withDeadLetterer(&fakeDLQ{}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Poll(context.Background()); !errors.Is(err, ErrUnknownTopic) {
		t.Fatalf("Poll: %v", err)
	}
}

// TestRetryBackoffDoubles: redeliveries wait RetryBackoff, doubling up to
// its cap, on the consumer's clock. The clock moves a minute at a time,
// each step once the member's heartbeat was answered, so its lease (a
// 5-minute session) never lapses meanwhile.
func TestRetryBackoffDoubles(t *testing.T) {
	fb := newFakeBrokers()
	fb.add("t", 0, "bad", "good")
	co := newFakeCoord(map[string]int{"t": 1})
	co.session = 5 * time.Minute
	clk := clockwork.NewFakeClock()
	dlq := &fakeDLQ{}
	c := fakeConsumer(t, fb, co, 1, withClock(clk), RetryBackoff(time.Hour, 4*time.Hour), MaxRetries(4), withDeadLetterer(dlq),
		Session(5*time.Minute))
	var mu sync.Mutex
	var at []time.Time
	runIn(t, c, func(ctx context.Context, m *Message) error {
		if string(m.Body) != "bad" {
			return nil
		}
		mu.Lock()
		at = append(at, clk.Now())
		mu.Unlock()
		return errors.New("bad")
	})
	deliveries := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(at)
	}
	waitFor(t, 5*time.Second, "the first delivery", func() bool { return deliveries() == 1 })
	for want := 2; want <= 5; want++ {
		deadline := time.Now().Add(10 * time.Second)
		for deliveries() < want {
			if time.Now().After(deadline) {
				t.Fatalf("delivery %d did not come", want)
			}
			beats := c.Stats().Heartbeats
			clk.Advance(time.Minute)
			// The member's next heartbeat timer may be set only after this
			// step: nudge the clock until one is answered.
			for c.Stats().Heartbeats == beats && deliveries() < want {
				if time.Now().After(deadline) {
					t.Fatal("no heartbeat answered")
				}
				clk.Advance(100 * time.Millisecond)
				time.Sleep(time.Millisecond)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i, want := range []time.Duration{time.Hour, 2 * time.Hour, 4 * time.Hour, 4 * time.Hour} {
		if d := at[i+1].Sub(at[i]); d < want || d > want+2*time.Minute {
			t.Errorf("wait before delivery %d: %v, want %v", i+2, d, want)
		}
	}
	waitFor(t, 5*time.Second, "the dead letter", func() bool { return c.Stats().DeadLetters == 1 })
}

// refusing is a coordinator that refuses every heartbeat with err.
type refusing struct{ err error }

func (r *refusing) CommitOffsets(ctx context.Context, req api.CommitRequest) (api.CommitReply, error) {
	return api.CommitReply{}, r.err
}

func (r *refusing) ConsumerHeartbeat(ctx context.Context, hb api.ConsumerHeartbeat) (api.ConsumerHeartbeatReply, error) {
	return api.ConsumerHeartbeatReply{}, r.err
}

// TestRefusedForGood: Run and Poll return a heartbeat refusal that retrying
// cannot cure.
func TestRefusedForGood(t *testing.T) {
	fb := newFakeBrokers()
	co := &refusing{err: &protocol.Error{Status: protocol.StatusUnknownTopic, Message: "deleted"}}
	c := fakeConsumer(t, fb, newFakeCoord(nil), 1, withCoordinator(co))
	err := c.Run(context.Background(), func(context.Context, *Message) error { return nil })
	if !errors.Is(err, ErrUnknownTopic) || !errors.Is(err, protocol.ErrUnknownTopic) {
		t.Fatalf("Run: %v", err)
	}
}
