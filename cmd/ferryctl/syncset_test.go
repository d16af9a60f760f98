package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/routing"
)

// threeBrokers is a registry on a fake clock whose group g1 has master
// g1-m and slaves g1-s1 and g1-s2 (heartbeats sent by the test, no broker
// processes), with g1-s1 in the sync set and the master's report of both.
type threeBrokers struct {
	m    *testcluster.Meta
	clk  *clockwork.FakeClock
	cl   *client.Client
	meta string
}

func startThreeBrokers(t *testing.T) *threeBrokers {
	t.Helper()
	clk := clockwork.NewFakeClockAt(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	m := testcluster.StartMeta(t, 1, func(c *metaserver.Config) { c.Clock = clk })
	tb := &threeBrokers{m: m, clk: clk, cl: m.Client(t), meta: "--meta=" + m.Addr()}
	tb.beat(t, "g1-m", "g1-s1", "g1-s2")
	g := tb.beat(t, "g1-m")
	if _, err := tb.cl.AlterSyncSet(context.Background(), api.AlterSyncSetRequest{Group: "g1", Epoch: g.Epoch, Master: "g1-m",
		ExpectVersion: g.SyncVersion, InSync: []string{"g1-s1"}}); err != nil {
		t.Fatal(err)
	}
	tb.beat(t, "g1-m")
	return tb
}

// beat sends a heartbeat of each of g1's brokers named (the first one
// registered prefers master); the master reports both slaves.
func (tb *threeBrokers) beat(t *testing.T, ids ...string) routing.Group {
	t.Helper()
	var g routing.Group
	for _, id := range ids {
		hb := api.Heartbeat{Group: "g1", BrokerID: id, Addr: "127.0.0.1:1" + id[len(id)-1:], Role: routing.RoleSlave, Epoch: 1}
		if id == "g1-s1" {
			hb.LogEnd = 5000
		}
		if id == "g1-s2" {
			hb.LogEnd = 1200
		}
		if id == "g1-m" {
			hb.Role, hb.LogEnd, hb.HighAcked = routing.RoleMaster, 5000, 4000
			hb.Replicas = []api.ReplicaStatus{
				{ID: "g1-s1", Connected: true, AckOffset: 5000, InSync: true},
				{ID: "g1-s2", Connected: true, AckOffset: 1200, LagBytes: 3800, LagMillis: 6500},
			}
		}
		reply, err := tb.cl.Heartbeat(context.Background(), hb)
		if err != nil {
			t.Fatalf("heartbeat of %s: %v", id, err)
		}
		g = reply.Group
	}
	return g
}

// slaveLine is the line of the brokers table's slave section for slave id.
func slaveLine(t *testing.T, table, id string) string {
	t.Helper()
	for _, l := range strings.Split(table, "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[1] == id && (f[3] == "yes" || f[3] == "no") {
			return l
		}
	}
	t.Fatalf("no slave line of %s in:\n%s", id, table)
	return ""
}

// `ferryctl brokers` lists every slave: in the sync set or not, what its
// master reported it acknowledged, its lag in bytes and time, and its last
// heartbeat; the group row says whether HIGH is taken (copies in the set,
// the master's counted, over copies needed). --json has the same per
// member.
func TestBrokersShowEverySlave(t *testing.T) {
	tb := startThreeBrokers(t)
	out := mustCtl(t, tb.meta, "brokers")
	if row := rowOf(t, out, "g1 "); !strings.Contains(row, "2/2 ok") {
		t.Fatalf("g1's row %q: want HIGH 2/2 ok", row)
	}
	header := rowOf(t, out, "GROUP  SLAVE")
	if f := strings.Fields(header); strings.Join(f, " ") != "GROUP SLAVE IN-SYNC ACKED LAG-BYTES LAG-TIME SLAVE-HB PROMOTABLE" {
		t.Fatalf("slave table header %q", header)
	}
	for _, want := range []struct{ slave, fields, promotable string }{
		{"g1-s1", "yes 5000 0 0s", "yes"},
		{"g1-s2", "no 1200 3800 6.5s", "no: slave-not-in-sync-set"},
	} {
		row := slaveLine(t, out, want.slave)
		if f := strings.Fields(row); len(f) < 7 || strings.Join(f[3:7], " ") != want.fields || !strings.Contains(row, "ago") ||
			!strings.HasSuffix(strings.TrimSpace(row), want.promotable) {
			t.Fatalf("slave row %q: want %q, a heartbeat age and promotable %q", row, want.fields, want.promotable)
		}
	}

	gi := brokersJSON(t, tb.meta)["g1"]
	s2, ok := memberIn(gi, "g1-s2", "slave")
	if !ok || s2.InSync || s2.AckOffset != 1200 || s2.LagBytes != 3800 || s2.LagMillis != 6500 || !s2.Reported ||
		s2.Eligible || s2.IneligibleReason != "slave-not-in-sync-set" || !strings.Contains(s2.NotEligible, "not in the sync set") {
		t.Fatalf("--json g1-s2: %+v", gi.Members)
	}
	if s1, ok := memberIn(gi, "g1-s1", "slave"); !ok || !s1.InSync || !s1.Eligible || len(gi.Slaves) != 2 || gi.InSync[0] != "g1-s1" {
		t.Fatalf("--json g1: %+v", gi)
	}

	// A slave's own word (broken, waiting) is a note naming it.
	if _, err := tb.cl.Heartbeat(context.Background(), api.Heartbeat{Group: "g1", BrokerID: "g1-s2", Addr: "127.0.0.1:12",
		Role: routing.RoleSlave, Epoch: 1, Waiting: "its master has not confirmed where epoch 1 began"}); err != nil {
		t.Fatal(err)
	}
	if note := rowOf(t, mustCtl(t, tb.meta, "brokers"), "g1 slave waiting:"); !strings.Contains(note, "g1-s2: its master has not confirmed") {
		t.Fatalf("waiting note %q", note)
	}

	// Above the minimum: HIGH is refused, and the row says so.
	mustCtl(t, tb.meta, "broker", "set-group", "g1", "--min-insync", "3")
	if row := rowOf(t, mustCtl(t, tb.meta, "brokers"), "g1 "); !strings.Contains(row, "2/3 REFUSED") {
		t.Fatalf("g1's row with min in-sync 3: %q", row)
	}
}

// set-group sets the minimum and the ack policy, a flag not given keeping
// the group's value; bad values are usage errors (exit 2) saying what is
// wanted, before anything is asked; a group that does not exist is exit 1.
func TestBrokerSetGroup(t *testing.T) {
	tb := startThreeBrokers(t)
	out := mustCtl(t, tb.meta, "broker", "set-group", "g1", "--min-insync", "2", "--ack", "quorum:3")
	if f := strings.Fields(rowOf(t, out, "g1 ")); strings.Join(f, " ") != "g1 3 quorum:3 g1-s1 2/3 REFUSED" {
		t.Fatalf("set-group g1 --min-insync 2 --ack quorum:3 (a quorum above the minimum raises it):\n%s", out)
	}
	out = mustCtl(t, tb.meta, "broker", "set-group", "g1", "--ack", "all")
	if f := strings.Fields(rowOf(t, out, "g1 ")); strings.Join(f, " ") != "g1 2 all g1-s1 2/2 ok" {
		t.Fatalf("set-group g1 --ack all:\n%s", out)
	}
	mustCtl(t, tb.meta, "broker", "set-group", "g1", "--min-insync", "1")
	g := brokersJSON(t, tb.meta)["g1"]
	if g.MinInSync != 1 || g.AckQuorum != 0 {
		t.Fatalf("after --min-insync 1 alone: min %d, quorum %d", g.MinInSync, g.AckQuorum)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--min-insync", "10"}, "--min-insync 10: want 0 to 9"},
		{[]string{"--min-insync", "-1"}, "--min-insync -1: want 0 to 9"},
		{[]string{"--ack", "quorum:1"}, "--ack quorum:1: want all, or quorum:K with K from 2 to 9"},
		{[]string{"--ack", "most"}, "--ack most: want all, or quorum:K"},
		{[]string{"--ack", "quorum:x"}, "--ack quorum:x: want"},
		{nil, "give --min-insync, --ack or both"},
	} {
		args := append([]string{tb.meta, "broker", "set-group", "g1"}, tc.args...)
		if code, _, errOut := ctl(args...); code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("set-group %v: exit %d, %q; want exit 2 saying %q", tc.args, code, errOut, tc.want)
		}
	}
	if g2 := brokersJSON(t, tb.meta)["g1"]; g2.MinInSync != 1 || g2.AckQuorum != 0 {
		t.Fatalf("refused command lines changed the policy: %+v", g2.Group)
	}
	if code, _, errOut := ctl(tb.meta, "broker", "set-group", "g9", "--ack", "all"); code != exitError || !strings.Contains(errOut, `"g9" does not exist`) {
		t.Fatalf("set-group of an unknown group: exit %d, %q", code, errOut)
	}
	if code, _, errOut := ctl(tb.meta, "broker", "set-group", "g9", "--ack", "all", "--min-insync", "2"); code != exitError || !strings.Contains(errOut, "NOT_FOUND") {
		t.Fatalf("set-group of an unknown group, both flags: exit %d, %q", code, errOut)
	}
}

// remove-slave needs --group (exit 2); refuses a live slave (GROUP_ACTIVE,
// exit 1), the master and a stranger (exit 1); takes a slave silent past
// the session out of the group, and `brokers` no longer lists it.
func TestBrokerRemoveSlave(t *testing.T) {
	tb := startThreeBrokers(t)
	if code, _, errOut := ctl(tb.meta, "broker", "remove-slave", "g1-s2"); code != exitUsage || !strings.Contains(errOut, "--group is required") {
		t.Fatalf("remove-slave without --group: exit %d, %q", code, errOut)
	}
	for _, tc := range []struct{ id, want string }{
		{"g1-s2", "GROUP_ACTIVE"},
		{"g1-m", "is the master"},
		{"g1-x", "g1-s1, g1-s2"},
	} {
		if code, _, errOut := ctl(tb.meta, "broker", "remove-slave", tc.id, "--group", "g1"); code != exitError || !strings.Contains(errOut, tc.want) {
			t.Fatalf("remove-slave %s: exit %d, %q; want exit 1 saying %q", tc.id, code, errOut, tc.want)
		}
	}
	session := tb.m.Cfgs[0].SessionTimeout
	for range 3 { // g1-s2 is silent; the others go on
		tb.clk.Advance(session / 2)
		tb.beat(t, "g1-m", "g1-s1")
	}
	out := mustCtl(t, tb.meta, "broker", "remove", "g1-s2", "--group", "g1") // the alias the issue names
	if f := strings.Fields(rowOf(t, out, "g1 ")); strings.Join(f, " ") != "g1 g1-m g1-s1 g1-s1 2/2 ok" {
		t.Fatalf("remove-slave:\n%s", out)
	}
	if out := mustCtl(t, tb.meta, "brokers"); strings.Contains(out, "g1-s2") {
		t.Fatalf("brokers still lists the removed slave:\n%s", out)
	}
}
