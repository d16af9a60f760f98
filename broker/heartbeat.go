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

// writeLease is the broker's permission to take writes. It holds when all
// of these do:
//
//   - the last heartbeat reply the metaserver leader accepted named this
//     broker the master of a writable group, in epoch E;
//   - that heartbeat was sent less than one session ago, by this broker's
//     monotonic clock (the lease runs from the send, not from the reply:
//     the leader's session for it started later, at the receipt, so the
//     lease always ends first); the session is the shorter of the broker's
//     and the metaserver's (the reply says it);
//   - the broker has taken over epoch E (ready: its follower stopped, the
//     epoch is on disk, replication runs);
//   - no reply, and no HA peer's fetch or ack, has shown the broker an
//     epoch newer than E. A client's request is no such proof: a newer
//     epoch on a SEND or PULL refuses that SEND and asks the registry now
//     (claim), and only its answer ends the lease.
//
// A broker cut off from the metaserver loses the lease by itself, without
// hearing anything; the leader promotes its slave only after the session
// plus a margin, by which time the lease has run out (DESIGN.md,
// "Failover"). Every acknowledgement is checked against the lease when it
// is sent, not only when the message arrived.
type writeLease struct {
	clock   clockwork.Clock
	session time.Duration

	// kick asks for a heartbeat now, coalesced and rate-limited
	// (heartbeater.kick); nil: none. Set before the broker serves.
	kick func()

	word  atomic.Pointer[leaseWord]
	ready atomic.Uint32 // the epoch the broker has taken over as master; 0: none
	seen  atomic.Uint32 // the newest epoch a reply or an HA peer showed
}

// leaseWord is the registry's last accepted word.
type leaseWord struct {
	master   bool // this broker is the master and the group is writable
	epoch    uint32
	sentAt   time.Time // carries the monotonic reading
	writable bool
	session  time.Duration // how long the word lasts from sentAt
}

// renew records an accepted heartbeat's verdict: whether the registry
// names this broker the master of a writable group, in which epoch, and
// when the heartbeat was sent. It reports whether the lease's validity
// changed.
//
// The registry's word replaces any newer epoch an HA peer showed, and a
// genuine newer epoch cannot be undone by a reply, since any reply that
// names this broker the master was sent before the promotion, by more than
// a session.
//
// metaSession is the metaserver's session from the reply (0: unknown); the
// word lasts the shorter of it and the broker's own.
func (l *writeLease) renew(sentAt time.Time, master bool, writable bool, epoch uint32, metaSession time.Duration) (changed bool) {
	was := l.valid()
	session := l.session
	if metaSession > 0 && metaSession < session {
		session = metaSession
	}
	l.seen.Store(epoch)
	l.word.Store(&leaseWord{master: master, writable: writable, epoch: epoch, sentAt: sentAt, session: session})
	return l.valid() != was
}

// fence records an epoch an HA peer's fetch or ack showed (the HA link
// takes only the cluster principal when authorization is on). A newer
// epoch than the lease's ends it at once, until the registry's next word.
// A client's epoch goes to claim instead.
func (l *writeLease) fence(epoch uint32) {
	for {
		s := l.seen.Load()
		if epoch <= s || l.seen.CompareAndSwap(s, epoch) {
			return
		}
	}
}

// claim takes the epoch a client's SEND or PULL names. A client is not
// trusted to fence the broker (anyone allowed one topic could then stop
// every write): a newer epoch than the lease's only asks for a heartbeat
// now, and reports true, so that the caller refuses a SEND (NOT_MASTER,
// nothing stored). If the epoch is genuine the registry's answer ends the
// lease; the timing rules (DESIGN.md, "Failover") keep a replaced master
// from acknowledging meanwhile. Kicks are coalesced and at least a quarter
// heartbeat interval apart, so a stream of claims costs at most four
// heartbeats an interval.
func (l *writeLease) claim(epoch uint32) (newer bool) {
	if epoch <= l.epoch() {
		return false
	}
	if l.kick != nil {
		l.kick()
	}
	return true
}

// epoch returns the epoch the lease is for (0 before any word).
func (l *writeLease) epoch() uint32 {
	if w := l.word.Load(); w != nil {
		return w.epoch
	}
	return 0
}

// valid reports whether the broker may take writes now.
func (l *writeLease) valid() bool { return l.validFor(l.epoch()) }

// validFor reports whether the broker may acknowledge a write it took in
// epoch: the lease holds now, for that same epoch.
func (l *writeLease) validFor(epoch uint32) bool {
	w := l.word.Load()
	return w != nil && w.master && w.writable && w.epoch == epoch && epoch != 0 &&
		l.ready.Load() == epoch && l.seen.Load() <= epoch && l.clock.Since(w.sentAt) < w.session
}

// fenced reports whether a reply or an HA peer showed a newer epoch than
// the lease's: the broker has been replaced as master.
func (l *writeLease) fenced() bool { return l.seen.Load() > l.epoch() }

// registry is the part of the metaserver client that heartbeats use.
type registry interface {
	Heartbeat(ctx context.Context, hb api.Heartbeat) (api.HeartbeatReply, error)
}

// heartbeater sends a heartbeat every interval (a quarter of it while the
// group is read-only, so a promotion or a recovery is learned fast) and
// renews the write lease with each accepted reply. Missing replies need no
// action: the lease runs out by itself.
type heartbeater struct {
	id       string // this broker's id
	meta     registry
	lease    *writeLease
	interval time.Duration
	clock    clockwork.Clock
	log      hclog.Logger
	// describe fills a heartbeat with the broker's current state.
	describe func(*api.Heartbeat)
	// observe takes the group as the registry has it, after each accepted
	// heartbeat. It must not block.
	observe func(routing.Group)
	// aclVersion, when authorization is on, takes each accepted reply's
	// ACL version (nil: off). It must not block.
	aclVersion func(uint64)

	// kicks asks for a heartbeat now (capacity 1): the broker learned
	// something the registry may have news about (a slave it does not
	// know fetched in its epoch). Kicked heartbeats are at least a quarter
	// interval apart.
	kicks chan struct{}

	failing bool // the last heartbeat failed; logged once per outage
	fast    bool // the last reply showed a read-only group
}

// kick asks for a heartbeat soon; it never blocks.
func (h *heartbeater) kick() {
	select {
	case h.kicks <- struct{}{}:
	default:
	}
}

func (h *heartbeater) run(ctx context.Context) {
	quarter := max(h.interval/4, time.Millisecond)
	for {
		h.beat(ctx)
		next := h.interval
		if h.fast {
			next = quarter
		}
		t := h.clock.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.Chan():
		case <-h.kicks:
			t.Stop()
			q := h.clock.NewTimer(quarter)
			select {
			case <-ctx.Done():
				q.Stop()
				return
			case <-q.Chan():
			}
		}
	}
}

// beat sends one heartbeat and applies its reply.
func (h *heartbeater) beat(ctx context.Context) {
	var hb api.Heartbeat
	h.describe(&hb)
	cctx, cancel := context.WithTimeout(ctx, h.interval)
	defer cancel()
	sentAt := h.clock.Now()
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
	g := reply.Group
	role, _ := g.RoleOf(h.id)
	h.fast = !g.Writable() || role == ""
	if h.lease.renew(sentAt, role == routing.RoleMaster, g.Writable(), g.Epoch, time.Duration(reply.SessionMillis)*time.Millisecond) {
		h.log.Info("write lease changed", "writable", h.lease.valid(), "role", role, "epoch", g.Epoch, "reasons", g.Reasons.String())
	}
	h.observe(g)
	if h.aclVersion != nil {
		h.aclVersion(reply.ACLVersion)
	}
}
