package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
)

func (c *Consumer) heartbeatReq(leave bool, released []api.QueueRef) api.ConsumerHeartbeat {
	c.mu.Lock()
	gen := c.gen
	c.mu.Unlock()
	// The filter asked for is the option's until the group named its own:
	// from then on the member follows the group's, also when it joins
	// again after a set-filter changed it.
	filter := c.cfg.filter
	if c.filter.Load() != nil {
		filter = ""
	}
	return api.ConsumerHeartbeat{Group: c.group, Member: c.cfg.member, Topics: c.topics, Generation: gen,
		SessionMillis: c.cfg.session.Milliseconds(), Leave: leave, Incarnation: c.incarnation, Released: released, Filter: filter}
}

// permanent reports whether the metaserver refused the member for good:
// retrying will not help (Run and Poll end with the error).
func permanent(err error) bool {
	return errors.Is(err, protocol.ErrUnknownTopic) || errors.Is(err, protocol.ErrInvalid) ||
		errors.Is(err, protocol.ErrNotAuthorized) || errors.Is(err, protocol.ErrMemberFenced)
}

// memberLoop heartbeats, applies new assignments and commits. It alone
// changes the generation and the set of parts; Close commits and leaves
// after it returns.
func (c *Consumer) memberLoop() {
	defer close(c.memberDone)
	clk := c.cfg.clock
	hb := clk.NewTimer(0)
	defer hb.Stop()
	var commitC <-chan time.Time
	if !c.cfg.manualCommit {
		t := clk.NewTicker(c.cfg.autoCommit)
		defer t.Stop()
		commitC = t.Chan()
	}
	session := c.cfg.session
	refused := false // refused for good: no more heartbeats (Close still leaves)
	for {
		select {
		case <-c.stopMember:
			return
		case <-hb.Chan():
		case <-c.kick:
			if refused {
				continue
			}
		case <-commitC:
			ctx, cancel := context.WithTimeout(c.bg, c.cfg.requestTimeout)
			err := c.commit(ctx)
			cancel()
			if err != nil && !errors.Is(err, ErrRebalanced) {
				c.cfg.Logger.Warn("commit failed; retrying at the next", "group", c.group, "err", err)
			}
			continue
		case req := <-c.commitReq:
			req.done <- c.commit(req.ctx)
			continue
		}
		// A member whose lease ran out (paused, cut off) delivers nothing
		// more and drops its queues: they may be another's by now, and it
		// takes them again from the registry's committed offsets.
		if c.lease.Load() != nil && !c.leaseValid() {
			c.dropAll("no heartbeat answered for the session")
		}
		if !c.cfg.manualCommit {
			ctx, cancel := context.WithTimeout(c.bg, c.cfg.requestTimeout)
			_ = c.commit(ctx)
			cancel()
		}
		ctx, cancel := context.WithTimeout(c.bg, min(c.cfg.requestTimeout, session/2))
		sent := clk.Now()
		released := c.toRelease()
		reply, err := c.cfg.coord.ConsumerHeartbeat(ctx, c.heartbeatReq(false, released))
		cancel()
		next := c.cfg.heartbeat
		if err != nil {
			select {
			case <-c.stopMember:
				return
			default:
			}
			if permanent(err) {
				// Run and Poll end with the error. The member stops here,
				// so that it never holds queues it will not consume should
				// the refusal's cause go away (a set-filter, a new topic).
				c.cfg.Logger.Error("the metaserver refuses this member for good", "group", c.group, "member", c.cfg.member, "err", err)
				c.fail(metaErr("heartbeat", err))
				c.dropAll("refused by the metaserver")
				refused = true
				continue
			} else {
				c.cfg.Logger.Warn("heartbeat failed; retrying", "group", c.group, "member", c.cfg.member, "err", err)
			}
			hb.Reset(min(next, c.leaseLeft()))
			continue
		}
		c.stats.heartbeats.Add(1)
		if reply.SessionMillis > 0 {
			session = time.Duration(reply.SessionMillis) * time.Millisecond
		}
		c.renewLease(sent, session)
		c.reported(released)
		if err := c.setFilter(reply.Filter); err != nil {
			c.cfg.Logger.Error("the metaserver refuses this member for good", "group", c.group, "member", c.cfg.member, "err", err)
			c.fail(err)
			c.dropAll("refused by the metaserver")
			refused = true
			continue
		}
		c.apply(reply)
		c.releaseUnheld(reply.Release)
		if reply.Waiting > 0 || reply.JoinWindowMillis > 0 {
			// Queues come as others let go, or when the join window closes:
			// ask again soon.
			next = min(next, 100*time.Millisecond)
			if w := time.Duration(reply.JoinWindowMillis) * time.Millisecond; w > 0 {
				next = min(next, w)
			}
		}
		hb.Reset(next)
	}
}

// setFilter records the group's filter from a heartbeat's reply: the
// PULLs sent from now on name it. The first reply to a member that asked
// for a filter names one, unless the metaserver keeps no filters (an
// older one): an error, since the member would receive every message.
func (c *Consumer) setFilter(f string) error {
	old := c.filter.Load()
	if old == nil && f == "" && c.cfg.filter != "" && c.cfg.filter != "*" {
		return fmt.Errorf("consumer: the metaserver answered the join with no filter for the group, though this member asked for %q: "+
			"it keeps no consumer group filters (upgrade the metaservers)", c.cfg.filter)
	}
	if old != nil && *old == f {
		return nil
	}
	if old != nil || f != "" {
		c.cfg.Logger.Info("the group's filter", "group", c.group, "filter", f)
	}
	c.filter.Store(&f)
	return nil
}

// leaseLeft is how long the lease has left (at least a millisecond), so a
// failing member wakes to drop its queues when it runs out.
func (c *Consumer) leaseLeft() time.Duration {
	until := c.lease.Load()
	if until == nil {
		return c.cfg.heartbeat
	}
	return max(until.Sub(c.cfg.clock.Now()), time.Millisecond)
}

// dropAll stops consuming every queue without committing: the member lost
// its lease, its queues are (or soon will be) another member's.
func (c *Consumer) dropAll(why string) {
	c.mu.Lock()
	parts := c.parts
	c.parts = map[qkey]*part{}
	c.gen = 0 // join again
	c.mu.Unlock()
	if len(parts) > 0 {
		c.cfg.Logger.Warn("stopped consuming every queue: "+why, "group", c.group, "queues", len(parts))
	}
	for _, p := range parts {
		p.stop()
	}
	c.relMu.Lock()
	c.released, c.lettingGo = nil, nil // nothing of those to report: the registry takes them from this member anyway
	c.relMu.Unlock()
}

// apply moves to the reply's assignment: the queues the member holds. Those
// it no longer holds are let go (letGo: their last handler call finishes and
// they are committed before they are reported released); new ones start
// from their committed offsets.
func (c *Consumer) apply(reply api.ConsumerHeartbeatReply) {
	want := make(map[qkey]api.QueueAssignment, len(reply.Assignment))
	for _, a := range reply.Assignment {
		want[qkey{a.Topic, a.Queue}] = a
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	var revoked []*part
	work := map[qkey]chan struct{}{}
	for k, p := range c.parts {
		if _, ok := want[k]; !ok {
			revoked = append(revoked, p)
			work[k] = c.lastWork[k]
			delete(c.parts, k)
		}
	}
	if reply.Generation == c.gen && len(revoked) == 0 && len(want) == len(c.parts) {
		return
	}
	if reply.Generation != c.gen {
		c.stats.rebalances.Add(1)
	}
	c.gen = reply.Generation
	c.letGo(revoked, work)
	share := c.cfg.maxPrefetchBytes / int64(max(1, len(want)))
	share = max(share, minQueueShare)
	var added []string
	for k, a := range want {
		if p := c.parts[k]; p != nil {
			p.mu.Lock()
			p.share = share
			p.mu.Unlock()
			signal(p.room)
			continue
		}
		p := newPart(c, k, a.Committed)
		if a.CommittedEpoch != 0 {
			p.setEpoch(a.CommittedEpoch, a.EpochGroup)
		}
		p.share = share
		c.parts[k] = p
		added = append(added, k.String())
		c.fetchWG.Add(1)
		go p.fetch(a.Committed)
		if mode(c.mode.Load()) == modeRun {
			prev := c.lastWork[k]
			done := make(chan struct{})
			c.lastWork[k] = done
			c.workWG.Add(1)
			go c.work(p, prev, done)
		}
	}
	c.cfg.Logger.Info("assignment", "group", c.group, "member", c.cfg.member, "generation", reply.Generation,
		"queues", len(want), "added", added, "letting-go", len(revoked), "waiting", reply.Waiting)
}

// commit commits every part's processed offset that moved. STALE_GENERATION
// (the member does not hold a queue it thought it did) wakes the heartbeat.
func (c *Consumer) commit(ctx context.Context) error {
	c.mu.Lock()
	parts := make([]*part, 0, len(c.parts))
	for _, p := range c.parts {
		parts = append(parts, p)
	}
	c.mu.Unlock()
	err := c.commitParts(ctx, parts)
	if errors.Is(err, protocol.ErrStaleGeneration) {
		signal(c.kick)
	}
	return err
}

// commitParts commits the processed offsets of parts that moved, with one
// call, as the queues this member incarnation holds.
func (c *Consumer) commitParts(ctx context.Context, parts []*part) error {
	var offs []api.QueueOffset
	var moved []*part
	for _, p := range parts {
		p.mu.Lock()
		pos := p.processedLocked()
		if pos >= 0 && pos != p.committed {
			epoch, group := p.epochNow()
			offs = append(offs, api.QueueOffset{Topic: p.key.topic, Queue: p.key.queue, Offset: pos, Epoch: epoch, EpochGroup: group, Rewound: p.rewound})
			moved = append(moved, p)
		}
		p.mu.Unlock()
	}
	if len(offs) == 0 {
		return nil
	}
	var redelivered []api.Redelivery // reported once: a failed commit drops them
	for _, p := range parts {
		p.mu.Lock()
		n := min(api.MaxRedelivered-len(redelivered), len(p.redelivered))
		redelivered = append(redelivered, p.redelivered[:n]...)
		p.redelivered = p.redelivered[n:]
		p.mu.Unlock()
	}
	c.mu.Lock()
	gen := c.gen
	c.mu.Unlock()
	_, err := c.cfg.coord.CommitOffsets(ctx, api.CommitRequest{Group: c.group, Member: c.cfg.member, Generation: gen,
		Incarnation: c.incarnation, Offsets: offs, Redelivered: redelivered})
	if err != nil {
		c.stats.commitErrors.Add(1)
		if errors.Is(err, protocol.ErrNotAuthorized) || errors.Is(err, protocol.ErrMemberFenced) {
			c.fail(metaErr("commit", err))
		}
		return metaErr("commit", err)
	}
	c.stats.commits.Add(1)
	for i, p := range moved {
		p.mu.Lock()
		if offs[i].Rewound {
			p.committed, p.rewound = offs[i].Offset, false
		} else {
			p.committed = max(p.committed, offs[i].Offset)
		}
		p.mu.Unlock()
	}
	return nil
}
