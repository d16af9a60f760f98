package metaserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

func TestBootstrapAndRestartKeepState(t *testing.T) {
	m := startMeta(t, 3, fakeClock())
	cl := m.Client(t)
	heartbeat(t, cl, "g1", routing.RoleMaster, nil)
	ctx := context.Background()
	route, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "orders", Queues: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(route.Queues) != 3 || route.Queues[0].Group != "g1" || !route.Queues[0].Writable {
		t.Fatalf("route: %+v", route)
	}
	if _, err := cl.SetGroupReadOnly(ctx, "g1", true); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "every node to apply", func() bool {
		for _, s := range m.Nodes {
			if g := groupOf(t, s, "g1"); g.Reasons&routing.Admin == 0 {
				return false
			}
		}
		return true
	})
	want := m.Nodes[0].FSM().State()

	m.StopAll()
	for i := range m.Nodes {
		m.Restart(i)
	}
	m.Leader()
	for i, s := range m.Nodes {
		testwait.For(t, 5*time.Second, "the log to replay", func() bool { return s.FSM().Version() >= want.Version })
		got := s.FSM().State()
		if len(got.Topics) != 1 || len(got.Groups) != 1 || got.Groups["g1"].Reasons&routing.Admin == 0 || len(got.Members) != 3 {
			t.Fatalf("node %d after restart: %+v", i, got)
		}
	}
	// Bootstrapping again on restart was skipped: the cluster has 3 members.
	st, err := m.Client(t).RaftStatus(ctx)
	if err != nil || len(st.Members) != 3 {
		t.Fatalf("raft status after restart: %+v, %v", st, err)
	}
}

func TestLeaderLossKeepsRoutesAndHeartbeats(t *testing.T) {
	m := startMeta(t, 3, fakeClock()) // no session can expire: the clock stands still
	cl := m.Client(t)
	b := startBroker(t, cl, "g1", routing.RoleMaster)
	old, leader := m.Leader()
	testwait.For(t, 5*time.Second, "g1 to register", func() bool { _, ok := leader.FSM().Group("g1"); return ok })
	ctx := context.Background()
	if _, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "t1", Queues: 2}); err != nil {
		t.Fatal(err)
	}
	before := groupOf(t, leader, "g1")

	killed := time.Now()
	m.Stop(old)
	_, newLeader := m.Leader()
	elected := time.Since(killed)
	// The broker's heartbeats follow the leader.
	beats := newLeader.Heartbeats()
	testwait.For(t, 5*time.Second, "a heartbeat taken by the new leader", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return newLeader.Heartbeats() > beats && b.lastErr == nil
	})
	info, err := cl.Groups(ctx)
	if err != nil || len(info) != 1 || info[0].MasterHeartbeatAgeMillis != 0 {
		t.Fatalf("groups from the new leader: %+v, %v", info, err)
	}
	t.Logf("leader killed: new leader in %v, its first heartbeat after %v", elected, time.Since(killed))
	route, err := cl.Route(ctx, "t1")
	if err != nil || len(route.Queues) != 2 {
		t.Fatalf("route after failover: %+v, %v", route, err)
	}
	if g := groupOf(t, newLeader, "g1"); !g.Writable() || g.Version != before.Version {
		t.Fatalf("g1 after the election: %+v (before: %+v)", g, before)
	}
}

// TestNewLeaderGivesOneSessionOfGrace: a group the new leader never heard
// from stays writable for exactly one session from the takeover.
func TestNewLeaderGivesOneSessionOfGrace(t *testing.T) {
	clk := fakeClock()
	m := startMeta(t, 3, clk)
	old, _ := m.Leader()
	heartbeat(t, m.Client(t), "g1", routing.RoleMaster, nil) // then silence
	m.Stop(old)
	_, leader := m.Leader()
	before := groupOf(t, leader, "g1")
	if !before.Writable() {
		t.Fatalf("g1 after the election: %+v", before)
	}
	session := m.Cfgs[0].SessionTimeout
	judged(t, m, clk, leader, session)
	if g := groupOf(t, leader, "g1"); !g.Writable() || g.Version != before.Version {
		t.Fatalf("g1 one session after the takeover: %+v (before: %+v)", g, before)
	}
	judged(t, m, clk, leader, m.Cfgs[0].JudgeInterval)
	if g := groupOf(t, leader, "g1"); g.Reasons != routing.HeartbeatLost {
		t.Fatalf("g1 past one session after the takeover: %+v", g)
	}
}

func TestHeartbeatLostMakesGroupReadOnly(t *testing.T) {
	clk := fakeClock()
	m := startMeta(t, 1, clk)
	_, leader := m.Leader()
	cl := m.Client(t)
	cfg := m.Cfgs[0]
	for range cfg.RecoverHeartbeats {
		heartbeat(t, cl, "g1", routing.RoleMaster, nil)
	}

	judged(t, m, clk, leader, cfg.SessionTimeout)
	if g := groupOf(t, leader, "g1"); !g.Writable() {
		t.Fatalf("g1 one session after its last heartbeat: %+v", g)
	}
	judged(t, m, clk, leader, cfg.JudgeInterval)
	g := groupOf(t, leader, "g1")
	if g.Reasons != routing.HeartbeatLost || g.ChangedAt != clk.Now().UnixMilli() {
		t.Fatalf("g1 a session and an interval after its last heartbeat: %+v (clock %d)", g, clk.Now().UnixMilli())
	}
	info, err := cl.Groups(context.Background())
	if err != nil || len(info) != 1 || info[0].State != "RO" ||
		info[0].MasterHeartbeatAgeMillis != (cfg.SessionTimeout+cfg.JudgeInterval).Milliseconds() {
		t.Fatalf("groups: %+v, %v", info, err)
	}

	// Back after RecoverHeartbeats in a row; each reply carries the state.
	for i := 1; i < cfg.RecoverHeartbeats; i++ {
		if g := heartbeat(t, cl, "g1", routing.RoleMaster, nil); g.Reasons != routing.HeartbeatLost {
			t.Fatalf("after %d heartbeats of %d: %+v", i, cfg.RecoverHeartbeats, g)
		}
	}
	if g := heartbeat(t, cl, "g1", routing.RoleMaster, nil); !g.Writable() {
		t.Fatalf("after %d heartbeats in a row: %+v", cfg.RecoverHeartbeats, g)
	}
}

// TestSlaveLagKeepsGroupWritable: a master reporting its slave far
// behind, past the judge's rounds, leaves the group writable (a lagging
// slave leaves the sync set instead, and HIGH is refused by the broker
// while the set is below MinInSync).
func TestSlaveLagKeepsGroupWritable(t *testing.T) {
	clk := fakeClock()
	m := startMeta(t, 1, clk)
	cl := m.Client(t)
	cfg := m.Cfgs[0]
	heartbeat(t, cl, "g1", routing.RoleMaster, nil)
	if g := heartbeat(t, cl, "g1", routing.RoleSlave, nil); g.Slave.ID == "" || !g.Writable() {
		t.Fatalf("after the slave's heartbeat: %+v", g)
	}
	lagging := func(hb *api.Heartbeat) {
		hb.LagMillis, hb.LagBytes = 10*cfg.LagTime.Milliseconds(), 10*cfg.LagBytes
		hb.Replicas = []api.ReplicaStatus{{ID: "g1-slave", LagBytes: hb.LagBytes, LagMillis: hb.LagMillis}}
	}
	_, leader := m.Leader()
	for start := clk.Now(); clk.Since(start) <= 2*cfg.LagTime; {
		heartbeat(t, cl, "g1", routing.RoleSlave, nil)
		if g := heartbeat(t, cl, "g1", routing.RoleMaster, lagging); g.Reasons != 0 {
			t.Fatalf("master reporting its slave far behind: %+v", g)
		}
		judged(t, m, clk, leader, cfg.JudgeInterval)
		if g := groupOf(t, leader, "g1"); g.Reasons != 0 {
			t.Fatalf("a judge round after a lag report: %+v", g)
		}
	}
}

func TestAdminReadOnlyIsSticky(t *testing.T) {
	clk := fakeClock()
	m := startMeta(t, 1, clk)
	_, leader := m.Leader()
	cl := m.Client(t)
	cfg := m.Cfgs[0]
	heartbeat(t, cl, "g1", routing.RoleMaster, nil)
	ctx := context.Background()
	g, err := cl.SetGroupReadOnly(ctx, "g1", true)
	if err != nil || g.Reasons != routing.Admin || g.ChangedAt != clk.Now().UnixMilli() {
		t.Fatalf("admin RO: %+v, %v", g, err)
	}
	// Healthy heartbeats, each judged, and judge rounds: more than a streak.
	for i := range 2 * cfg.RecoverHeartbeats {
		if g := heartbeat(t, cl, "g1", routing.RoleMaster, nil); g.Reasons != routing.Admin {
			t.Fatalf("healthy heartbeat %d cleared an admin's read-only: %+v", i+1, g)
		}
		judged(t, m, clk, leader, cfg.JudgeInterval)
	}
	if g := groupOf(t, leader, "g1"); g.Reasons != routing.Admin {
		t.Fatalf("healthy heartbeats and judge rounds cleared an admin's read-only: %v", g.Reasons)
	}
	if g, err := cl.SetGroupReadOnly(ctx, "g1", false); err != nil || !g.Writable() {
		t.Fatalf("admin RW: %+v, %v", g, err)
	}
	if _, err := cl.SetGroupReadOnly(ctx, "nope", true); !errors.Is(err, protocol.ErrNotFound) {
		t.Fatalf("unknown group: %v", err)
	}
}

func TestRoutesOnEveryNode(t *testing.T) {
	m := startMeta(t, 3, fakeClock())
	cl := m.Client(t)
	heartbeat(t, cl, "g1", routing.RoleMaster, nil)
	heartbeat(t, cl, "g2", routing.RoleMaster, nil)
	ctx := context.Background()
	created, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "spread", Queues: 4})
	if err != nil {
		t.Fatal(err)
	}
	if groups := created.Groups(); len(groups) != 2 {
		t.Fatalf("queues not spread over both groups: %+v", created)
	}
	// Every node answers from its own FSM once it has applied the change;
	// auto-create works through a follower too.
	for i, s := range m.Nodes {
		one, err := client.New(client.Config{Addrs: []string{s.RPCAddr()}})
		if err != nil {
			t.Fatal(err)
		}
		testwait.For(t, 5*time.Second, "the node to apply", func() bool {
			r, err := one.Route(ctx, "spread")
			return err == nil && r.Version >= created.Version && len(r.Queues) == 4
		})
		auto, err := one.Route(ctx, "auto-"+s.ID())
		if err != nil || len(auto.Queues) != 4 {
			t.Fatalf("node %d auto-create: %+v, %v", i, auto, err)
		}
		one.Close()
	}
	// A follower that has not applied a fresh topic yet asks the leader
	// before calling it unknown, so a topic is visible everywhere as soon
	// as its creation returns.
	for i := range 5 {
		name := fmt.Sprintf("fresh-%d", i)
		if _, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: name, Queues: 2}); err != nil {
			t.Fatal(err)
		}
		for _, s := range m.Nodes {
			one, err := client.New(client.Config{Addrs: []string{s.RPCAddr()}})
			if err != nil {
				t.Fatal(err)
			}
			r, err := one.RouteExisting(ctx, name)
			one.Close()
			if err != nil || len(r.Queues) != 2 {
				t.Fatalf("node %s right after creating %s: %+v, %v", s.ID(), name, r, err)
			}
		}
	}
	if _, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "spread", Queues: 1}); !errors.Is(err, protocol.ErrConflict) {
		t.Fatalf("creating an existing topic: %v", err)
	}
	more, err := cl.AddQueues(ctx, "spread", 2)
	if err != nil || len(more.Queues) != 6 {
		t.Fatalf("add queues: %+v, %v", more, err)
	}
}

func TestAutoCreateOff(t *testing.T) {
	m := testcluster.StartMeta(t, 1, func(cfg *metaserver.Config) { cfg.AutoCreateTopics = false })
	cl := m.Client(t)
	ctx := context.Background()
	if _, err := cl.Route(ctx, "missing"); !errors.Is(err, protocol.ErrUnknownTopic) {
		t.Fatalf("unknown topic with auto-create off: %v", err)
	}
	if _, err := cl.RouteExisting(ctx, "missing"); !errors.Is(err, protocol.ErrUnknownTopic) {
		t.Fatalf("RouteExisting of an unknown topic: %v", err)
	}
	if _, err := cl.Route(ctx, "bad name!"); !errors.Is(err, protocol.ErrInvalid) {
		t.Fatalf("bad topic name: %v", err)
	}
}

func TestMalformedRequestsGetClearErrors(t *testing.T) {
	m := testcluster.StartMeta(t, 1, nil)
	_, leader := m.Leader()
	raw := transport.NewClient(leader.RPCAddr(), transport.ClientConfig{})
	defer raw.Close()
	ctx := context.Background()
	if _, err := raw.Call(ctx, protocol.CodeRouteLookup, []byte("{not json")); !errors.Is(err, protocol.ErrInvalid) {
		t.Fatalf("garbage route request: %v", err)
	}
	if _, err := raw.Call(ctx, protocol.CodeHeartbeat, []byte(`{"group":"g1"}`)); !errors.Is(err, protocol.ErrInvalid) {
		t.Fatalf("heartbeat without a broker: %v", err)
	}
	if _, err := raw.Call(ctx, protocol.CodeSend, nil); !errors.Is(err, protocol.ErrUnknownCode) {
		t.Fatalf("a broker's request code: %v", err)
	}
	if _, err := m.Client(t).Topics(ctx); err != nil {
		t.Fatalf("node stopped serving after bad requests: %v", err)
	}
}

func TestAddAndRemoveVoter(t *testing.T) {
	m := testcluster.StartMeta(t, 3, nil)
	n4, err := metaserver.New(testcluster.MetaConfig("m4", t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer n4.Close()
	if err := n4.Start(nil); err != nil { // not in the peer list: waits to be added
		t.Fatal(err)
	}
	ctx := context.Background()
	cl := m.Client(t)
	st, err := cl.AddVoter(ctx, api.VoterRequest{ID: "m4", RaftAddr: n4.RaftAddr(), RPCAddr: n4.RPCAddr()})
	if err != nil || len(st.Members) != 4 {
		t.Fatalf("add voter: %+v, %v", st, err)
	}
	// The 4-node cluster takes writes; this one is refused (no broker
	// group), asked of the leader directly: the client would retry the
	// retriable NO_ROUTE until its call timeout.
	_, leader := m.Leader()
	req, _ := json.Marshal(api.CreateTopicRequest{Name: "after-join", Queues: 1})
	if _, err := testcluster.Dial(t, leader.RPCAddr()).Call(ctx, protocol.CodeAdminCreateTopic, req); !errors.Is(err, protocol.ErrNoRoute) {
		t.Fatalf("creating a topic with no broker groups: %v", err)
	}
	testwait.For(t, 5*time.Second, "m4 to catch up", func() bool { return len(n4.FSM().Members()) == 4 })
	st, err = cl.RemoveVoter(ctx, "m4")
	if err != nil || len(st.Members) != 3 {
		t.Fatalf("remove voter: %+v, %v", st, err)
	}
}
