package metaserver

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/internal/testlog"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/routing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testConfig is a node config with timings shrunk for tests.
func testConfig(id, dir string) Config {
	return Config{
		ID: id, Dir: dir, RaftAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0",
		AutoCreateTopics: true, DefaultQueues: 4,
		SessionTimeout: time.Second, LagBytes: 1 << 20, LagTime: 500 * time.Millisecond,
		RecoverHeartbeats: 3, JudgeInterval: 50 * time.Millisecond,
		RaftHeartbeatTimeout: 300 * time.Millisecond, RaftElectionTimeout: 300 * time.Millisecond,
		RaftLeaderLeaseTimeout: 150 * time.Millisecond,
		Logger:                 testlog.New(id),
	}
}

type cluster struct {
	t     *testing.T
	cfgs  []Config
	nodes []*Server // nil when stopped
	peers []Peer
}

// newCluster starts n nodes bootstrapped from one peer list.
func newCluster(t *testing.T, n int, edit func(*Config)) *cluster {
	t.Helper()
	c := &cluster{t: t}
	for i := range n {
		cfg := testConfig(fmt.Sprintf("m%d", i+1), t.TempDir())
		if edit != nil {
			edit(&cfg)
		}
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		// Restarts reuse the ports picked now.
		cfg.RaftAddr, cfg.RPCAddr = s.RaftAddr(), s.RPCAddr()
		c.cfgs = append(c.cfgs, cfg)
		c.nodes = append(c.nodes, s)
		c.peers = append(c.peers, Peer{ID: cfg.ID, RaftAddr: cfg.RaftAddr, RPCAddr: cfg.RPCAddr})
	}
	for _, s := range c.nodes {
		if err := s.Start(c.peers); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(c.stopAll)
	return c
}

func (c *cluster) stop(i int) {
	if c.nodes[i] != nil {
		_ = c.nodes[i].Close()
		c.nodes[i] = nil
	}
}

func (c *cluster) stopAll() {
	for i := range c.nodes {
		c.stop(i)
	}
}

func (c *cluster) restart(i int) {
	c.t.Helper()
	cfg := c.cfgs[i]
	cfg.Peers = c.peers
	s, err := Open(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.nodes[i] = s
}

func (c *cluster) addrs() []string {
	var out []string
	for _, p := range c.peers {
		out = append(out, p.RPCAddr)
	}
	return out
}

// leader waits for a node whose leader work is ready.
func (c *cluster) leader() (int, *Server) {
	c.t.Helper()
	var idx int
	var leader *Server
	waitFor(c.t, 10*time.Second, "a leader", func() bool {
		for i, s := range c.nodes {
			if s != nil && s.IsLeader() {
				idx, leader = i, s
				return true
			}
		}
		return false
	})
	return idx, leader
}

func (c *cluster) client() *client.Client {
	cl, err := client.New(client.Config{Addrs: c.addrs(), CallTimeout: 10 * time.Second})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = cl.Close() })
	return cl
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fakeBroker heartbeats like a broker, with a lag the test can change.
type fakeBroker struct {
	cl       *client.Client
	hb       api.Heartbeat
	interval time.Duration

	mu       sync.Mutex
	lagMs    int64
	lastErr  error
	lastResp api.HeartbeatReply

	stopCh chan struct{}
	done   chan struct{}
}

func startBroker(t *testing.T, cl *client.Client, group string, role routing.Role) *fakeBroker {
	b := &fakeBroker{cl: cl, interval: 100 * time.Millisecond, stopCh: make(chan struct{}), done: make(chan struct{}),
		hb: api.Heartbeat{Group: group, Role: role, BrokerID: group + "-" + string(role), Addr: "127.0.0.1:1" + group[len(group)-1:], HAAddr: "127.0.0.1:2"}}
	go b.loop()
	t.Cleanup(b.stop)
	return b
}

func (b *fakeBroker) loop() {
	defer close(b.done)
	tick := time.NewTicker(b.interval)
	defer tick.Stop()
	for {
		b.mu.Lock()
		hb := b.hb
		hb.LagMillis = b.lagMs
		hb.SlaveConnected = b.lagMs == 0
		b.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := b.cl.Heartbeat(ctx, hb)
		cancel()
		b.mu.Lock()
		b.lastErr, b.lastResp = err, resp
		b.mu.Unlock()
		select {
		case <-b.stopCh:
			return
		case <-tick.C:
		}
	}
}

func (b *fakeBroker) setLag(ms int64) {
	b.mu.Lock()
	b.lagMs = ms
	b.mu.Unlock()
}

func (b *fakeBroker) stop() {
	select {
	case <-b.stopCh:
	default:
		close(b.stopCh)
	}
	<-b.done
}

func groupOf(t *testing.T, s *Server, name string) routing.Group {
	t.Helper()
	g, _ := s.FSM().Group(name)
	return g
}
