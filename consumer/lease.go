package consumer

import (
	"context"
	"slices"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
)

// One owner at a time, on the member's side (DESIGN.md, "Consumer groups").
//
//   - The lease: a member delivers a message only while its last answered
//     heartbeat was sent less than its session, less a heartbeat interval,
//     ago (by its own clock). The leader ends a silent member's session a
//     session after it received that heartbeat, which was after the send, so
//     a member that is cut off, paused or slow stops delivering before the
//     leader gives its queues to another. Every delivery checks it (Run's
//     workers before each handler call, Poll before it hands messages out),
//     not only a failed heartbeat; once it lapsed the member drops every
//     queue without committing, and takes them again from the registry's
//     committed offsets when a heartbeat is answered.
//   - Letting go: a queue the registry gives to another member is stopped
//     (no further message handed out), its handler call under way is
//     allowed to finish, its offset is committed, and only then does the
//     member report it released in its next heartbeat (sent at once). The
//     registry gives the queue to its new owner only after that report,
//     the member's leave, or the end of its session.

// leaseMargin is how much before its session ends a member stops
// delivering without an answered heartbeat.
func (c *Consumer) leaseMargin(session time.Duration) time.Duration {
	return min(c.cfg.heartbeat, session/2)
}

// renewLease records an answered heartbeat sent at sent, in a session,
// and wakes whoever waits for the lease.
func (c *Consumer) renewLease(sent time.Time, session time.Duration) {
	until := sent.Add(session - c.leaseMargin(session))
	c.lease.Store(&until)
	c.leaseMu.Lock()
	if c.leaseWake != nil {
		close(c.leaseWake)
		c.leaseWake = nil
	}
	c.leaseMu.Unlock()
}

// leaseValid reports whether the member may deliver now. It runs before
// every handler call: on the real clock, time.Until reads the monotonic
// clock alone (the lease's end has a monotonic reading, from the clock's
// Now), where Now reads the wall clock too, as costly again on a VM.
func (c *Consumer) leaseValid() bool {
	until := c.lease.Load()
	if until == nil {
		return false
	}
	if c.cfg.realClock {
		return time.Until(*until) > 0
	}
	return c.cfg.clock.Now().Before(*until)
}

// waitLease waits until the member may deliver, or ctx ends (false). A
// worker whose member lost its lease waits here: the member loop drops the
// queue or renews the lease.
func (c *Consumer) waitLease(ctx context.Context) bool {
	if c.leaseValid() {
		return true // the lease is renewed by a store: no lock to see it
	}
	for {
		c.leaseMu.Lock()
		if c.leaseValid() {
			c.leaseMu.Unlock()
			return true
		}
		if c.leaseWake == nil {
			c.leaseWake = make(chan struct{})
		}
		wake := c.leaseWake
		c.leaseMu.Unlock()
		signal(c.kick)
		select {
		case <-ctx.Done():
			return false
		case <-wake:
		}
	}
}

// letGo stops handing out the parts' messages and, for each on its own
// goroutine, waits for its handler call under way, commits it, and queues
// it to be reported released (the member loop is kicked to send it).
func (c *Consumer) letGo(parts []*part, work map[qkey]chan struct{}) {
	c.relMu.Lock()
	if c.lettingGo == nil {
		c.lettingGo = map[qkey]bool{}
	}
	for _, p := range parts {
		c.lettingGo[p.key] = true
	}
	c.relMu.Unlock()
	for _, p := range parts {
		p.stopFetch() // the worker hands out nothing more and returns after its call
		done := work[p.key]
		c.releaseWG.Add(1)
		go func() {
			defer c.releaseWG.Done()
			if done != nil {
				<-done
			}
			ctx, cancel := context.WithTimeout(c.bg, c.cfg.requestTimeout)
			if err := c.commitParts(ctx, []*part{p}); err != nil {
				c.cfg.Logger.Debug("commit of a released queue refused", "group", c.group, "queue", p.key.String(), "err", err)
			}
			cancel()
			p.stop()
			c.relMu.Lock()
			c.released = append(c.released, api.QueueRef{Topic: p.key.topic, Queue: p.key.queue})
			c.relMu.Unlock()
			signal(c.kick)
		}()
	}
}

// releaseUnheld reports released, at once, the queues the registry says
// this member holds for others that it has no part of (it never took them:
// say a rebalance gave them to it and away again between two of its
// heartbeats), nor is letting go.
func (c *Consumer) releaseUnheld(release []api.QueueRef) {
	if len(release) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.relMu.Lock()
	defer c.relMu.Unlock()
	for _, q := range release {
		k := qkey{q.Topic, q.Queue}
		if c.parts[k] != nil || c.lettingGo[k] || slices.Contains(c.released, q) {
			continue
		}
		c.released = append(c.released, q)
		signal(c.kick)
	}
}

// toRelease is what the next heartbeat reports released.
func (c *Consumer) toRelease() []api.QueueRef {
	c.relMu.Lock()
	defer c.relMu.Unlock()
	return slices.Clone(c.released)
}

// reported drops what an answered heartbeat reported released.
func (c *Consumer) reported(sent []api.QueueRef) {
	if len(sent) == 0 {
		return
	}
	c.relMu.Lock()
	defer c.relMu.Unlock()
	c.released = slices.DeleteFunc(c.released, func(q api.QueueRef) bool { return slices.Contains(sent, q) })
	for _, q := range sent {
		delete(c.lettingGo, qkey{q.Topic, q.Queue})
	}
}
