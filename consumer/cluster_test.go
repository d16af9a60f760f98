package consumer

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/sdk"
)

// cuttable is a coordinator that can be cut off, as a killed member's is.
type cuttable struct {
	inner coordinator
	cut   atomic.Bool
}

func (c *cuttable) ConsumerHeartbeat(ctx context.Context, hb api.ConsumerHeartbeat) (api.ConsumerHeartbeatReply, error) {
	if c.cut.Load() {
		return api.ConsumerHeartbeatReply{}, errFakeDown
	}
	return c.inner.ConsumerHeartbeat(ctx, hb)
}

func (c *cuttable) CommitOffsets(ctx context.Context, req api.CommitRequest) (api.CommitReply, error) {
	if c.cut.Load() {
		return api.CommitReply{}, errFakeDown
	}
	return c.inner.CommitOffsets(ctx, req)
}

// TestMemberKilled: a member that dies (no Close, no heartbeat) loses its
// queues within its session; the other member handles every message at
// least once.
func TestMemberKilled(t *testing.T) {
	forEachCoord(t, []string{"g1"}, func(t *testing.T, e *env) {
		e.cl.Meta.CreateTopic(t, "orders", "g1", "g1", "g1", "g1")
		topics := []string{"orders"}
		var inner coordinator = e.coord(t, "grp", topics)
		if !e.fake {
			inner = e.meta
		}
		cut := &cuttable{inner: inner}
		rec := newRecorder()
		a := e.consumer(t, "grp", topics, MemberID("a"), Session(time.Second), withCoordinator(cut))
		stopA := runIn(t, a, rec.handler("a"))
		b := e.consumer(t, "grp", topics, MemberID("b"), Session(time.Second))
		runIn(t, b, rec.handler("b"))
		waitFor(t, 10*time.Second, "two queues each", func() bool { return len(queuesOf(a)) == 2 && len(queuesOf(b)) == 2 })
		send(t, e, "orders", "m", 200)
		waitFor(t, 20*time.Second, "200 handled", func() bool { return rec.count() == 200 })

		// a dies: it handles nothing more and its heartbeats stop.
		stopA()
		cut.cut.Store(true)
		began := time.Now()
		send(t, e, "orders", "after", 100)
		waitFor(t, 5*time.Second, "b to hold every queue", func() bool { return len(queuesOf(b)) == 4 })
		t.Logf("b held every queue %v after a died (session 1 s)", time.Since(began))
		waitFor(t, 20*time.Second, "300 handled", func() bool { return rec.count() == 300 })
		waitFor(t, 3*time.Second, "a to drop its queues", func() bool { return len(queuesOf(a)) == 0 })
	})
}

// TestLongPollWakeUp: an idle consumer's PULL is held by the broker (it
// costs nothing while nothing comes), and a new message wakes it.
func TestLongPollWakeUp(t *testing.T) {
	e := startEnv(t, []string{"g1"}, false)
	e.cl.Meta.CreateTopic(t, "quiet", "g1")
	arrived := make(chan time.Time, 1)
	c := e.consumer(t, "grp", []string{"quiet"}, PollWait(30*time.Second))
	runIn(t, c, func(ctx context.Context, m *Message) error {
		arrived <- time.Now()
		return nil
	})
	master := e.cl.Master("g1")
	waitFor(t, 10*time.Second, "the broker to hold the idle queue's PULL", func() bool { return master.Stats().PullsParked.Load() == 1 })
	before := c.Stats().Fetches
	send(t, e, "quiet", "wake", 1)
	stored := time.Now()
	select {
	case at := <-arrived:
		t.Logf("handled %v after the send returned", at.Sub(stored))
	case <-time.After(10 * time.Second):
		t.Fatal("the message did not arrive")
	}
	// The parked PULL brought it: the consumer did not poll for it again
	// (a 30 s wait that ran out would take the test's whole budget).
	if n := c.Stats().Fetches - before; n > 1 {
		t.Errorf("%d PULLs between the send and the delivery; want the parked one to answer", n)
	}
}

// TestMembersClosingTogetherCommitEverything: members that close one after
// another each commit what they handled, although every leave starts a new
// generation (a member whose final commit is refused as stale takes the
// new generation and commits the queues it still holds), so a member that
// takes over later gets nothing again.
func TestMembersClosingTogetherCommitEverything(t *testing.T) {
	forEachCoord(t, []string{"g1", "g2"}, func(t *testing.T, e *env) {
		topics := []string{"orders"}
		e.cl.Meta.CreateTopic(t, "orders", "g1", "g2", "g1", "g2")
		rec := newRecorder()
		var members []*Consumer
		for _, id := range []string{"a", "b", "c"} {
			m := e.consumer(t, "closing", topics, MemberID(id), ManualCommit())
			runIn(t, m, rec.handler(id))
			members = append(members, m)
		}
		send(t, e, "orders", "m", 300)
		waitFor(t, 20*time.Second, "300 handled", func() bool { return rec.count() == 300 })
		for _, m := range members {
			if err := m.Close(); err != nil {
				t.Errorf("Close of %s: %v", m.MemberID(), err)
			}
		}
		route, err := e.meta.RouteExisting(context.Background(), "orders")
		if err != nil {
			t.Fatal(err)
		}
		var lagging []string
		for _, qr := range route.Queues {
			end := int64(len(testcluster.PullAll(t, testcluster.Dial(t, qr.Master), "orders", qr.Queue)))
			if got := e.committed(t, "closing", "orders", qr.Queue); got != end {
				lagging = append(lagging, fmt.Sprintf("queue %d committed %d of %d", qr.Queue, got, end))
			}
		}
		if len(lagging) > 0 {
			t.Fatalf("members that closed together left work uncommitted: %v", lagging)
		}
	})
}

// TestReadsFromSlave: with the master down, the queue is read from the
// group's slave.
func TestReadsFromSlave(t *testing.T) {
	cl := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1"}, Slaves: true, MetaEdit: testcluster.SteadyMeta, BrokerEdit: testcluster.SteadyBroker})
	e := &env{cl: cl, meta: cl.Meta.Client(t), fakes: map[string]*fakeCoord{}}
	e.cl.Meta.CreateTopic(t, "t", "g1")
	send(t, e, "t", "m", 20)
	g := cl.Groups["g1"]
	waitFor(t, 10*time.Second, "the slave to hold everything", func() bool {
		return len(testcluster.PullAll(t, testcluster.Dial(t, g.Slave.Addr()), "t", 0)) == 20
	})
	_ = g.Master.Close()
	rec := newRecorder()
	c := e.consumer(t, "grp", []string{"t"})
	runIn(t, c, rec.handler("c"))
	waitFor(t, 20*time.Second, "20 handled", func() bool { return rec.count() == 20 })
	if s := c.Stats(); s.FromSlave == 0 {
		t.Errorf("nothing read from the slave: %+v", s)
	}
}

// TestOffsetsSurviveMetaLeaderChange: offsets committed before the
// metaserver's leader stops are where the group resumes under the new one.
func TestOffsetsSurviveMetaLeaderChange(t *testing.T) {
	m := testcluster.StartMeta(t, 3, testcluster.SteadyMeta)
	testcluster.StartGroup(t, m.Addrs(), "g1", testcluster.GroupOpts{Edit: testcluster.SteadyBroker})
	m.CreateTopic(t, "t", "g1", "g1")
	meta := m.Client(t)
	if !metaHasGroups(t, meta) {
		t.Skip("the metaserver does not serve consumer groups yet")
	}
	e := &env{cl: &testcluster.Cluster{Meta: m}, meta: meta, fakes: map[string]*fakeCoord{}}
	newC := func() *Consumer {
		c, err := New("grp", []string{"t"}, sdk.MetaAddrs(m.Addrs()...), Heartbeat(100*time.Millisecond), Session(2*time.Second),
			AutoCommit(100*time.Millisecond), PollWait(200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	send(t, e, "t", "old", 60)
	rec := newRecorder()
	c1 := newC()
	stop := runIn(t, c1, rec.handler("c1"))
	waitFor(t, 20*time.Second, "60 handled", func() bool { return rec.count() == 60 })
	stop()
	if err := c1.Close(); err != nil {
		t.Fatal(err)
	}
	i, _ := m.Leader()
	m.Stop(i)
	m.Leader()
	send(t, e, "t", "new", 40)
	rec2 := newRecorder()
	c2 := newC()
	runIn(t, c2, rec2.handler("c2"))
	// Every queue got new messages, and a queue's messages come in offset
	// order: an old one handled again would have come before them.
	waitFor(t, 20*time.Second, "40 new handled", func() bool { return rec2.count() == 40 })
	rec2.mu.Lock()
	defer rec2.mu.Unlock()
	for body := range rec2.seen {
		if !strings.HasPrefix(body, "new") {
			t.Errorf("handled %q again after the leader change", body)
		}
	}
}
