package broker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// Interleavings a review found (each failed before its fix).

func modelRepl(log masterLog, clock *clockwork.FakeClock) *replication {
	return newReplication(log, replConfig{HighWait: time.Hour, FetchBytes: 1 << 20, FetchWait: 50 * time.Millisecond,
		SlaveLagTime: time.Second}, &Stats{}, clock, hclog.NewNullLogger(), nil)
}

func ackFrom(r *replication, id string, end int64) {
	rep := make(chanReplier, 1)
	r.handleAck(rep, protocol.AppendHAAck(nil, &protocol.HAAck{Acked: end, Epoch: testEpoch, BrokerID: id}))
	<-rep
}

// proposalDone waits until r's proposal in flight (if any) has ended.
func proposalDone(t interface{ Fatalf(string, ...any) }, r *replication) {
	r.mu.Lock()
	p := r.proposal
	r.mu.Unlock()
	if p == nil {
		return
	}
	select {
	case <-p:
	case <-time.After(5 * time.Second):
		t.Fatalf("a proposal did not end")
	}
}

// A master that begins to serve (a restart in its epoch, or a promotion)
// has confirmed nothing yet, but the HIGH messages answered before it
// began are in its log: a slave joins the set only once it holds all of
// the log the master began with, not on its first acknowledgement.
func TestNewMasterAddsOnlyASlaveHoldingItsLog(t *testing.T) {
	clock := clockwork.NewFakeClock()
	log := &modelLog{}
	log.append(1000) // answered before the restart, held by s1
	reg := newMemRegistry(testEpoch, "s1")
	reg.g.Slaves = append(reg.g.Slaves, routing.Broker{ID: "s2", Addr: "s2"})
	r := modelRepl(log, clock)
	r.alter = reg.alter
	r.setGroup(reg.group(), testMaster)
	ackFrom(r, "s2", 10)
	r.step(context.Background())
	proposalDone(t, r)
	if g := reg.group(); len(g.InSync) != 1 {
		t.Fatalf("s2, holding 10 of the 1000 bytes the master began with, was added: %v", g.InSync)
	}
	ackFrom(r, "s2", 1000)
	r.step(context.Background())
	proposalDone(t, r)
	if g := reg.group(); len(g.InSync) != 2 {
		t.Fatalf("s2, holding the whole log, was not added: %v", g.InSync)
	}
}

// Under a quorum, a member whose removal is on its way does not count: a
// message is answered only on k-1 copies of the members that stay.
func TestQuorumDoesNotCountALeavingMember(t *testing.T) {
	clock := clockwork.NewFakeClock()
	log := &modelLog{}
	reg := newMemRegistry(testEpoch, "A", "B", "C")
	reg.g.AckQuorum = 3
	sr := &slowRegistry{mem: reg, pending: make(chan proposal, 1)}
	r := modelRepl(log, clock)
	r.alter = sr.alter
	r.setGroup(reg.group(), testMaster)
	log.append(90)
	ackFrom(r, "A", 90)
	ackFrom(r, "B", 90)
	ackFrom(r, "C", 80)
	clock.Advance(3 * time.Second)
	r.mu.Lock()
	r.slaves["C"].caughtUpAt = clock.Now().Add(-3 * time.Second)
	r.slaves["A"].caughtUpAt = clock.Now()
	r.slaves["B"].caughtUpAt = clock.Now()
	r.mu.Unlock()
	r.step(context.Background())
	p := <-sr.pending // C's removal, in flight
	end := log.append(60)
	st := make(chan protocol.Status, 1)
	r.await(end, func(s protocol.Status) { st <- s })
	ackFrom(r, "A", 150)
	ackFrom(r, "C", 150)
	g, _ := reg.alter(context.Background(), p.req)
	p.done <- g
	proposalDone(t, r)
	select {
	case s := <-st:
		t.Fatalf("answered %v at %d on copies of the master, A and the leaving C; B holds 90", s, end)
	default:
	}
	ackFrom(r, "B", 150)
	if s := <-st; s != protocol.StatusOK {
		t.Fatalf("with A and B holding it: %v", s)
	}
}

// An addition whose answer is lost may have been taken: the master goes on
// waiting for the slave until a later group says what the set is.
func TestLostAnswerKeepsTheAdditionWaitedFor(t *testing.T) {
	clock := clockwork.NewFakeClock()
	log := &modelLog{}
	reg := newMemRegistry(testEpoch, "s1")
	reg.g.Slaves = append(reg.g.Slaves, routing.Broker{ID: "s2", Addr: "s2"})
	r := modelRepl(log, clock)
	r.alter = func(ctx context.Context, req api.AlterSyncSetRequest) (routing.Group, error) {
		_, _ = reg.alter(ctx, req)
		return routing.Group{}, errors.New("the answer was lost")
	}
	r.setGroup(reg.group(), testMaster)
	log.append(100)
	ackFrom(r, "s1", 100)
	ackFrom(r, "s2", 100)
	r.step(context.Background())
	proposalDone(t, r)
	if len(reg.group().InSync) != 2 {
		t.Fatalf("the registry did not take the addition: %v", reg.group().InSync)
	}
	end := log.append(50)
	st := make(chan protocol.Status, 1)
	r.await(end, func(s protocol.Status) { st <- s })
	ackFrom(r, "s1", 150)
	select {
	case s := <-st:
		t.Fatalf("answered %v at %d while the committed member s2 holds 100", s, end)
	default:
	}
	r.setGroup(reg.group(), testMaster) // a heartbeat brings the set: s2 is a member
	ackFrom(r, "s2", 150)
	if s := <-st; s != protocol.StatusOK {
		t.Fatalf("once both hold it: %v", s)
	}
}
