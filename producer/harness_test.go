package producer

import (
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/sdk"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start starts testcluster's cluster of groups with steady timings.
func start(tb testing.TB, slaves bool, groups ...string) *testcluster.Cluster {
	tb.Helper()
	return testcluster.Start(tb, testcluster.Opts{Groups: groups, Slaves: slaves, MetaEdit: testcluster.SteadyMeta, BrokerEdit: testcluster.SteadyBroker})
}

// newProducer is a producer of c's metaserver, closed by Cleanup.
func newProducer(tb testing.TB, c *testcluster.Cluster, opts ...Opt) *Client {
	tb.Helper()
	p, err := New(append([]Opt{sdk.MetaAddrs(c.MetaAddr())}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}

// pull reads one stored message back by its result.
func pull(tb testing.TB, tc *transport.Client, r Result) protocol.Message {
	tb.Helper()
	pr := testcluster.Pull(tb, tc, r.Topic, r.Queue, r.QueueOffset, 1)
	if len(pr.Messages) != 1 {
		tb.Fatalf("pull %+v: %d messages", r, len(pr.Messages))
	}
	return pr.Messages[0].Message
}

// cachedRoute is the producer's cached route of topic.
func cachedRoute(p *Client, topic string) (routing.Route, bool) {
	e := p.router.cache.Get(topic)
	if e == nil || !e.Known {
		return routing.Route{}, false
	}
	return e.Route, true
}

// routeWritable reports whether the producer's cached route of topic lets
// it send to group.
func routeWritable(p *Client, topic, group string) bool {
	r, _ := cachedRoute(p, topic)
	for _, q := range r.Queues {
		if q.Group == group && q.Writable {
			return true
		}
	}
	return false
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

// count is how many promises were called, and how many of them with an error.
func (p *promises) count() (called, failed int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.results) + len(p.errs), len(p.errs)
}
