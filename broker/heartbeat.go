package broker

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/routing"
)

// writeLease is the broker's permission to take writes: the group state in
// the last heartbeat reply the metaserver leader accepted, good for one
// session from when it was accepted. A broker cut off from the metaserver
// loses it by itself, without hearing anything: the registry may already
// have marked its group read-only, and it must not take writes the cluster
// thinks it refuses.
type writeLease struct {
	clock   clockwork.Clock
	session time.Duration

	writable atomic.Bool
	at       atomic.Int64 // unix nanoseconds of the last accepted heartbeat; 0 before the first
}

// renew records an accepted heartbeat's verdict and reports whether the
// lease's validity changed.
func (l *writeLease) renew(writable bool) (changed bool) {
	was := l.valid()
	l.writable.Store(writable)
	l.at.Store(l.clock.Now().UnixNano())
	return l.valid() != was
}

// valid reports whether the broker may take writes now.
func (l *writeLease) valid() bool {
	at := l.at.Load()
	return at != 0 && l.writable.Load() && l.clock.Since(time.Unix(0, at)) < l.session
}

// registry is the part of the metaserver client that heartbeats use.
type registry interface {
	Heartbeat(ctx context.Context, hb api.Heartbeat) (api.HeartbeatReply, error)
}

// heartbeater sends a heartbeat every interval and renews the write lease
// with each accepted reply. Missing replies need no action: the lease runs
// out by itself.
type heartbeater struct {
	meta     registry
	lease    *writeLease
	interval time.Duration
	clock    clockwork.Clock
	log      hclog.Logger
	// describe fills a heartbeat with the broker's current state.
	describe func(*api.Heartbeat)
	// observe takes the group as the registry has it, after each accepted
	// heartbeat.
	observe func(routing.Group)

	failing bool // the last heartbeat failed; logged once per outage
}

func (h *heartbeater) run(ctx context.Context) {
	tick := h.clock.NewTicker(h.interval)
	defer tick.Stop()
	for {
		h.beat(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.Chan():
		}
	}
}

// beat sends one heartbeat and applies its reply.
func (h *heartbeater) beat(ctx context.Context) {
	var hb api.Heartbeat
	h.describe(&hb)
	cctx, cancel := context.WithTimeout(ctx, h.interval)
	defer cancel()
	reply, err := h.meta.Heartbeat(cctx, hb)
	if err != nil {
		if ctx.Err() == nil && !h.failing {
			h.log.Warn("heartbeat failed; the broker turns read-only if none is accepted for a session",
				"session", h.lease.session, "error", err)
		}
		h.failing = true
		return
	}
	if h.failing {
		h.log.Info("heartbeats accepted again")
	}
	h.failing = false
	if h.lease.renew(reply.Group.Writable()) {
		h.log.Info("write lease changed", "writable", h.lease.valid(), "reasons", reply.Group.Reasons.String())
	}
	h.observe(reply.Group)
}
