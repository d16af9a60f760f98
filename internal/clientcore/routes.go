package clientcore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// Source says where a stored route came from.
type Source uint8

const (
	// FromLookup is a route read from the metaserver (RoutesConfig.Lookup,
	// or a lookup the owner made).
	FromLookup Source = iota
	// FromPush is a route the metaserver leader pushed (a broker's
	// ROUTE_WATCH): it may carry less than a lookup does.
	FromPush
)

// Entry is a topic's cached route. An entry is never modified: every change
// stores a new one, so a reader holds a consistent view without a lock, and
// comparing pointers says whether the entry changed since it was read.
type Entry[V any] struct {
	Route routing.Route // the zero Route until Known
	// Value is RoutesConfig.Derive's, made from Route when it was stored.
	Value V
	// Known: a lookup or a push succeeded (false: lookups failed so far,
	// remembered only with RoutesConfig.KeepMisses).
	Known  bool
	Source Source
	// Fetched is the last successful lookup or push (zero: none), one that
	// answered an older route than the entry's included (the metaserver
	// answered: the entry is at least as new); Tried the last lookup,
	// successful or not, or push.
	Fetched, Tried time.Time
	// Stale: MarkStale was called since Fetched (an error said the route
	// may be wrong).
	Stale bool
	// forced is when MarkStale last asked for a refresh.
	forced time.Time
}

// RoutesConfig configures a Routes cache.
type RoutesConfig[V any] struct {
	// Lookup reads a topic's route: the metaserver (Route, which may create
	// the topic, or RouteExisting), plus whatever the owner does before the
	// route may count (the broker takes moved queues up). Required.
	Lookup func(ctx context.Context, topic string) (routing.Route, error)
	// Derive makes an entry's Value from its route, the route's source and
	// the entry it replaces (nil: none, or one not Known). It runs under
	// the cache's lock: it must be quick and call nothing of the cache.
	// nil: the zero V.
	Derive func(topic string, r routing.Route, src Source, prev *Entry[V]) V
	// Stored, if set, is called after each stored route with the entry it
	// replaced (nil: none) and the new one, outside the lock. Calls for one
	// topic may come out of order when stores race: compare versions.
	Stored func(topic string, prev, next *Entry[V])
	// TTL is how long a route counts as fresh (Fresh). Default 30 s.
	TTL time.Duration
	// MinRefresh spaces the refreshes MarkStale asks for, per topic.
	// Default 1 s.
	MinRefresh time.Duration
	// KeepMisses remembers a failed lookup of a topic not known yet (an
	// entry that is not Known, with Tried set), so that the owner can space
	// lookups of names nobody has; Prune forgets them.
	KeepMisses bool
	// Clock times entries. Default: the real clock.
	Clock clockwork.Clock
}

// Routes is the route cache of a producer, a consumer or a broker: one entry
// per topic, read without waiting (Get), looked up once per topic at a time
// however many callers miss at once (Lookup), refreshed by pushes (Store),
// whose versions only move forward: a route older than the one cached is
// never stored (a lookup answered by a metaserver that lags, or a push
// overtaken by a lookup). It is safe for concurrent use.
type Routes[V any] struct {
	cfg RoutesConfig[V]

	mu     sync.RWMutex
	topics map[string]*Entry[V] // replaced, never modified, per topic

	fmu     sync.Mutex
	flights map[string]*flight[V] // lookups under way, per topic

	// lookups counts the lookups made; joined the callers that waited for
	// another's instead of making their own.
	lookups, joined atomic.Int64
}

// flight is one lookup under way; done closes when e or err is set.
type flight[V any] struct {
	done     chan struct{}
	e        *Entry[V]
	err      error
	ctxEnded bool // the lookup failed because its caller's context ended
}

// NewRoutes returns an empty cache.
func NewRoutes[V any](cfg RoutesConfig[V]) *Routes[V] {
	if cfg.TTL <= 0 {
		cfg.TTL = 30 * time.Second
	}
	if cfg.MinRefresh <= 0 {
		cfg.MinRefresh = time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	return &Routes[V]{cfg: cfg, topics: map[string]*Entry[V]{}, flights: map[string]*flight[V]{}}
}

// Get returns topic's entry, or nil; it never waits for a lookup. The entry
// may not be Known (a remembered miss).
func (c *Routes[V]) Get(topic string) *Entry[V] {
	c.mu.RLock()
	e := c.topics[topic]
	c.mu.RUnlock()
	return e
}

// Fresh reports whether e is a route younger than the TTL that no error
// marked stale.
func (c *Routes[V]) Fresh(e *Entry[V], now time.Time) bool {
	return e != nil && e.Known && !e.Stale && now.Sub(e.Fetched) < c.cfg.TTL
}

// Now is the cache's clock's time.
func (c *Routes[V]) Now() time.Time { return c.cfg.Clock.Now() }

// Lookups counts the lookups the cache made, and joined the Lookup calls
// that waited for one under way instead.
func (c *Routes[V]) Lookups() (made, joined int64) { return c.lookups.Load(), c.joined.Load() }

// Lookup looks topic up and stores the route (unless the cache holds a
// newer one, which it returns instead). Callers that miss at once share one
// lookup: only the first calls RoutesConfig.Lookup, with its own context;
// the others wait for its answer or for their own context's end. When the
// first caller's context ends before an answer, the others still waiting
// look up again. A failed lookup keeps the cached entry and returns the
// error.
func (c *Routes[V]) Lookup(ctx context.Context, topic string) (*Entry[V], error) {
	for {
		c.fmu.Lock()
		f := c.flights[topic]
		if f == nil {
			f = &flight[V]{done: make(chan struct{})}
			c.flights[topic] = f
			c.fmu.Unlock()
			c.fly(ctx, topic, f)
			return f.e, f.err
		}
		c.fmu.Unlock()
		c.joined.Add(1)
		select {
		case <-f.done:
		case <-ctx.Done():
			return nil, waitEnded(ctx, topic)
		}
		if f.err != nil && f.ctxEnded && ctx.Err() == nil {
			continue // the first caller gave up, not the metaserver: look again
		}
		return f.e, f.err
	}
}

// waitEnded is the error of a caller whose context ended while it waited
// for another caller's lookup: like a call's own deadline, it matches
// protocol.ErrTimeout (and the context's error).
func waitEnded(ctx context.Context, topic string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("route lookup of %q under way: %w (%w)", topic, protocol.ErrTimeout, ctx.Err())
	}
	return fmt.Errorf("route lookup of %q under way: %w", topic, ctx.Err())
}

func (c *Routes[V]) fly(ctx context.Context, topic string, f *flight[V]) {
	defer func() {
		c.fmu.Lock()
		delete(c.flights, topic)
		c.fmu.Unlock()
		close(f.done)
	}()
	c.lookups.Add(1)
	r, err := c.cfg.Lookup(ctx, topic)
	if err != nil {
		f.err, f.ctxEnded = err, ctx.Err() != nil
		c.failed(topic)
		return
	}
	f.e, _ = c.store(topic, r, FromLookup)
}

// failed notes a failed lookup of topic: the entry keeps its route, with
// Tried now.
func (c *Routes[V]) failed(topic string) {
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	prev := c.topics[topic]
	if prev == nil && !c.cfg.KeepMisses {
		return
	}
	next := &Entry[V]{Tried: now}
	if prev != nil {
		*next = *prev
		next.Tried = now
	}
	c.topics[topic] = next
}

// Store stores a route learned outside Lookup (a push, or a lookup the owner
// made) unless the cache holds a newer version. It returns the entry the
// cache holds afterwards and whether r was stored.
func (c *Routes[V]) Store(topic string, r routing.Route, src Source) (*Entry[V], bool) {
	return c.store(topic, r, src)
}

func (c *Routes[V]) store(topic string, r routing.Route, src Source) (*Entry[V], bool) {
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	prev := c.topics[topic]
	if prev != nil && prev.Known && r.Version < prev.Route.Version {
		// Versions only move forward: keep the newer route, as fetched
		// now (looking again at once would ask the same lagging node).
		next := *prev
		next.Fetched, next.Tried = now, now
		c.topics[topic] = &next
		c.mu.Unlock()
		return &next, false
	}
	known := prev
	if known != nil && !known.Known {
		known = nil
	}
	next := &Entry[V]{Route: r, Known: true, Source: src, Fetched: now, Tried: now}
	if prev != nil {
		next.forced = prev.forced
	}
	if c.cfg.Derive != nil {
		next.Value = c.cfg.Derive(topic, r, src, known)
	}
	c.topics[topic] = next
	c.mu.Unlock()
	if c.cfg.Stored != nil {
		c.cfg.Stored(topic, known, next)
	}
	return next, true
}

// MarkStale marks topic's route stale (an error said it may be wrong) and
// reports whether a refresh is due: none was asked for in the last
// MinRefresh. An unknown topic is not marked (false).
func (c *Routes[V]) MarkStale(topic string) (due bool) {
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	prev := c.topics[topic]
	if prev == nil || !prev.Known {
		return false
	}
	next := *prev
	next.Stale = true
	if due = now.Sub(prev.forced) >= c.cfg.MinRefresh; due {
		next.forced = now
	}
	c.topics[topic] = &next
	return due
}

// Range calls f with every entry, under the cache's read lock (f must call
// nothing of the cache).
func (c *Routes[V]) Range(f func(topic string, e *Entry[V])) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for t, e := range c.topics {
		f(t, e)
	}
}

// Prune forgets the topics drop says, calling drop under the cache's lock
// (drop must call nothing of the cache).
func (c *Routes[V]) Prune(drop func(topic string, e *Entry[V]) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, e := range c.topics {
		if drop(t, e) {
			delete(c.topics, t)
		}
	}
}
