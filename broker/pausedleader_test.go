package broker_test

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver"
)

// TestPausedMetaLeaderKeepsGroupsWritable: the metaserver leader stops
// answering without closing anything (a SIGSTOPped process: its RPC port
// still takes connections) while the other two elect a new leader. The
// broker, whose cached leader is the paused one, must find the new leader:
// the new leader hears its heartbeats and the group stays writable, a
// session later too.
//
// Each metaserver's RPC address is a proxy in front of it (the address the
// nodes advertise, so NOT_LEADER answers name proxies too); the paused
// leader is its proxy frozen (taking connections, forwarding nothing, its
// clients' connections left open) and the node itself stopped, so that
// raft elects another.
func TestPausedMetaLeaderKeepsGroupsWritable(t *testing.T) {
	const n = 3
	proxies := make([]*freezeProxy, n)
	for i := range proxies {
		proxies[i] = startFreezeProxy(t)
	}
	next := 0
	m := testcluster.StartMeta(t, n, func(c *metaserver.Config) {
		testcluster.SteadyMeta(c)
		c.RPCAddr, c.AdvertiseRPC = proxies[next].target, proxies[next].addr
		next++
	})
	g := testcluster.StartGroup(t, m.Addrs(), "g1", testcluster.GroupOpts{Edit: testcluster.SteadyBroker})
	li, old := m.Leader()
	// The broker's heartbeats go to the leader: it is the broker's cached one.
	testwait.For(t, 10*time.Second, "the leader to hear the broker", func() bool { return old.Heartbeats() > 0 })

	proxies[li].freeze()
	m.Stop(li)
	_, leader := m.Leader()

	groupWritable := func() bool {
		grp, ok := leader.FSM().Group("g1")
		return ok && grp.Writable()
	}
	testwait.For(t, 20*time.Second, "the new leader to hear g1's master, with g1 writable", func() bool {
		return leader.Heartbeats() > 0 && groupWritable() && g.Master.Writable()
	})
	// A session later, by the new leader's judge, it still is: the broker
	// keeps reaching the new leader while the old one stays paused.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := leader.WaitJudged(ctx, time.Now().Add(m.Cfgs[li].SessionTimeout+time.Second)); err != nil {
		t.Fatal(err)
	}
	if !groupWritable() || !g.Master.Writable() {
		t.Fatalf("a session after the new leader heard it, g1 writable at the leader: %v, master writable: %v", groupWritable(), g.Master.Writable())
	}
}

// freezeProxy forwards connections at addr to target until frozen; then
// it takes connections and forwards nothing, and leaves its clients'
// connections open: to them it is a paused process.
type freezeProxy struct {
	addr, target string
	ln           net.Listener

	mu      sync.Mutex
	frozen  bool
	closed  bool
	clients []net.Conn
	ups     []net.Conn
	wg      sync.WaitGroup
}

func startFreezeProxy(t *testing.T) *freezeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The node behind listens here (a port the kernel picked, let go).
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezeProxy{addr: ln.Addr().String(), target: tl.Addr().String(), ln: ln}
	_ = tl.Close()
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *freezeProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return
		}
		p.clients = append(p.clients, c)
		frozen := p.frozen
		p.mu.Unlock()
		if frozen {
			continue // taken, never answered
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = up.Close()
			return
		}
		p.ups = append(p.ups, up)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); _, _ = io.Copy(up, c); p.hangUp(c, up) }()
		go func() { defer p.wg.Done(); _, _ = io.Copy(c, up); p.hangUp(c, up) }()
	}
}

// hangUp ends a forwarded pair, leaving the client's side open once frozen.
func (p *freezeProxy) hangUp(c, up net.Conn) {
	_ = up.Close()
	p.mu.Lock()
	frozen := p.frozen
	p.mu.Unlock()
	if !frozen {
		_ = c.Close()
	}
}

// freeze stops forwarding: the connections to the node are cut, those of
// the clients stay open and get nothing more.
func (p *freezeProxy) freeze() {
	p.mu.Lock()
	p.frozen = true
	ups := p.ups
	p.mu.Unlock()
	for _, up := range ups {
		_ = up.Close()
	}
}

func (p *freezeProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for _, c := range append(p.clients, p.ups...) {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
