package metaserver

import (
	"fmt"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/routing"
)

// What ferryctl brokers shows of dead brokers: the judge on a fake clock.

// memberOf returns the member id of gi with role, failing the test if
// there is none.
func memberOf(t *testing.T, gi api.GroupInfo, id, role string) api.BrokerStatus {
	t.Helper()
	for _, m := range gi.Members {
		if m.ID == id && m.Role == role {
			return m
		}
	}
	t.Fatalf("no %s %s among %+v", role, id, gi.Members)
	return api.BrokerStatus{}
}

// TestStatusDeadMasterKeepsItsLastHeartbeat: a master that stops
// heartbeating is shown with the real age of its last heartbeat, growing
// with the clock, alive within the session and lost past it; after the
// failover that takes it out of the group it is still shown, as the former
// master with that age, and the promoted slave's age is that of its last
// heartbeat as the slave, not "never".
func TestStatusDeadMasterKeepsItsLastHeartbeat(t *testing.T) {
	r := newFailoverRig(t, nil)
	r.heartbeat(masterHB("g1", 5000, 5000))
	r.heartbeat(slaveHB("g1", 5000, 5000))
	info := func() api.GroupInfo { return r.j.info(r.group("g1"), r.clk.Now()) }

	r.lose(tSession, slaveHB("g1", 5000, 5000)) // the master's last heartbeat is a session old
	gi := info()
	if m := memberOf(t, gi, "g1-master", "master"); m.LastHeartbeatAgeMillis != tSession.Milliseconds() || !m.Heard || !m.Alive || m.Lost {
		t.Fatalf("master silent for exactly the session: %+v", m)
	}
	if gi.MasterHeartbeatAgeMillis != tSession.Milliseconds() || gi.SessionMillis != tSession.Milliseconds() {
		t.Fatalf("master age %d, session %d; want both %d", gi.MasterHeartbeatAgeMillis, gi.SessionMillis, tSession.Milliseconds())
	}
	r.lose(tInterval, slaveHB("g1", 5000, 5000))
	r.wantReasons("g1", routing.HeartbeatLost, "past the session")
	if m := memberOf(t, info(), "g1-master", "master"); m.LastHeartbeatAgeMillis != (tSession+tInterval).Milliseconds() || m.Alive || !m.Lost {
		t.Fatalf("master silent past the session: %+v", m)
	}

	r.lose(tMargin+tInterval, slaveHB("g1", 5000, 5000))
	if g := r.group("g1"); g.Master.ID != "g1-slave" || g.Epoch != 2 {
		t.Fatalf("no promotion past the session and the margin: %+v", g)
	}
	silent := tSession + tMargin + 2*tInterval
	gi = info()
	if len(gi.Members) != 2 {
		t.Fatalf("members after the failover: %+v; want the new master and the former one", gi.Members)
	}
	if m := gi.Members[0]; m.ID != "g1-slave" || m.Role != "master" || m.LastHeartbeatAgeMillis != 0 || !m.Alive {
		t.Fatalf("the promoted slave, heard as the slave this round: %+v", m)
	}
	if gi.MasterHeartbeatAgeMillis != 0 || gi.SlaveHeartbeatAgeMillis != -1 {
		t.Fatalf("master age %d and slave age %d after the failover; want 0 (its last heartbeat as slave) and -1 (no slave)",
			gi.MasterHeartbeatAgeMillis, gi.SlaveHeartbeatAgeMillis)
	}
	former := memberOf(t, gi, "g1-master", api.RoleFormerMaster)
	if former.LastHeartbeatAgeMillis != silent.Milliseconds() || former.Alive || !former.Lost ||
		former.ReplacedAtEpoch != 2 || former.ReplacedBy != "g1-slave" || former.Addr != "g1-master:1" {
		t.Fatalf("the former master: %+v; want silent %v, lost, replaced by g1-slave at epoch 2", former, silent)
	}
	r.clk.Advance(time.Minute)
	if m := memberOf(t, info(), "g1-master", api.RoleFormerMaster); m.LastHeartbeatAgeMillis != (silent + time.Minute).Milliseconds() {
		t.Fatalf("a minute later the former master's age is %d ms; want %d", m.LastHeartbeatAgeMillis, (silent + time.Minute).Milliseconds())
	}

	// It comes back and joins as the slave (its new master heartbeating):
	// a member again, not a former one.
	r.heartbeat(api.Heartbeat{Group: "g1", Role: routing.RoleMaster, BrokerID: "g1-slave", Addr: "g1-slave:1"})
	// As the heartbeat handler does for a broker the group does not name.
	r.mustApply(&fsm.RegisterBroker{Group: "g1", Role: routing.RoleMaster, Broker: routing.Broker{ID: "g1-master", Addr: "g1-master:1"}})
	hb := masterHB("g1", 5000, 5000)
	hb.Role = routing.RoleSlave
	r.heartbeat(hb)
	gi = info()
	if len(gi.Members) != 2 || gi.Members[1].ID != "g1-master" || gi.Members[1].Role != "slave" || !gi.Members[1].Alive {
		t.Fatalf("members after the old master rejoined: %+v", gi.Members)
	}
}

// TestStatusNewLeaderSaysWhatItDoesNotKnow: heartbeats live in the leader's
// memory, so a new leader has not heard a broker that went silent before
// it took over. It says so (not heard, since when it leads), rather than
// "never", and counts the broker lost once a session passes from its
// takeover, as its judge does.
func TestStatusNewLeaderSaysWhatItDoesNotKnow(t *testing.T) {
	r := newJudgeRig(t)
	r.register("g1", routing.RoleMaster)
	r.heartbeat(master("g1"))
	r.after(3 * tSession)

	r.j.begin() // another term of leadership, as after an election
	r.after(tSession)
	gi := r.j.info(r.group("g1"), r.clk.Now())
	m := memberOf(t, gi, "g1-master", "master")
	if m.Heard || m.LastHeartbeatAgeMillis != -1 || m.Alive || m.Lost || gi.LeaderForMillis != tSession.Milliseconds() {
		t.Fatalf("a session into the new leadership: %+v, leading for %d ms", m, gi.LeaderForMillis)
	}
	r.after(tInterval)
	r.wantReasons("g1", routing.HeartbeatLost, "a session and an interval into the new leadership")
	gi = r.j.info(r.group("g1"), r.clk.Now())
	if m := memberOf(t, gi, "g1-master", "master"); m.Heard || m.Alive || !m.Lost || gi.LeaderForMillis != (tSession+tInterval).Milliseconds() {
		t.Fatalf("past a session into the new leadership: %+v, leading for %d ms", m, gi.LeaderForMillis)
	}
}

// TestStatusFormerMembersAreBounded: brokers that come and go (here by a
// promotion after another) cannot grow the judge's memory of former
// members without bound: it keeps the latest maxFormer.
func TestStatusFormerMembersAreBounded(t *testing.T) {
	r := newJudgeRig(t)
	r.register("g1", routing.RoleMaster)
	r.heartbeat(master("g1"))
	for i := range 3 * maxFormer {
		id := fmt.Sprintf("b%d", i)
		r.mustApply(&fsm.RegisterBroker{Group: "g1", Role: routing.RoleSlave, Broker: routing.Broker{ID: id, Addr: id + ":1"}})
		r.j.heartbeat(api.Heartbeat{Group: "g1", Role: routing.RoleSlave, BrokerID: id, Addr: id + ":1"}, r.clk.Now())
		r.clk.Advance(tInterval)
		g := r.group("g1")
		r.mustApply(&fsm.Promote{Group: "g1", Epoch: g.Epoch, Master: g.Master.ID, Slave: id})
	}
	gi := r.j.info(r.group("g1"), r.clk.Now())
	if n := len(gi.Members); n != 1+maxFormer || gi.Members[0].ID != fmt.Sprintf("b%d", 3*maxFormer-1) {
		t.Fatalf("members %+v; want the last master and the %d latest former ones", gi.Members, maxFormer)
	}
	for i, m := range gi.Members[1:] {
		if want := fmt.Sprintf("b%d", 3*maxFormer-2-i); m.ID != want || m.Role != api.RoleFormerMaster {
			t.Fatalf("former member %d is %+v; want %s, newest first", i, m, want)
		}
	}
}
