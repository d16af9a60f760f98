package clientcore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// fakeMeta answers lookups with the route it holds, counting them; while
// gate is set, every lookup waits for it to close (or for its context).
type fakeMeta struct {
	calls atomic.Int64
	mu    sync.Mutex
	gate  chan struct{}
	route routing.Route
	err   error
}

func (f *fakeMeta) set(version uint64, groups ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.route = routing.Route{Topic: "t", Version: version}
	for i, g := range groups {
		f.route.Queues = append(f.route.Queues, routing.QueueRoute{Queue: uint32(i), Group: g, Master: g + ":1", Writable: true})
	}
}

func (f *fakeMeta) lookup(ctx context.Context, topic string) (routing.Route, error) {
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
	return f.route, f.err
}

func newTestRoutes(f *fakeMeta, clk clockwork.Clock, edit func(*RoutesConfig[int])) *Routes[int] {
	cfg := RoutesConfig[int]{Lookup: f.lookup, Clock: clk, TTL: 30 * time.Second, MinRefresh: time.Second,
		Derive: func(_ string, r routing.Route, _ Source, _ *Entry[int]) int { return len(r.Queues) }}
	if edit != nil {
		edit(&cfg)
	}
	return NewRoutes(cfg)
}

// A route is fresh for its TTL by the cache's clock, and not a moment
// longer; the entry carries Derive's value of its route.
func TestRoutesTTL(t *testing.T) {
	clk := clockwork.NewFakeClock()
	f := &fakeMeta{}
	f.set(1, "g1", "g2")
	c := newTestRoutes(f, clk, nil)
	e, err := c.Lookup(context.Background(), "t")
	if err != nil {
		t.Fatal(err)
	}
	if !e.Known || e.Value != 2 || !e.Fetched.Equal(clk.Now()) || c.Get("t") != e {
		t.Fatalf("entry %+v after a lookup", e)
	}
	clk.Advance(30*time.Second - time.Nanosecond)
	if !c.Fresh(c.Get("t"), c.Now()) {
		t.Fatal("stale before its TTL")
	}
	clk.Advance(time.Nanosecond)
	if c.Fresh(c.Get("t"), c.Now()) {
		t.Fatal("fresh after its TTL")
	}
	if _, err := c.Lookup(context.Background(), "t"); err != nil {
		t.Fatal(err)
	}
	if !c.Fresh(c.Get("t"), c.Now()) {
		t.Fatal("a new lookup did not make it fresh")
	}
}

// N callers that miss at once make one lookup: the first calls the
// metaserver, the others wait for its answer and get the same entry.
func TestRoutesOneLookupPerTopic(t *testing.T) {
	const n = 32
	f := &fakeMeta{gate: make(chan struct{})}
	f.set(3, "g1")
	c := newTestRoutes(f, clockwork.NewFakeClock(), nil)
	entries := make([]*Entry[int], n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			entries[i], errs[i] = c.Lookup(context.Background(), "t")
		}()
	}
	testwait.For(t, 5*time.Second, "every caller to wait for the one lookup", func() bool {
		_, joined := c.Lookups()
		return joined == n-1
	})
	close(f.gate)
	wg.Wait()
	if calls := f.calls.Load(); calls != 1 {
		t.Fatalf("%d concurrent misses made %d lookups, want 1", n, calls)
	}
	for i := range n {
		if errs[i] != nil || entries[i] != entries[0] || entries[i].Route.Version != 3 {
			t.Fatalf("caller %d: %v %+v", i, errs[i], entries[i])
		}
	}
}

// When the caller that made the lookup gives up (its context ends), the
// callers still waiting look up again instead of failing with its error;
// one whose own context ends gets an error that matches protocol.ErrTimeout.
func TestRoutesLookupOutlivesItsFirstCaller(t *testing.T) {
	f := &fakeMeta{gate: make(chan struct{})}
	f.set(1, "g1")
	c := newTestRoutes(f, clockwork.NewFakeClock(), nil)
	first, cancel := context.WithCancel(context.Background())
	firstErr := make(chan error, 1)
	go func() {
		_, err := c.Lookup(first, "t")
		firstErr <- err
	}()
	testwait.For(t, 5*time.Second, "the first lookup", func() bool { return f.calls.Load() == 1 })
	second := make(chan error, 1)
	go func() {
		_, err := c.Lookup(context.Background(), "t")
		second <- err
	}()
	testwait.For(t, 5*time.Second, "the second caller to wait", func() bool {
		_, joined := c.Lookups()
		return joined == 1
	})
	short, cancelShort := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancelShort()
	if _, err := c.Lookup(short, "t"); !errors.Is(err, protocol.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a waiter whose deadline passed got %v, want a timeout", err)
	}
	cancel()
	if err := <-firstErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("the first caller got %v", err)
	}
	testwait.For(t, 5*time.Second, "the second caller's own lookup", func() bool { return f.calls.Load() == 2 })
	close(f.gate)
	if err := <-second; err != nil {
		t.Fatalf("the waiting caller failed with the first caller's error: %v", err)
	}
}

// Versions only move forward: a lookup answered by a lagging metaserver or
// a push older than the cached route is not stored, and the newer route
// stays; Stored hears only of routes stored.
func TestRoutesVersionsNeverMoveBack(t *testing.T) {
	clk := clockwork.NewFakeClock()
	f := &fakeMeta{}
	var stored []uint64
	c := newTestRoutes(f, clk, func(cfg *RoutesConfig[int]) {
		cfg.Stored = func(_ string, _, next *Entry[int]) { stored = append(stored, next.Route.Version) }
	})
	f.set(5, "g1", "g2")
	if _, err := c.Lookup(context.Background(), "t"); err != nil {
		t.Fatal(err)
	}
	f.set(3, "g1")
	clk.Advance(time.Second)
	e, err := c.Lookup(context.Background(), "t")
	if err != nil {
		t.Fatal(err)
	}
	if e.Route.Version != 5 || e.Value != 2 || c.Get("t").Route.Version != 5 {
		t.Fatalf("an older lookup replaced the route: %+v", e)
	}
	if !e.Tried.Equal(clk.Now()) || !e.Fetched.Equal(clk.Now()) {
		t.Errorf("the older answer's lookup was not noted: fetched %v, tried %v", e.Fetched, e.Tried)
	}
	if _, ok := c.Store("t", routing.Route{Topic: "t", Version: 4}, FromPush); ok || c.Get("t").Route.Version != 5 {
		t.Fatal("an older push replaced the route")
	}
	if e, ok := c.Store("t", routing.Route{Topic: "t", Version: 5, Queues: make([]routing.QueueRoute, 4)}, FromPush); !ok || e.Value != 4 {
		t.Fatal("the same version was not stored")
	}
	if e, ok := c.Store("t", routing.Route{Topic: "t", Version: 6}, FromPush); !ok || e.Route.Version != 6 || e.Source != FromPush {
		t.Fatal("a newer push was not stored")
	}
	if want := []uint64{5, 5, 6}; len(stored) != len(want) || stored[0] != 5 || stored[1] != 5 || stored[2] != 6 {
		t.Fatalf("Stored heard of versions %v, want %v", stored, want)
	}
}

// An error marks a route stale: it is no longer fresh, a refresh is due at
// once but at most once per MinRefresh, and the next stored route is fresh
// again. An unknown topic is not marked.
func TestRoutesStaleMarking(t *testing.T) {
	clk := clockwork.NewFakeClock()
	f := &fakeMeta{}
	f.set(1, "g1")
	c := newTestRoutes(f, clk, nil)
	if c.MarkStale("t") {
		t.Fatal("an unknown topic was marked")
	}
	if _, err := c.Lookup(context.Background(), "t"); err != nil {
		t.Fatal(err)
	}
	if !c.MarkStale("t") {
		t.Fatal("the first error asked for no refresh")
	}
	if e := c.Get("t"); !e.Stale || c.Fresh(e, c.Now()) || !e.Known {
		t.Fatalf("a marked route: %+v", e)
	}
	clk.Advance(999 * time.Millisecond)
	if c.MarkStale("t") {
		t.Fatal("a second refresh within MinRefresh")
	}
	clk.Advance(time.Millisecond)
	if !c.MarkStale("t") {
		t.Fatal("no refresh after MinRefresh")
	}
	if _, err := c.Lookup(context.Background(), "t"); err != nil {
		t.Fatal(err)
	}
	if e := c.Get("t"); e.Stale || !c.Fresh(e, c.Now()) {
		t.Fatalf("a route looked up again is still stale: %+v", e)
	}
}

// A failed lookup keeps the route the cache had, noting when it tried; a
// failed lookup of an unknown topic is remembered only with KeepMisses,
// and Prune forgets what it is told to.
func TestRoutesFailedLookups(t *testing.T) {
	clk := clockwork.NewFakeClock()
	f := &fakeMeta{}
	f.set(2, "g1")
	c := newTestRoutes(f, clk, nil)
	if _, err := c.Lookup(context.Background(), "t"); err != nil {
		t.Fatal(err)
	}
	f.err = errors.New("metaserver away")
	clk.Advance(time.Second)
	if _, err := c.Lookup(context.Background(), "t"); err == nil {
		t.Fatal("no error")
	}
	if e := c.Get("t"); !e.Known || e.Route.Version != 2 || !e.Tried.Equal(clk.Now()) || e.Fetched.Equal(clk.Now()) {
		t.Fatalf("after a failed lookup: %+v", e)
	}
	if _, err := c.Lookup(context.Background(), "nope"); err == nil || c.Get("nope") != nil {
		t.Fatal("a miss was remembered without KeepMisses")
	}
	keep := newTestRoutes(f, clk, func(cfg *RoutesConfig[int]) { cfg.KeepMisses = true })
	if _, err := keep.Lookup(context.Background(), "nope"); err == nil {
		t.Fatal("no error")
	}
	if e := keep.Get("nope"); e == nil || e.Known || !e.Tried.Equal(clk.Now()) {
		t.Fatalf("a remembered miss: %+v", e)
	}
	keep.Prune(func(topic string, e *Entry[int]) bool { return !e.Known })
	if keep.Get("nope") != nil {
		t.Fatal("Prune kept the miss")
	}
}
