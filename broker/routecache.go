package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

const (
	// routeTTL is how long a looked-up route counts as fresh. An older one
	// is still served while a refresh runs in the background: a queue moves
	// between groups only off a retired group, whose brokers the registry
	// refuses (their write lease runs out), and a group that takes a queue
	// up learns it at its first lookup of the topic after a miss.
	routeTTL = 30 * time.Second
	// routeMinRefresh spaces the lookups of one topic. It is short because
	// a producer that holds a newer route than ours is waiting.
	routeMinRefresh = 100 * time.Millisecond
	// routeLookupTimeout bounds one lookup.
	routeLookupTimeout = 2 * time.Second
	// maxPendingRoutes bounds the topics waiting for a lookup, so that a
	// client naming many unknown topics cannot grow the queue.
	maxPendingRoutes = 1024
)

// routeLookup is the part of the metaserver client the route cache uses.
type routeLookup interface {
	RouteExisting(ctx context.Context, topic string) (routing.Route, error)
}

// routeCache knows which queues of each topic are routed to this broker's
// group, on the client core's route cache (the producers' and consumers'
// too: one entry per topic, versions only move forward, pushes and lookups
// feeding the same entries). The send path asks it for every message and
// never waits: a topic it does not know, or a queue not routed here, is
// answered at once (the message gets a retriable NO_ROUTE) and a lookup is
// queued. One goroutine, run, does the lookups, one at a time and never two
// for the same topic, so a burst of misses costs one RPC per topic and a
// slow metaserver slows nobody's sends.
type routeCache struct {
	group  string
	lookup routeLookup
	clock  clockwork.Clock
	log    hclog.Logger
	wake   chan struct{} // capacity 1: the queue has topics
	// store is the commit log's part that takes moved queues up (nil: no
	// queue moves, in tests): a queue routed here with a base is
	// counted as this group's only once the log continues it at or past
	// the base.
	store queueBases
	// refused names the moved queues the log could not take up, each
	// logged once (the lookup goroutine's own).
	refused map[string]bool

	// routes holds each topic's entry: what a lookup or a push said, as
	// groupRoute; failed lookups of unknown topics are remembered too
	// (KeepMisses), so that misses are looked up at most once every
	// routeMinRefresh.
	routes *clientcore.Routes[groupRoute]

	// qmu guards the lookup queue. The cache's lock may be taken under it,
	// never the other way round.
	qmu     sync.Mutex
	pending map[string]struct{} // topics queued or being looked up
	queue   []string
	full    bool // the queue was found full; logged once until it has room
}

// queueBases is the part of the commit log the route cache uses.
type queueBases interface {
	SetQueueBase(topic string, queue uint32, base int64) error
	QueueRange(topic string, queue uint32) (first, next int64)
}

// groupRoute is what a route says of this group (the cache entry's Value).
type groupRoute struct {
	mine []bool  // mine[q]: queue q is routed to this group (nil: unknown topic)
	base []int64 // base[q]: where this group took queue q up (nil: no queue moved)
}

func newRouteCache(group string, lookup routeLookup, clock clockwork.Clock, log hclog.Logger) *routeCache {
	c := &routeCache{group: group, lookup: lookup, clock: clock, log: log, wake: make(chan struct{}, 1),
		pending: map[string]struct{}{}}
	c.routes = clientcore.NewRoutes(clientcore.RoutesConfig[groupRoute]{
		Lookup: c.lookupTakingUp, Derive: c.derive,
		TTL: routeTTL, MinRefresh: routeMinRefresh, KeepMisses: true, Clock: clock,
	})
	return c
}

// routed reports whether queue q of topic is routed to this group, from
// the cache alone. A miss, a stale entry or a queue not routed here queues a
// lookup (at most one per topic every routeMinRefresh).
func (c *routeCache) routed(topic string, q uint32) bool {
	e := c.routes.Get(topic)
	now := c.clock.Now()
	mine := e != nil && int(q) < len(e.Value.mine) && e.Value.mine[q]
	if mine && e.Value.base != nil && e.Value.base[q] > 0 && c.store != nil {
		if _, next := c.store.QueueRange(topic, q); next < e.Value.base[q] {
			// The log lost the base (a truncation cut the queue's
			// records): not ours until a lookup sets it again.
			mine = false
		}
	}
	if e == nil || ((!mine || now.Sub(e.Fetched) >= routeTTL) && now.Sub(e.Tried) >= routeMinRefresh) {
		c.refresh(topic, e)
	}
	return mine
}

// refresh queues a lookup of topic unless one is queued or running, or
// one finished since the caller read seen (its entry then is no longer
// seen, and the caller's reason to refresh is gone).
func (c *routeCache) refresh(topic string, seen *clientcore.Entry[groupRoute]) {
	c.qmu.Lock()
	if _, ok := c.pending[topic]; ok || c.routes.Get(topic) != seen {
		c.qmu.Unlock()
		return
	}
	if len(c.pending) >= maxPendingRoutes {
		full := !c.full
		c.full = true
		c.qmu.Unlock()
		if full {
			c.log.Warn("route lookups are backed up; topics not yet looked up get NO_ROUTE until the queue drains",
				"queued", maxPendingRoutes)
		}
		return
	}
	c.full = false
	c.pending[topic] = struct{}{}
	c.queue = append(c.queue, topic)
	c.qmu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run looks up queued topics until ctx ends, and drops entries of topics
// that no longer route anything here.
func (c *routeCache) run(ctx context.Context) {
	prune := c.clock.NewTicker(routeTTL)
	defer prune.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-prune.Chan():
			c.prune()
		case <-c.wake:
		}
		for ctx.Err() == nil {
			c.qmu.Lock()
			if len(c.queue) == 0 {
				c.qmu.Unlock()
				break
			}
			topic := c.queue[0]
			c.queue = c.queue[1:]
			c.qmu.Unlock()
			c.fetch(ctx, topic)
			c.qmu.Lock()
			delete(c.pending, topic)
			c.qmu.Unlock()
		}
	}
}

// fetch looks topic up and stores what it learned, unless a push brought a
// newer route meanwhile. A failed lookup keeps the old entry (noting when
// it was tried): a broker serves from its last known route while the
// metaserver is away.
func (c *routeCache) fetch(ctx context.Context, topic string) {
	lctx, cancel := context.WithTimeout(ctx, routeLookupTimeout)
	_, err := c.routes.Lookup(lctx, topic)
	cancel()
	if err != nil {
		c.log.Debug("route lookup failed", "topic", topic, "error", err)
	}
}

// lookupTakingUp is the cache's lookup: the metaserver's route, with every
// queue moved to this group taken up by the commit log first (takeUp); a
// queue the log refused is stored with no group, so it is not this
// group's. Runs outside the cache's lock: a base waits for the appends
// queued before it.
func (c *routeCache) lookupTakingUp(ctx context.Context, topic string) (routing.Route, error) {
	route, err := c.lookup.RouteExisting(ctx, topic)
	if err != nil {
		return route, err
	}
	for i, ok := range c.takeUp(route) {
		if !ok {
			route.Queues = slices.Clone(route.Queues)
			route.Queues[i].Group = ""
		}
	}
	return route, nil
}

// derive is what a stored route says of this group. A push carries which
// queues are this group's but leaves out the queues moved here by a
// retirement (they are taken up at their base by a lookup): for those, it
// keeps what a lookup learned.
func (c *routeCache) derive(_ string, r routing.Route, src clientcore.Source, prev *clientcore.Entry[groupRoute]) groupRoute {
	g := groupRoute{mine: make([]bool, len(r.Queues))}
	for i, qr := range r.Queues {
		g.mine[i] = qr.Group == c.group
		if src == clientcore.FromLookup && qr.Base > 0 && g.mine[i] {
			if g.base == nil {
				g.base = make([]int64, len(r.Queues))
			}
			g.base[i] = qr.Base
		}
	}
	if src == clientcore.FromPush && prev != nil && prev.Value.base != nil {
		g.base = make([]int64, len(r.Queues))
		for q := range min(len(prev.Value.base), len(g.mine)) {
			if prev.Value.base[q] > 0 {
				g.mine[q], g.base[q] = prev.Value.mine[q], prev.Value.base[q]
			}
		}
	}
	return g
}

// takeUp makes the commit log continue every queue the route moved to this
// group at its base, before the queue counts as this group's (so no append
// gives it a lower offset), and reports which queues may count: a queue
// whose log cannot take it up (it holds older records of it, from an
// earlier stay here) is refused, loudly, until an operator acts. Runs
// outside mu: a base waits for the appends queued before it.
func (c *routeCache) takeUp(route routing.Route) []bool {
	ok := make([]bool, len(route.Queues))
	for i, qr := range route.Queues {
		ok[i] = true
		if qr.Group != c.group || qr.Base <= 0 || c.store == nil {
			continue
		}
		if serr := c.store.SetQueueBase(route.Topic, qr.Queue, qr.Base); serr != nil && !errors.Is(serr, storage.ErrBaseBelowNext) {
			ok[i] = false
			if k := fmt.Sprintf("%s/%d", route.Topic, qr.Queue); !c.refused[k] {
				if c.refused == nil {
					c.refused = map[string]bool{}
				}
				c.refused[k] = true
				c.log.Error("cannot take up a queue moved to this group: the queue gets NO_ROUTE here (move the group's data directory away, or retire the group so the queue moves on)",
					"topic", route.Topic, "queue", qr.Queue, "base", qr.Base, "error", serr)
			}
		}
	}
	return ok
}

// prune forgets topics with no queue here that were not looked up for a
// TTL, so names that clients made up do not stay in memory.
func (c *routeCache) prune() {
	now := c.clock.Now()
	c.routes.Prune(func(_ string, e *clientcore.Entry[groupRoute]) bool {
		return now.Sub(e.Tried) >= routeTTL && !anyTrue(e.Value.mine)
	})
}

func anyTrue(bs []bool) bool {
	for _, b := range bs {
		if b {
			return true
		}
	}
	return false
}
