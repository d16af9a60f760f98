package broker

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

// roleLog is the part of the commit log that role changes use.
type roleLog interface {
	masterLog
	slaveLog
	StartOffset() int64
	Truncate(offset int64, sideFile string) (storage.TruncateResult, error)
}

// RoleKind is what a broker is in its group now.
type RoleKind uint8

const (
	// RoleStarting: the registry has not placed the broker yet.
	RoleStarting RoleKind = iota
	// RoleMaster: the registry names it the master and it took the epoch
	// over.
	RoleMaster
	// RoleSlave: it follows its master.
	RoleSlave
	// RoleWaiting: a slave that does not follow yet, for a reason that
	// passes by itself (its new master has not confirmed where its epoch
	// began).
	RoleWaiting
	// RoleBroken: a slave that cannot follow because of its own log (it is
	// not a prefix of the master's, or cannot be cut where the group's
	// history says): it stays so until an operator resyncs it (`ferryctl
	// broker resync ID`) or it restarts. It holds no group read-only.
	RoleBroken
)

var roleKindNames = [...]string{RoleStarting: "starting", RoleMaster: "master", RoleSlave: "slave",
	RoleWaiting: "waiting", RoleBroken: "broken"}

func (k RoleKind) String() string {
	if int(k) < len(roleKindNames) {
		return roleKindNames[k]
	}
	return fmt.Sprintf("RoleKind(%d)", k)
}

// RoleState is what the broker is, and why when it waits or is broken.
type RoleState struct {
	Kind RoleKind
	Why  string
}

func (s RoleState) String() string {
	if s.Why == "" {
		return s.Kind.String()
	}
	return s.Kind.String() + ": " + s.Why
}

// roles makes the broker what the registry says it is. It runs on one
// goroutine and reads the session's latest view after each accepted
// heartbeat reply (a slow reconcile skips the views in between); it is the
// only place that starts or stops replication and the follower, cuts the
// log on a role change, and writes the local epochs (epochs.go).
//
// Becoming the master of epoch E: stop the follower (so the log stops
// growing from the old master), record E as starting at the log end on
// disk, start replication, then mark E ready in the write lease. Every
// heartbeat then reports that start (the registry fixes it once). Becoming
// the slave in epoch E: stop replication (HIGH messages still waiting are
// answered LEASE_LOST), cut the log back to the lowest start of the epochs
// after the last one it holds (waiting while the current epoch's start is
// not fixed), record the registry's epochs up to E, and follow the master;
// the first fetch of every stream checks that the log is a prefix of the
// master's.
type roles struct {
	id      string
	dir     string
	log     roleLog
	sess    *session
	epochs  *epochState // written here only
	clock   clockwork.Clock
	lg      hclog.Logger
	partLog hclog.Logger // the broker's, for replication and the follower
	stats   *Stats
	fixedHA string // a configured master HA address, "" to take the registry's
	// pulls are the parked PULLs: answered at a step-down or a truncation,
	// woken by the follower's appends.
	pulls pullWaker
	// tails hands the side file of a cut that a failover made (the old
	// master's acknowledged tail) to the new master (recover.go); nil: cut
	// tails are kept for the operator only (-failover-tail=discard).
	tails *tailHandover
	// What replication and the follower are made with.
	replCfg    replConfig
	dial       func(addr string) masterLink
	fetchBytes int
	fetchWait  time.Duration

	views    <-chan struct{} // the session's signal of a newer view
	diverged chan error      // capacity 1: the follower found the log is not the master's prefix

	repl      atomic.Pointer[replication] // while master
	alter     alterFunc
	readable  int64 // the last view's ReadableEnd, owned by the role loop
	replStop  func()
	follow    *follower // while slave
	followEnd func()
	hist      localEpochs  // owned by run's goroutine
	masterEnd atomic.Int64 // the master's log end in the follower's last answer
	// start is where the epoch this broker leads began, as its disk
	// records it (-1 while it is not master, or the start is unknown).
	start atomic.Int64
	// takeoverTail is where the log's last record began when this broker
	// last took over as master, before it took a write (-1: none): the
	// delayer checks it for a release whose mark a crash or a failover cut.
	takeoverTail atomic.Int64
	// cut is told when the log was cut back (the delayer rebuilds its
	// index); nil: nobody.
	cut        func()
	lastCut    atomic.Pointer[api.Cut]
	resyncDone atomic.Uint64 // the Seq of the last resync order carried out
	state      atomic.Pointer[RoleState]
	warned     string // the last reason logged, so each is logged once
}

// pullWaker is what the roles and the follower tell the parked PULLs
// (longPoll).
type pullWaker interface {
	releaseAll()  // answer every parked PULL now (a step-down, a truncation)
	appendedAny() // the log grew by records of unknown queues
}

const epochFile = "epoch"

// alterFunc proposes a sync set to the registry (metaserver/client's
// AlterSyncSet) and returns the group as the registry has it after.
type alterFunc func(ctx context.Context, req api.AlterSyncSetRequest) (routing.Group, error)

// sideDir holds the records cut by truncations.
const sideDir = "truncated"

// newRoles makes the role loop of the broker cfg configures, over its log;
// it loads the local epochs from cfg.Dir into epochs.
//
// alter proposes the group's sync set to the registry while this broker
// is the master (nil: it never changes the set).
func newRoles(cfg Config, log roleLog, sess *session, epochs *epochState, pulls pullWaker, tails *tailHandover, stats *Stats, lg hclog.Logger, alter alterFunc) (*roles, error) {
	r := &roles{id: cfg.ID, dir: cfg.Dir, log: log, sess: sess, epochs: epochs, clock: cfg.Clock, lg: lg.Named("roles"), partLog: lg, stats: stats,
		fixedHA: cfg.MasterHAAddr, pulls: pulls, tails: tails, alter: alter,
		replCfg: replConfig{HighWait: cfg.HighWait, FetchBytes: cfg.HAFetchBytes, FetchWait: cfg.HAFetchWait,
			SlaveLagTime: cfg.SlaveLagTime},
		dial: masterDialer(cfg.TLSClient, cfg.ClusterToken), fetchBytes: cfg.HAFetchBytes, fetchWait: cfg.HAFetchWait,
		views: sess.subscribe(), diverged: make(chan error, 1)}
	r.setState(RoleState{Kind: RoleStarting})
	r.start.Store(-1)
	r.takeoverTail.Store(-1)
	h, err := loadEpochs(r.dir)
	if err != nil {
		return nil, err
	}
	r.hist = h
	epochs.local.Store(h.epoch())
	return r, nil
}

// replication returns the running replication, nil unless master.
func (r *roles) replication() *replication { return r.repl.Load() }

// State is what the broker is now.
func (r *roles) State() RoleState { return *r.state.Load() }

func (r *roles) setState(s RoleState) { r.state.Store(&s) }

func (r *roles) run(ctx context.Context) {
	defer r.stopAll()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.views:
			if v := r.sess.latest(); v != nil {
				r.reconcile(ctx, v)
			}
		case err := <-r.diverged:
			if r.follow != nil {
				r.stopFollower()
				r.setBroken(err.Error())
			}
		}
	}
}

func (r *roles) stopAll() {
	r.sess.lease.ready.Store(0)
	r.stopReplication("the broker is shutting down")
	r.stopFollower()
}

// serveFetch serves an HA_FETCH while the broker is master, and refuses
// it NOT_MASTER otherwise.
func (r *roles) serveFetch(q *transport.Request) {
	if rep := r.replication(); rep != nil {
		rep.handleFetch(q, q.Body)
		return
	}
	q.ReplyError(r.notMaster())
}

// serveAck serves an HA_ACK like serveFetch.
func (r *roles) serveAck(q *transport.Request) {
	if rep := r.replication(); rep != nil {
		rep.handleAck(q, q.Body)
		return
	}
	q.ReplyError(r.notMaster())
}

func (r *roles) notMaster() error {
	return &protocol.Error{Status: protocol.StatusNotMaster, Message: "broker " + r.id + " is not its group's master"}
}

// reconcile makes the broker what the view v says.
func (r *roles) reconcile(ctx context.Context, v *groupView) {
	r.epochs.view.Store(v)
	g := v.Group
	if v.ResyncSeq > r.resyncDone.Load() {
		r.resync(v, v.ResyncSeq)
	}
	if v.Role == "" || g.Epoch == 0 {
		return // the registry has not placed this broker (the heartbeat said why)
	}
	if h, changed := r.hist.learn(g); changed {
		if err := h.save(r.dir); err != nil {
			r.lg.Warn("recording the epoch starts the registry fixed failed", "error", err)
		} else {
			r.hist = h
		}
	}
	if why := r.hist.conflict(g); why != "" {
		if v.Role == routing.RoleMaster {
			// A master cannot set its log aside; its slave's prefix check
			// (LOG_DIVERGED) stops a slave from copying onto a log that
			// left this one.
			r.warn("the group's epoch history disagrees with this master's log", why)
		} else {
			r.stopFollower()
			r.setBroken(why + "; to copy this broker's log afresh from its master: ferryctl broker resync " + r.id)
			return
		}
	}
	switch v.Role {
	case routing.RoleMaster:
		r.becomeMaster(g, v.LagTime)
	case routing.RoleSlave:
		r.becomeSlave(ctx, g)
		if v.ReadableEnd != r.readable {
			// Reads stop somewhere else now: PULLs parked at the old limit
			// look again.
			r.readable = v.ReadableEnd
			r.pulls.appendedAny()
		}
	}
}

func (r *roles) becomeMaster(g routing.Group, lagTime time.Duration) {
	if rep := r.repl.Load(); rep != nil && r.sess.lease.ready.Load() == g.Epoch {
		rep.setLagTime(lagTime)
		rep.setGroup(g, r.id)
		return
	}
	r.stopFollower() // from now on the log grows only by this broker's writes
	start := int64(-1)
	if r.hist.epoch() != g.Epoch {
		start = r.log.EndOffset()
		own := routing.EpochRecord{Epoch: g.Epoch, Master: r.id, Start: start, Fixed: true}
		if reg, ok := g.Record(g.Epoch); ok {
			own.At = reg.At
		}
		h := r.hist.joined(g, g.Epoch, &own)
		if err := h.save(r.dir); err != nil {
			r.lg.Error("cannot take over as master: the epoch is not on disk", "epoch", g.Epoch, "error", err)
			return
		}
		r.hist = h
		r.epochs.local.Store(g.Epoch)
	} else if rec, _ := r.hist.record(g.Epoch); rec.Start >= 0 {
		start = rec.Start // a restart in the epoch it leads: where the epoch began, not the log's end now
	} else if reg, ok := g.Record(g.Epoch); ok {
		// An epochs file of an earlier version holds no start: confirm the
		// registry's (its slave's prefix check catches a wrong one).
		start = reg.Start
	}
	rep := r.repl.Load()
	if rep == nil {
		r.takeoverTail.Store(-1)
		if at, _, ok, err := r.log.LastRecord(); err == nil && ok {
			r.takeoverTail.Store(at) // no SEND is taken before r.repl is set below
		}
		rep = newReplication(r.log, r.replCfg, r.stats, r.clock, r.partLog.Named("replication"), r.sess)
		rep.alter = r.alter
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			rep.run(ctx)
		}()
		r.replStop = func() { cancel(); <-done }
		r.repl.Store(rep)
	}
	rep.setLagTime(lagTime)
	rep.setGroup(g, r.id)
	r.start.Store(start)
	r.sess.lease.ready.Store(g.Epoch)
	r.setState(RoleState{Kind: RoleMaster})
	r.stats.Takeovers.Add(1)
	r.lg.Info("took over as master", "epoch", g.Epoch, "epoch-start", start, "log-end", r.log.EndOffset(), "slave", g.Slave.ID)
}

func (r *roles) becomeSlave(ctx context.Context, g routing.Group) {
	if r.repl.Load() != nil {
		r.sess.lease.ready.Store(0)
		r.start.Store(-1)
		r.stopReplication("the registry made this broker the slave")
		r.releaseParkedPulls()
		r.lg.Warn("stepped down: the registry names another master", "epoch", g.Epoch, "master", g.Master.ID)
	}
	if r.State().Kind == RoleBroken {
		return // until a resync or a restart
	}
	if local := r.hist.epoch(); local < g.Epoch {
		r.stopFollower()
		led := local
		if led == 0 {
			led = g.LastLed(r.id) // a log from before local epochs were kept
		}
		off, cut, err := g.TruncationPoint(led)
		switch {
		case errors.Is(err, routing.ErrStartPending):
			r.setState(RoleState{Kind: RoleWaiting, Why: fmt.Sprintf("epoch %d's master %s has not confirmed where the epoch began", g.Epoch, g.Master.ID)})
			return
		case err != nil:
			r.setBroken(fmt.Sprintf("cannot tell where this log left the group's: %v; to copy it afresh from the master: ferryctl broker resync %s", err, r.id))
			return
		}
		if cut && off < r.log.EndOffset() {
			side := filepath.Join(r.dir, sideDir, storage.SideFileName(off, led))
			handOver := r.tails != nil
			if handOver {
				if err := r.tails.mark(side); err != nil {
					r.lg.Warn("cannot mark the tail to cut for handing over; it stays in its side file for the operator", "side-file", side, "error", err)
					handOver = false
				}
			}
			res, err := r.log.Truncate(off, side)
			if handOver && (err != nil || res.Records == 0) {
				r.tails.unmark(side)
			}
			if err != nil {
				r.setBroken(fmt.Sprintf("cutting the log back to offset %d, where the group's history says epoch %d's successor began, failed: %v; to copy it afresh from the master: ferryctl broker resync %s",
					off, led, err, r.id))
				return
			}
			r.logCut()             // first: the parked PULLs answered next read by the rebuilt index
			r.releaseParkedPulls() // a queue's next offset may have gone back under them
			r.stats.Truncations.Add(1)
			r.stats.TruncatedBytes.Add(res.To - res.From)
			r.lastCut.Store(&api.Cut{Epoch: g.Epoch, Bytes: res.To - res.From, Records: res.Records, SideFile: res.SideFile})
			r.lg.Warn("cut the log back to where the new master's epoch began; the cut records are kept for the operator",
				"from", res.From, "to", res.To, "records", res.Records, "side-file", res.SideFile,
				"led-epoch", led, "epoch", g.Epoch, "read-with", "ferryctl truncated "+res.SideFile)
			if handOver && res.Records > 0 {
				r.tails.cut(res.SideFile)
			}
		}
		h := r.hist.joined(g, g.Epoch, nil)
		if err := h.save(r.dir); err != nil {
			r.setBroken(err.Error())
			return
		}
		r.hist = h
		r.epochs.local.Store(g.Epoch)
	}
	addr := r.fixedHA
	if addr == "" {
		addr = g.Master.HAAddr
	}
	if r.follow != nil && r.follow.epoch == g.Epoch && r.follow.addr == addr {
		return
	}
	r.stopFollower()
	if addr == "" {
		return
	}
	f := &follower{id: r.id, epoch: g.Epoch, addr: addr, log: r.log, dial: r.dial, fetchBytes: r.fetchBytes, fetchWait: r.fetchWait,
		clock: r.clock, lg: r.partLog.Named("follower"), masterEnd: &r.masterEnd, appended: r.pulls.appendedAny, onDiverged: r.followerDiverged}
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.run(fctx)
	}()
	r.follow, r.followEnd = f, func() { cancel(); <-done }
	r.setState(RoleState{Kind: RoleSlave})
	r.lg.Info("following the master", "epoch", g.Epoch, "master", g.Master.ID, "ha-addr", addr, "log-end", r.log.EndOffset())
}

// logCut tells whoever keeps state derived from the log that it was cut.
func (r *roles) logCut() {
	if r.cut != nil {
		r.cut()
	}
}

// followerDiverged is the follower's report that the master refused its log
// (LOG_DIVERGED); it never blocks, and run makes the broker broken.
func (r *roles) followerDiverged(err error) {
	select {
	case r.diverged <- err:
	default:
	}
}

// resync carries out an operator's order: the log is set aside (cut from
// its first offset into a side file) and copied again from the master; the
// broker is no longer broken. A master takes no such order (the registry
// refuses it); one found here is stale and only reported done.
func (r *roles) resync(v *groupView, seq uint64) {
	if v.Role != routing.RoleMaster {
		g := v.Group
		r.stopFollower()
		from := r.log.StartOffset()
		side := filepath.Join(r.dir, sideDir, fmt.Sprintf("%020d-resync-%d.log", from, seq))
		res, err := r.log.Truncate(from, side)
		if err != nil {
			r.setBroken(fmt.Sprintf("the resync could not set the log aside: %v", err))
			return
		}
		r.logCut()
		r.releaseParkedPulls()
		h := r.hist.joined(g, g.Epoch, nil)
		if err := h.save(r.dir); err != nil {
			r.setBroken(fmt.Sprintf("the resync could not record the epochs: %v", err))
			return
		}
		r.hist = h
		r.epochs.local.Store(g.Epoch)
		r.warned = ""
		r.setState(RoleState{Kind: RoleStarting})
		r.stats.Resyncs.Add(1)
		r.lg.Warn("set the log aside on an operator's order; copying it again from the master", "seq", seq,
			"from", res.From, "to", res.To, "records", res.Records, "side-file", res.SideFile)
	}
	r.resyncDone.Store(seq)
}

// setBroken makes the broker broken: it follows nobody until a resync or
// a restart.
func (r *roles) setBroken(why string) {
	r.setState(RoleState{Kind: RoleBroken, Why: why})
	r.warn("the broker cannot follow its master", why)
}

// warn logs why at Error, once per distinct reason.
func (r *roles) warn(msg, why string) {
	if why != r.warned {
		r.lg.Error(msg, "why", why)
		r.warned = why
	}
}

func (r *roles) stopReplication(why string) {
	rep := r.repl.Load()
	if rep == nil {
		return
	}
	r.repl.Store(nil)
	rep.failWaiters(why, protocol.StatusLeaseLost)
	r.replStop()
	r.replStop = nil
}

func (r *roles) releaseParkedPulls() { r.pulls.releaseAll() }

func (r *roles) stopFollower() {
	if r.follow == nil {
		return
	}
	r.followEnd()
	r.follow, r.followEnd = nil, nil
}
