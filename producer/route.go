package producer

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/routing"
)

// router chooses each record's queue on the client core's route cache,
// avoiding groups with latency faults, and keeps the routes fresh: a
// background refresher, refreshes on routing errors, and each group's sink
// shown its group as every newly stored route names it.
type router struct {
	cfg   *config
	life  *life
	sinks *sinkSet
	sel   *routing.Selector
	cache *clientcore.Routes[*topicPlan]

	// For tests: route refreshes started by routing errors (refreshSoon),
	// passes of the refresher done (stale routes refreshed, troubled ones
	// polled), and the polls (lookups of routes in trouble).
	forcedRefreshes atomic.Int64
	refreshPasses   atomic.Int64
	routePolls      atomic.Int64
	// refreshTimer drives the refresher; made in newRouter so that a
	// test's clock has it before the first Advance.
	refreshTimer clockwork.Timer
}

func newRouter(cfg *config, l *life, sinks *sinkSet) *router {
	r := &router{cfg: cfg, life: l, sinks: sinks, sel: routing.NewSelector(cfg.avoider)}
	r.cache = clientcore.NewRoutes(clientcore.RoutesConfig[*topicPlan]{
		Lookup: cfg.routeSrc.route, Derive: derivePlan, Stored: r.stored,
		TTL: cfg.routeRefresh, MinRefresh: time.Second, Clock: cfg.clock,
	})
	r.refreshTimer = cfg.clock.NewTimer(r.pollWait())
	return r
}

// topicPlan is what the producer makes of a topic's cached route (the
// route cache's Value): the plan the selector picks queues by, and whether
// a queue has no writable master (the route is polled while it is used).
type topicPlan struct {
	plan       *plan
	unwritable bool
	// used: sent to since the last periodic refresh. One flag per topic,
	// handed from each entry to the next.
	used *atomic.Bool
}

// derivePlan makes a stored route's topicPlan.
func derivePlan(_ string, r routing.Route, _ clientcore.Source, prev *clientcore.Entry[*topicPlan]) *topicPlan {
	tp := &topicPlan{plan: newPlan(r)}
	if prev != nil {
		tp.used = prev.Value.used
	} else {
		tp.used = new(atomic.Bool)
		tp.used.Store(true)
	}
	for _, q := range r.Queues {
		if !q.Writable || q.Master == "" {
			tp.unwritable = true
			break
		}
	}
	return tp
}

// markUsed records that records wait for the topic's route.
func (tp *topicPlan) markUsed() {
	if !tp.used.Load() { // most sends find it set: no write
		tp.used.Store(true)
	}
}

// plan is a route prepared for selection, and whether its writable queues
// are all of one group (then the selector needs no time: there is no group
// to avoid or choose).
type plan struct {
	*routing.Plan
	oneGroup bool
}

func newPlan(r routing.Route) *plan {
	p := &plan{Plan: routing.NewPlan(r), oneGroup: true}
	group := ""
	for _, q := range r.Queues {
		if !q.Writable {
			continue
		}
		if group != "" && q.Group != group {
			p.oneGroup = false
			break
		}
		group = q.Group
	}
	return p
}

// routeSource looks routes up: the metaserver, or a fake in tests.
type routeSource interface {
	route(ctx context.Context, topic string) (routing.Route, error)
}

type metaRoutes struct{ meta *client.Client }

func (m metaRoutes) route(ctx context.Context, topic string) (routing.Route, error) {
	return m.meta.Route(ctx, topic)
}

// route returns the cached route of the record's topic, looking it up on
// first use (one lookup per topic at a time, however many records miss).
// The lookup ends by the record's delivery deadline.
func (r *router) route(rec *record) (*plan, error) {
	topic := rec.msg.Topic
	if e := r.cache.Get(topic); e != nil && e.Known {
		e.Value.markUsed()
		return e.Value.plan, nil
	}
	lctx, cancel := context.WithDeadline(rec.ctx, rec.deadlineWithin(r.cfg.requestTimeout))
	defer cancel()
	e, err := r.cache.Lookup(lctx, topic)
	if err != nil {
		return nil, lookupErr(err)
	}
	e.Value.markUsed()
	return e.Value.plan, nil
}

// pick chooses the record's queue: a keyed record's is its key's (unless
// MoveKeyedOnFailure lets it leave a queue that is not writable or just
// failed), whether or not it is writable now: the record then waits there.
func (r *router) pick(plan *plan, rec *record) (routing.QueueRoute, error) {
	if qs := plan.Route.Queues; rec.key != "" && len(qs) > 0 {
		q := qs[clientcore.KeyHash(rec.key)%uint32(len(qs))]
		if !r.cfg.moveKeyed || q.Writable && q.Group != lastGroup(rec) {
			return q, nil
		}
	}
	if rec.txn != nil {
		// A transaction's messages go to its first message's group.
		if q, ok := rec.txn.queueIn(rec.msg.Topic, plan.Route.Queues); ok {
			return q, nil
		}
	}
	var now time.Time // a plan of one group takes its queues in turn: no clock read per message
	if !plan.oneGroup {
		now = r.cfg.clock.Now()
	}
	return r.sel.SelectPlan(plan.Plan, lastGroup(rec), now)
}

// queueRoute is the cached route of one queue, and the route's version.
func (r *router) queueRoute(topic string, queue uint32) (routing.QueueRoute, uint64, bool) {
	e := r.cache.Get(topic)
	if e == nil || !e.Known {
		return routing.QueueRoute{}, 0, false
	}
	e.Value.markUsed() // records wait for this queue
	for _, q := range e.Route.Queues {
		if q.Queue == queue {
			return q, e.Route.Version, true
		}
	}
	return routing.QueueRoute{}, 0, false
}

// stored shows each group's sink the group's master, epoch and state in a
// route the cache just stored (a sink gives up calls to a master the route
// no longer names), and wakes the sinks of groups a queue moved off.
func (r *router) stored(_ string, prev, next *clientcore.Entry[*topicPlan]) {
	type seen struct {
		s *sink
		v view
	}
	var sinks []seen
	var left []*sink // sinks of groups a queue moved off
	rt := next.Route
	r.sinks.mu.Lock()
	if prev != nil {
		for _, old := range prev.Route.Queues {
			if int(old.Queue) < len(rt.Queues) && rt.Queues[old.Queue].Group != old.Group {
				if s := r.sinks.m[old.Group]; s != nil && !slices.Contains(left, s) {
					left = append(left, s)
				}
			}
		}
	}
queues:
	for i, q := range rt.Queues {
		for _, p := range rt.Queues[:i] {
			if p.Group == q.Group {
				continue queues // a group's first queue speaks for it
			}
		}
		if s := r.sinks.m[q.Group]; s != nil {
			sinks = append(sinks, seen{s, viewOf(rt.Version, q)})
		}
	}
	r.sinks.mu.Unlock()
	for _, x := range sinks {
		x.s.observe(x.v)
	}
	for _, s := range left {
		s.wake()
	}
}

// refreshSoon refreshes a topic's route in the background, at most once a
// second per topic (by the producer's clock).
func (r *router) refreshSoon(topic string) {
	if r.life.closed.Load() || !r.cache.MarkStale(topic) {
		return
	}
	r.forcedRefreshes.Add(1)
	r.life.wg.Add(1)
	go func() {
		defer r.life.wg.Done()
		r.refresh(topic)
	}()
}

func (r *router) refresh(topic string) {
	ctx, cancel := context.WithTimeout(r.life.ctx, r.cfg.requestTimeout)
	defer cancel()
	if _, err := r.cache.Lookup(ctx, topic); err != nil {
		r.cfg.Logger.Warn("route refresh failed", "topic", topic, "error", err)
	}
}

// refresher refreshes routes older than RouteRefresh, and polls the routes
// in trouble (by the producer's clock), every RoutePoll, jittered. A route
// is in trouble while one of its queues has no writable master, or while a
// call to one of its groups has waited longer than RoutePoll; it is polled
// only if it was sent to since its last periodic refresh. Runs under
// life.wg.
func (r *router) refresher() {
	defer r.life.wg.Done()
	defer r.refreshTimer.Stop()
	for {
		select {
		case <-r.life.stop:
			return
		case <-r.refreshTimer.Chan():
		}
		stale, poll := r.due(r.cfg.clock.Now())
		for _, t := range stale {
			r.refresh(t)
		}
		for _, t := range poll {
			r.routePolls.Add(1)
			r.refresh(t)
		}
		// Reset before the pass is counted: a test that waits for the pass
		// and then moves its clock moves it past this timer.
		r.refreshTimer.Reset(r.pollWait())
		r.refreshPasses.Add(1)
	}
}

// due names the topics whose routes are stale, and those in trouble to
// poll; a stale route's used flag is cleared.
func (r *router) due(now time.Time) (stale, poll []string) {
	stalled := r.stalledGroups(now)
	r.cache.Range(func(t string, e *clientcore.Entry[*topicPlan]) {
		switch {
		case !e.Known:
		case now.Sub(e.Fetched) >= r.cfg.routeRefresh:
			stale = append(stale, t)
			e.Value.used.Store(false)
		case e.Value.used.Load() && (e.Value.unwritable || usesAny(&e.Route, stalled)):
			poll = append(poll, t)
		}
	})
	return stale, poll
}

// pollWait is the refresher's next wait: RoutePoll (or RouteRefresh, if
// shorter), jittered.
func (r *router) pollWait() time.Duration {
	return routing.Jitter(min(r.cfg.routePoll, r.cfg.routeRefresh))
}

// stalledGroups names the groups with a call that has waited at least
// RoutePoll for its answer.
func (r *router) stalledGroups(now time.Time) map[string]bool {
	var out map[string]bool
	for _, s := range r.sinks.all() {
		if s.stalled(now, r.cfg.routePoll) {
			if out == nil {
				out = map[string]bool{}
			}
			out[s.group] = true
		}
	}
	return out
}

// usesAny reports whether r routes a queue to one of groups.
func usesAny(r *routing.Route, groups map[string]bool) bool {
	if len(groups) == 0 {
		return false
	}
	for _, q := range r.Queues {
		if groups[q.Group] {
			return true
		}
	}
	return false
}
