package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
)

// brokersJSON runs `ferryctl brokers --json` and returns the groups by name.
func brokersJSON(t *testing.T, meta string) map[string]api.GroupInfo {
	t.Helper()
	var gs []api.GroupInfo
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "brokers", "--json")), &gs); err != nil {
		t.Fatalf("brokers --json: %v", err)
	}
	out := map[string]api.GroupInfo{}
	for _, g := range gs {
		out[g.Name] = g
	}
	return out
}

// member is the member of gi with id and role, or false.
func memberIn(gi api.GroupInfo, id, role string) (api.BrokerStatus, bool) {
	for _, m := range gi.Members {
		if m.ID == id && m.Role == role {
			return m, true
		}
	}
	return api.BrokerStatus{}, false
}

// rowOf is the line of a table that starts with prefix.
func rowOf(t *testing.T, table, prefix string) string {
	t.Helper()
	for _, l := range strings.Split(table, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	t.Fatalf("no line starting %q in:\n%s", prefix, table)
	return ""
}

// TestBrokersShowDeadMasters stops the master of a group without a slave
// (g2) and the master of a group with one (g1), in-process, with the
// metaserver's judge on a fake clock. `ferryctl brokers` shows each dead
// master's last heartbeat as a real age that grows with the clock, marked
// DEAD past the session; g1's master, which the failover takes out of the
// group, stays in view as its former master.
func TestBrokersShowDeadMasters(t *testing.T) {
	clk := clockwork.NewFakeClockAt(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	m := testcluster.StartMeta(t, 1, func(c *metaserver.Config) { c.Clock = clk; c.FailoverMargin = 500 * time.Millisecond })
	g1 := testcluster.StartGroup(t, m.Addrs(), "g1", testcluster.GroupOpts{Slave: true})
	g2 := testcluster.StartGroup(t, m.Addrs(), "g2", testcluster.GroupOpts{})
	_, leader := m.Leader()
	meta := "--meta=" + m.Addr()
	session := m.Cfgs[0].SessionTimeout
	advance := func(d time.Duration) {
		t.Helper()
		clk.Advance(d)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := leader.WaitJudged(ctx, clk.Now()); err != nil {
			t.Fatal(err)
		}
	}

	// Move the clock while every broker heartbeats, so that the leader's
	// age (since its takeover) differs from the brokers' heartbeat ages.
	advance(300 * time.Millisecond)
	testwait.For(t, 10*time.Second, "every broker heard after the clock moved", func() bool {
		gs := brokersJSON(t, meta)
		for _, gi := range gs {
			for _, mb := range gi.Members {
				if mb.LastHeartbeatAgeMillis != 0 {
					return false
				}
			}
		}
		return len(gs) == 2 && len(gs["g1"].Members) == 2 && len(gs["g2"].Members) == 1
	})
	_ = g1.Master.Close()
	_ = g2.Master.Close()

	advance(session / 2)
	gs := brokersJSON(t, meta)
	dead, ok := memberIn(gs["g2"], "g2-master", "master")
	// A heartbeat the broker sent just before it closed may have been
	// taken after the clock moved: its age is at most the move.
	if !ok || !dead.Heard || dead.LastHeartbeatAgeMillis < 0 || dead.LastHeartbeatAgeMillis > (session/2).Milliseconds() ||
		!dead.Alive || dead.Lost || gs["g2"].LeaderForMillis != (300*time.Millisecond+session/2).Milliseconds() {
		t.Fatalf("g2 half a session after its master stopped: %+v", gs["g2"])
	}
	first := dead.LastHeartbeatAgeMillis
	firstG1, ok := memberIn(gs["g1"], "g1-master", "master")
	if !ok || !firstG1.Heard || firstG1.LastHeartbeatAgeMillis < 0 {
		t.Fatalf("g1 half a session after its master stopped: %+v", gs["g1"])
	}

	advance(session)
	gs = brokersJSON(t, meta)
	dead, _ = memberIn(gs["g2"], "g2-master", "master")
	if dead.LastHeartbeatAgeMillis != first+session.Milliseconds() || dead.Alive || !dead.Lost || gs["g2"].State != "RO" {
		t.Fatalf("g2 a session later: %+v; want its master's age %d ms, lost, and the group read-only", gs["g2"], first+session.Milliseconds())
	}
	row := rowOf(t, mustCtl(t, meta, "brokers"), "g2 ")
	if want := age(first+session.Milliseconds()) + " DEAD"; !strings.Contains(row, want) || strings.Contains(row, "never") {
		t.Fatalf("g2's row %q; want %q", row, want)
	}

	// Past the session and the failover margin g1's slave is promoted (it
	// heartbeats on its own, at the fake clock's time) and its old master
	// leaves the group, but not the table.
	advance(session)
	testwait.For(t, 10*time.Second, "g1's slave to be promoted", func() bool {
		return brokersJSON(t, meta)["g1"].Master.ID == "g1-slave"
	})
	gs = brokersJSON(t, meta)
	former, ok := memberIn(gs["g1"], "g1-master", api.RoleFormerMaster)
	if want := firstG1.LastHeartbeatAgeMillis + 2*session.Milliseconds(); !ok || former.LastHeartbeatAgeMillis != want || !former.Lost ||
		former.ReplacedBy != "g1-slave" || former.ReplacedAtEpoch != 2 {
		t.Fatalf("g1 after the failover: %+v; want the former master g1-master, lost, last heard %d ms ago", gs["g1"], want)
	}
	if nm, ok := memberIn(gs["g1"], "g1-slave", "master"); !ok || !nm.Alive || nm.LastHeartbeatAgeMillis < 0 {
		t.Fatalf("g1's new master: %+v", gs["g1"])
	}
	table := mustCtl(t, meta, "brokers")
	t.Logf("brokers after g1's failover:\n%s", table)
	note := rowOf(t, table, "g1 former master:")
	if want := age(former.LastHeartbeatAgeMillis) + " DEAD"; !strings.Contains(note, "g1-master") || !strings.Contains(note, want) ||
		!strings.Contains(note, "replaced by g1-slave at epoch 2") {
		t.Fatalf("g1's former master line %q; want g1-master, %q and its replacement", note, want)
	}
	if row := rowOf(t, table, "g1 "); strings.Contains(row, "never") {
		t.Fatalf("g1's row after the failover says never: %q", row)
	}
}
