package metaserver_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/routing"
)

// fakeClock is a fake clock at a fixed start, shared by a test's nodes.
func fakeClock() *clockwork.FakeClock {
	return clockwork.NewFakeClockAt(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
}

// startMeta starts an n-node cluster whose failure detection reads clk.
func startMeta(t *testing.T, n int, clk clockwork.Clock) *testcluster.Meta {
	t.Helper()
	return testcluster.StartMeta(t, n, func(c *metaserver.Config) { c.Clock = clk })
}

// judged moves clk by d and waits until s's judge has finished a round
// that saw the new time. d is at least a judge interval, so the judge's
// ticker fires on the way.
func judged(t *testing.T, m *testcluster.Meta, clk *clockwork.FakeClock, s *metaserver.Server, d time.Duration) {
	t.Helper()
	if d < m.Cfgs[0].JudgeInterval {
		t.Fatalf("moving the clock by %v, less than a judge interval (%v), may not tick", d, m.Cfgs[0].JudgeInterval)
	}
	clk.Advance(d)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitJudged(ctx, clk.Now()); err != nil {
		t.Fatalf("no judge round %v later: %v", d, err)
	}
}

// heartbeat sends one heartbeat of group's broker of role and returns the
// group as the reply carries it (judged after this heartbeat).
func heartbeat(t *testing.T, cl *client.Client, group string, role routing.Role, edit func(*api.Heartbeat)) routing.Group {
	t.Helper()
	hb := brokerHeartbeat(group, role)
	if edit != nil {
		edit(&hb)
	}
	resp, err := cl.Heartbeat(context.Background(), hb)
	if err != nil {
		t.Fatalf("heartbeat of %s's %s: %v", group, role, err)
	}
	return resp.Group
}

func brokerHeartbeat(group string, role routing.Role) api.Heartbeat {
	return api.Heartbeat{Group: group, Role: role, BrokerID: group + "-" + string(role),
		Addr: "127.0.0.1:1" + group[len(group)-1:], HAAddr: "127.0.0.1:2"}
}

func groupOf(t *testing.T, s *metaserver.Server, name string) routing.Group {
	t.Helper()
	g, _ := s.FSM().Group(name)
	return g
}

// fakeBroker heartbeats like a broker, every 100 ms until stopped.
type fakeBroker struct {
	cl       *client.Client
	hb       api.Heartbeat
	interval time.Duration

	mu       sync.Mutex
	lastErr  error
	lastResp api.HeartbeatReply

	stopCh chan struct{}
	done   chan struct{}
}

func startBroker(t *testing.T, cl *client.Client, group string, role routing.Role) *fakeBroker {
	b := &fakeBroker{cl: cl, interval: 100 * time.Millisecond, stopCh: make(chan struct{}), done: make(chan struct{}),
		hb: brokerHeartbeat(group, role)}
	go b.loop()
	t.Cleanup(b.stop)
	return b
}

func (b *fakeBroker) loop() {
	defer close(b.done)
	tick := time.NewTicker(b.interval)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := b.cl.Heartbeat(ctx, b.hb)
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

func (b *fakeBroker) stop() {
	select {
	case <-b.stopCh:
	default:
		close(b.stopCh)
	}
	<-b.done
}
