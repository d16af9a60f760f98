package metaserver

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testlog"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// Failover in groups of several slaves: the judge, an FSM, no raft.

// newGroupRig is a failover rig whose group g1 has master g1-master and
// the slaves named (the first registered, the others joined), with the
// sync set set to inSync by the master.
func newGroupRig(t *testing.T, edit func(*Config), slaves []string, inSync ...string) *judgeRig {
	t.Helper()
	r := newJudgeRigWith(t, func(c *Config) {
		c.FailoverMargin = tMargin
		if edit != nil {
			edit(c)
		}
	})
	r.register("g1", routing.RoleMaster)
	for i, id := range slaves {
		b := routing.Broker{ID: id, Addr: id + ":1"}
		if i == 0 {
			r.mustApply(&fsm.RegisterBroker{Group: "g1", Role: routing.RoleSlave, Broker: b})
		} else {
			r.mustApply(&fsm.JoinSlave{Group: "g1", Broker: b})
		}
	}
	if len(inSync) > 0 {
		r.alter(inSync...)
	}
	return r
}

// alter is g1's master setting its sync set.
func (r *judgeRig) alter(inSync ...string) {
	r.t.Helper()
	g := r.group("g1")
	r.mustApply(&fsm.AlterSyncSet{Group: "g1", Epoch: g.Epoch, Master: g.Master.ID, ExpectVersion: g.SyncVersion, InSync: inSync})
}

// slaveOf is a heartbeat of g1's slave id in epoch 1.
func slaveOf(id string, logEnd, masterEnd int64) api.Heartbeat {
	return api.Heartbeat{Group: "g1", Role: routing.RoleSlave, BrokerID: id, Addr: id + ":1", LogEnd: logEnd, MasterEnd: masterEnd, Epoch: 1}
}

// masterAcked is g1's master reporting its log end and what every HIGH
// message it answered ends at or below.
func masterAcked(logEnd, highAcked int64, replicas ...api.ReplicaStatus) api.Heartbeat {
	hb := master("g1")
	hb.LogEnd, hb.HighAcked, hb.Replicas = logEnd, highAcked, replicas
	return hb
}

// loseAll lets the master fall silent, the slaves heartbeating every
// interval, until d has passed.
func (r *judgeRig) loseAll(d time.Duration, slaves ...api.Heartbeat) {
	for passed := time.Duration(0); passed < d; passed += tInterval {
		r.clk.Advance(tInterval)
		for _, hb := range slaves {
			r.j.heartbeat(hb, r.clk.Now())
		}
		r.j.round(context.Background())
	}
}

// lost is the master silent past the session and the margin: the group is
// judged a round after every broker's heartbeat.
func (r *judgeRig) lostPastMargin(slaves ...api.Heartbeat) {
	r.loseAll(tSession+tMargin+tInterval, slaves...)
}

func (r *judgeRig) wantMaster(id string, epoch uint32) routing.Group {
	r.t.Helper()
	g := r.group("g1")
	if g.Master.ID != id || g.Epoch != epoch {
		gi := r.j.info(g, r.clk.Now())
		r.t.Fatalf("master %s at epoch %d, want %s at %d (failover word: %q)", g.Master.ID, g.Epoch, id, epoch, gi.Failover)
	}
	return g
}

// The set member with the largest log end is promoted; the others stay
// slaves (the set's other members stay in it), and the new master's log
// starts where the promoted slave's ended.
func TestFailoverPromotesTheMostCaughtUp(t *testing.T) {
	r := newGroupRig(t, nil, []string{"s1", "s2", "s3"}, "s1", "s2", "s3")
	r.heartbeat(masterAcked(1000, 800))
	s1, s2, s3 := slaveOf("s1", 900, 1000), slaveOf("s2", 1000, 1000), slaveOf("s3", 800, 1000)
	r.lostPastMargin(s1, s2, s3)
	g := r.wantMaster("s2", 2)
	if ids := slaveIDs(g); strings.Join(ids, ",") != "s1,s3" || strings.Join(g.InSync, ",") != "s1,s3" {
		t.Fatalf("after promoting s2: slaves %v, set %v", ids, g.InSync)
	}
	if h := g.History[1]; h.Start != 1000 || h.Master != "s2" {
		t.Fatalf("epoch 2 starts %+v, want at s2's log end 1000", h)
	}
	if gi := r.j.info(g, r.clk.Now()); !strings.HasPrefix(gi.Failover, "promoted s2 over g1-master at epoch 2") {
		t.Fatalf("failover word %q", gi.Failover)
	}
	// The other slaves' heartbeats stay with the new master's session: no
	// heartbeat-lost for them, and the new master's session starts now.
	r.heartbeat(api.Heartbeat{Group: "g1", Role: routing.RoleMaster, BrokerID: "s2", Addr: "s2:1", LogEnd: 1000, Epoch: 2})
	if gi := r.j.info(r.group("g1"), r.clk.Now()); len(gi.Members) != 4 || !gi.Members[1].Alive || !gi.Members[2].Alive ||
		gi.Members[3].Role != api.RoleFormerMaster {
		t.Fatalf("members after the promotion: %+v", gi.Members)
	}
}

// Equal log ends: the lowest id is promoted, whatever the order the
// slaves joined in.
func TestFailoverTieGoesToTheLowestID(t *testing.T) {
	r := newGroupRig(t, nil, []string{"sb", "sa"}, "sb", "sa")
	r.heartbeat(masterAcked(500, 500))
	r.lostPastMargin(slaveOf("sb", 500, 500), slaveOf("sa", 500, 500))
	r.wantMaster("sa", 2)
}

// A slave outside a non-empty sync set is never promoted, however far it
// got: it may lack a HIGH message the master answered. With the set's only
// member dead the group stays read-only, and the word names each slave
// and why.
func TestFailoverOnlyFromTheSyncSet(t *testing.T) {
	r := newGroupRig(t, nil, []string{"s1", "s2"}, "s1")
	r.heartbeat(masterAcked(1000, 600))
	r.lostPastMargin(slaveOf("s1", 700, 1000), slaveOf("s2", 1000, 1000))
	r.wantMaster("s1", 2)

	r = newGroupRig(t, nil, []string{"s1", "s2"}, "s1")
	r.heartbeat(masterAcked(1000, 600))
	r.heartbeat(slaveOf("s1", 700, 1000)) // and then nothing from s1
	r.loseAll(3*tSession, slaveOf("s2", 1000, 1000))
	g := r.wantMaster("g1-master", 1)
	if g.Reasons&routing.HeartbeatLost == 0 {
		t.Fatalf("reasons %q", g.Reasons)
	}
	word := r.j.info(g, r.clk.Now()).Failover
	for _, want := range []string{"s1 has not heartbeated within a session", "s2 is not in the sync set"} {
		if !strings.Contains(word, want) {
			t.Fatalf("failover word %q does not say %q", word, want)
		}
	}
	if n := r.j.failovers.refused[refuseMixed]; n != 1 {
		t.Fatalf("refusals %v, want one %q", r.j.failovers.refused, refuseMixed)
	}
}

// A slave that left the sync set while it fell below the group's minimum
// is eligible (no HIGH message was answered after it left): with the
// set's only member dead, it is promoted; a slave that never was in the set
// is not, however far it got.
func TestFailoverPromotesAnEligibleMember(t *testing.T) {
	r := newGroupRig(t, nil, []string{"s1", "s2", "s3"}, "s1", "s2")
	r.mustApply(&fsm.SetGroupPolicy{Group: "g1", MinInSync: 3})
	r.alter("s1") // s2 leaves: two copies, below three
	if g := r.group("g1"); strings.Join(g.Eligible, ",") != "s2" {
		t.Fatalf("eligible %v, want s2", g.Eligible)
	}
	r.heartbeat(masterAcked(1000, 600))
	r.heartbeat(slaveOf("s1", 700, 1000)) // and then nothing from s1
	r.loseAll(tSession+tMargin+2*tInterval, slaveOf("s2", 800, 1000), slaveOf("s3", 1000, 1000))
	r.wantMaster("s2", 2)
}

// With an empty sync set (a group whose master has not added anyone, as a
// group of one slave before sync sets) any live slave in the epoch is a
// candidate: the most caught-up.
func TestFailoverWithAnEmptySetTakesAnySlave(t *testing.T) {
	r := newGroupRig(t, nil, []string{"s1", "s2"})
	r.heartbeat(masterAcked(1000, 0))
	r.lostPastMargin(slaveOf("s1", 900, 1000), slaveOf("s2", 950, 1000))
	r.wantMaster("s2", 2)
}

// A member below what the master last reported acknowledged (HighAcked,
// or its own AckOffset among the Replicas) is not promoted: HIGH messages
// would be lost. The next member is, if it holds them.
func TestFailoverRefusesASlaveBelowTheAcknowledged(t *testing.T) {
	for _, tc := range []struct {
		name   string
		master api.Heartbeat
		want   string // promoted, "" for none
	}{
		{"both hold HighAcked", masterAcked(1000, 970), "s1"},
		{"both below HighAcked", masterAcked(1000, 990), ""},
		{"below its own ack", masterAcked(1000, 0, api.ReplicaStatus{ID: "s1", AckOffset: 1000, InSync: true},
			api.ReplicaStatus{ID: "s2", AckOffset: 960, InSync: true}), "s2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// s1 has the larger log end: it would be chosen if eligible.
			r := newGroupRig(t, nil, []string{"s1", "s2"}, "s1", "s2")
			r.heartbeat(tc.master)
			r.lostPastMargin(slaveOf("s1", 980, 1000), slaveOf("s2", 970, 1000))
			if tc.want != "" {
				r.wantMaster(tc.want, 2)
				return
			}
			g := r.wantMaster("g1-master", 1)
			word := r.j.info(g, r.clk.Now()).Failover
			if !strings.Contains(word, "s1 holds 980 bytes, below the acknowledged 990") || !strings.Contains(word, "s2 holds 970 bytes") {
				t.Fatalf("failover word %q", word)
			}
			if n := r.j.failovers.refused[refuseHigh]; n != 1 {
				t.Fatalf("refusals %v, want one %q", r.j.failovers.refused, refuseHigh)
			}
		})
	}
}

// With an ack quorum of k copies and n members, a message answered is on
// k-1 members: the leader promotes only once n-k+2 members are heard,
// alive and in the epoch, and then the most caught-up of them.
func TestFailoverQuorumHearsEnoughMembers(t *testing.T) {
	for _, tc := range []struct {
		quorum int
		heard  int // members heard, of s1..s3
		ok     bool
	}{
		{quorum: 2, heard: 2, ok: false}, // 3-2+2 = 3 needed
		{quorum: 2, heard: 3, ok: true},
		{quorum: 3, heard: 1, ok: false}, // 3-3+2 = 2 needed
		{quorum: 3, heard: 2, ok: true},
		{quorum: 4, heard: 1, ok: true}, // every member has every message: one is enough
		{quorum: 0, heard: 1, ok: true},
	} {
		r := newGroupRig(t, nil, []string{"s1", "s2", "s3"}, "s1", "s2", "s3")
		r.mustApply(&fsm.SetGroupPolicy{Group: "g1", AckQuorum: tc.quorum})
		r.heartbeat(masterAcked(1000, 500))
		all := []api.Heartbeat{slaveOf("s1", 600, 1000), slaveOf("s2", 700, 1000), slaveOf("s3", 800, 1000)}
		heard := all[:tc.heard]
		r.lostPastMargin(heard...)
		g := r.group("g1")
		promoted := g.Epoch == 2
		if promoted != tc.ok {
			t.Fatalf("quorum %d, %d of 3 members heard: promoted %v, want %v (%q)", tc.quorum, tc.heard, promoted, tc.ok,
				r.j.info(g, r.clk.Now()).Failover)
		}
		if want := heard[len(heard)-1].BrokerID; promoted && g.Master.ID != want {
			t.Fatalf("quorum %d: promoted %s, want the most caught-up heard, %s", tc.quorum, g.Master.ID, want)
		}
		if !promoted && r.j.failovers.refused[refuseQuorum] != 1 {
			t.Fatalf("quorum %d: refusals %v", tc.quorum, r.j.failovers.refused)
		}
	}
}

// A slave of an earlier epoch, or broken, does not count toward the
// quorum: it may hold records the others do not.
func TestFailoverQuorumCountsOnlyMembersInTheEpoch(t *testing.T) {
	r := newGroupRig(t, nil, []string{"s1", "s2", "s3"}, "s1", "s2", "s3")
	r.mustApply(&fsm.SetGroupPolicy{Group: "g1", AckQuorum: 2})
	r.heartbeat(masterAcked(1000, 500))
	old := slaveOf("s3", 900, 1000)
	old.Epoch = 0
	broken := slaveOf("s2", 800, 1000)
	broken.Broken = "its log is not a prefix"
	r.lostPastMargin(slaveOf("s1", 600, 1000), broken, old)
	r.wantMaster("g1-master", 1)
}

// A third broker's heartbeat joins its group as a slave (the registry's
// two places are taken), and its heartbeats count for the judge: a
// failover may promote it once it is in the set.
func TestJudgeHearsEverySlave(t *testing.T) {
	r := newGroupRig(t, nil, []string{"s1", "s2"}, "s2")
	r.heartbeat(masterAcked(100, 100))
	broken := slaveOf("s1", 100, 100)
	broken.Broken = "its log is not a prefix"
	r.heartbeat(broken)
	r.heartbeat(slaveOf("s2", 100, 100))
	gi := r.j.info(r.group("g1"), r.clk.Now())
	if len(gi.Members) != 3 || gi.Members[1].ID != "s1" || gi.Members[2].ID != "s2" || !gi.Members[2].InSync || gi.Members[1].InSync {
		t.Fatalf("members %+v", gi.Members)
	}
	if gi.Members[1].Broken != broken.Broken || gi.Members[2].Broken != "" {
		t.Fatalf("each slave's own word: %+v", gi.Members)
	}
	// Slave is the set's first member: the one-slave fields follow it.
	if gi.Slave.ID != "s2" || gi.LastSlave.BrokerID != "s2" {
		t.Fatalf("mirror slave %q, last slave heartbeat of %q", gi.Slave.ID, gi.LastSlave.BrokerID)
	}
}

// The master's last report of each slave shows in the members: in-set,
// acknowledged end and lag.
func TestMembersShowTheMastersReport(t *testing.T) {
	r := newGroupRig(t, nil, []string{"s1", "s2"}, "s1")
	r.heartbeat(masterAcked(1000, 900,
		api.ReplicaStatus{ID: "s1", Connected: true, AckOffset: 1000, InSync: true},
		api.ReplicaStatus{ID: "s2", Connected: true, AckOffset: 400, LagBytes: 600, LagMillis: 7000}))
	gi := r.j.info(r.group("g1"), r.clk.Now())
	s1, s2 := gi.Members[1], gi.Members[2]
	if !s1.InSync || !s1.Reported || s1.AckOffset != 1000 || s1.LagBytes != 0 {
		t.Fatalf("s1: %+v", s1)
	}
	if s2.InSync || !s2.Reported || s2.AckOffset != 400 || s2.LagBytes != 600 || s2.LagMillis != 7000 {
		t.Fatalf("s2: %+v", s2)
	}
	// Promotable now, were the master lost: s1 once heard holding what the
	// master acknowledged; s2 never (outside the set).
	if s1.Eligible || s1.IneligibleReason != refuseSlaveOut || s2.Eligible || s2.IneligibleReason != refuseNotInSet {
		t.Fatalf("before the slaves' heartbeats: s1 %+v, s2 %+v", s1, s2)
	}
	r.heartbeat(slaveOf("s1", 950, 1000))
	if s1 := r.j.info(r.group("g1"), r.clk.Now()).Members[1]; s1.Eligible || s1.IneligibleReason != refuseHigh {
		t.Fatalf("s1 below its acknowledged 1000: %+v", s1)
	}
	r.heartbeat(slaveOf("s1", 1000, 1000))
	if s1 := r.j.info(r.group("g1"), r.clk.Now()).Members[1]; !s1.Eligible || s1.NotEligible != "" {
		t.Fatalf("s1 caught up: %+v", s1)
	}
}

// An ALTER_SYNC_SET that comes in while the judge applies a promotion of
// the group is answered once the promotion is done, refused (the epoch
// moved), and the set stays as the promotion left it. (That it waits
// rather than racing the promotion is not shown here: without the wait the
// test's own Promote usually wins the race too.)
func TestAlterSyncSetWaitsForAPromotion(t *testing.T) {
	cfg := Config{ID: "m1", Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0",
		RaftHeartbeatTimeout: 150 * time.Millisecond, RaftElectionTimeout: 150 * time.Millisecond,
		RaftLeaderLeaseTimeout: 150 * time.Millisecond, Logger: testlog.New("m1"), RaftSecret: testRaftSecret}
	s := startNodes(t, cfg)[0]
	testwait.For(t, 20*time.Second, "the node to lead", s.IsLeader)
	ctx := context.Background()
	for _, c := range []fsm.Command{
		&fsm.RegisterBroker{Group: "g1", Role: routing.RoleMaster, Broker: routing.Broker{ID: "m", Addr: "m:1"}},
		&fsm.RegisterBroker{Group: "g1", Role: routing.RoleSlave, Broker: routing.Broker{ID: "s1", Addr: "s1:1"}},
		&fsm.JoinSlave{Group: "g1", Broker: routing.Broker{ID: "s2", Addr: "s2:1"}},
	} {
		if _, err := s.apply(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	g, _ := s.fsm.Group("g1")

	// The judge is promoting s1 (as maybePromote marks it).
	done := make(chan struct{})
	s.judge.mu.Lock()
	s.judge.sessionLocked("g1").promoting = done
	s.judge.mu.Unlock()
	answered := make(chan error, 1)
	go func() {
		_, err := s.alterSyncSet(ctx, api.AlterSyncSetRequest{Group: "g1", Epoch: g.Epoch, Master: "m", ExpectVersion: g.SyncVersion,
			InSync: []string{"s2"}})
		answered <- err
	}()
	if _, err := s.apply(ctx, &fsm.Promote{Group: "g1", Epoch: g.Epoch, Master: "m", Slave: "s1", Start: 0}); err != nil {
		t.Fatal(err)
	}
	s.judge.mu.Lock()
	s.judge.sessionLocked("g1").promoting = nil
	s.judge.mu.Unlock()
	close(done)
	if err := <-answered; !errors.Is(err, protocol.ErrConflict) {
		t.Fatalf("a set change during a promotion: %v, want CONFLICT after it", err)
	}
	if g, _ := s.fsm.Group("g1"); g.Master.ID != "s1" || len(g.InSync) != 0 {
		t.Fatalf("after the promotion: %+v", g)
	}
}

// A slave's heartbeat reply names where its reads stop: the lowest
// acknowledgement among the sync set's members in the master's last report
// of this epoch; while there is no such report, or it lacks a member (it
// was built before the member joined), the last end told in this epoch
// (where the epoch began before any): reads never go back; no limit with an
// empty set.
func TestReadableEndIsTheSetsLowestAck(t *testing.T) {
	r := newGroupRig(t, nil, []string{"s1", "s2", "s3"}, "s1", "s2")
	if end := r.j.readableEnd(r.group("g1")); end == nil || *end != 0 {
		t.Fatalf("no master report yet: %v, want the epoch's start 0", end)
	}
	r.heartbeat(inEpoch1(masterAcked(1000, 300,
		api.ReplicaStatus{ID: "s1", AckOffset: 500, InSync: true},
		api.ReplicaStatus{ID: "s2", AckOffset: 300, InSync: true},
		api.ReplicaStatus{ID: "s3", AckOffset: 100})))
	if end := r.j.readableEnd(r.group("g1")); end == nil || *end != 300 {
		t.Fatalf("readable end %v, want 300 (s2's, the lowest of the set; s3 is not in it)", end)
	}
	r.heartbeat(inEpoch1(masterAcked(1000, 300, api.ReplicaStatus{ID: "s1", AckOffset: 500, InSync: true})))
	if end := r.j.readableEnd(r.group("g1")); end == nil || *end != 300 {
		t.Fatalf("a report without s2: %v, want 300, the end told before", end)
	}
	r.alter()
	r.heartbeat(inEpoch1(masterAcked(1000, 300, api.ReplicaStatus{ID: "s1", AckOffset: 500})))
	if end := r.j.readableEnd(r.group("g1")); end != nil {
		t.Fatalf("an empty set: %d, want no limit", *end)
	}
}

func inEpoch1(hb api.Heartbeat) api.Heartbeat {
	hb.Epoch = 1
	return hb
}
