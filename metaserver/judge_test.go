package metaserver

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/testlog"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/routing"
)

// The judge on its own: a fake clock, an FSM applied to directly, no raft,
// no network. Every step is synchronous, so the tests are deterministic.

const (
	tSession  = time.Second
	tInterval = 100 * time.Millisecond
	tLagTime  = 500 * time.Millisecond
	tLagBytes = 1 << 20
	tRecover  = 3
)

type judgeRig struct {
	t     *testing.T
	clk   *clockwork.FakeClock
	f     *fsm.FSM
	j     *judge
	index atomic.Uint64
}

func newJudgeRig(t *testing.T) *judgeRig {
	t.Helper()
	return newJudgeRigWith(t, nil)
}

// newJudgeRigWith is newJudgeRig with edit (if not nil) applied to the config.
func newJudgeRigWith(t *testing.T, edit func(*Config)) *judgeRig {
	t.Helper()
	r := &judgeRig{t: t, clk: clockwork.NewFakeClockAt(time.Unix(1_800_000_000, 0)), f: fsm.New()}
	cfg := Config{SessionTimeout: tSession, JudgeInterval: tInterval, LagTime: tLagTime, LagBytes: tLagBytes,
		RecoverHeartbeats: tRecover, Clock: r.clk, Logger: testlog.New("judge")}
	if edit != nil {
		edit(&cfg)
	}
	cfg = cfg.withDefaults()
	r.j = &judge{}
	r.j.init(cfg, r.f, r.apply, cfg.Logger)
	r.j.begin()
	return r
}

// apply commits a command straight to the FSM, as raft would.
func (r *judgeRig) apply(_ context.Context, c fsm.Command) (*fsm.Result, error) {
	b, err := fsm.Encode(c)
	if err != nil {
		return nil, err
	}
	switch res := r.f.Apply(&raft.Log{Type: raft.LogCommand, Data: b, Index: r.index.Add(1)}).(type) {
	case error:
		return nil, res
	case *fsm.Result:
		return res, nil
	default:
		return &fsm.Result{}, nil
	}
}

func (r *judgeRig) mustApply(c fsm.Command) {
	r.t.Helper()
	if _, err := r.apply(context.Background(), c); err != nil {
		r.t.Fatalf("%T: %v", c, err)
	}
}

// register adds a broker of role to group, as the heartbeat handler does.
func (r *judgeRig) register(group string, role routing.Role) {
	r.t.Helper()
	id := group + "-" + string(role)
	r.mustApply(&fsm.RegisterBroker{Group: group, Role: role, Broker: routing.Broker{ID: id, Addr: id + ":1"}, At: r.clk.Now().UnixMilli()})
}

// heartbeat is what the heartbeat handler does: record, then judge the group.
func (r *judgeRig) heartbeat(hb api.Heartbeat) routing.Group {
	r.t.Helper()
	now := r.clk.Now()
	r.j.heartbeat(hb, now)
	r.j.judgeGroup(context.Background(), hb.Group, now)
	return r.group(hb.Group)
}

func master(group string) api.Heartbeat {
	return api.Heartbeat{Group: group, Role: routing.RoleMaster, BrokerID: group + "-master", Addr: group + "-master:1"}
}

// after moves the clock by d and runs one judge round.
func (r *judgeRig) after(d time.Duration) {
	r.clk.Advance(d)
	r.j.round(context.Background())
}

func (r *judgeRig) group(name string) routing.Group {
	r.t.Helper()
	g, ok := r.f.Group(name)
	if !ok {
		r.t.Fatalf("no group %q", name)
	}
	return g
}

func (r *judgeRig) wantReasons(name string, want routing.Reasons, when string) {
	r.t.Helper()
	if g := r.group(name); g.Reasons != want {
		r.t.Fatalf("%s: %s has reasons %q, want %q", when, name, g.Reasons, want)
	}
}

func TestJudgeNewLeaderGivesOneSessionOfGrace(t *testing.T) {
	r := newJudgeRig(t)
	r.register("g1", routing.RoleMaster) // known to the registry, never heard by this leader
	version := r.group("g1").Version
	r.after(tSession) // exactly one session since the judge began
	r.wantReasons("g1", 0, "one session after taking over")
	if g := r.group("g1"); g.Version != version {
		t.Fatalf("judging a healthy group changed it: version %d -> %d", version, g.Version)
	}
	r.after(time.Millisecond)
	r.wantReasons("g1", routing.HeartbeatLost, "past one session")
	if g := r.group("g1"); g.ChangedAt != r.clk.Now().UnixMilli() {
		t.Fatalf("change stamped at %d, want the judge's clock %d", g.ChangedAt, r.clk.Now().UnixMilli())
	}

	// A new term starts every session again.
	r.j.begin()
	r.heartbeat(master("g1"))
	r.after(tSession)
	r.wantReasons("g1", routing.HeartbeatLost, "one session into the next term, one heartbeat") // recovery needs a streak
}

func TestJudgeHeartbeatLostAndRecovered(t *testing.T) {
	r := newJudgeRig(t)
	r.register("g1", routing.RoleMaster)
	for range tRecover {
		r.heartbeat(master("g1"))
	}
	r.after(tSession)
	r.wantReasons("g1", 0, "one session after the last heartbeat")
	r.after(tInterval)
	r.wantReasons("g1", routing.HeartbeatLost, "a session and an interval after the last heartbeat")

	// The streak counts again from the first heartbeat after the loss.
	for i := 1; i < tRecover; i++ {
		if g := r.heartbeat(master("g1")); g.Writable() {
			t.Fatalf("writable after %d heartbeats of %d", i, tRecover)
		}
		r.after(tInterval)
	}
	if g := r.heartbeat(master("g1")); g.Reasons != 0 {
		t.Fatalf("after %d heartbeats in a row: %q", tRecover, g.Reasons)
	}

	// A slave's lag does not break a streak, with a slave or without: a
	// lagging slave leaves the sync set (the master's act), and the group
	// stays writable.
	r.register("g1", routing.RoleSlave)
	r.after(tSession + tInterval)
	r.wantReasons("g1", routing.HeartbeatLost, "lost again")
	lagging := master("g1")
	lagging.LagBytes, lagging.LagMillis = tLagBytes+1, tLagTime.Milliseconds()+1
	for range tRecover {
		r.heartbeat(lagging)
	}
	r.wantReasons("g1", 0, "a streak of heartbeats reporting a lagging slave")
}

// TestJudgeNeverSetsSlaveLag: a master reporting its slaves far behind, in
// bytes or in time, leaves its group writable round after round (HIGH is
// the broker's to refuse below MinInSync; NORMAL is written), and a
// slave-lag reason an earlier version set is cleared at the next judging.
func TestJudgeNeverSetsSlaveLag(t *testing.T) {
	r := newJudgeRig(t)
	r.register("g1", routing.RoleMaster)
	r.register("g1", routing.RoleSlave)
	r.heartbeat(master("g1"))
	for _, tc := range []struct {
		name  string
		bytes int64
		ms    int64
	}{
		{"bytes", 100 * tLagBytes, 0},
		{"time", 0, 100 * tLagTime.Milliseconds()},
	} {
		hb := master("g1")
		hb.LagBytes, hb.LagMillis = tc.bytes, tc.ms
		hb.Replicas = []api.ReplicaStatus{{ID: "g1-slave", Connected: false, LagBytes: tc.bytes, LagMillis: tc.ms}}
		if g := r.heartbeat(hb); g.Reasons != 0 {
			t.Fatalf("slave behind by %s: %q", tc.name, g.Reasons)
		}
		r.after(tInterval)
		r.wantReasons("g1", 0, "a round after a lag report")
	}

	r.mustApply(&fsm.SetGroupReasons{Group: "g1", Set: routing.SlaveLag})
	r.wantReasons("g1", routing.SlaveLag, "set as an earlier version would")
	r.after(tInterval)
	r.wantReasons("g1", 0, "a round after")

	// Nor while the master is lost: only heartbeat-lost.
	r.mustApply(&fsm.SetGroupReasons{Group: "g1", Set: routing.SlaveLag})
	r.after(tSession + tInterval)
	r.wantReasons("g1", routing.HeartbeatLost, "master lost")
}

func TestJudgeNeverTouchesAdmin(t *testing.T) {
	r := newJudgeRig(t)
	r.register("g1", routing.RoleMaster)
	r.mustApply(&fsm.SetGroupReasons{Group: "g1", Set: routing.Admin})
	for range 2 * tRecover {
		r.heartbeat(master("g1"))
		r.after(tInterval)
	}
	r.wantReasons("g1", routing.Admin, "healthy heartbeats")
	r.after(tSession)
	r.wantReasons("g1", routing.Admin|routing.HeartbeatLost, "lost")
	for range tRecover {
		r.heartbeat(master("g1"))
	}
	r.wantReasons("g1", routing.Admin, "recovered")
}

func TestJudgeInfoAgesFromTheClock(t *testing.T) {
	r := newJudgeRig(t)
	r.register("g1", routing.RoleMaster)
	r.register("g1", routing.RoleSlave)
	if gi := r.j.info(r.group("g1"), r.clk.Now()); gi.MasterHeartbeatAgeMillis != -1 || gi.SlaveHeartbeatAgeMillis != -1 {
		t.Fatalf("ages before any heartbeat: %+v", gi)
	}
	r.heartbeat(master("g1"))
	r.clk.Advance(250 * time.Millisecond)
	r.heartbeat(api.Heartbeat{Group: "g1", Role: routing.RoleSlave, BrokerID: "g1-slave", Addr: "g1-slave:1"})
	r.clk.Advance(100 * time.Millisecond)
	gi := r.j.info(r.group("g1"), r.clk.Now())
	if gi.MasterHeartbeatAgeMillis != 350 || gi.SlaveHeartbeatAgeMillis != 100 || gi.State != "RW" {
		t.Fatalf("info: %+v", gi)
	}
}

// TestJudgeRunTicksOnTheClock runs the judge's loop: it judges on the
// fake clock's ticks and nowhere else, and stops with its context.
func TestJudgeRunTicksOnTheClock(t *testing.T) {
	r := newJudgeRig(t)
	r.register("g1", routing.RoleMaster)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.j.run(ctx)
	}()
	defer func() {
		cancel()
		wg.Wait()
		if r.j.ready.Load() {
			t.Error("judge still ready after it stopped")
		}
	}()
	wait, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	if err := r.clk.BlockUntilContext(wait, 1); err != nil { // the judge's ticker
		t.Fatal(err)
	}
	start := r.clk.Now()

	r.clk.Advance(tInterval - time.Millisecond) // short of a tick
	r.clk.Advance(time.Millisecond)             // the first tick
	if err := r.j.waitRound(wait, r.clk.Now()); err != nil {
		t.Fatal(err)
	}
	if n := r.j.rounds.Load(); n != 1 {
		t.Fatalf("%d rounds after one tick", n)
	}
	r.wantReasons("g1", 0, "one interval")

	r.clk.Advance(tSession) // past the session since start: ticks on the way merge
	if err := r.j.waitRound(wait, start.Add(tSession+tInterval)); err != nil {
		t.Fatal(err)
	}
	r.wantReasons("g1", routing.HeartbeatLost, "a round past the session")
}
