package broker

import (
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
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
//     (session.claim), and only its answer ends the lease.
//
// A broker cut off from the metaserver loses the lease by itself, without
// hearing anything; the leader promotes its slave only after the session
// plus a margin, by which time the lease has run out (DESIGN.md,
// "Failover"). Every acknowledgement is checked against the lease when it
// is sent, not only when the message arrived.
type writeLease struct {
	clock   clockwork.Clock
	session time.Duration

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
// A client's epoch goes to session.claim instead.
func (l *writeLease) fence(epoch uint32) {
	for {
		s := l.seen.Load()
		if epoch <= s || l.seen.CompareAndSwap(s, epoch) {
			return
		}
	}
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
