package consumer

import (
	"context"
	"errors"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
)

func (c *Consumer) heartbeatReq(leave bool) api.ConsumerHeartbeat {
	c.mu.Lock()
	gen := c.gen
	c.mu.Unlock()
	return api.ConsumerHeartbeat{Group: c.group, Member: c.cfg.member, Topics: c.topics, Generation: gen,
		SessionMillis: c.cfg.session.Milliseconds(), Leave: leave}
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
	var lastOK time.Time // the send time of the last answered heartbeat
	session := c.cfg.session
	for {
		select {
		case <-c.stopMember:
			return
		case <-hb.Chan():
		case <-c.kick:
		case <-commitC:
			ctx, cancel := context.WithTimeout(c.bg, c.cfg.requestTimeout)
			err := c.commit(ctx)
			cancel()
			if err != nil && !errors.Is(err, ErrRebalanced) {
				c.cfg.logger.Warn("commit failed; retrying at the next", "group", c.group, "err", err)
			}
			continue
		case req := <-c.commitReq:
			req.done <- c.commit(req.ctx)
			continue
		}
		// Commit what moved first: a rebalance the heartbeat brings would
		// refuse it (the leader takes commits of the current generation
		// only), and the queue's next owner would handle it again.
		if !c.cfg.manualCommit {
			ctx, cancel := context.WithTimeout(c.bg, c.cfg.requestTimeout)
			_ = c.commit(ctx)
			cancel()
		}
		// Heartbeat.
		ctx, cancel := context.WithTimeout(c.bg, min(c.cfg.requestTimeout, session/2))
		sent := clk.Now()
		reply, err := c.cfg.coord.ConsumerHeartbeat(ctx, c.heartbeatReq(false))
		cancel()
		next := c.cfg.heartbeat
		if err != nil {
			select {
			case <-c.stopMember:
				return
			default:
			}
			c.cfg.logger.Warn("heartbeat failed", "group", c.group, "member", c.cfg.member, "err", err)
			if errors.Is(err, protocol.ErrUnknownTopic) || errors.Is(err, protocol.ErrInvalid) {
				c.fail(metaErr("heartbeat", err))
			}
			// The leader ends the session at least a session after it got
			// the last heartbeat, which it got after it was sent. Stop
			// consuming a heartbeat before that, so another member that
			// takes the queues does not find this one still at them.
			if !lastOK.IsZero() && clk.Since(lastOK) >= session-c.cfg.heartbeat {
				c.dropAll("no heartbeat answered for the session")
				lastOK = time.Time{}
			}
			hb.Reset(next)
			continue
		}
		lastOK = sent
		c.stats.heartbeats.Add(1)
		if reply.SessionMillis > 0 {
			session = time.Duration(reply.SessionMillis) * time.Millisecond
		}
		c.apply(reply)
		hb.Reset(next)
	}
}

// dropAll stops consuming every queue without committing: the member lost
// its session, its queues are (or soon will be) another member's.
func (c *Consumer) dropAll(why string) {
	c.mu.Lock()
	parts := c.parts
	c.parts = map[qkey]*part{}
	c.gen = 0 // join again
	c.mu.Unlock()
	if len(parts) > 0 {
		c.cfg.logger.Warn("stopped consuming every queue: "+why, "group", c.group, "queues", len(parts))
	}
	for _, p := range parts {
		p.stop()
	}
}

// apply moves to the reply's generation: it commits and stops the queues no
// longer assigned, and starts the new ones from their committed offsets.
func (c *Consumer) apply(reply api.ConsumerHeartbeatReply) {
	want := make(map[qkey]api.QueueAssignment, len(reply.Assignment))
	for _, a := range reply.Assignment {
		want[qkey{a.Topic, a.Queue}] = a
	}
	c.mu.Lock()
	oldGen := c.gen
	var revoked []*part
	for k, p := range c.parts {
		if _, ok := want[k]; !ok {
			revoked = append(revoked, p)
		}
	}
	same := reply.Generation == oldGen && len(revoked) == 0 && len(want) == len(c.parts)
	c.mu.Unlock()
	if same {
		return
	}
	if reply.Generation != oldGen {
		c.stats.rebalances.Add(1)
	}
	if len(revoked) > 0 {
		// Stop fetching, then commit what was processed in the old
		// generation (the leader may refuse it: the new owner then gets the
		// uncommitted messages again), then drop.
		for _, p := range revoked {
			p.stopFetch()
		}
		ctx, cancel := context.WithTimeout(c.bg, c.cfg.requestTimeout)
		if err := c.commitParts(ctx, oldGen, revoked); err != nil {
			c.cfg.logger.Debug("commit of revoked queues refused", "group", c.group, "err", err)
		}
		cancel()
		for _, p := range revoked {
			p.stop()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	for _, p := range revoked {
		delete(c.parts, p.key)
	}
	c.gen = reply.Generation
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
	c.cfg.logger.Info("assignment", "group", c.group, "member", c.cfg.member, "generation", reply.Generation,
		"queues", len(want), "added", added, "revoked", len(revoked))
}

// commit commits every part's processed offset that moved, in the current
// generation. STALE_GENERATION wakes the heartbeat.
func (c *Consumer) commit(ctx context.Context) error {
	c.mu.Lock()
	gen := c.gen
	parts := make([]*part, 0, len(c.parts))
	for _, p := range c.parts {
		parts = append(parts, p)
	}
	c.mu.Unlock()
	err := c.commitParts(ctx, gen, parts)
	if errors.Is(err, protocol.ErrStaleGeneration) {
		signal(c.kick)
	}
	return err
}

// commitParts commits the processed offsets of parts that moved, in gen,
// with one call.
func (c *Consumer) commitParts(ctx context.Context, gen uint64, parts []*part) error {
	if gen == 0 {
		return nil
	}
	var offs []api.QueueOffset
	var moved []*part
	for _, p := range parts {
		p.mu.Lock()
		pos := p.processedLocked()
		if pos >= 0 && pos != p.committed {
			epoch, group := p.epochNow()
			offs = append(offs, api.QueueOffset{Topic: p.key.topic, Queue: p.key.queue, Offset: pos, Epoch: epoch, EpochGroup: group})
			moved = append(moved, p)
		}
		p.mu.Unlock()
	}
	if len(offs) == 0 {
		return nil
	}
	_, err := c.cfg.coord.CommitOffsets(ctx, api.CommitRequest{Group: c.group, Member: c.cfg.member, Generation: gen, Offsets: offs})
	if err != nil {
		c.stats.commitErrors.Add(1)
		return metaErr("commit", err)
	}
	c.stats.commits.Add(1)
	for i, p := range moved {
		p.mu.Lock()
		p.committed = max(p.committed, offs[i].Offset)
		p.mu.Unlock()
	}
	return nil
}
