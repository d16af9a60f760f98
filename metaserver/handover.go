package metaserver

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/protocol"
)

// One owner at a time, on the leader (fsm/handover.go has the rules). A
// member that names its incarnation is heartbeated through here: its
// heartbeat records the incarnation's session, joins (a newer incarnation
// replaces the older, which keeps its queues until it releases them or its
// session runs out), applies the queues it released, and is answered with
// the queues it holds. Each round of the judge also:
//
//   - expires members whose session ran out (LeaveMember: their queues go
//     to their owners, since such a member stopped delivering a margin
//     before, by its own clock);
//   - releases the queues an older incarnation still holds once its session
//     ran out since its last heartbeat (a new leader counts from its
//     takeover);
//   - closes join windows that have passed (SettleGroup).
//
// How long queues waited for their holder is observed in
// ferrymq_metaserver_consumer_handover_seconds.

func newHandoverHistogram() prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ferrymq_metaserver_consumer_handover_seconds",
		Help: "Time a consumer group queue waited, after its owner changed, for its earlier holder to stop and release it " +
			"(or to leave, or for its session to run out): the time the queue had no member delivering it.",
		Buckets: LatencyBuckets,
	})
}

// ConsumerHandover is the histogram of handover waits, for a metrics
// registry.
func (s *Server) ConsumerHandover() prometheus.Histogram { return s.consumers.handover }

// incKey is one incarnation of a member.
type incKey struct {
	memberKey
	inc uint64
}

// cooperativeHeartbeat is consumerHeartbeat for a member that names its
// incarnation.
func (s *Server) cooperativeHeartbeat(ctx context.Context, hb api.ConsumerHeartbeat, session time.Duration) (api.ConsumerHeartbeatReply, error) {
	now := s.cfg.Clock.Now()
	k := memberKey{hb.Group, hb.Member}
	reply := api.ConsumerHeartbeatReply{Assignment: []api.QueueAssignment{}, SessionMillis: session.Milliseconds()}
	g, _ := s.fsm.ConsumerGroup(hb.Group)
	if m := g.Members[hb.Member]; m != nil && hb.Incarnation < m.Incarnation {
		return reply, &protocol.Error{Status: protocol.StatusMemberFenced,
			Message: fmt.Sprintf("member %q of consumer group %q was replaced by a newer instance", hb.Member, hb.Group)}
	}
	if hb.Leave {
		before, _ := s.fsm.ConsumerGroup(hb.Group)
		res, err := s.apply(ctx, &fsm.LeaveMember{Group: hb.Group, Member: hb.Member, Incarnation: hb.Incarnation, At: now.UnixMilli(),
			Principal: principalOf(ctx)})
		if err != nil {
			return reply, err
		}
		s.consumers.forgetInc(incKey{k, hb.Incarnation})
		s.consumers.observeReleased(before, hb.Member, hb.Incarnation, nil, true, now)
		reply.Generation = res.Generation
		if res.Changed {
			s.consumers.rebalances.Add(1)
			s.log.Info("consumer group member left", "group", hb.Group, "member", hb.Member, "generation", res.Generation)
		}
		return reply, nil
	}
	topics, err := s.validateTopics(hb.Topics)
	if err != nil {
		return reply, err
	}
	s.consumers.heartbeatInc(incKey{k, hb.Incarnation}, now) // before the join: the judge must not expire it meanwhile
	who := principalOf(ctx)
	if m := g.Members[hb.Member]; m == nil || m.Incarnation != hb.Incarnation || !slices.Equal(m.Topics, topics) || m.SessionMillis != session.Milliseconds() ||
		m.Principal == "" && who != "" {
		res, err := s.apply(ctx, &fsm.JoinMember{Group: hb.Group, Member: hb.Member, Incarnation: hb.Incarnation, Topics: topics,
			SessionMillis: session.Milliseconds(), JoinWindowMillis: max(s.cfg.ConsumerJoinWindow, 0).Milliseconds(), At: now.UnixMilli(),
			Principal: who, Filter: hb.Filter})
		if err != nil {
			if m == nil {
				s.consumers.forgetInc(incKey{k, hb.Incarnation})
			}
			return reply, err
		}
		if res.Rebalanced > 0 {
			s.consumers.rebalances.Add(1)
		}
		if res.Changed {
			s.log.Info("consumer group member joined", "group", hb.Group, "member", hb.Member, "incarnation", hb.Incarnation,
				"topics", topics, "session", session, "generation", res.Generation, "replaced", m != nil && m.Incarnation != hb.Incarnation)
		}
	}
	if len(hb.Released) > 0 {
		before, _ := s.fsm.ConsumerGroup(hb.Group)
		queues := make([]fsm.QueueRef, len(hb.Released))
		for i, q := range hb.Released {
			queues[i] = fsm.QueueRef{Topic: q.Topic, Queue: q.Queue}
		}
		if _, err := s.apply(ctx, &fsm.ReleaseQueues{Group: hb.Group, Member: hb.Member, Incarnation: hb.Incarnation, Queues: queues,
			Principal: who}); err != nil {
			return reply, err
		}
		s.consumers.observeReleased(before, hb.Member, hb.Incarnation, queues, false, now)
	}
	s.heldQueues(hb.Group, hb.Member, hb.Incarnation, now, &reply)
	return reply, nil
}

// heldQueues fills a reply with what a member incarnation holds (with the
// committed offsets and epochs), what it owns that others still hold, what
// it holds for others, and the join window left.
func (s *Server) heldQueues(group, member string, inc uint64, now time.Time, reply *api.ConsumerHeartbeatReply) {
	gen, held, waiting, release, joinUntil := s.fsm.HeldQueues(group, member, inc)
	reply.Generation, reply.Waiting = gen, waiting
	reply.Filter = s.fsm.GroupFilter(group)
	for _, q := range held {
		reply.Assignment = append(reply.Assignment, api.QueueAssignment{Topic: q.Topic, Queue: q.Queue, Committed: q.Offset,
			CommittedEpoch: q.Epoch, EpochGroup: q.EpochGroup})
	}
	for _, q := range release {
		reply.Release = append(reply.Release, api.QueueRef{Topic: q.Topic, Queue: q.Queue})
	}
	if joinUntil != 0 {
		reply.JoinWindowMillis = max(joinUntil-now.UnixMilli(), 1)
	}
}

// heartbeatInc records a heartbeat of a member incarnation at now.
func (c *consumers) heartbeatInc(k incKey, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sessions[k.memberKey] = now
	if c.incs[k.memberKey] == nil {
		c.incs[k.memberKey] = map[uint64]time.Time{}
	}
	c.incs[k.memberKey][k.inc] = now
}

// forgetInc forgets a member incarnation (it left, or its join failed).
func (c *consumers) forgetInc(k incKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.sessions, k.memberKey)
	delete(c.incs[k.memberKey], k.inc)
	if len(c.incs[k.memberKey]) == 0 {
		delete(c.incs, k.memberKey)
	}
}

// lastIncLocked is an incarnation's last heartbeat, or the takeover.
func (c *consumers) lastIncLocked(k incKey) time.Time {
	if t, ok := c.incs[k.memberKey][k.inc]; ok {
		return t
	}
	return c.since
}

// observeReleased observes how long the queues member incarnation inc
// released had waited, from the group as it was before (any: every
// incarnation of the member; queues nil: all).
func (c *consumers) observeReleased(before fsm.ConsumerGroup, member string, inc uint64, queues []fsm.QueueRef, any bool, now time.Time) {
	for t, qs := range before.Releasing {
		for q, h := range qs {
			if h.Member != member || !any && h.Incarnation != inc {
				continue
			}
			if queues != nil && !slices.Contains(queues, fsm.QueueRef{Topic: t, Queue: q}) {
				continue
			}
			c.handover.Observe(float64(max(now.UnixMilli()-h.Since, 0)) / 1e3)
		}
	}
}

// cooperativeRound does a judge round's one-owner-at-a-time work at now:
// it releases the queues of older incarnations whose session ran out, and
// closes the join windows that have passed.
func (c *consumers) cooperativeRound(ctx context.Context, now time.Time) {
	for _, g := range c.fsm.ConsumerGroups() {
		if g.JoinUntil != 0 && now.UnixMilli() >= g.JoinUntil {
			if _, err := c.apply(ctx, &fsm.SettleGroup{Group: g.Name, At: now.UnixMilli()}); err != nil {
				c.log.Warn("closing a consumer group's join window failed", "group", g.Name, "error", err)
			} else {
				c.rebalances.Add(1)
				c.log.Info("consumer group's join window closed: first assignment", "group", g.Name, "members", len(g.Members))
			}
		}
		for _, k := range c.staleIncarnations(g, now) {
			before, _ := c.fsm.ConsumerGroup(g.Name)
			if _, err := c.apply(ctx, &fsm.ReleaseQueues{Group: g.Name, Member: k.member, Incarnation: k.inc}); err != nil {
				c.log.Warn("releasing the queues of a replaced consumer instance failed", "group", g.Name, "member", k.member, "error", err)
				continue
			}
			c.observeReleased(before, k.member, k.inc, nil, false, now)
			c.mu.Lock()
			delete(c.incs[k.memberKey], k.inc)
			c.mu.Unlock()
			c.log.Info("released the queues a replaced consumer instance held: its session ran out", "group", g.Name,
				"member", k.member, "incarnation", k.inc)
		}
	}
}

// staleIncarnations returns the older incarnations that hold queues in g
// and whose session ran out at now.
func (c *consumers) staleIncarnations(g fsm.ConsumerGroup, now time.Time) []incKey {
	var out []incKey
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, qs := range g.Releasing {
		for _, h := range qs {
			m := g.Members[h.Member]
			k := incKey{memberKey{g.Name, h.Member}, h.Incarnation}
			if m == nil || m.Incarnation == h.Incarnation || slices.Contains(out, k) {
				continue // a live holder releases by itself, or expires
			}
			if now.Sub(c.lastIncLocked(k)) > c.sessionOf(m) {
				out = append(out, k)
			}
		}
	}
	return out
}

// deleteConsumerGroup removes a consumer group with no member (the
// registry's) and no live session (the leader's).
func (s *Server) deleteConsumerGroup(ctx context.Context, req api.DeleteGroupRequest) (empty, error) {
	if err := fsm.ValidateConsumerName("group", req.Group); err != nil {
		return empty{}, invalid("%v", err)
	}
	now := s.cfg.Clock.Now()
	if g, _ := s.fsm.ConsumerGroup(req.Group); len(g.Members) > 0 || s.consumers.live(req.Group, now) {
		return empty{}, &protocol.Error{Status: protocol.StatusGroupActive,
			Message: fmt.Sprintf("consumer group %q has %d live members; stop them (or wait for their sessions to run out) before deleting it",
				req.Group, max(len(g.Members), 1))}
	}
	if _, err := s.apply(ctx, &fsm.DeleteGroup{Group: req.Group}); err != nil {
		return empty{}, err
	}
	s.log.Info("consumer group deleted", "group", req.Group)
	return empty{}, nil
}
