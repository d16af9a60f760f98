package metaserver

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

func TestBootstrapAndRestartKeepState(t *testing.T) {
	c := newCluster(t, 3, nil)
	c.leader()
	cl := c.client()
	b := startBroker(t, cl, "g1", "master")
	waitFor(t, 5*time.Second, "g1 to register", func() bool { _, ok := c.nodes[0].FSM().Group("g1"); return ok })
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
	b.stop()
	waitFor(t, 5*time.Second, "every node to apply", func() bool {
		for _, s := range c.nodes {
			if g := groupOf(t, s, "g1"); g.Reasons&routing.Admin == 0 {
				return false
			}
		}
		return true
	})
	want := c.nodes[0].FSM().State()

	c.stopAll()
	for i := range c.nodes {
		c.restart(i)
	}
	c.leader()
	for i, s := range c.nodes {
		waitFor(t, 5*time.Second, "the log to replay", func() bool { return s.FSM().Version() >= want.Version })
		got := s.FSM().State()
		if len(got.Topics) != 1 || len(got.Groups) != 1 || got.Groups["g1"].Reasons&routing.Admin == 0 || len(got.Members) != 3 {
			t.Fatalf("node %d after restart: %+v", i, got)
		}
	}
	// Bootstrapping again on restart was skipped: the cluster has 3 members.
	st, err := c.client().RaftStatus(ctx)
	if err != nil || len(st.Members) != 3 {
		t.Fatalf("raft status after restart: %+v, %v", st, err)
	}
}

func TestLeaderLossKeepsRoutesAndHeartbeats(t *testing.T) {
	c := newCluster(t, 3, nil)
	c.leader()
	cl := c.client()
	b := startBroker(t, cl, "g1", "master")
	waitFor(t, 5*time.Second, "g1 to register", func() bool { _, ok := c.nodes[0].FSM().Group("g1"); return ok })
	ctx := context.Background()
	if _, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "t1", Queues: 2}); err != nil {
		t.Fatal(err)
	}
	old, leader := c.leader()
	versionBefore := groupOf(t, leader, "g1").Version

	killed := time.Now()
	c.stop(old)
	_, newLeader := c.leader()
	elected := time.Since(killed)
	// Heartbeats reach the new leader.
	var hbAt time.Duration
	waitFor(t, 5*time.Second, "a heartbeat accepted by the new leader", func() bool {
		info, err := cl.Groups(ctx)
		if err != nil || len(info) != 1 || info[0].MasterHeartbeatAgeMillis < 0 {
			return false
		}
		hbAt = time.Since(killed)
		return true
	})
	t.Logf("leader killed: new leader in %v, accepting heartbeats in %v", elected, hbAt)
	route, err := cl.Route(ctx, "t1")
	if err != nil || len(route.Queues) != 2 {
		t.Fatalf("route after failover: %+v, %v", route, err)
	}
	// The election alone expired nobody: g1 is writable at the version it had.
	time.Sleep(c.cfgs[0].SessionTimeout + 300*time.Millisecond)
	if g := groupOf(t, newLeader, "g1"); !g.Writable() || g.Version != versionBefore {
		t.Fatalf("g1 after the election and a session: %+v (version before %d)", g, versionBefore)
	}
	b.stop()
}

func TestHeartbeatLostMakesGroupReadOnly(t *testing.T) {
	c := newCluster(t, 3, nil)
	_, leader := c.leader()
	cl := c.client()
	b := startBroker(t, cl, "g1", "master")
	waitFor(t, 5*time.Second, "g1 to register", func() bool { _, ok := leader.FSM().Group("g1"); return ok })

	b.stop()
	stopped := time.Now()
	waitFor(t, 10*time.Second, "g1 read-only", func() bool { return !groupOf(t, leader, "g1").Writable() })
	took := time.Since(stopped)
	g := groupOf(t, leader, "g1")
	if g.Reasons != routing.HeartbeatLost {
		t.Fatalf("reasons %v, want heartbeat-lost", g.Reasons)
	}
	t.Logf("lost broker marked read-only after %v (session %v, heartbeat interval %v)", took, c.cfgs[0].SessionTimeout, b.interval)
	// Within one session and one heartbeat interval, plus scheduling slack.
	if limit := c.cfgs[0].SessionTimeout + b.interval + time.Second; took > limit {
		t.Fatalf("read-only after %v, over %v", took, limit)
	}

	b2 := startBroker(t, cl, "g1", "master")
	waitFor(t, 5*time.Second, "g1 writable again", func() bool { return groupOf(t, leader, "g1").Writable() })
	waitFor(t, 2*time.Second, "the heartbeat reply to carry the state", func() bool {
		b2.mu.Lock()
		defer b2.mu.Unlock()
		return b2.lastErr == nil && b2.lastResp.Group.Writable()
	})
}

func TestSlaveLagMakesGroupReadOnly(t *testing.T) {
	c := newCluster(t, 3, nil)
	_, leader := c.leader()
	cl := c.client()
	master := startBroker(t, cl, "g1", "master")
	startBroker(t, cl, "g1", "slave")
	waitFor(t, 5*time.Second, "the slave to register", func() bool { return groupOf(t, leader, "g1").Slave.ID != "" })

	master.setLag(c.cfgs[0].LagTime.Milliseconds() + 1)
	waitFor(t, 5*time.Second, "g1 read-only for slave lag", func() bool { return groupOf(t, leader, "g1").Reasons == routing.SlaveLag })
	waitFor(t, 2*time.Second, "the master to be told", func() bool {
		master.mu.Lock()
		defer master.mu.Unlock()
		return master.lastResp.Group.Reasons == routing.SlaveLag
	})
	master.setLag(0)
	waitFor(t, 5*time.Second, "g1 writable after the slave caught up", func() bool { return groupOf(t, leader, "g1").Writable() })
}

func TestAdminReadOnlyIsSticky(t *testing.T) {
	c := newCluster(t, 3, nil)
	_, leader := c.leader()
	cl := c.client()
	startBroker(t, cl, "g1", "master")
	waitFor(t, 5*time.Second, "g1 to register", func() bool { _, ok := leader.FSM().Group("g1"); return ok })
	ctx := context.Background()
	g, err := cl.SetGroupReadOnly(ctx, "g1", true)
	if err != nil || g.Reasons != routing.Admin {
		t.Fatalf("admin RO: %+v, %v", g, err)
	}
	time.Sleep(time.Second) // ten healthy heartbeats
	if g := groupOf(t, leader, "g1"); g.Reasons != routing.Admin {
		t.Fatalf("healthy heartbeats cleared an admin's read-only: %v", g.Reasons)
	}
	if g, err := cl.SetGroupReadOnly(ctx, "g1", false); err != nil || !g.Writable() {
		t.Fatalf("admin RW: %+v, %v", g, err)
	}
	if _, err := cl.SetGroupReadOnly(ctx, "nope", true); !errors.Is(err, protocol.ErrNotFound) {
		t.Fatalf("unknown group: %v", err)
	}
}

func TestRoutesOnEveryNode(t *testing.T) {
	c := newCluster(t, 3, nil)
	_, leader := c.leader()
	cl := c.client()
	startBroker(t, cl, "g1", "master")
	startBroker(t, cl, "g2", "master")
	waitFor(t, 5*time.Second, "two groups", func() bool { return len(leader.FSM().Groups()) == 2 })
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
	for i, s := range c.nodes {
		one, err := client.New(client.Config{Addrs: []string{s.RPCAddr()}})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "the node to apply", func() bool {
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
		for _, s := range c.nodes {
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
	c := newCluster(t, 1, func(cfg *Config) { cfg.AutoCreateTopics = false })
	c.leader()
	if _, err := c.client().Route(context.Background(), "missing"); !errors.Is(err, protocol.ErrUnknownTopic) {
		t.Fatalf("unknown topic with auto-create off: %v", err)
	}
	if _, err := c.client().RouteExisting(context.Background(), "missing"); !errors.Is(err, protocol.ErrUnknownTopic) {
		t.Fatalf("RouteExisting of an unknown topic: %v", err)
	}
	if _, err := c.client().Route(context.Background(), "bad name!"); !errors.Is(err, protocol.ErrInvalid) {
		t.Fatalf("bad topic name: %v", err)
	}
}

func TestMalformedRequestsGetClearErrors(t *testing.T) {
	c := newCluster(t, 1, nil)
	_, leader := c.leader()
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
	if _, err := c.client().Topics(ctx); err != nil {
		t.Fatalf("node stopped serving after bad requests: %v", err)
	}
}

func TestAddAndRemoveVoter(t *testing.T) {
	c := newCluster(t, 3, nil)
	c.leader()
	cfg := testConfig("m4", t.TempDir())
	n4, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n4.Close()
	if err := n4.Start(nil); err != nil { // not in the peer list: waits to be added
		t.Fatal(err)
	}
	ctx := context.Background()
	cl := c.client()
	st, err := cl.AddVoter(ctx, api.VoterRequest{ID: "m4", RaftAddr: n4.RaftAddr(), RPCAddr: n4.RPCAddr()})
	if err != nil || len(st.Members) != 4 {
		t.Fatalf("add voter: %+v, %v", st, err)
	}
	if _, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "after-join", Queues: 1, Groups: nil}); err == nil {
		t.Fatal("created a topic with no broker groups")
	}
	waitFor(t, 5*time.Second, "m4 to catch up", func() bool { return len(n4.FSM().Members()) == 4 })
	st, err = cl.RemoveVoter(ctx, "m4")
	if err != nil || len(st.Members) != 3 {
		t.Fatalf("remove voter: %+v, %v", st, err)
	}
}
