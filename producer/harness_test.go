package producer

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/testlog"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// cluster is an in-process metaserver and broker groups on loopback.
type cluster struct {
	meta    *metaserver.Server
	masters map[string]*broker.Broker
	slaves  map[string]*broker.Broker
	closers []func()
}

func (c *cluster) Close() {
	for i := len(c.closers) - 1; i >= 0; i-- {
		c.closers[i]()
	}
}

type clusterOpts struct {
	groups  []string
	slaves  bool
	autoOff bool
	flush   storage.FlushMode
	dirs    func() string
}

// startCluster starts a one-node metaserver and a master (and slave) per group.
func startCluster(tb testing.TB, o clusterOpts) *cluster {
	tb.Helper()
	c, err := newCluster(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

func newCluster(o clusterOpts) (*cluster, error) {
	c := &cluster{masters: map[string]*broker.Broker{}, slaves: map[string]*broker.Broker{}}
	meta, err := metaserver.New(metaserver.Config{
		ID: "m1", Dir: o.dirs(), RaftAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0",
		AutoCreateTopics: !o.autoOff, DefaultQueues: 4, SessionTimeout: 2 * time.Second, LagTime: time.Minute,
		RecoverHeartbeats: 2, JudgeInterval: 50 * time.Millisecond,
		RaftHeartbeatTimeout: 200 * time.Millisecond, RaftElectionTimeout: 200 * time.Millisecond,
		RaftLeaderLeaseTimeout: 100 * time.Millisecond, Logger: testlog.New("meta"),
	})
	if err != nil {
		return nil, err
	}
	c.meta = meta
	c.closers = append(c.closers, func() { _ = meta.Close() })
	if err := meta.Start([]metaserver.Peer{{ID: "m1", RaftAddr: meta.RaftAddr(), RPCAddr: meta.RPCAddr()}}); err != nil {
		c.Close()
		return nil, err
	}
	for _, g := range o.groups {
		roles := []routing.Role{routing.RoleMaster}
		if o.slaves {
			roles = append(roles, routing.RoleSlave)
		}
		for _, role := range roles {
			b, err := broker.New(broker.Config{
				ID: g + "-" + string(role), Group: g, Role: role, Dir: o.dirs(), Addr: "127.0.0.1:0", MetaAddrs: []string{meta.RPCAddr()},
				HeartbeatInterval: 100 * time.Millisecond, SessionTimeout: 2 * time.Second, HAFetchWait: 20 * time.Millisecond,
				SegmentSize: 256 << 20, Flush: o.flush, Logger: testlog.New(g + "-" + string(role)),
			})
			if err != nil {
				c.Close()
				return nil, err
			}
			c.closers = append(c.closers, func() { _ = b.Close() })
			if role == routing.RoleMaster {
				c.masters[g] = b
			} else {
				c.slaves[g] = b
			}
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for g, m := range c.masters {
		for !m.Writable() || (o.slaves && !m.Slave().Connected) {
			if time.Now().After(deadline) {
				c.Close()
				return nil, errTimeout("group " + g + " to be ready")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return c, nil
}

type errTimeout string

func (e errTimeout) Error() string { return "timed out waiting for " + string(e) }

func (c *cluster) metaClient(tb testing.TB) *client.Client {
	cl, err := client.New(client.Config{Addrs: []string{c.meta.RPCAddr()}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cl.Close() })
	return cl
}

func (c *cluster) createTopic(tb testing.TB, name string, groups ...string) {
	tb.Helper()
	if _, err := c.metaClient(tb).CreateTopic(context.Background(), api.CreateTopicRequest{Name: name, Queues: len(groups), Groups: groups}); err != nil {
		tb.Fatal(err)
	}
}

func newProducer(tb testing.TB, c *cluster, opts ...Opt) *Client {
	tb.Helper()
	p, err := New(append([]Opt{MetaAddrs(c.meta.RPCAddr())}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}

// pull reads one stored message back by its result.
func pull(tb testing.TB, addr string, r Result) protocol.Message {
	tb.Helper()
	tc := transport.NewClient(addr, transport.ClientConfig{})
	defer tc.Close()
	resp, err := tc.Call(context.Background(), protocol.CodePull, protocol.AppendPullRequest(nil, &protocol.PullRequest{Topic: r.Topic, Queue: r.Queue, Offset: r.QueueOffset, MaxBytes: 1}))
	if err != nil {
		tb.Fatal(err)
	}
	pr, err := protocol.DecodePullResponse(resp.Body)
	if err != nil || len(pr.Messages) != 1 {
		tb.Fatalf("pull %+v: %d messages, %v", r, len(pr.Messages), err)
	}
	return pr.Messages[0].Message
}

func waitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// promises counts the results of async sends, and fails on a second call.
type promises struct {
	tb      testing.TB
	mu      sync.Mutex
	results map[string]Result
	errs    []error
	calls   map[int]int
	wg      sync.WaitGroup
}

func newPromises(tb testing.TB) *promises {
	return &promises{tb: tb, results: map[string]Result{}, calls: map[int]int{}}
}

func (p *promises) next(i int) func(Result, error) {
	p.wg.Add(1)
	return func(r Result, err error) {
		p.mu.Lock()
		p.calls[i]++
		if p.calls[i] > 1 {
			p.mu.Unlock()
			p.tb.Errorf("promise %d called %d times", i, p.calls[i])
			return
		}
		if err != nil {
			p.errs = append(p.errs, err)
		} else {
			p.results[r.ID] = r
		}
		p.mu.Unlock()
		p.wg.Done()
	}
}
