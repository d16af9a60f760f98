package broker

import (
	"context"
	"sync"
	"time"
)

const (
	routeTTL = 30 * time.Second
	// routeMinRefresh spaces the lookups of a queue that was not routed here:
	// short, because a producer with a newer route than ours is waiting.
	routeMinRefresh = 100 * time.Millisecond
)

// routeCache knows which queues of each topic are routed to this broker's
// group. It asks the metaserver on a miss, at most once a second per topic.
type routeCache struct {
	mu     sync.RWMutex
	topics map[string]*topicRoute
}

type topicRoute struct {
	mine    []bool // mine[q]: queue q is routed to this group
	fetched time.Time
}

func (c *routeCache) init() { c.topics = map[string]*topicRoute{} }

// routedHere reports whether queue q of topic is routed to this group,
// asking the metaserver when the cache does not say yes.
func (b *Broker) routedHere(topic string, q uint32) bool {
	b.routes.mu.RLock()
	tr := b.routes.topics[topic]
	b.routes.mu.RUnlock()
	now := time.Now()
	if tr != nil && now.Sub(tr.fetched) < routeTTL && int(q) < len(tr.mine) && tr.mine[q] {
		return true
	}
	if tr != nil && now.Sub(tr.fetched) < routeMinRefresh {
		return false
	}
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
	defer cancel()
	route, err := b.meta.RouteExisting(ctx, topic)
	if err != nil {
		b.log.Debug("route lookup failed", "topic", topic, "error", err)
		if tr != nil && int(q) < len(tr.mine) {
			return tr.mine[q] // keep serving from a stale route while the metaserver is away
		}
		b.routes.mu.Lock()
		b.routes.topics[topic] = &topicRoute{fetched: now}
		b.routes.mu.Unlock()
		return false
	}
	tr = &topicRoute{mine: make([]bool, len(route.Queues)), fetched: now}
	for i, qr := range route.Queues {
		tr.mine[i] = qr.Group == b.cfg.Group
	}
	b.routes.mu.Lock()
	b.routes.topics[topic] = tr
	b.routes.mu.Unlock()
	return int(q) < len(tr.mine) && tr.mine[q]
}
