package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver/api"
)

// TestMetaStatusShowsAStoppedMember stops a follower of a 3-node
// metaserver cluster: `ferryctl meta status` shows it unreachable, with
// the error, and not as a follower; the other two answer for themselves,
// with their roles, applied indexes, how far behind the leader's they are,
// and the follower's last contact with the leader.
func TestMetaStatusShowsAStoppedMember(t *testing.T) {
	m := testcluster.StartMeta(t, 3, nil)
	li, leader := m.Leader()
	stopped := (li + 1) % 3
	follower := (li + 2) % 3
	m.Stop(stopped)
	meta := "--meta=" + strings.Join(m.Addrs(), ",")

	var st api.MetaStatus
	byID := map[string]api.MemberStatus{}
	// The remaining follower has heard from the leader once raft's first
	// append reached it.
	testwait.For(t, 10*time.Second, "meta status with the follower's contact with the leader", func() bool {
		st = api.MetaStatus{}
		if err := json.Unmarshal([]byte(mustCtl(t, meta, "meta", "status", "--json", "--member-timeout", "500ms")), &st); err != nil {
			t.Fatalf("meta status --json: %v", err)
		}
		for _, ms := range st.Members {
			byID[ms.ID] = ms
		}
		return byID[m.Cfgs[follower].ID].LastContactMillis >= 0
	})
	if len(st.Members) != 3 || st.LeaderID != leader.ID() || st.LeaderAddr != leader.RPCAddr() || st.AppliedIndex == 0 {
		t.Fatalf("meta status --json: %+v; want 3 members and leader %s with its applied index", st, leader.ID())
	}
	down := byID[m.Cfgs[stopped].ID]
	if down.Reachable || down.Error == "" || down.State != "" || down.Leader || down.AppliedBehind != -1 || down.LastContactMillis != -1 ||
		down.RPCAddr != m.Peers[stopped].RPCAddr || down.Suffrage != "Voter" {
		t.Fatalf("the stopped member: %+v; want unreachable with an error and no state", down)
	}
	lead := byID[leader.ID()]
	if !lead.Reachable || lead.State != "Leader" || !lead.Leader || lead.AppliedIndex != st.AppliedIndex || lead.AppliedBehind != 0 || lead.LastContactMillis != 0 {
		t.Fatalf("the leader: %+v", lead)
	}
	f := byID[m.Cfgs[follower].ID]
	if !f.Reachable || f.State != "Follower" || f.Leader || f.AppliedIndex == 0 || f.Term != lead.Term ||
		f.AppliedBehind != int64(lead.AppliedIndex)-int64(f.AppliedIndex) {
		t.Fatalf("the follower: %+v (leader %+v)", f, lead)
	}

	out := mustCtl(t, meta, "meta", "status")
	t.Logf("meta status with %s stopped:\n%s", m.Cfgs[stopped].ID, out)
	if !strings.Contains(out, "leader "+leader.ID()) || !strings.Contains(out, "2 of 3 members reachable") {
		t.Fatalf("meta status:\n%s", out)
	}
	if row := rowOf(t, out, m.Cfgs[stopped].ID+" "); strings.Contains(row, "follower") || !strings.Contains(row, "no: ") {
		t.Fatalf("the stopped member's row %q; want it unreachable with the error, not a follower", row)
	}
	if row := rowOf(t, out, m.Cfgs[follower].ID+" "); !strings.Contains(row, "follower") || !strings.Contains(row, " ago") ||
		!strings.HasSuffix(strings.TrimSpace(row), "yes") {
		t.Fatalf("the follower's row %q", row)
	}
	if row := rowOf(t, out, leader.ID()+" "); !strings.Contains(row, "leader") || !strings.HasSuffix(strings.TrimSpace(row), "yes") {
		t.Fatalf("the leader's row %q", row)
	}
}
