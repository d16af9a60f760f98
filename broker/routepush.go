package broker

import (
	"context"
	"errors"
	"time"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

const (
	// routeWatchWait is how long the metaserver leader may hold a route
	// watch that has nothing new.
	routeWatchWait = 10 * time.Second
	// routeWatchBackoff and routeWatchMaxBackoff space the watches after a
	// failed one, doubling.
	routeWatchBackoff    = 100 * time.Millisecond
	routeWatchMaxBackoff = 5 * time.Second
	// routeWatchUnsupported spaces the watches while the leader does not
	// know ROUTE_WATCH (an older metaserver, during an upgrade).
	routeWatchUnsupported = time.Minute
)

// routeWatcher is the part of the metaserver client the route push uses.
type routeWatcher interface {
	WatchRoutes(ctx context.Context, w api.RouteWatch) (api.RouteWatchReply, error)
}

// watch keeps a route watch (ROUTE_WATCH) open at the metaserver leader
// until ctx ends, and takes each answer's topics into the cache: the
// leader answers a topic creation or a queue addition only once this
// group's master has asked again after an answer carrying it, so the first
// SEND to a new queue finds its route (DESIGN.md, "Route push"). The send
// path is unchanged: a topic the push did not bring (an older leader, a
// leader that gave up waiting, an answer with Partial) is still looked up
// on its first miss.
func (c *routeCache) watch(ctx context.Context, meta routeWatcher, brokerID string) {
	var version uint64 // 0: nothing taken in yet
	backoff := time.Duration(0)
	failing, unsupported := false, false
	for ctx.Err() == nil {
		reply, err := meta.WatchRoutes(ctx, api.RouteWatch{Group: c.group, BrokerID: brokerID, Version: version,
			WaitMillis: routeWatchWait.Milliseconds()})
		if err == nil {
			if failing || unsupported {
				c.log.Debug("route watch answered again")
			}
			failing, unsupported, backoff = false, false, 0
			c.take(reply)
			version = reply.Version
			continue
		}
		if ctx.Err() != nil {
			return
		}
		wait := min(max(2*backoff, routeWatchBackoff), routeWatchMaxBackoff)
		backoff = wait
		if errors.Is(err, protocol.ErrUnknownCode) {
			if !unsupported {
				c.log.Info("the metaserver leader does not push routes; new topics are learned on their first send", "error", err)
			}
			unsupported, wait = true, routeWatchUnsupported
		} else if !failing {
			c.log.Debug("route watch failed; retrying", "error", err)
		}
		failing = true
		t := c.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.Chan():
		}
	}
}

// take stores the routes a watch answer carried, unless a lookup already
// stored a newer one: each as a route whose queues are this group's or
// nobody's, which the cache's derive reads as a push.
func (c *routeCache) take(reply api.RouteWatchReply) {
	if reply.Partial {
		c.log.Debug("route push left older topics out; they are looked up on their first send", "version", reply.Version)
	}
	for _, t := range reply.Topics {
		r := routing.Route{Topic: t.Name, Version: reply.Version, Queues: make([]routing.QueueRoute, t.Queues)}
		for q := range r.Queues {
			r.Queues[q].Queue = uint32(q)
		}
		for _, q := range t.Mine {
			if q < t.Queues {
				r.Queues[q].Group = c.group
			}
		}
		c.routes.Store(t.Name, r, clientcore.FromPush)
	}
}
