package metaserverd

import (
	"context"
	"maps"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ferrymq/ferrymq/cmd/internal/cli"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testmetrics"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/routing"
)

// TestGroupStateMetrics: a broker group's state is
// ferrymq_metaserver_group_writable{group} and one
// ferrymq_metaserver_group_readonly_reason{group,reason} per known reason,
// valued as the registry says; the series stay the same (no label value
// changes) while the group's reasons change.
func TestGroupStateMetrics(t *testing.T) {
	meta := testcluster.StartMeta(t, 1, nil)
	_, s := meta.Leader()
	m := cli.NewMetrics()
	register(m, s)
	cl := meta.Client(t)
	ctx := context.Background()
	if _, err := cl.Heartbeat(ctx, api.Heartbeat{Group: "g1", Role: routing.RoleMaster, BrokerID: "g1-master", Addr: "127.0.0.1:11", HAAddr: "127.0.0.1:21"}); err != nil {
		t.Fatal(err)
	}
	known := []string{"heartbeat-lost", "slave-lag", "admin"}

	// check compares the metrics with the registry's group and returns the
	// series' identities.
	check := func(step string) []string {
		t.Helper()
		g, ok := s.FSM().Group("g1")
		if !ok {
			t.Fatalf("%s: no group g1", step)
		}
		fams := testmetrics.Gather(t, m.Registry)
		var series []string
		w := fams["ferrymq_metaserver_group_writable"].GetMetric()
		if len(w) != 1 || !maps.Equal(testmetrics.Labels(w[0]), map[string]string{"group": "g1"}) || (w[0].GetGauge().GetValue() == 1) != g.Writable() {
			t.Fatalf("%s: group_writable %v, the registry's group is %s (%s)", step, w, g.Reasons.State(), g.Reasons)
		}
		got := map[string]float64{}
		for _, r := range fams["ferrymq_metaserver_group_readonly_reason"].GetMetric() {
			l := testmetrics.Labels(r)
			if len(l) != 2 || l["group"] != "g1" {
				t.Fatalf("%s: readonly_reason labels %v, want group and reason", step, l)
			}
			got[l["reason"]] = r.GetGauge().GetValue()
			series = append(series, l["reason"])
		}
		want := map[string]float64{}
		for _, r := range readOnlyReasons {
			want[r.String()] = b2f(g.Reasons&r != 0)
		}
		if !maps.Equal(got, want) || len(got) != len(known) {
			t.Fatalf("%s: reasons %v, the registry's group has %q: want %v, one series for each of %v", step, got, g.Reasons, want, known)
		}
		slices.Sort(series)
		return series
	}
	before := check("a master alone")
	if _, err := cl.SetGroupReadOnly(ctx, "g1", true); err != nil {
		t.Fatal(err)
	}
	marked := check("marked read-only")
	if fams := testmetrics.Gather(t, m.Registry); fams["ferrymq_metaserver_group_writable"].GetMetric()[0].GetGauge().GetValue() != 0 {
		t.Fatal("a group marked read-only by an admin is exported writable")
	}
	if !slices.Equal(before, marked) || !slices.Equal(marked, []string{"admin", "heartbeat-lost", "slave-lag"}) {
		t.Fatalf("the reason series changed with the reasons: %v, then %v", before, marked)
	}
}

// TestRaftMetricsOneStatusPerScrape: a scrape asks the node for its raft
// status once (each ask is a trip through raft's main loop), and exports
// from it ferrymq_metaserver_raft_state{state} (1 for the node's state, 0
// for the others), _raft_term and _raft_last_index.
func TestRaftMetricsOneStatusPerScrape(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	var calls atomic.Int64
	registerRaft(reg, func() api.RaftStatus {
		calls.Add(1)
		return api.RaftStatus{State: "Candidate", Term: 7, LastIndex: 42}
	})
	for scrape := int64(1); scrape <= 2; scrape++ {
		fams := testmetrics.Gather(t, reg)
		if n := calls.Load(); n != scrape {
			t.Fatalf("%d scrapes asked for the raft status %d times, want once each", scrape, n)
		}
		states := map[string]float64{}
		f := fams["ferrymq_metaserver_raft_state"]
		for _, m := range f.GetMetric() {
			states[testmetrics.Labels(m)["state"]] = m.GetGauge().GetValue()
		}
		want := map[string]float64{"Follower": 0, "Candidate": 1, "Leader": 0, "Shutdown": 0}
		if f.GetType() != dto.MetricType_GAUGE || !maps.Equal(states, want) {
			t.Errorf("raft_state %v (%v), want %v", states, f.GetType(), want)
		}
		for name, v := range map[string]float64{"ferrymq_metaserver_raft_term": 7, "ferrymq_metaserver_raft_last_index": 42} {
			m := fams[name].GetMetric()
			if fams[name].GetType() != dto.MetricType_GAUGE || len(m) != 1 || len(m[0].GetLabel()) != 0 || m[0].GetGauge().GetValue() != v {
				t.Errorf("%s: %v, want one gauge without labels at %v", name, fams[name], v)
			}
		}
	}
}

// TestReadOnlyReasonsAreRoutingsReasons: the exported reasons are every
// reason routing names, so a reason added there is exported too.
func TestReadOnlyReasonsAreRoutingsReasons(t *testing.T) {
	var names []string
	all := routing.Reasons(0)
	for _, r := range readOnlyReasons {
		names = append(names, r.String())
		all |= r
	}
	if !slices.Equal(names, []string{"heartbeat-lost", "slave-lag", "admin"}) || all.String() != "heartbeat-lost,slave-lag,admin" {
		t.Fatalf("readOnlyReasons %v", names)
	}
}

// TestGroupSyncSetMetrics: a group's sync set size, the copies its policy
// requires and whether HIGH is allowed follow the registry as the master
// changes its set and an operator its policy.
func TestGroupSyncSetMetrics(t *testing.T) {
	meta := testcluster.StartMeta(t, 1, nil)
	_, s := meta.Leader()
	m := cli.NewMetrics()
	register(m, s)
	cl := meta.Client(t)
	ctx := context.Background()
	for _, hb := range []api.Heartbeat{
		{Group: "g1", Role: routing.RoleMaster, BrokerID: "g1-master", Addr: "127.0.0.1:11"},
		{Group: "g1", Role: routing.RoleSlave, BrokerID: "g1-s1", Addr: "127.0.0.1:12"},
		{Group: "g1", Role: routing.RoleSlave, BrokerID: "g1-s2", Addr: "127.0.0.1:13"},
	} {
		if _, err := cl.Heartbeat(ctx, hb); err != nil {
			t.Fatal(err)
		}
	}
	gauge := func(name string) float64 {
		t.Helper()
		ms := testmetrics.Gather(t, m.Registry)[name].GetMetric()
		if len(ms) != 1 || !maps.Equal(testmetrics.Labels(ms[0]), map[string]string{"group": "g1"}) {
			t.Fatalf("%s: %v, want one series of group g1", name, ms)
		}
		return ms[0].GetGauge().GetValue()
	}
	want := func(step string, size, minCopies, high float64) {
		t.Helper()
		got := [3]float64{gauge("ferrymq_metaserver_group_sync_set_size"), gauge("ferrymq_metaserver_group_min_insync"),
			gauge("ferrymq_metaserver_group_high_allowed")}
		if got != [3]float64{size, minCopies, high} {
			t.Fatalf("%s: sync set size, min in-sync, HIGH allowed = %v, want %v", step, got, [3]float64{size, minCopies, high})
		}
	}
	want("no set", 0, 2, 0)
	g, _ := s.FSM().Group("g1")
	if _, err := cl.AlterSyncSet(ctx, api.AlterSyncSetRequest{Group: "g1", Epoch: g.Epoch, Master: "g1-master",
		ExpectVersion: g.SyncVersion, InSync: []string{"g1-s1", "g1-s2"}}); err != nil {
		t.Fatal(err)
	}
	want("two members", 2, 2, 1)
	if _, err := cl.SetGroupPolicy(ctx, api.GroupPolicyRequest{Group: "g1", MinInSync: 2, AckQuorum: 4}); err != nil {
		t.Fatal(err)
	}
	want("a quorum of four copies", 2, 4, 0)
}
