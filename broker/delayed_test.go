package broker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"

	tc "github.com/ferrymq/ferrymq/internal/testcluster"
)

// delayedMsg is a delayed message of topic/queue due at due.
func delayedMsg(topic string, queue uint32, rel protocol.Reliability, body string, due time.Time) protocol.Message {
	m := tc.Msg(topic, queue, rel, body)
	m.Schedule = protocol.Schedule{Kind: protocol.ScheduleDelayed, At: due.UnixMilli(), Ref: -1}
	return m
}

// released reads the released copies a queue holds (the probe and other
// ordinary messages skipped).
func released(t *testing.T, c *transport.Client, topic string, queue uint32) []protocol.StoredMessage {
	t.Helper()
	var out []protocol.StoredMessage
	for _, m := range tc.PullAll(t, c, topic, queue) {
		if m.Message.Schedule.Kind == protocol.ScheduleReleased {
			out = append(out, m)
		}
	}
	return out
}

// callDelayed makes a delayed-message request and decodes its JSON answer
// into out, zeroed first.
func callDelayed[T any](t *testing.T, c *transport.Client, code protocol.Code, req any, out *T) error {
	t.Helper()
	*out = *new(T)
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Call(context.Background(), code, body)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(resp.Body, out); err != nil {
		t.Fatalf("%v answer %q: %v", code, resp.Body, err)
	}
	return nil
}

// Delayed messages are stored pending and each is released into its target
// queue once, never before its time, earliest first (by due time, then by
// the order they were stored: one key's messages due at the same time keep
// their order); a time in the past is due at once. The released copy says
// when it was due and which pending record it came from, and the slave
// holds the same copies.
func TestDelayedReleasedOnceAtItsTime(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true})
	meta.CreateTopic(t, "later", "g1", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "later", 0, 1)

	now := time.Now()
	var batch []protocol.Message
	for i := range 120 {
		due := now.Add(time.Duration(50+(i%6)*60) * time.Millisecond) // six due times, 20 messages each
		rel := protocol.Normal
		if i%3 == 0 {
			rel = protocol.High
		}
		batch = append(batch, delayedMsg("later", uint32(i%2), rel, fmt.Sprintf("m%03d", i), due))
	}
	batch = append(batch, delayedMsg("later", 0, protocol.Normal, "past", now.Add(-time.Hour)))
	res := tc.Send(t, c, batch)
	handles := map[int64]protocol.Message{}
	for i, r := range res {
		if r.Status != protocol.StatusOK {
			t.Fatalf("delayed message %d: %v", i, r.Status)
		}
		handles[r.LogOffset] = batch[i]
	}
	testwait.For(t, 10*time.Second, "every delayed message to be released", func() bool {
		return len(released(t, c, "later", 0))+len(released(t, c, "later", 1)) == len(batch)
	})
	seen := map[string]bool{}
	for q := range uint32(2) {
		got := released(t, c, "later", q)
		for i, m := range got {
			orig, ok := handles[m.Message.Schedule.Ref]
			if !ok || orig.ID != m.Message.ID || string(orig.Body) != string(m.Message.Body) || orig.Reliability != m.Message.Reliability {
				t.Fatalf("queue %d: released %+v names pending record %d, which holds %+v", q, m.Message, m.Message.Schedule.Ref, orig)
			}
			if seen[m.Message.ID] {
				t.Fatalf("message %s released twice", m.Message.ID)
			}
			seen[m.Message.ID] = true
			if m.Message.Schedule.At != orig.Schedule.At || m.StoreTime < orig.Schedule.At {
				t.Fatalf("message %s due at %d released at %d (says due %d): early", m.Message.ID, orig.Schedule.At, m.StoreTime, m.Message.Schedule.At)
			}
			if i > 0 {
				prev := got[i-1].Message.Schedule
				if prev.At > m.Message.Schedule.At || prev.At == m.Message.Schedule.At && prev.Ref > m.Message.Schedule.Ref {
					t.Fatalf("queue %d: released out of order: %+v before %+v", q, prev, m.Message.Schedule)
				}
			}
		}
	}
	if n := g.Master.Stats().DelayedFired.Load(); n != int64(len(batch)) {
		t.Fatalf("%d released, want %d", n, len(batch))
	}
	sc := tc.Dial(t, g.Slave.Addr())
	testwait.For(t, 10*time.Second, "the slave to hold the released copies", func() bool {
		return len(released(t, sc, "later", 0)) == len(released(t, c, "later", 0)) && len(released(t, sc, "later", 1)) == len(released(t, c, "later", 1))
	})
	// A lookup says where a message went.
	var st protocol.DelayedState
	if err := callDelayed(t, c, protocol.CodeDelayedState, protocol.DelayedRef{Offset: res[7].LogOffset}, &st); err != nil {
		t.Fatal(err)
	}
	if st.State != protocol.DelayReleased || st.Released == nil || st.ID != batch[7].ID || st.Released.QueueOffset < 1 {
		t.Fatalf("state of a released message: %+v", st)
	}
	got := tc.Pull(t, c, "later", batch[7].Queue, st.Released.QueueOffset, 1<<20).Messages[0]
	if got.Message.ID != batch[7].ID || got.LogOffset != st.Released.LogOffset {
		t.Fatalf("the lookup's queue offset %d holds %+v", st.Released.QueueOffset, got)
	}
}

// A cancel wins or loses against the release, and its answer says which:
// a pending message cancelled is never released; a released one answers
// where it went.
func TestDelayedCancel(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{})
	meta.CreateTopic(t, "later", "g1", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "later", 0)

	far := delayedMsg("later", 0, protocol.Normal, "far", time.Now().Add(time.Hour))
	soon := delayedMsg("later", 0, protocol.Normal, "soon", time.Now().Add(30*time.Millisecond))
	res := tc.Send(t, c, []protocol.Message{far, soon})
	var st protocol.DelayedState
	if err := callDelayed(t, c, protocol.CodeDelayedCancel, protocol.DelayedRef{Offset: res[0].LogOffset}, &st); err != nil {
		t.Fatal(err)
	}
	if st.State != protocol.DelayCancelled || st.By != "cancel" || st.ID != far.ID {
		t.Fatalf("cancel of a pending message: %+v", st)
	}
	if err := callDelayed(t, c, protocol.CodeDelayedCancel, protocol.DelayedRef{Offset: res[0].LogOffset}, &st); err != nil {
		t.Fatal(err)
	}
	if st.State != protocol.DelayCancelled || st.By != "" {
		t.Fatalf("a second cancel: %+v, want cancelled before", st)
	}
	testwait.For(t, 10*time.Second, "the other message to be released", func() bool { return len(released(t, c, "later", 0)) == 1 })
	if err := callDelayed(t, c, protocol.CodeDelayedCancel, protocol.DelayedRef{Offset: res[1].LogOffset}, &st); err != nil {
		t.Fatal(err)
	}
	if st.State != protocol.DelayReleased || st.Released == nil {
		t.Fatalf("cancel of a released message: %+v", st)
	}
	var list protocol.DelayedList
	if err := callDelayed(t, c, protocol.CodeDelayedList, protocol.DelayedListRequest{}, &list); err != nil {
		t.Fatal(err)
	}
	if list.Pending != 0 || list.NextDue != 0 {
		t.Fatalf("after the cancel and the release: %+v", list)
	}
	if got := released(t, c, "later", 0); got[0].Message.ID != soon.ID {
		t.Fatalf("released %+v, want only %s", got, soon.ID)
	}
	// A cancel naming something that is not a pending record.
	for _, off := range []int64{res[0].LogOffset + 1, g.Master.Store().EndOffset() + 100, -1} {
		err := callDelayed(t, c, protocol.CodeDelayedCancel, protocol.DelayedRef{Offset: off}, &st)
		var pe *protocol.Error
		if !errors.As(err, &pe) || (pe.Status != protocol.StatusNotFound && pe.Status != protocol.StatusInvalid) {
			t.Fatalf("cancel at %d: %v, want NOT_FOUND", off, err)
		}
	}
}

// A delay beyond the maximum is refused INVALID, never clamped; a topic
// over its quota of pending messages gets DELAY_QUOTA, and nothing of a
// refused message is stored.
func TestDelayedRefusals(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Edit: func(c *broker.Config) { c.MaxDelay = time.Hour; c.DelayQuota = 3 }})
	meta.CreateTopic(t, "later", "g1", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "later", 0)

	if r := tc.Send(t, c, []protocol.Message{delayedMsg("later", 0, protocol.Normal, "x", time.Now().Add(2*time.Hour))}); r[0].Status != protocol.StatusInvalid {
		t.Fatalf("beyond the maximum delay: %v, want INVALID", r[0].Status)
	}
	for i := range 3 {
		if r := tc.Send(t, c, []protocol.Message{delayedMsg("later", 0, protocol.Normal, "x", time.Now().Add(30*time.Minute))}); r[0].Status != protocol.StatusOK {
			t.Fatalf("delayed message %d: %v", i, r[0].Status)
		}
	}
	testwait.For(t, 5*time.Second, "the index to count 3 pending", func() bool {
		var list protocol.DelayedList
		return callDelayed(t, c, protocol.CodeDelayedList, protocol.DelayedListRequest{Topic: "later"}, &list) == nil && list.Pending == 3
	})
	end := g.Master.Store().EndOffset()
	if r := tc.Send(t, c, []protocol.Message{delayedMsg("later", 0, protocol.Normal, "x", time.Now().Add(time.Minute))}); r[0].Status != protocol.StatusDelayQuota {
		t.Fatalf("over the quota: %v, want DELAY_QUOTA", r[0].Status)
	}
	if g.Master.Store().EndOffset() != end {
		t.Fatal("a refused delayed message was stored")
	}
	// An ordinary message to the same queue is not held by the quota.
	if r := tc.Send(t, c, []protocol.Message{tc.Msg("later", 0, protocol.Normal, "now")}); r[0].Status != protocol.StatusOK {
		t.Fatalf("an ordinary message: %v", r[0].Status)
	}
}

// A broker killed between the two records of a release (its copy is the
// log's last record, its mark missing) marks the release when it takes
// over again and never releases the message a second time.
func TestDelayedReleaseWithoutItsMark(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{})
	meta.CreateTopic(t, "later", "g1", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "later", 0)
	m := delayedMsg("later", 0, protocol.Normal, "once", time.Now().Add(2*time.Second))
	res := tc.Send(t, c, []protocol.Message{m})
	if res[0].Status != protocol.StatusOK {
		t.Fatal(res[0].Status)
	}
	cfg := g.Config(routing.RoleMaster)
	if err := g.Master.Close(); err != nil {
		t.Fatal(err)
	}
	// What the firer's append would have left had the broker died after
	// its first record: the released copy alone.
	l, err := storage.Open(storage.Config{Dir: cfg.Dir, ProducerStamp: func(p []byte) (storage.ProducerStamp, bool) {
		ps, ok := protocol.PeekProducerStamp(p)
		return storage.ProducerStamp(ps), ok
	}})
	if err != nil {
		t.Fatal(err)
	}
	cp := m
	cp.Producer = protocol.ProducerStamp{}
	cp.Schedule = protocol.Schedule{Kind: protocol.ScheduleReleased, At: m.Schedule.At, Ref: res[0].LogOffset}
	pos, err := l.Append([]storage.Entry{{Topic: "later", Queue: 0, Payload: protocol.AppendMessage(nil, &cp)}}, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	b := tc.StartBroker(t, cfg)
	testwait.For(t, 10*time.Second, "the broker to take over again", b.Writable)
	c = tc.Dial(t, b.Addr())
	var st protocol.DelayedState
	testwait.For(t, 10*time.Second, "the release to be marked", func() bool {
		return callDelayed(t, c, protocol.CodeDelayedState, protocol.DelayedRef{Offset: res[0].LogOffset}, &st) == nil && st.State == protocol.DelayReleased
	})
	if st.Released.LogOffset != pos[0].LogOffset {
		t.Fatalf("released at %d, want the copy at %d", st.Released.LogOffset, pos[0].LogOffset)
	}
	// A message due after it is released: by then it was not released a
	// second time.
	releasedAfterProbe(t, c, "later", 0, time.UnixMilli(m.Schedule.At+1))
	if n := timesReleased(t, c, "later", 0, m.ID); n != 1 {
		t.Fatalf("message released %d times, want once", n)
	}
}

// After a failover, the new master releases what is due exactly once:
// what the old master released (and its slave copied) is not released
// again, and the rest is.
func TestDelayedAcrossFailover(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true})
	meta.CreateTopic(t, "later", "g1", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "later", 0)
	now := time.Now()
	var batch []protocol.Message
	for i := range 40 {
		due := now.Add(50 * time.Millisecond) // the first half
		if i >= 20 {
			due = now.Add(3 * time.Second) // after the failover
		}
		batch = append(batch, delayedMsg("later", 0, protocol.High, fmt.Sprintf("m%d", i), due))
	}
	for i, r := range tc.Send(t, c, batch) {
		if r.Status != protocol.StatusOK {
			t.Fatalf("message %d: %v", i, r.Status)
		}
	}
	testwait.For(t, 10*time.Second, "the first half to be released", func() bool { return len(released(t, c, "later", 0)) == 20 })
	end := g.Master.Store().EndOffset()
	testwait.For(t, 10*time.Second, "the slave to copy the releases", func() bool { return g.Slave.Store().EndOffset() == end })
	_ = g.Master.Close()
	testwait.For(t, 20*time.Second, "the slave to take over", func() bool { return g.Slave.Writable() })
	sc := tc.Dial(t, g.Slave.Addr())
	testwait.For(t, 20*time.Second, "the second half to be released", func() bool { return len(released(t, sc, "later", 0)) >= 40 })
	ids := map[string]int{}
	for _, m := range released(t, sc, "later", 0) {
		ids[m.Message.ID]++
	}
	for _, m := range batch {
		if ids[m.ID] != 1 {
			t.Fatalf("message %s released %d times, want once", m.ID, ids[m.ID])
		}
	}
	if len(ids) != len(batch) || slices.ContainsFunc(released(t, sc, "later", 0), func(m protocol.StoredMessage) bool { return m.StoreTime < m.Message.Schedule.At }) {
		t.Fatalf("released %v", ids)
	}
}

// A delayed message is cancelled only by a principal that may send to its
// topic, and looked up by them or by describe: a producer of another topic
// is refused, naming the request.
func TestDelayedCancelNeedsItsTopic(t *testing.T) {
	ac := startAuthCluster(t)
	if _, err := ac.admin.CreateTopic(context.Background(), api.CreateTopicRequest{Name: "orders", Queues: 1, IfMissing: true}); err != nil {
		t.Fatal(err)
	}
	prod := ac.dial(t, ac.addPrincipal(t, "prod", "produce:orders"))
	other := ac.dial(t, ac.addPrincipal(t, "other", "produce:payments"))
	var res []protocol.SendResult
	testwait.For(t, 10*time.Second, "the broker to take prod's delayed message", func() bool {
		res = tc.Send(t, prod.data, []protocol.Message{delayedMsg("orders", 0, protocol.Normal, "x", time.Now().Add(time.Hour))})
		return res[0].Status == protocol.StatusOK
	})
	ref := protocol.DelayedRef{Offset: res[0].LogOffset}
	var st protocol.DelayedState
	for _, code := range []protocol.Code{protocol.CodeDelayedState, protocol.CodeDelayedCancel} {
		if err := callDelayed(t, other.data, code, ref, &st); !refusedFor(err, "other") || !strings.Contains(err.Error(), code.String()) {
			t.Fatalf("%v of an orders message by a producer of payments: %v, want NOT_AUTHORIZED", code, err)
		}
	}
	if err := callDelayed(t, prod.data, protocol.CodeDelayedCancel, ref, &st); err != nil || st.State != protocol.DelayCancelled {
		t.Fatalf("cancel by its producer: %+v %v", st, err)
	}
}
