package broker

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

// fakeLookup answers route lookups from a table, counting them; while gate
// is not nil, every lookup waits for it.
type fakeLookup struct {
	calls atomic.Int64
	mu    sync.Mutex
	gate  chan struct{}
	route map[string][]string // topic -> group of each queue
	bases map[string][]int64  // topic -> base of each queue (nil: none moved)
	err   error
}

func (f *fakeLookup) RouteExisting(ctx context.Context, topic string) (routing.Route, error) {
	f.calls.Add(1)
	f.mu.Lock()
	gate := f.gate
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return routing.Route{}, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return routing.Route{}, f.err
	}
	groups, ok := f.route[topic]
	if !ok {
		return routing.Route{}, errors.New("unknown topic")
	}
	r := routing.Route{Topic: topic}
	for i, g := range groups {
		r.Queues = append(r.Queues, routing.QueueRoute{Queue: uint32(i), Group: g})
		if b := f.bases[topic]; b != nil {
			r.Queues[i].Base = b[i]
		}
	}
	return r, nil
}

func startRouteCache(t *testing.T, l *fakeLookup, clock clockwork.Clock) *routeCache {
	return startRouteCacheOn(t, l, clock, nil)
}

// startRouteCacheOn starts a route cache whose moved queues go to store.
func startRouteCacheOn(t *testing.T, l *fakeLookup, clock clockwork.Clock, store queueBases) *routeCache {
	t.Helper()
	c := newRouteCache("g1", l, clock, hclog.NewNullLogger())
	c.store = store
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return c
}

// settle waits until no lookup is queued or running.
func settle(t *testing.T, c *routeCache) {
	t.Helper()
	testwait.For(t, 5*time.Second, "the lookups to finish", func() bool {
		c.qmu.Lock()
		defer c.qmu.Unlock()
		return len(c.pending) == 0
	})
}

// A burst of misses while the metaserver hangs answers every message at
// once (not routed) and costs one lookup.
func TestRouteCacheMissesNeverWaitAndLookUpOnce(t *testing.T) {
	gate := make(chan struct{})
	l := &fakeLookup{gate: gate, route: map[string][]string{"t": {"g1", "g2"}}}
	c := startRouteCache(t, l, clockwork.NewFakeClock())

	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c.routed("t", 0) {
				t.Error("routed before any lookup returned")
			}
		}()
	}
	wg.Wait() // every check returned while the lookup hangs
	testwait.For(t, 5*time.Second, "the lookup to start", func() bool { return l.calls.Load() == 1 })
	if c.routed("t", 0) {
		t.Fatal("routed while the lookup hangs")
	}
	close(gate)
	testwait.For(t, 5*time.Second, "the route to be cached", func() bool { return c.routed("t", 0) })
	if c.routed("t", 1) {
		t.Fatal("queue 1 belongs to g2")
	}
	if n := l.calls.Load(); n != 1 {
		t.Fatalf("%d lookups for one topic, want 1", n)
	}
}

// A known route is served without lookups while fresh, still served while
// a refresh runs once it is stale (and while the metaserver is away), and
// a queue not routed here is looked up again at most once per interval.
func TestRouteCacheFreshnessAndRefresh(t *testing.T) {
	clock := clockwork.NewFakeClock()
	l := &fakeLookup{route: map[string][]string{"t": {"g1", "g2"}}}
	c := startRouteCache(t, l, clock)
	c.routed("t", 0)
	testwait.For(t, 5*time.Second, "the route", func() bool { return c.routed("t", 0) })
	settle(t, c)
	base := l.calls.Load()

	for range 100 {
		c.routed("t", 0)
	}
	if n := l.calls.Load(); n != base {
		t.Fatalf("%d lookups for a fresh route", n-base)
	}

	// Not routed here: at most one lookup per routeMinRefresh.
	for round := range int64(2) {
		clock.Advance(routeMinRefresh)
		for range 100 {
			if c.routed("t", 1) {
				t.Fatal("queue 1 belongs to g2")
			}
		}
		settle(t, c)
		if n := l.calls.Load(); n != base+round+1 {
			t.Fatalf("round %d: %d lookups, want %d", round, n-base, round+1)
		}
	}
	base += 2

	// Stale, metaserver away: the old route is served, and refreshed in the background.
	l.mu.Lock()
	l.err = errors.New("metaserver unreachable")
	l.mu.Unlock()
	clock.Advance(routeTTL)
	if !c.routed("t", 0) {
		t.Fatal("a stale route must be served while it is refreshed")
	}
	testwait.For(t, 5*time.Second, "the stale refresh", func() bool { return l.calls.Load() == base+1 })
	if !c.routed("t", 0) {
		t.Fatal("a failed refresh must keep the last known route")
	}
}

// Unknown topics are forgotten after a TTL, so made-up names do not pile up.
func TestRouteCachePrunesUnknownTopics(t *testing.T) {
	clock := clockwork.NewFakeClock()
	l := &fakeLookup{route: map[string][]string{"t": {"g1"}}}
	c := startRouteCache(t, l, clock)
	c.routed("t", 0)
	c.routed("nope", 0)
	cached := func(topic string) bool { return c.routes.Get(topic) != nil }
	testwait.For(t, 5*time.Second, "both lookups", func() bool { return cached("t") && cached("nope") })
	settle(t, c)
	clock.Advance(routeTTL)
	testwait.For(t, 5*time.Second, "the unknown topic to be pruned", func() bool { return !cached("nope") })
	kept := cached("t")
	if !kept {
		t.Fatal("a topic with queues here was pruned")
	}
}

// A pushed route serves at once, and a lookup that was already running
// when the push came, and answers the older route, does not replace it.
func TestPushedRouteOutlivesAnOlderLookup(t *testing.T) {
	gate := make(chan struct{})
	l := &fakeLookup{gate: gate, route: map[string][]string{"t": {"g1", "g2"}}} // the route before two queues were added (version 0)
	c := startRouteCache(t, l, clockwork.NewFakeClock())
	if c.routed("t", 2) {
		t.Fatal("routed before any lookup or push")
	}
	testwait.For(t, 5*time.Second, "the lookup to start", func() bool { return l.calls.Load() == 1 })
	c.take(api.RouteWatchReply{Version: 7, Topics: []api.PushedTopic{{Name: "t", Queues: 4, Mine: []uint32{0, 2}}}})
	if !c.routed("t", 2) || c.routed("t", 3) {
		t.Fatal("the pushed route is not served")
	}
	close(gate)
	settle(t, c)
	if !c.routed("t", 2) {
		t.Fatal("the older lookup replaced the pushed route")
	}
}

// A queue moved to this group counts as routed here only once the commit
// log continues it at its base, so no append gives it a lower offset: the
// lookup sets the base before the queue counts; a log that lost it (a
// truncation cut the queue's records) makes the queue not routed until a
// lookup sets it again; and a log holding older records of the queue
// refuses the base, and the queue stays not routed here.
func TestRouteCacheTakesMovedQueuesUp(t *testing.T) {
	log := openLog(t)
	if _, err := log.Append([]storage.Entry{{Topic: "old", Payload: []byte("a")}, {Topic: "old", Payload: []byte("b")}}, false); err != nil {
		t.Fatal(err)
	}
	clock := clockwork.NewFakeClock()
	l := &fakeLookup{route: map[string][]string{"t": {"g1", "g2", "g1"}, "old": {"g1"}},
		bases: map[string][]int64{"t": {100, 7, 0}, "old": {50}}}
	c := startRouteCacheOn(t, l, clock, log)
	c.routed("t", 0)
	testwait.For(t, 5*time.Second, "the moved queue to be routed here", func() bool { return c.routed("t", 0) })
	if first, next := log.QueueRange("t", 0); first != 100 || next != 100 {
		t.Fatalf("the moved queue's range [%d,%d), want [100,100)", first, next)
	}
	if first, next := log.QueueRange("t", 1); next != 0 || first != 0 {
		t.Fatalf("another group's moved queue was taken up: [%d,%d)", first, next)
	}
	if !c.routed("t", 2) {
		t.Fatal("a queue that never moved")
	}
	pos, err := log.Append([]storage.Entry{{Topic: "t", Queue: 0, Payload: []byte("x")}}, false)
	if err != nil || pos[0].QueueOffset != 100 {
		t.Fatalf("the moved queue's first message at %d, %v; want 100", pos[0].QueueOffset, err)
	}

	// A truncation cuts its records: not routed until the base is back.
	if _, err := log.Truncate(pos[0].LogOffset, filepath.Join(t.TempDir(), "cut.log")); err != nil {
		t.Fatal(err)
	}
	if c.routed("t", 0) {
		t.Fatal("routed here while the log would give the queue offset 0")
	}
	clock.Advance(routeMinRefresh)
	testwait.For(t, 5*time.Second, "the base to be set again", func() bool { clock.Advance(routeMinRefresh); return c.routed("t", 0) })
	if _, next := log.QueueRange("t", 0); next != 100 {
		t.Fatalf("after the lookup the queue goes on at %d, want 100", next)
	}

	// A log with older records of the queue cannot take it up at 50.
	c.routed("old", 0)
	settle(t, c)
	if c.routed("old", 0) {
		t.Fatal("a queue the log cannot continue at its base is routed here")
	}
	if first, next := log.QueueRange("old", 0); first != 0 || next != 2 {
		t.Fatalf("the refused base changed the queue: [%d,%d)", first, next)
	}
}
