package broker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/routing"
)

// registry is the part of the metaserver client that heartbeats use.
type registry interface {
	Heartbeat(ctx context.Context, hb api.Heartbeat) (api.HeartbeatReply, error)
}

// groupView is the registry's word on this broker's group, from one
// accepted heartbeat reply. The session publishes one per reply and never
// changes it afterwards; the roles, the ACL copy and the tail handover act
// on it.
type groupView struct {
	// Group is the group as the registry has it: its epoch, master and
	// slave, whether it is writable (Reasons), and its epoch history.
	routing.Group
	// Role is this broker's role in the group; "" while the group does not
	// name it (the registry has not placed it).
	Role routing.Role
	// ResyncSeq is the Seq of an operator's order to this broker to set its
	// log aside and copy it afresh from the master; 0: none.
	ResyncSeq uint64
	// ACLVersion is the version of the registry's permission table.
	ACLVersion uint64
	// LagTime is the cluster's lag time (0: the broker's own).
	LagTime time.Duration
	// ReadableEnd is where this broker's reads stop while it is a slave
	// (api.HeartbeatReply.ReadableEnd); -1: no limit.
	ReadableEnd int64
}

// viewSource is where a part reads the registry's word: subscribe returns a
// channel signalled (capacity 1, never waited on) after each newer view,
// and latest returns the newest one (nil before the first reply). A slow
// reader misses nothing but the views between two it read.
type viewSource interface {
	subscribe() <-chan struct{}
	latest() *groupView
}

// session is this broker's session with the registry. It owns the
// heartbeat loop, the write lease that accepted replies renew, and kicks
// (requests for a heartbeat now); it publishes each accepted reply as a
// groupView. It calls nothing of the parts that read the views: it
// signals them and goes on, so a slow reader never holds up a heartbeat.
//
// A heartbeat goes out every interval (a quarter of it while the group is
// read-only or the broker unplaced, so a promotion or a recovery is learned
// fast); a kick brings the next one forward, at least a quarter interval
// after the last. Missing replies need no action: the lease runs out by
// itself.
type session struct {
	id       string // this broker's id
	meta     registry
	interval time.Duration
	clock    clockwork.Clock
	log      hclog.Logger

	lease writeLease
	// skew is the registry leader's clock minus this broker's, as of the
	// last heartbeat reply (nanoseconds; within half a round trip).
	skew atomic.Int64
	// kicks asks for a heartbeat now (capacity 1): the broker learned
	// something the registry may have news about (a client's newer epoch, a
	// slave it does not know fetching in its epoch).
	kicks chan struct{}

	view atomic.Pointer[groupView]
	mu   sync.Mutex
	subs []chan struct{}

	failing bool // the last heartbeat failed; logged once per outage (run's)
	fast    bool // the last reply showed a read-only group or no place (run's)
}

// newSession makes the session of broker id; run starts its heartbeats.
// The write lease lasts timeout from each accepted heartbeat's send, or the
// metaserver's session if shorter.
func newSession(id string, meta registry, interval, timeout time.Duration, clock clockwork.Clock, log hclog.Logger) *session {
	return &session{id: id, meta: meta, interval: interval, clock: clock, log: log,
		lease: writeLease{clock: clock, session: timeout}, kicks: make(chan struct{}, 1)}
}

// subscribe returns a channel signalled after each view published from now
// on (see viewSource).
func (s *session) subscribe() <-chan struct{} {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	s.subs = append(s.subs, ch)
	s.mu.Unlock()
	return ch
}

// latest returns the newest view, nil before the first accepted reply.
func (s *session) latest() *groupView { return s.view.Load() }

func (s *session) publish(v *groupView) {
	s.view.Store(v)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ch := range s.subs {
		select {
		case ch <- struct{}{}:
		default: // signalled already: the reader reads the latest
		}
	}
}

// kick asks for a heartbeat soon; it never blocks.
func (s *session) kick() {
	select {
	case s.kicks <- struct{}{}:
	default:
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
func (s *session) claim(epoch uint32) (newer bool) {
	if epoch <= s.lease.epoch() {
		return false
	}
	s.kick()
	return true
}

// fence takes an epoch an HA peer's fetch or ack showed (writeLease.fence).
func (s *session) fence(epoch uint32) { s.lease.fence(epoch) }

// run heartbeats until ctx ends; describe fills each heartbeat with the
// broker's state.
func (s *session) run(ctx context.Context, describe func(*api.Heartbeat)) {
	quarter := max(s.interval/4, time.Millisecond)
	for {
		s.beat(ctx, describe)
		next := s.interval
		if s.fast {
			next = quarter
		}
		t := s.clock.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.Chan():
		case <-s.kicks:
			t.Stop()
			q := s.clock.NewTimer(quarter)
			select {
			case <-ctx.Done():
				q.Stop()
				return
			case <-q.Chan():
			}
		}
	}
}

// beat sends one heartbeat, renews the lease with its reply and publishes
// the reply's view.
func (s *session) beat(ctx context.Context, describe func(*api.Heartbeat)) {
	var hb api.Heartbeat
	describe(&hb)
	cctx, cancel := context.WithTimeout(ctx, s.interval)
	defer cancel()
	sentAt := s.clock.Now()
	reply, err := s.meta.Heartbeat(cctx, hb)
	if err != nil {
		if ctx.Err() == nil && !s.failing {
			s.log.Warn("heartbeat failed; the broker turns read-only if none is accepted for a session",
				"session", s.lease.session, "error", err)
		}
		s.failing = true
		return
	}
	if s.failing {
		s.log.Info("heartbeats accepted again")
	}
	s.failing = false
	if reply.NowMillis > 0 {
		// The leader read its clock between sending and receiving: its
		// reading against the middle of the round trip.
		recvAt := s.clock.Now()
		mid := sentAt.Add(recvAt.Sub(sentAt) / 2)
		s.skew.Store(int64(time.UnixMilli(reply.NowMillis).Sub(mid)))
	}
	g := reply.Group
	role, _ := g.RoleOf(s.id)
	s.fast = !g.Writable() || role == ""
	if s.lease.renew(sentAt, role == routing.RoleMaster, g.Writable(), g.Epoch, time.Duration(reply.SessionMillis)*time.Millisecond) {
		s.log.Info("write lease changed", "writable", s.lease.valid(), "role", role, "epoch", g.Epoch, "reasons", g.Reasons.String())
	}
	v := &groupView{Group: g, Role: role, ACLVersion: reply.ACLVersion, LagTime: time.Duration(reply.LagTimeMillis) * time.Millisecond, ReadableEnd: -1}
	if reply.ReadableEnd != nil {
		v.ReadableEnd = *reply.ReadableEnd
	}
	if o := g.Resync; o != nil && o.Broker == s.id {
		v.ResyncSeq = o.Seq
	}
	s.publish(v)
}
