package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is a cluster and the group coordinator the consumers use: the
// metaserver's, or a fake one per group (fake set).
type env struct {
	cl    *testcluster.Cluster
	meta  *client.Client
	fake  bool
	mu    sync.Mutex
	fakes map[string]*fakeCoord
}

// metaHasGroups reports whether the metaserver serves consumer groups.
func metaHasGroups(t testing.TB, meta *client.Client) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := meta.ConsumerGroups(ctx, "")
	if errors.Is(err, protocol.ErrUnknownCode) {
		return false
	}
	if err != nil {
		t.Logf("consumer groups: %v", err)
	}
	return err == nil
}

// forEachCoord runs f with a fake coordinator and, when the metaserver
// serves consumer groups, with the metaserver's.
func forEachCoord(t *testing.T, groups []string, f func(t *testing.T, e *env)) {
	t.Run("fake", func(t *testing.T) { f(t, startEnv(t, groups, true)) })
	t.Run("meta", func(t *testing.T) {
		e := startEnv(t, groups, false)
		if !metaHasGroups(t, e.meta) {
			t.Skip("the metaserver does not serve consumer groups yet")
		}
		f(t, e)
	})
}

func startEnv(t testing.TB, groups []string, fake bool) *env {
	cl := testcluster.Start(t, testcluster.Opts{Groups: groups, MetaEdit: testcluster.SteadyMeta, BrokerEdit: testcluster.SteadyBroker})
	return &env{cl: cl, meta: cl.Meta.Client(t), fake: fake, fakes: map[string]*fakeCoord{}}
}

// coord is the fake coordinator of group (made on first use, knowing the
// topics' queue counts), or nil with the metaserver's.
func (e *env) coord(t testing.TB, group string, topics []string) *fakeCoord {
	if !e.fake {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if f := e.fakes[group]; f != nil {
		return f
	}
	counts := map[string]int{}
	for _, tp := range topics {
		r, err := e.meta.RouteExisting(context.Background(), tp)
		if err != nil {
			t.Fatal(err)
		}
		counts[tp] = len(r.Queues)
	}
	f := newFakeCoord(counts)
	e.fakes[group] = f
	return f
}

// consumer is a consumer of e's cluster with test timings, closed by
// Cleanup.
func (e *env) consumer(t testing.TB, group string, topics []string, opts ...Opt) *Consumer {
	t.Helper()
	all := []Opt{sdk.MetaAddrs(e.cl.MetaAddr()), Heartbeat(100 * time.Millisecond), Session(2 * time.Second),
		AutoCommit(100 * time.Millisecond), PollWait(200 * time.Millisecond), RetryBackoff(5*time.Millisecond, 20*time.Millisecond)}
	if f := e.coord(t, group, topics); f != nil {
		all = append(all, withCoordinator(f))
	}
	c, err := New(group, topics, append(all, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// committed is group's committed offset of a queue (-1: none).
func (e *env) committed(t testing.TB, group, topic string, queue uint32) int64 {
	t.Helper()
	if e.fake {
		e.mu.Lock()
		f := e.fakes[group]
		e.mu.Unlock()
		return f.offset(topic, queue)
	}
	gs, err := e.meta.ConsumerGroups(context.Background(), group)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gs {
		for _, o := range g.Offsets {
			if o.Topic == topic && o.Queue == queue {
				return o.Offset
			}
		}
	}
	return -1
}

// send sends n messages to topic, bodies prefix-0, prefix-1, ..., and
// returns their ids.
func send(t testing.TB, e *env, topic, prefix string, n int) []string {
	t.Helper()
	p, err := producer.New(sdk.MetaAddrs(e.cl.Meta.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ids := make([]string, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i := range n {
		wg.Add(1)
		p.SendAsync(context.Background(), &producer.Message{Topic: topic, Key: fmt.Sprint("k", i%16), Body: fmt.Appendf(nil, "%s-%d", prefix, i)},
			func(r producer.Result, err error) {
				defer wg.Done()
				mu.Lock()
				defer mu.Unlock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				ids[i] = r.ID
			})
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	return ids
}

// recorder collects what handlers saw.
type recorder struct {
	mu     sync.Mutex
	seen   map[string]int     // body -> deliveries seen
	by     map[string]string  // body -> the member that handled it last
	order  map[string][]int64 // offsets handled per member and queue, in order
	notify chan struct{}
}

func newRecorder() *recorder {
	return &recorder{seen: map[string]int{}, by: map[string]string{}, order: map[string][]int64{}, notify: make(chan struct{}, 1)}
}

func (r *recorder) handler(member string) Handler {
	return func(ctx context.Context, m *Message) error {
		r.mu.Lock()
		r.seen[string(m.Body)]++
		r.by[string(m.Body)] = member
		k := member + " " + qkey{m.Topic, m.Queue}.String()
		r.order[k] = append(r.order[k], m.Offset)
		r.mu.Unlock()
		signal(r.notify)
		return nil
	}
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// waitFor waits until cond holds, up to d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testwait.ForEvery(t, d, 10*time.Millisecond, what, cond)
}

// runIn runs c.Run in a goroutine; the returned func stops it and waits.
func runIn(t testing.TB, c *Consumer, h Handler) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, h) }()
	stop := func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}
	var once sync.Once
	t.Cleanup(func() { once.Do(stop) })
	return func() { once.Do(stop) }
}

// queuesOf is the queues c holds.
func queuesOf(c *Consumer) map[qkey]bool {
	out := map[qkey]bool{}
	for _, q := range c.Stats().Queues {
		out[qkey{q.Topic, q.Queue}] = true
	}
	return out
}
