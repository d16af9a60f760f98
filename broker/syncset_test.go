package broker

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

// syncGroup is a master's replication over slaves that the test moves by
// hand: each "slave" acknowledges what the test says, by id, as a fetch
// or an HA_ACK from that broker would.
type syncGroup struct {
	log   *storage.Log
	repl  *replication
	reg   *memRegistry
	clock *clockwork.FakeClock
}

func newSyncGroup(t *testing.T, slaves ...string) *syncGroup {
	g := &syncGroup{log: openLog(t), clock: clockwork.NewFakeClock(), reg: newMemRegistry(testEpoch, slaves...)}
	g.repl = newReplication(g.log, replConfig{HighWait: time.Minute, FetchBytes: 64 << 10, FetchWait: 50 * time.Millisecond,
		SlaveLagTime: 2 * time.Second}, &Stats{}, g.clock, hclog.NewNullLogger(), nil)
	g.repl.alter = g.reg.alter
	g.repl.setGroup(g.reg.group(), testMaster)
	return g
}

func (g *syncGroup) append(t *testing.T, n int) []storage.Position {
	t.Helper()
	entries := make([]storage.Entry, n)
	for i := range entries {
		entries[i] = storage.Entry{Topic: "t", Queue: 0, Payload: []byte("m")}
	}
	pos, err := g.log.Append(entries, false)
	if err != nil {
		t.Fatal(err)
	}
	return pos
}

// ack is an HA_ACK from slave id that it has appended up to end.
func (g *syncGroup) ack(t *testing.T, id string, end int64) {
	t.Helper()
	rep := make(chanReplier, 1)
	g.repl.handleAck(rep, protocol.AppendHAAck(nil, &protocol.HAAck{Acked: end, Epoch: testEpoch, BrokerID: id}))
	if a := <-rep; a.err != nil {
		t.Fatalf("ack from %s: %v", id, a.err)
	}
}

// fetch is a fetch from slave id whose log ends at end (nothing new: it is
// answered at once, empty, since its wait is 0).
func (g *syncGroup) fetch(t *testing.T, id string, end int64) {
	t.Helper()
	rep := make(chanReplier, 1)
	g.repl.handleFetch(rep, protocol.AppendHAFetchRequest(nil, &protocol.HAFetchRequest{Offset: end, Acked: end, MaxBytes: 1 << 20,
		Epoch: testEpoch, BrokerID: id}))
	g.clock.Advance(time.Millisecond)
	g.repl.step(context.Background())
	if a := <-rep; a.err != nil {
		t.Fatalf("fetch from %s: %v", id, a.err)
	}
}

// waits registers HIGH messages at pos, outcomes on the channel.
func (g *syncGroup) waits(pos []storage.Position) <-chan protocol.Status {
	done := make(chan protocol.Status, len(pos))
	for _, p := range pos {
		g.repl.await(p.End, func(st protocol.Status) { done <- st })
	}
	return done
}

// stepUntil runs the replication loop's step until cond holds.
func (g *syncGroup) stepUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.For(t, 5*time.Second, what, func() bool {
		g.repl.step(context.Background())
		return cond()
	})
}

// A HIGH message is answered only once every member of the sync set holds
// it, counted per broker however it acknowledges (a fetch's Acked or an
// HA_ACK), not once any slave does: RocketMQ's HA wait counted connections,
// so one slave acknowledging twice passed for two.
func TestHighWaitsForEveryMember(t *testing.T) {
	g := newSyncGroup(t, "s1", "s2")
	pos := g.append(t, 3)
	end := pos[2].End
	done := g.waits(pos)
	g.ack(t, "s1", end)
	g.fetch(t, "s1", end) // the same slave again, by another way
	expectNone(t, done, "one of two members acknowledged")
	g.ack(t, "s2", pos[0].End)
	expectAll(t, done, 1, protocol.StatusOK)
	expectNone(t, done, "the second member holds only the first message")
	g.ack(t, "s2", end)
	expectAll(t, done, 2, protocol.StatusOK)
	if got := g.repl.highAcked(); got != end {
		t.Fatalf("HighAcked %d, want %d", got, end)
	}
}

// With a quorum of two copies (the master's and one slave's), a HIGH
// message is answered once any member of the committed set holds it.
func TestHighQuorumAnswersOnTheFirstMember(t *testing.T) {
	g := newSyncGroup(t, "s1", "s2")
	g.repl.setGroup(g.reg.set(func(gr *routing.Group) { gr.AckQuorum = 2 }), testMaster)
	pos := g.append(t, 1)
	done := g.waits(pos)
	expectNone(t, done, "no member acknowledged")
	g.ack(t, "s2", pos[0].End)
	expectAll(t, done, 1, protocol.StatusOK)
}

// A member not caught up for the lag time leaves the sync set; while its
// removal is on its way the master still waits for it, and once the
// registry committed it, HIGH messages wait only for the others. A slave
// that has caught up and holds what is confirmed joins again.
func TestLaggingMemberLeavesAndComesBack(t *testing.T) {
	g := newSyncGroup(t, "s1", "s2")
	g.fetch(t, "s1", 0)
	g.fetch(t, "s2", 0)
	pos := g.append(t, 2)
	done := g.waits(pos[:1])
	g.ack(t, "s1", pos[1].End)
	expectNone(t, done, "s2 has not acknowledged and is still in the set")

	g.clock.Advance(2*time.Second + time.Millisecond) // s2 not caught up for longer than the lag time
	g.fetch(t, "s1", pos[1].End)                      // s1 keeps up
	g.stepUntil(t, "s2 to leave the set", func() bool { return slices.Equal(g.reg.inSync(), []string{"s1"}) })
	testwait.For(t, 5*time.Second, "the master to take the committed set", func() bool {
		g.repl.mu.Lock()
		defer g.repl.mu.Unlock()
		return slices.Equal(g.repl.set, []string{"s1"})
	})
	expectAll(t, done, 1, protocol.StatusOK)
	more := g.waits(g.append(t, 1))
	end := g.log.EndOffset()
	g.ack(t, "s1", end)
	expectAll(t, more, 1, protocol.StatusOK)

	g.ack(t, "s2", end) // caught up, and holds what is confirmed
	g.stepUntil(t, "s2 to join again", func() bool { return slices.Equal(g.reg.inSync(), []string{"s1", "s2"}) })
	if s := g.reg.altered; len(s) != 2 {
		t.Fatalf("the registry took %v, want one removal and one addition", s)
	}
}

// With a minimum of three copies, a set of two members that loses one is
// below it: the HIGH messages waiting are answered
// NOT_ENOUGH_REPLICAS_AFTER_APPEND at once, and later ones are refused
// before they are stored, until the member is back.
func TestBelowMinInSyncRefusesHigh(t *testing.T) {
	g := newSyncGroup(t, "s1", "s2")
	g.repl.setGroup(g.reg.set(func(gr *routing.Group) { gr.MinInSync = 3 }), testMaster)
	if g.repl.refusesHigh() {
		t.Fatal("a set of two slaves and the master holds three copies")
	}
	g.fetch(t, "s1", 0)
	done := g.waits(g.append(t, 1))
	g.clock.Advance(2*time.Second + time.Millisecond)
	g.fetch(t, "s1", g.log.EndOffset())
	g.stepUntil(t, "s2 to leave the set", func() bool { return g.repl.refusesHigh() })
	expectAll(t, done, 1, protocol.StatusNotEnoughReplicasAfterAppend)
	late := g.waits(g.append(t, 1))
	expectAll(t, late, 1, protocol.StatusNotEnoughReplicasAfterAppend)

	g.ack(t, "s2", g.log.EndOffset())
	g.stepUntil(t, "s2 to join again", func() bool { return !g.repl.refusesHigh() })
}

// A slave that fetches from below what it acknowledged lost acknowledged
// bytes (its machine lost power): it no longer counts as holding them,
// leaves the set, and HIGH messages are not answered on its word meanwhile.
func TestMemberThatLostBytesLeavesTheSet(t *testing.T) {
	g := newSyncGroup(t, "s1", "s2")
	pos := g.append(t, 2)
	g.ack(t, "s1", pos[1].End)
	g.ack(t, "s2", pos[1].End)
	done := g.waits(g.append(t, 1))
	g.ack(t, "s1", g.log.EndOffset())
	// s2 restarts with only the first message.
	rep := make(chanReplier, 1)
	g.repl.handleFetch(rep, protocol.AppendHAFetchRequest(nil, &protocol.HAFetchRequest{Offset: pos[0].End, Acked: pos[0].End,
		MaxBytes: 1 << 20, Epoch: testEpoch, BrokerID: "s2"}))
	if a := <-rep; a.err != nil {
		t.Fatal(a.err)
	}
	if st := g.repl.replicas(); st[1].AckOffset != pos[0].End {
		t.Fatalf("s2 after it lost bytes: %+v", st[1])
	}
	g.stepUntil(t, "s2 to leave the set", func() bool { return slices.Equal(g.reg.inSync(), []string{"s1"}) })
	expectAll(t, done, 1, protocol.StatusOK)
}

// A slave the registry does not name is refused, and its acknowledgements
// count for nothing; one it names later is served.
func TestOnlyTheRegistrysSlavesAreServed(t *testing.T) {
	g := newSyncGroup(t, "s1")
	rep := make(chanReplier, 1)
	g.repl.handleAck(rep, protocol.AppendHAAck(nil, &protocol.HAAck{Acked: 0, Epoch: testEpoch, BrokerID: "s3"}))
	if a := <-rep; !errors.Is(a.err, protocol.ErrNotAuthorized) {
		t.Fatalf("an unknown slave's ack: %v", a.err)
	}
	g.repl.setGroup(g.reg.set(func(gr *routing.Group) {
		gr.Slaves = append(gr.Slaves, routing.Broker{ID: "s3", Addr: "s3"})
	}), testMaster)
	g.ack(t, "s3", 0)
}
