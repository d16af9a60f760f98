package broker

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/routing"
)

const (
	// routeTTL is how long a looked-up route counts as fresh. An older one
	// is still served (queues do not move between groups) while a refresh
	// runs in the background.
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
// group. The send path asks it for every message and never waits: a topic
// it does not know, or a queue not routed here, is answered at once (the
// message gets a retriable NO_ROUTE) and a lookup is queued. One goroutine,
// run, does the lookups, one at a time and never two for the same topic,
// so a burst of misses costs one RPC per topic and a slow metaserver slows
// nobody's sends.
type routeCache struct {
	group  string
	lookup routeLookup
	clock  clockwork.Clock
	log    hclog.Logger
	wake   chan struct{} // capacity 1: the queue has topics

	mu     sync.RWMutex
	topics map[string]*topicRoute // replaced, never modified, per topic

	// qmu is taken before mu, never after.
	qmu     sync.Mutex
	pending map[string]struct{} // topics queued or being looked up
	queue   []string
	full    bool // the queue was found full; logged once until it has room
}

type topicRoute struct {
	mine    []bool    // mine[q]: queue q is routed to this group (nil: unknown topic)
	fetched time.Time // the last successful lookup or push (zero: none)
	tried   time.Time // the last lookup, successful or not, or push
	version uint64    // the registry version mine was read at
}

func newRouteCache(group string, lookup routeLookup, clock clockwork.Clock, log hclog.Logger) *routeCache {
	return &routeCache{group: group, lookup: lookup, clock: clock, log: log, wake: make(chan struct{}, 1),
		topics: map[string]*topicRoute{}, pending: map[string]struct{}{}}
}

// routed reports whether queue q of topic is routed to this group, from
// the cache alone. A miss, a stale entry or a queue not routed here queues a
// lookup (at most one per topic every routeMinRefresh).
func (c *routeCache) routed(topic string, q uint32) bool {
	c.mu.RLock()
	tr := c.topics[topic]
	c.mu.RUnlock()
	now := c.clock.Now()
	mine := tr != nil && int(q) < len(tr.mine) && tr.mine[q]
	if tr == nil || ((!mine || now.Sub(tr.fetched) >= routeTTL) && now.Sub(tr.tried) >= routeMinRefresh) {
		c.refresh(topic, tr)
	}
	return mine
}

// refresh queues a lookup of topic unless one is queued or running, or
// one finished since the caller read seen (its entry then is no longer
// seen, and the caller's reason to refresh is gone).
func (c *routeCache) refresh(topic string, seen *topicRoute) {
	c.qmu.Lock()
	c.mu.RLock()
	current := c.topics[topic]
	c.mu.RUnlock()
	if _, ok := c.pending[topic]; ok || current != seen {
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

// fetch looks topic up and stores what it learned. A failed lookup keeps
// the old entry: a broker serves from its last known route while the
// metaserver is away.
func (c *routeCache) fetch(ctx context.Context, topic string) {
	lctx, cancel := context.WithTimeout(ctx, routeLookupTimeout)
	route, err := c.lookup.RouteExisting(lctx, topic)
	cancel()
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.topics[topic]
	if err != nil {
		c.log.Debug("route lookup failed", "topic", topic, "error", err)
		next := &topicRoute{tried: now}
		if old != nil {
			next.mine, next.fetched, next.version = old.mine, old.fetched, old.version
		}
		c.topics[topic] = next
		return
	}
	if old != nil && old.version > route.Version {
		// A push (routepush.go) brought a newer route while this lookup
		// ran.
		c.topics[topic] = &topicRoute{mine: old.mine, fetched: old.fetched, tried: now, version: old.version}
		return
	}
	tr := &topicRoute{mine: make([]bool, len(route.Queues)), fetched: now, tried: now, version: route.Version}
	for i, qr := range route.Queues {
		tr.mine[i] = qr.Group == c.group
	}
	c.topics[topic] = tr
}

// prune forgets topics with no queue here that were not looked up for a
// TTL, so names that clients made up do not stay in memory.
func (c *routeCache) prune() {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for topic, tr := range c.topics {
		if now.Sub(tr.tried) >= routeTTL && !anyTrue(tr.mine) {
			delete(c.topics, topic)
		}
	}
}

func anyTrue(bs []bool) bool {
	for _, b := range bs {
		if b {
			return true
		}
	}
	return false
}
