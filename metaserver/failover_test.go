package metaserver

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/routing"
)

// Failover decisions on a moved clock: the judge, an FSM, no raft.

const tMargin = 200 * time.Millisecond

// newFailoverRig is a judge rig with master g1-master and slave g1-slave
// registered, and edit (if not nil) applied to its config.
func newFailoverRig(t *testing.T, edit func(*Config)) *judgeRig {
	t.Helper()
	r := newJudgeRigWith(t, func(c *Config) {
		c.FailoverMargin = tMargin
		if edit != nil {
			edit(c)
		}
	})
	r.register("g1", routing.RoleMaster)
	r.register("g1", routing.RoleSlave)
	return r
}

func slaveHB(group string, logEnd, masterEnd int64) api.Heartbeat {
	return api.Heartbeat{Group: group, Role: routing.RoleSlave, BrokerID: group + "-slave", Addr: group + "-slave:1",
		LogEnd: logEnd, MasterEnd: masterEnd, Epoch: 1}
}

func masterHB(group string, logEnd, ack int64) api.Heartbeat {
	hb := master(group)
	hb.LogEnd, hb.SlaveAckOffset, hb.SlaveConnected, hb.LagBytes = logEnd, ack, true, logEnd-ack
	return hb
}

// lose lets the master fall silent after a last report, the slave still
// heartbeating every interval with slave, until d has passed.
func (r *judgeRig) lose(d time.Duration, slave api.Heartbeat) {
	for passed := time.Duration(0); passed < d; passed += tInterval {
		r.clk.Advance(tInterval)
		r.j.heartbeat(slave, r.clk.Now())
		r.j.round(context.Background())
	}
}

func TestFailoverPromotesOnlyAfterSessionAndMargin(t *testing.T) {
	r := newFailoverRig(t, nil)
	r.heartbeat(masterHB("g1", 5000, 4000))
	r.heartbeat(slaveHB("g1", 4500, 5000))
	before := r.group("g1")
	if before.Epoch != 1 || len(before.History) != 1 || before.History[0].Master != "g1-master" {
		t.Fatalf("a new group: epoch %d, history %+v", before.Epoch, before.History)
	}

	r.lose(tSession+tMargin, slaveHB("g1", 4500, 5000))
	if g := r.group("g1"); g.Master.ID != "g1-master" || g.Epoch != 1 {
		t.Fatalf("promoted at session + margin, not after it: %+v", g)
	}
	r.wantReasons("g1", routing.HeartbeatLost, "silent for the session and the margin")
	if gi := r.j.info(r.group("g1"), r.clk.Now()); gi.Failover == "" {
		t.Fatal("no word on why the slave is not promoted yet")
	}

	r.lose(tInterval, slaveHB("g1", 4500, 5000))
	g := r.group("g1")
	if g.Master.ID != "g1-slave" || g.Slave.ID != "" || g.Epoch != 2 || !g.Writable() {
		t.Fatalf("after session + margin + an interval: %+v", g)
	}
	if h := g.History; len(h) != 2 || h[1] != (routing.EpochRecord{Epoch: 2, Master: "g1-slave", Start: 4500, At: r.clk.Now().UnixMilli()}) {
		t.Fatalf("history %+v", h)
	}
	fs := &r.j.failovers
	if fs.promotions.Load() != 1 || fs.lostBytes.Load() != 500 {
		t.Fatalf("promotions %d, lost %d bytes; want 1 and 500 (master end 5000, slave end 4500)", fs.promotions.Load(), fs.lostBytes.Load())
	}

	// The new master has its own session: its heartbeats keep the group
	// writable, and the old master, back, is told it is the slave.
	r.heartbeat(api.Heartbeat{Group: "g1", Role: routing.RoleMaster, BrokerID: "g1-slave", Addr: "g1-slave:1", LogEnd: 4500})
	if _, _, err := r.group("g1").TruncationPoint(1); !errors.Is(err, routing.ErrStartPending) {
		t.Fatalf("before the new master confirmed where epoch 2 began, the old master may cut: %v", err)
	}
	// The new master's heartbeat carries its start (Server.epochWord).
	r.mustApply(&fsm.FixEpochStart{Group: "g1", Epoch: 2, Master: "g1-slave", Start: 4500})
	r.after(tSession)
	r.wantReasons("g1", 0, "the new master heartbeating")
	r.mustApply(registerCmd("g1", routing.RoleMaster, "g1-master", r.clk.Now()))
	if g := r.group("g1"); g.Master.ID != "g1-slave" || g.Slave.ID != "g1-master" || g.Epoch != 2 {
		t.Fatalf("the old master came back preferring master: %+v", g)
	}
	if off, cut, err := r.group("g1").TruncationPoint(1); err != nil || !cut || off != 4500 {
		t.Fatalf("the old master, who led epoch 1, cuts at %d (cut %v, %v), want 4500", off, cut, err)
	}
}

func TestFailoverRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		edit   func(*Config)
		master api.Heartbeat
		slave  api.Heartbeat
		admin  bool
		silent bool // the slave stops heartbeating too
		reason string
	}{
		{name: "failover off", edit: func(c *Config) { c.DisableFailover = true },
			master: masterHB("g1", 100, 100), slave: slaveHB("g1", 100, 100), reason: refuseOff},
		{name: "slave dead", master: masterHB("g1", 100, 100), slave: slaveHB("g1", 100, 100), silent: true, reason: refuseSlaveOut},
		{name: "slave lacks acknowledged HIGH", master: masterHB("g1", 3000, 2000), slave: slaveHB("g1", 1500, 2000), reason: refuseHigh},
		{name: "slave too far behind", master: masterHB("g1", 3<<20, 0), slave: slaveHB("g1", 0, 3<<20), reason: refuseLoss},
		{name: "no loss allowed", edit: func(c *Config) { c.FailoverMaxLoss = NoLoss },
			master: masterHB("g1", 1001, 1000), slave: slaveHB("g1", 1000, 1001), reason: refuseLoss},
		{name: "slave behind by its own report", master: masterHB("g1", 1000, 1000), slave: slaveHB("g1", 1000, 3<<20), reason: refuseLoss},
		{name: "admin", master: masterHB("g1", 100, 100), slave: slaveHB("g1", 100, 100), admin: true, reason: refuseAdmin},
		{name: "slave broken", master: masterHB("g1", 100, 100), reason: refuseBroken,
			slave: func() api.Heartbeat { hb := slaveHB("g1", 100, 100); hb.Broken = "its log is not a prefix"; return hb }()},
		{name: "slave not in the epoch", master: masterHB("g1", 100, 100), reason: refuseEpoch,
			slave: func() api.Heartbeat { hb := slaveHB("g1", 100, 100); hb.Epoch = 0; return hb }()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newFailoverRig(t, tc.edit)
			if tc.admin {
				r.mustApply(setAdmin("g1"))
			}
			r.heartbeat(tc.master)
			r.heartbeat(tc.slave)
			if tc.silent {
				r.after(3 * tSession)
			} else {
				r.lose(3*tSession, tc.slave)
			}
			g := r.group("g1")
			if g.Master.ID != "g1-master" || g.Epoch != 1 || g.Reasons&routing.HeartbeatLost == 0 {
				t.Fatalf("promoted or writable: %+v", g)
			}
			if n := r.j.failovers.refused[tc.reason]; n != 1 {
				t.Fatalf("refusals %v, want one %q", r.j.failovers.refused, tc.reason)
			}
			if gi := r.j.info(g, r.clk.Now()); gi.Failover == "" {
				t.Fatal("ferryctl brokers would not say why")
			}
		})
	}
}

// Promotions back and forth keep a history of who led from where, and a
// broker that led an epoch the history forgot cannot tell where to cut.
func TestFailoverEpochHistory(t *testing.T) {
	r := newFailoverRig(t, nil)
	end := int64(0)
	for i := range routing.MaxEpochHistory + 2 {
		end += 100
		g := r.group("g1")
		mhb := masterHB("g1", end, end)
		mhb.BrokerID, mhb.Addr = g.Master.ID, g.Master.ID+":1"
		shb := slaveHB("g1", end, end)
		shb.BrokerID, shb.Addr, shb.Epoch = g.Slave.ID, g.Slave.ID+":1", g.Epoch
		r.heartbeat(mhb)
		r.heartbeat(shb)
		r.lose(tSession+tMargin+tInterval, shb)
		g = r.group("g1")
		if g.Epoch != uint32(i+2) || g.Master.ID != shb.BrokerID {
			t.Fatalf("promotion %d: %+v", i+1, g)
		}
		r.mustApply(&fsm.FixEpochStart{Group: "g1", Epoch: g.Epoch, Master: g.Master.ID, Start: end})
		// The old master comes back and registers as the slave.
		r.mustApply(registerCmd("g1", routing.RoleMaster, mhb.BrokerID, r.clk.Now()))
	}
	g := r.group("g1")
	if len(g.History) != routing.MaxEpochHistory || g.History[len(g.History)-1].Epoch != g.Epoch {
		t.Fatalf("history of %d, last %+v, epoch %d", len(g.History), g.History[len(g.History)-1], g.Epoch)
	}
	for i := 1; i < len(g.History); i++ {
		if h, p := g.History[i], g.History[i-1]; h.Epoch != p.Epoch+1 || h.Start < p.Start || h.Master == p.Master {
			t.Fatalf("history out of order at %d: %+v after %+v", i, h, p)
		}
	}
	if _, _, err := g.TruncationPoint(1); err == nil {
		t.Fatal("a broker that led epoch 1, long forgotten, was given a cut point")
	}
}

func registerCmd(group string, role routing.Role, id string, now time.Time) *fsm.RegisterBroker {
	return &fsm.RegisterBroker{Group: group, Role: role, Broker: routing.Broker{ID: id, Addr: id + ":1"}, At: now.UnixMilli()}
}

func setAdmin(group string) *fsm.SetGroupReasons {
	return &fsm.SetGroupReasons{Group: group, Set: routing.Admin}
}

// A master heartbeating between the judge's decision to promote its slave
// and the promotion's commit (back from a pause just then) is answered
// only after the commit, so it never hears that it still leads the old
// epoch; a second promotion of the same group is not attempted meanwhile.
// RecoverHeartbeats 1 and a margin shorter than a round are the settings
// under which such a heartbeat would otherwise be told "master, writable".
func TestHeartbeatDuringPromotionWaitsForIt(t *testing.T) {
	r := newFailoverRig(t, func(c *Config) { c.RecoverHeartbeats = 1; c.FailoverMargin = tInterval / 2 })
	hold, entered := make(chan struct{}), make(chan struct{})
	var promotes atomic.Int32
	r.j.apply = func(ctx context.Context, c fsm.Command) (*fsm.Result, error) {
		if _, ok := c.(*fsm.Promote); ok {
			promotes.Add(1)
			close(entered)
			<-hold
		}
		return r.apply(ctx, c)
	}
	r.heartbeat(masterHB("g1", 100, 100))
	r.heartbeat(slaveHB("g1", 100, 100))
	r.clk.Advance(tSession)
	r.j.heartbeat(slaveHB("g1", 100, 100), r.clk.Now())
	r.clk.Advance(tInterval)
	r.j.heartbeat(slaveHB("g1", 100, 100), r.clk.Now())
	round := make(chan struct{})
	go func() {
		defer close(round)
		r.j.round(context.Background())
	}()
	<-entered
	if r.j.maybePromote(context.Background(), r.group("g1"), r.clk.Now()) {
		t.Fatal("a second promotion started while the first was applied")
	}

	// The old master is back now.
	wait := r.j.heartbeat(masterHB("g1", 100, 100), r.clk.Now())
	if wait == nil {
		t.Fatal("a heartbeat during a promotion may be answered before it commits")
	}
	select {
	case <-wait:
		t.Fatal("the wait ended before the promotion was applied")
	default:
	}
	close(hold)
	<-wait
	<-round
	if g := r.group("g1"); g.Master.ID != "g1-slave" || g.Epoch != 2 {
		t.Fatalf("after the promotion: %+v", g)
	}
	if role, _ := r.group("g1").RoleOf("g1-master"); role == routing.RoleMaster {
		t.Fatal("the old master would be answered as the master")
	}
	if n := promotes.Load(); n != 1 {
		t.Fatalf("%d promotions applied, want 1", n)
	}
	if r.j.heartbeat(masterHB("g1", 100, 100), r.clk.Now()) != nil {
		t.Fatal("heartbeats still wait after the promotion")
	}
}
