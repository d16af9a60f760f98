package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/protocol"
)

// newFake is a consumer of fake brokers and a fake coordinator that is not
// run (its options and helpers are checked).
func newFake(t *testing.T, opts ...Opt) *Consumer {
	t.Helper()
	all := []Opt{withCoordinator(newFakeCoord(nil)), withRouter(fakeRouter{1}), withPuller(newFakeBrokers()), withDeadLetterer(&fakeDLQ{})}
	c, err := New("grp", []string{"t"}, append(all, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestRetryScheduleWaits: the n-th retry waits the schedule's n-th entry,
// and the last one past the list; RetryBackoff keeps its doubling; the
// option given last wins.
func TestRetryScheduleWaits(t *testing.T) {
	s, m, h := time.Second, time.Minute, time.Hour
	for _, c := range []struct {
		name string
		opts []Opt
		want []time.Duration // the waits before deliveries 2, 3, ...
	}{
		{"default doubling", nil, []time.Duration{s, 2 * s, 4 * s, 8 * s, 16 * s, 30 * s, 30 * s}},
		{"RetryBackoff", []Opt{RetryBackoff(h, 4*h)}, []time.Duration{h, 2 * h, 4 * h, 4 * h}},
		{"RetryBackoff not a power of two", []Opt{RetryBackoff(3*s, 10*s)}, []time.Duration{3 * s, 6 * s, 10 * s, 10 * s}},
		{"RetryBackoff flat", []Opt{RetryBackoff(s, s)}, []time.Duration{s, s, s}},
		{"RetrySchedule", []Opt{RetrySchedule(s, 5*s, 30*s, 5*m)}, []time.Duration{s, 5 * s, 30 * s, 5 * m, 5 * m, 5 * m}},
		{"RetrySchedule not increasing", []Opt{RetrySchedule(h, 3*h, 2*h)}, []time.Duration{h, 3 * h, 2 * h, 2 * h}},
		{"RetrySchedule of one", []Opt{RetrySchedule(7 * s)}, []time.Duration{7 * s, 7 * s}},
		{"RetryBackoff after RetrySchedule", []Opt{RetrySchedule(h), RetryBackoff(s, 2*s)}, []time.Duration{s, 2 * s, 2 * s}},
		{"RetrySchedule after RetryBackoff", []Opt{RetryBackoff(s, 2*s), RetrySchedule(h, m)}, []time.Duration{h, m, m}},
	} {
		t.Run(c.name, func(t *testing.T) {
			con := newFake(t, c.opts...)
			var got []time.Duration
			for n := 1; n <= len(c.want); n++ {
				got = append(got, con.backoff(n))
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("waits %v, want %v", got, c.want)
			}
		})
	}
	// The list is the caller's: changing it after the option changes
	// nothing.
	ds := []time.Duration{s, 2 * s}
	opt := RetrySchedule(ds...)
	ds[0] = h
	if got := newFake(t, opt).backoff(1); got != s {
		t.Errorf("the schedule changed with its caller's slice: first wait %v", got)
	}
}

// TestRetryScheduleRefused: New refuses an empty schedule or a wait that
// is not positive, naming it, and a group whose retry topic's name is too
// long for NonBlockingRetries.
func TestRetryScheduleRefused(t *testing.T) {
	for _, c := range []struct {
		name  string
		group string
		opts  []Opt
		want  []string
	}{
		{"empty", "grp", []Opt{RetrySchedule()}, []string{"RetrySchedule is empty"}},
		{"zero and negative", "grp", []Opt{RetrySchedule(time.Second, 0, -time.Second)},
			[]string{"RetrySchedule's wait 2 (0s) must be positive", "RetrySchedule's wait 3 (-1s) must be positive"}},
		{"too long", "grp", []Opt{RetrySchedule(make([]time.Duration, 2000)...)}, []string{"over the cap 1024"}},
		{"RetryBackoff still checked", "grp", []Opt{RetryBackoff(0, time.Second)}, []string{"RetryBackoff 0s must be positive"}},
		{"retry topic name", strings.Repeat("g", 242), []Opt{NonBlockingRetries()},
			[]string{"NonBlockingRetries: the retry topic", "group names of at most 241 bytes"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(c.group, []string{"t"}, append([]Opt{withCoordinator(newFakeCoord(nil)), withRouter(fakeRouter{1}),
				withPuller(newFakeBrokers()), withDeadLetterer(&fakeDLQ{})}, c.opts...)...)
			if err == nil {
				t.Fatal("New took it")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	// A RetrySchedule replaces a bad RetryBackoff given before it; the
	// longest group name with a retry topic is taken.
	newFake(t, RetryBackoff(0, 0), RetrySchedule(time.Second))
	c, err := New(strings.Repeat("g", 241), []string{"t"}, withCoordinator(newFakeCoord(nil)), withRouter(fakeRouter{1}),
		withPuller(newFakeBrokers()), withDeadLetterer(&fakeDLQ{}), NonBlockingRetries())
	if err != nil {
		t.Fatalf("a group of 241 bytes: %v", err)
	}
	_ = c.Close()
}

// advanceUntil moves clk by step until cond holds (10 s of real time at
// most); after each step it nudges the clock until the member's heartbeat
// was answered, so its lease never lapses.
func advanceUntil(t *testing.T, clk *clockwork.FakeClock, c *Consumer, step time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not come", what)
		}
		beats := c.Stats().Heartbeats
		clk.Advance(step)
		for c.Stats().Heartbeats == beats && !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("no heartbeat answered waiting for %s", what)
			}
			clk.Advance(100 * time.Millisecond)
			time.Sleep(time.Millisecond)
		}
	}
}

// calls records a handler's deliveries on the consumer's clock.
type calls struct {
	mu  sync.Mutex
	clk clockwork.Clock
	got []*Message
	at  []time.Time
}

func (r *calls) add(m *Message) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	cp := *m
	r.got = append(r.got, &cp)
	r.at = append(r.at, r.clk.Now())
	return len(r.got)
}

func (r *calls) n() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

func (r *calls) of(body string) (ms []*Message, at []time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, m := range r.got {
		if string(m.Body) == body {
			ms, at = append(ms, m), append(at, r.at[i])
		}
	}
	return ms, at
}

// slowFake is a consumer of fb with a fake clock and a 5-minute session.
func slowFake(t *testing.T, fb *fakeBrokers, co *fakeCoord, clk *clockwork.FakeClock, opts ...Opt) *Consumer {
	co.session = 5 * time.Minute
	return fakeConsumer(t, fb, co, 1, append([]Opt{withClock(clk), Session(5 * time.Minute)}, opts...)...)
}

// TestRetryScheduleDelivers: a failing message is delivered again after
// each wait of the schedule in turn (its queue waiting), on the consumer's
// clock, and dead-lettered after MaxRetries.
func TestRetryScheduleDelivers(t *testing.T) {
	fb := newFakeBrokers()
	fb.add("t", 0, "bad", "good")
	co := newFakeCoord(map[string]int{"t": 1})
	clk := clockwork.NewFakeClock()
	dlq := &fakeDLQ{}
	c := slowFake(t, fb, co, clk, RetrySchedule(time.Hour, 3*time.Hour, 2*time.Hour), MaxRetries(4), withDeadLetterer(dlq))
	rec := &calls{clk: clk}
	runIn(t, c, func(ctx context.Context, m *Message) error {
		rec.add(m)
		if string(m.Body) == "bad" {
			return errors.New("bad")
		}
		return nil
	})
	waitFor(t, 5*time.Second, "the first delivery", func() bool { return rec.n() == 1 })
	advanceUntil(t, clk, c, time.Minute, "five deliveries of bad", func() bool { ms, _ := rec.of("bad"); return len(ms) == 5 })
	ms, at := rec.of("bad")
	for i, want := range []time.Duration{time.Hour, 3 * time.Hour, 2 * time.Hour, 2 * time.Hour} {
		if d := at[i+1].Sub(at[i]); d < want || d > want+2*time.Minute {
			t.Errorf("wait before delivery %d: %v, want %v", i+2, d, want)
		}
		if ms[i+1].Deliveries != i+2 {
			t.Errorf("delivery %d counted %d", i+2, ms[i+1].Deliveries)
		}
	}
	// Holding the queue: good comes after bad's last delivery.
	advanceUntil(t, clk, c, time.Second, "good", func() bool { return rec.n() == 6 })
	if string(rec.got[5].Body) != "good" {
		t.Errorf("deliveries %v: want bad five times, then good", rec.got)
	}
	if dl := dlq.sent("%DLQ%grp"); len(dl) != 1 || dl[0].Properties[PropDeliveries] != "5" {
		t.Fatalf("dead letters %+v", dl)
	}
}

// TestRetryAtAndAfter: a handler's RetryAt and RetryAfter set its message's
// next delivery instead of the schedule, wrap their cause (the dead letter
// records it), and count toward MaxRetries.
func TestRetryAtAndAfter(t *testing.T) {
	fb := newFakeBrokers()
	fb.add("t", 0, "m", "next")
	co := newFakeCoord(map[string]int{"t": 1})
	clk := clockwork.NewFakeClock()
	dlq := &fakeDLQ{}
	c := slowFake(t, fb, co, clk, RetrySchedule(time.Minute), MaxRetries(2), withDeadLetterer(dlq))
	start := clk.Now()
	rec := &calls{clk: clk}
	cause := errors.New("the bank is closed")
	runIn(t, c, func(ctx context.Context, m *Message) error {
		if string(m.Body) != "m" {
			rec.add(m)
			return nil
		}
		switch rec.add(m) {
		case 1:
			return RetryAt(start.Add(7 * time.Hour)) // no cause
		case 2:
			return fmt.Errorf("wrapped: %w", RetryAfter(30*time.Minute, cause))
		default:
			return RetryAfter(time.Hour, cause) // out of retries: dead-lettered now
		}
	})
	waitFor(t, 5*time.Second, "the first delivery", func() bool { return rec.n() == 1 })
	advanceUntil(t, clk, c, time.Minute, "next", func() bool { n, _ := rec.of("next"); return len(n) == 1 })
	ms, at := rec.of("m")
	if len(ms) != 3 {
		t.Fatalf("%d deliveries of m, want 3 (MaxRetries 2)", len(ms))
	}
	if d := at[1].Sub(start); d < 7*time.Hour || d > 7*time.Hour+2*time.Minute {
		t.Errorf("RetryAt(start+7h) delivered at start+%v", d)
	}
	if d := at[2].Sub(at[1]); d < 30*time.Minute || d > 32*time.Minute {
		t.Errorf("RetryAfter(30m) delivered after %v", d)
	}
	_, nat := rec.of("next")
	if d := nat[0].Sub(at[2]); d > 2*time.Minute {
		t.Errorf("the message out of retries was not dead-lettered at once: next came %v after", d)
	}
	dl := dlq.sent("%DLQ%grp")
	if len(dl) != 1 || dl[0].Properties[PropDeliveries] != "3" || !strings.Contains(dl[0].Properties[PropError], "the bank is closed") {
		t.Fatalf("dead letters %+v", dl)
	}
	// The error says what it asks, and unwraps to its cause.
	if err := RetryAfter(time.Second, cause); !errors.Is(err, cause) || !strings.Contains(err.Error(), "retry after 1s: the bank is closed") {
		t.Errorf("RetryAfter's error %q", err)
	}
	if err := RetryAt(time.Unix(0, 0).UTC()); errors.Unwrap(err) != nil || !strings.Contains(err.Error(), "retry at 1970-01-01T00:00:00Z") {
		t.Errorf("RetryAt's error %q", err)
	}
}

// addMsg appends m to its queue's log.
func (f *fakeBrokers) addMsg(m protocol.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := qkey{m.Topic, m.Queue}
	f.logs[k] = append(f.logs[k], m)
	close(f.changed)
	f.changed = make(chan struct{})
}

// release appends a retry as sent to its retry topic's queue 0, as the
// broker does when it is due.
func release(fb *fakeBrokers, dl deadLetter) {
	m := *dl.msg
	m.Queue = 0
	m.Schedule = protocol.Schedule{Kind: protocol.ScheduleReleased, At: dl.Schedule.At, Ref: 1}
	fb.addMsg(m)
}

// TestNonBlockingRetries: a failed message is stored as a delayed message
// due at its retry's time in %RETRY%group, with its origin, its
// deliveries and its error, and its queue moves on at once (the offset is
// committed past it); released from there it is handed as the original
// (topic, queue, offset, id, key, properties, stamp, times, deliveries
// restored; PropRetry set), stored again when it fails again, and
// dead-lettered (under its origin) once out of retries. The retry topic's
// offset is committed too.
func TestNonBlockingRetries(t *testing.T) {
	fb := newFakeBrokers()
	stored := time.Now().Add(-time.Minute).UnixMilli()
	for i, b := range []string{"a", "bad", "c"} {
		m := protocol.Message{ID: "id-" + b, Topic: "t", Queue: 0, Timestamp: stored - 5, Body: []byte(b), Tag: "tag-" + b,
			Producer:   protocol.ProducerStamp{ID: 42, Epoch: 1, Seq: int64(i)},
			Properties: []protocol.Property{{Key: "color", Value: "red"}, {Key: "key", Value: "k-" + b}}}
		if b == "bad" { // a delayed message, released into t
			m.Schedule = protocol.Schedule{Kind: protocol.ScheduleReleased, At: stored - 100, Ref: 9}
		}
		fb.addMsg(m)
	}
	co := newFakeCoord(map[string]int{"t": 1, "%RETRY%grp": 1})
	clk := clockwork.NewFakeClock()
	dlq := &fakeDLQ{}
	c := slowFake(t, fb, co, clk, NonBlockingRetries(), RetrySchedule(time.Hour, 2*time.Hour), MaxRetries(2), withDeadLetterer(dlq))
	if !slices.Equal(c.topics, []string{"%RETRY%grp", "t"}) {
		t.Fatalf("subscribed %v, want the retry topic too", c.topics)
	}
	rec := &calls{clk: clk}
	runIn(t, c, func(ctx context.Context, m *Message) error {
		if rec.add(m); string(m.Body) == "bad" {
			return fmt.Errorf("delivery %d failed", m.Deliveries)
		}
		return nil
	})
	// The queue does not wait for bad's retry: c comes with the clock
	// moved by milliseconds only.
	began := clk.Now()
	advanceUntil(t, clk, c, 20*time.Millisecond, "a, bad and c handled, offset 3 committed", func() bool { return rec.n() == 3 && co.offset("t", 0) == 3 })
	if d := clk.Since(began); d > 10*time.Second {
		t.Errorf("c came %v after bad failed", d)
	}
	retries := dlq.sent("%RETRY%grp")
	if len(retries) != 1 {
		t.Fatalf("%d retries stored, want 1", len(retries))
	}
	r := retries[0]
	want := map[string]string{"color": "red", PropRetryTopic: "t", PropRetryQueue: "0", PropRetryOffset: "1", PropRetryID: "id-bad",
		PropRetryStoreTime: r.Properties[PropRetryStoreTime], PropRetryProducer: "42", PropRetrySeq: "1", PropRetryDeliveries: "1",
		PropRetry: "delivery 1 failed", "key": "k-bad", PropRetryDueAt: fmt.Sprint(stored - 100),
		PropRetryReleasedAt: r.Properties[PropRetryReleasedAt], PropRetryHandle: fmt.Sprintf("g@9/%d", stored-100)}
	if !mapsEqual(r.Properties, want) || r.Properties[PropRetryStoreTime] == "" || r.Key != "k-bad" || string(r.Body) != "bad" || r.Tag != "tag-bad" {
		t.Errorf("retry %+v, want properties %v", r, want)
	}
	_, badAt := rec.of("bad")
	checkDue(t, r.Schedule, badAt[0].Add(time.Hour))
	if r.Timestamp != stored-5 || r.ID == "" || r.ID == "id-bad" {
		t.Errorf("retry's timestamp %d (want the original's %d), id %q (want its own)", r.Timestamp, stored-5, r.ID)
	}
	if s := c.Stats(); s.RetriesStored != 1 || s.HandlerErrors != 1 || s.Redeliveries != 0 {
		t.Errorf("stats %+v", s)
	}

	// The broker releases it: handed as the original.
	release(fb, r)
	advanceUntil(t, clk, c, 20*time.Millisecond, "bad's second delivery", func() bool { ms, _ := rec.of("bad"); return len(ms) == 2 })
	ms, badAt := rec.of("bad")
	first, again := ms[0], ms[1]
	if again.Topic != "t" || again.Queue != 0 || again.Offset != 1 || again.ID != "id-bad" || again.Key != "k-bad" || again.Tag != "tag-bad" ||
		again.ProducerID != 42 || again.Seq != 1 || again.Deliveries != 2 || !again.Timestamp.Equal(first.Timestamp) ||
		!again.StoreTime.Equal(first.StoreTime) || again.Recovered || !again.DueAt.Equal(time.UnixMilli(stored-100)) ||
		!again.ReleasedAt.Equal(first.ReleasedAt) || again.DelayedHandle != (protocol.Handle{Group: "g", Offset: 9, DueAt: stored - 100}) {
		t.Errorf("retry handed as %+v, want the original %+v with 2 deliveries", again, first)
	}
	if want := map[string]string{"color": "red", PropRetry: "delivery 1 failed"}; !mapsEqual(again.Properties, want) {
		t.Errorf("retry's properties %v, want %v", again.Properties, want)
	}
	advanceUntil(t, clk, c, 20*time.Millisecond, "a second retry", func() bool { return len(dlq.sent("%RETRY%grp")) == 2 })
	r2 := dlq.sent("%RETRY%grp")[1]
	if r2.Properties[PropRetryDeliveries] != "2" || r2.Properties[PropRetryOffset] != "1" || r2.Properties[PropRetryTopic] != "t" ||
		r2.Properties[PropRetry] != "delivery 2 failed" || r2.ID == r.ID {
		t.Errorf("second retry %+v", r2)
	}
	checkDue(t, r2.Schedule, badAt[1].Add(2*time.Hour))
	advanceUntil(t, clk, c, 20*time.Millisecond, "the retry topic's offset 1 committed", func() bool { return co.offset("%RETRY%grp", 0) == 1 })

	// Its third delivery fails too: out of retries, dead-lettered as the
	// original.
	release(fb, r2)
	advanceUntil(t, clk, c, 20*time.Millisecond, "the dead letter", func() bool { return len(dlq.sent("%DLQ%grp")) == 1 })
	dl := dlq.sent("%DLQ%grp")[0]
	if dl.Properties[PropOriginTopic] != "t" || dl.Properties[PropOriginOffset] != "1" || dl.Properties[PropOriginID] != "id-bad" ||
		dl.Properties[PropDeliveries] != "3" || dl.Properties[PropError] != "delivery 3 failed" || dl.Key != "k-bad" || dl.Tag != "tag-bad" || dl.Properties["color"] != "red" {
		t.Errorf("dead letter %+v", dl)
	}
	for k := range dl.Properties {
		if strings.HasPrefix(k, "RETRY_") {
			t.Errorf("the dead letter carries the retry's property %s", k)
		}
	}
	advanceUntil(t, clk, c, 20*time.Millisecond, "the retry topic's offset 2 committed", func() bool { return co.offset("%RETRY%grp", 0) == 2 })
	if n := len(dlq.sent("%RETRY%grp")); n != 2 {
		t.Errorf("%d retries stored, want 2", n)
	}
	if s := c.Stats(); s.RetriesStored != 2 || s.DeadLetters != 1 || s.Redeliveries != 2 || s.HandlerErrors != 3 {
		t.Errorf("stats %+v", s)
	}
}

// checkDue checks a retry's schedule: delayed, due at want (give or take
// the clock's steps while the handler returned).
func checkDue(t *testing.T, s protocol.Schedule, want time.Time) {
	t.Helper()
	if d := time.Duration(s.At-want.UnixMilli()) * time.Millisecond; s.Kind != protocol.ScheduleDelayed || s.Ref != -1 || d < 0 || d > time.Second {
		t.Errorf("retry's schedule %+v, want delayed, due at %d (ref -1)", s, want.UnixMilli())
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestNonBlockingRetryStoredOnce: a retry whose store fails (the retry
// topic's delay quota is full) is tried again with the same message (its
// id, and the stamp the sender gave it), its queue waiting meanwhile; one the broker refuses for good (a delay past
// its maximum) is dead-lettered with the refusal.
func TestNonBlockingRetryStoredOnce(t *testing.T) {
	fb := newFakeBrokers()
	fb.add("t", 0, "bad", "after", "far")
	co := newFakeCoord(map[string]int{"t": 1, "%RETRY%grp": 1})
	clk := clockwork.NewFakeClock()
	dlq := &fakeDLQ{}
	var failures int
	dlq.fail = func(m *protocol.Message) error {
		if m.Topic != "%RETRY%grp" {
			return nil
		}
		if string(m.Body) == "far" {
			return &protocol.Error{Status: protocol.StatusInvalid, Message: "delay over the maximum"}
		}
		if failures++; failures <= 2 {
			if m.Producer.ID == 0 {
				m.Producer = protocol.ProducerStamp{ID: 7, Seq: 3} // as the sender stamps it
			}
			return &protocol.Error{Status: protocol.StatusDelayQuota, Message: "quota full"}
		}
		return nil
	}
	c := slowFake(t, fb, co, clk, NonBlockingRetries(), RetrySchedule(time.Minute), withDeadLetterer(dlq))
	rec := &calls{clk: clk}
	runIn(t, c, func(ctx context.Context, m *Message) error {
		rec.add(m)
		switch string(m.Body) {
		case "bad":
			return errors.New("bad")
		case "far":
			return RetryAfter(100 * 24 * time.Hour)
		}
		return nil
	})
	tried := func() int {
		dlq.mu.Lock()
		defer dlq.mu.Unlock()
		return len(dlq.tries)
	}
	advanceUntil(t, clk, c, 10*time.Second, "two tries of the retry", func() bool { return tried() >= 2 })
	if n, _ := rec.of("after"); len(n) != 0 && len(dlq.sent("%RETRY%grp")) == 0 {
		t.Fatal("after was handled while bad's retry was not stored: the queue must wait for it")
	}
	advanceUntil(t, clk, c, 10*time.Second, "the retry stored", func() bool { return len(dlq.sent("%RETRY%grp")) == 1 })
	dlq.mu.Lock()
	tries := slices.Clone(dlq.tries)
	dlq.mu.Unlock()
	for _, tr := range tries[:3] {
		if tr.msg != tries[0].msg || tr.ID != tries[0].ID {
			t.Errorf("a try sent another message: %q, want %q (the first's)", tr.ID, tries[0].ID)
		}
	}
	if tries[2].msg.Producer.ID != 7 || tries[2].msg.Producer.Seq != 3 {
		t.Errorf("the stamp of an earlier try was not kept: %+v", tries[2].msg.Producer)
	}
	advanceUntil(t, clk, c, 20*time.Millisecond, "far dead-lettered", func() bool { return len(dlq.sent("%DLQ%grp")) == 1 })
	dl := dlq.sent("%DLQ%grp")[0]
	if string(dl.Body) != "far" || !strings.Contains(dl.Properties[PropError], "retry refused") ||
		!strings.Contains(dl.Properties[PropError], "delay over the maximum") {
		t.Errorf("dead letter %+v", dl)
	}
	advanceUntil(t, clk, c, 20*time.Millisecond, "offset 3 committed", func() bool { return co.offset("t", 0) == 3 })
}

// TestNonBlockingRetriesBatch: a failed batch stores a retry of each of its
// messages, all due at the time its RetryAt asks.
func TestNonBlockingRetriesBatch(t *testing.T) {
	fb := newFakeBrokers()
	fb.add("t", 0, "0", "1", "2", "3")
	co := newFakeCoord(map[string]int{"t": 1, "%RETRY%grp": 1})
	clk := clockwork.NewFakeClock()
	dlq := &fakeDLQ{}
	c := slowFake(t, fb, co, clk, NonBlockingRetries(), MaxPollRecords(4), withDeadLetterer(dlq))
	due := clk.Now().Add(90 * time.Minute)
	var once sync.Once
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.RunBatch(ctx, func(ctx context.Context, msgs []*Message) error {
			var err error
			once.Do(func() {
				if len(msgs) == 4 {
					err = RetryAt(due)
				}
			})
			return err
		})
	}()
	defer func() {
		cancel()
		<-done
	}()
	advanceUntil(t, clk, c, 20*time.Millisecond, "four retries", func() bool { return len(dlq.sent("%RETRY%grp")) == 4 })
	// Due at RetryAt's time in milliseconds, rounded up: never early.
	want := due.UnixMilli()
	if due.After(time.UnixMilli(want)) {
		want++
	}
	for i, r := range dlq.sent("%RETRY%grp") {
		if r.Schedule.At != want || r.Properties[PropRetryOffset] != fmt.Sprint(i) {
			t.Errorf("retry %d: %+v, want due at %d", i, r, want)
		}
	}
	advanceUntil(t, clk, c, 20*time.Millisecond, "offset 4 committed", func() bool { return co.offset("t", 0) == 4 })
}

// TestPollRefusesNonBlockingRetries: Poll has no retries, so it refuses
// the option with an error that says so.
func TestPollRefusesNonBlockingRetries(t *testing.T) {
	c := newFake(t, NonBlockingRetries())
	if _, err := c.Poll(context.Background()); err == nil || !strings.Contains(err.Error(), "Poll has no retries") {
		t.Fatalf("Poll: %v", err)
	}
}

// TestRetryTopicReadFromItsStart: the retry topic is read from its oldest
// message whatever StartFrom says, so a retry stored before the member
// took its queue is not skipped; the group's topics start as asked.
func TestRetryTopicReadFromItsStart(t *testing.T) {
	fb := newFakeBrokers()
	fb.add("t", 0, "old")
	fb.addMsg(protocol.Message{ID: "r1", Topic: "%RETRY%grp", Queue: 0, Timestamp: 1, Body: []byte("retried"),
		Schedule: protocol.Schedule{Kind: protocol.ScheduleReleased, At: 1, Ref: 0},
		Properties: []protocol.Property{{Key: PropRetryTopic, Value: "t"}, {Key: PropRetryQueue, Value: "0"},
			{Key: PropRetryOffset, Value: "0"}, {Key: PropRetryID, Value: "id-retried"}, {Key: PropRetryDeliveries, Value: "1"}}})
	co := newFakeCoord(map[string]int{"t": 1, "%RETRY%grp": 1})
	c := fakeConsumer(t, fb, co, 1, NonBlockingRetries(), StartFrom(Latest))
	rec := &calls{clk: clockwork.NewRealClock()}
	runIn(t, c, func(ctx context.Context, m *Message) error {
		rec.add(m)
		return nil
	})
	waitFor(t, 5*time.Second, "the retry handled, t's start committed", func() bool {
		return rec.n() == 1 && co.offset("%RETRY%grp", 0) == 1 && co.offset("t", 0) == 1
	})
	got, _ := rec.of("retried")
	if rec.n() != 1 || len(got) != 1 {
		t.Fatalf("handled %v: want the retry, and not t's message stored before the start", rec.got)
	}
	// Its original was not a delayed message: the retry's own release is
	// not shown as its.
	if m := got[0]; m.Topic != "t" || m.ID != "id-retried" || m.Deliveries != 2 || !m.DueAt.IsZero() || !m.ReleasedAt.IsZero() ||
		m.DelayedHandle != (protocol.Handle{}) {
		t.Errorf("the retry handed as %+v", m)
	}
}
