package broker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

// masterLog is the part of the commit log that replication reads.
type masterLog interface {
	EndOffset() int64
	ReadRawTo(dst []byte, offset int64, maxBytes int) ([]byte, error)
	RecordAt(at int64) (end int64, crc uint32, err error)
}

// replier answers one request; *transport.Request is one. Its methods never
// block on the peer, and Reply is done with body when it returns (the
// transport encodes the answer into the connection's buffer), so the caller
// may reuse it.
type replier interface {
	Reply(body []byte) error
	ReplyError(err error)
	// ReplyGiven answers with a body it takes from the caller, who must
	// not touch it until release is called (see transport.Request).
	ReplyGiven(body []byte, release func()) error
}

// replConfig is what replication takes from the broker's Config.
type replConfig struct {
	HighWait     time.Duration // how long a HIGH message waits for the slave
	FetchBytes   int           // cap of one fetch answer
	FetchWait    time.Duration // the slave's fetch interval, for "connected"
	SlaveLagTime time.Duration // a member of the sync set not caught up this long leaves it
}

// replication is the master's side of HA sync with the group's slaves.
// Each slave fetches raw log bytes from its received end and acknowledges
// what it has appended, separately: in an HA_ACK after each append, and in
// every fetch's Acked. HIGH messages (a SEND's together) wait in a FIFO
// ordered by log offset (appends complete in log order) until confirmed
// reaches their end, or their deadline. A fetch with nothing to return is
// parked until data arrives or its wait passes; a fetch that follows
// another (protocol.HAFetchRequest) is parked until the answer to that one
// is built, then answered from where it ended. run answers parked fetches,
// expires waiters and keeps the sync set, so no request worker is ever
// held, and nothing here waits on a slave's socket.
//
// The sync set is the registry's (routing.Group.InSync): the slaves that
// hold every HIGH message answered in this epoch. With the policy "all",
// confirmed is the lowest acknowledgement of the set's members and of a
// slave whose addition is on its way; with a quorum of k copies, the
// (k-1)th highest of the committed members'. The master changes the set
// through the registry (alter), one change at a time: it adds a slave
// that holds what is confirmed and has caught up, waiting for it from the
// moment it proposes; it removes a member not caught up for lagTime (or
// one that restarted below what it acknowledged), waiting for it until the
// removal is committed. While the committed set holds fewer copies than
// the group's minimum, HIGH messages are refused before they are stored,
// and those waiting are answered NOT_ENOUGH_REPLICAS_AFTER_APPEND.
type replication struct {
	log   masterLog
	cfg   replConfig
	stats *Stats
	clock clockwork.Clock
	lg    hclog.Logger
	wake  chan struct{} // capacity 1: new data was appended
	sess  haSession
	// alter proposes a sync set to the registry and returns the group as
	// the registry has it after (nil: the set is never changed; tests).
	alter alterFunc

	mu       sync.Mutex
	group    string
	master   string              // this broker's id
	epoch    uint32              // the epoch this master serves
	slaves   map[string]*replica // the registry's slaves: the only brokers whose fetches are served and counted
	set      []string            // the committed sync set
	setVer   uint64              // its version
	adding   string              // a slave whose addition is proposed: waited for already
	dropping string              // a member whose removal is proposed: still waited for
	minCopy  int                 // copies a HIGH message needs, the master's counted
	quorum   int                 // 0: every member; k: k copies
	lagTime  time.Duration       // a member not caught up this long leaves the set
	proposal chan struct{}       // closed when the proposal in flight ends (nil: none)
	retryAt  time.Time           // no proposal before (after a refused one)
	// unsure: the last proposal (lastReq) may or may not have been taken;
	// adding and dropping stand until a later set version settles it.
	unsure  bool
	lastReq *api.AlterSyncSetRequest
	// floor is the log's end when this master began to serve: every HIGH
	// message answered before (by it before a restart, or by an earlier
	// master) ends at or below it, so a slave joins the set only once it
	// holds that much.
	floor   int64
	confirm int64 // HIGH messages ending at or below it are answered OK
	waiters []highWaiter
	parked  []parkedFetch
	closed  bool
}

// replica is one slave as the master sees it.
type replica struct {
	ack       int64     // the slave's acknowledged (appended) end offset
	lastFetch time.Time // when it last fetched or acknowledged
	// caughtUpAt is the latest time at which the master's log ended where
	// the slave has now acknowledged (or its first contact, or when the
	// master began to serve): its lag in time is how long ago that was.
	caughtUpAt time.Time
	offers     []offer // answers sent past the acknowledged end, oldest first
	everSeen   bool
	// lost is set when the slave fetched from below what it had
	// acknowledged: it lost acknowledged bytes (its disk, not its process,
	// failed) and must leave the set.
	lost bool
	// lastSeq and lastEnd: the sequenced fetch last answered and where its
	// answer ended, what a fetch that follows it starts from (hasLast).
	lastSeq uint32
	lastEnd int64
	hasLast bool
}

// offer is the master's log end when an answer was built, and when: once
// the slave acknowledges end, it had everything the master had at that time.
type offer struct {
	end int64
	at  time.Time
}

// maxOffers bounds the offers kept; a slave has at most a few answers in its
// pipeline, and forgetting the oldest only makes its lag look longer.
const maxOffers = 16

// highWaiter is one wait for the sync set: a HIGH message, or every HIGH
// message of one appended batch (end is the highest of their ends), whose
// answers all leave together anyway.
type highWaiter struct {
	end      int64
	n        int // messages it answers, for the counters
	deadline time.Time
	done     func(protocol.Status)
}

// parkedFetch is a fetch waiting for the log to grow, or, while
// fetch.Follows is still set, for the answer to the fetch it follows.
type parkedFetch struct {
	rep      replier
	fetch    protocol.HAFetchRequest
	deadline time.Time
}

// followGrace is how long past its wait a fetch that follows another may
// wait for that one's answer before it is refused: the one it follows
// failed, or never came.
const followGrace = time.Second

// haSession is what replication tells the registry session (session):
// fence takes an epoch a fetch or an ack showed (a newer one than the
// master's ends its write lease); kick asks for a heartbeat now, after a
// fetch in this master's epoch from a broker it does not know as its slave
// (the registry may have just placed it: a former master rejoining).
type haSession interface {
	fence(epoch uint32)
	kick()
}

// noSession is a replication's session when it has none (tests).
type noSession struct{}

func (noSession) fence(uint32) {}
func (noSession) kick()        {}

func newReplication(log masterLog, cfg replConfig, stats *Stats, clock clockwork.Clock, lg hclog.Logger, sess haSession) *replication {
	if sess == nil {
		sess = noSession{}
	}
	return &replication{log: log, cfg: cfg, stats: stats, clock: clock, lg: lg, sess: sess,
		wake: make(chan struct{}, 1), slaves: map[string]*replica{}, minCopy: routing.DefaultMinInSync, lagTime: cfg.SlaveLagTime,
		floor: log.EndOffset()}
}

// setGroup takes the group as the registry has it: its slaves, its
// committed sync set and policy, and the epoch this master serves.
func (r *replication) setGroup(g routing.Group, master string) {
	r.mu.Lock()
	released, refused := r.setGroupLocked(g, master)
	r.mu.Unlock()
	r.complete(released, protocol.StatusOK)
	r.complete(refused, protocol.StatusNotEnoughReplicasAfterAppend)
}

// setGroupLocked is setGroup with r.mu held; it returns the waiters to
// answer OK and those to refuse.
//
// A change the master proposed is settled by the first group of a later
// set version it sees: what that set holds is what the registry took (a
// removal proposed goes on being waited for, and an addition stays waited
// for, until then, whatever an answer said or did not say).
func (r *replication) setGroupLocked(g routing.Group, master string) (released, refused []highWaiter) {
	now := r.clock.Now()
	r.group, r.master, r.epoch = g.Name, master, g.Epoch
	slaves := make(map[string]*replica, len(g.Slaves))
	for _, b := range g.Slaves {
		rp := r.slaves[b.ID]
		if rp == nil {
			rp = &replica{caughtUpAt: now} // its lag counts from now
		}
		slaves[b.ID] = rp
	}
	r.slaves = slaves
	for id, rp := range slaves {
		if rp.lost && !slices.Contains(g.InSync, id) {
			rp.lost = false // out of the set: it may join again once it holds what is confirmed
		}
	}
	if g.SyncVersion >= r.setVer {
		newer := g.SyncVersion > r.setVer
		r.set, r.setVer = slices.Clone(g.InSync), g.SyncVersion
		if newer && r.proposal == nil {
			// Whatever was proposed is settled: the set says what stands.
			r.adding, r.dropping, r.unsure = "", "", false
		}
		if slices.Contains(r.set, r.adding) {
			r.adding = "" // a member now: waited for as one
		}
		if r.dropping != "" && !slices.Contains(r.set, r.dropping) {
			r.dropping = ""
		}
	}
	r.minCopy, r.quorum = g.MinCopies(), g.AckQuorum
	if r.adding != "" && r.slaves[r.adding] == nil {
		r.adding = "" // no longer a slave of the group: the registry took it out of the set too
	}
	return r.settleLocked()
}

// setLagTime sets how long a member may be behind before it leaves the
// sync set: the cluster's (from the registry), or the broker's own when 0.
func (r *replication) setLagTime(d time.Duration) {
	if d <= 0 {
		d = r.cfg.SlaveLagTime
	}
	r.mu.Lock()
	r.lagTime = d
	r.mu.Unlock()
}

// belowMinLocked reports whether the committed set, with the master,
// holds fewer copies than a HIGH message needs.
func (r *replication) belowMinLocked() bool { return len(r.set)+1 < r.minCopy }

// confirmedLocked computes how far every HIGH message is held as the
// policy asks (see replication), or -1 when nothing more can be.
func (r *replication) confirmedLocked() int64 {
	if r.quorum > 0 {
		need := r.quorum - 1
		acks := make([]int64, 0, len(r.set))
		for _, id := range r.set {
			// A member whose removal is on its way counts for nothing: once
			// it is committed, the others must hold k-1 copies without it.
			if rp := r.slaves[id]; rp != nil && !rp.lost && id != r.dropping {
				acks = append(acks, rp.ack)
			}
		}
		if need == 0 {
			return r.log.EndOffset()
		}
		if len(acks) < need {
			return -1
		}
		slices.Sort(acks)
		return acks[len(acks)-need]
	}
	c := int64(-1)
	n := 0
	for _, id := range r.waitedLocked() {
		rp := r.slaves[id]
		if rp == nil || rp.lost {
			return -1
		}
		if n == 0 || rp.ack < c {
			c = rp.ack
		}
		n++
	}
	if n == 0 {
		return r.log.EndOffset() // the policy asks for the master's copy alone
	}
	return c
}

// waitedLocked lists the slaves the policy "all" waits for: the committed
// set and a slave whose addition is on its way.
func (r *replication) waitedLocked() []string {
	if r.adding == "" || slices.Contains(r.set, r.adding) {
		return r.set
	}
	return append(slices.Clone(r.set), r.adding)
}

// settleLocked moves confirmed and takes the waiters it releases, or every
// waiter when the committed set is below the minimum.
func (r *replication) settleLocked() (released, refused []highWaiter) {
	if r.belowMinLocked() {
		refused, r.waiters = r.waiters, nil
		return nil, refused
	}
	if c := r.confirmedLocked(); c > r.confirm {
		r.confirm = c
	}
	return r.releaseLocked(), nil
}

// notify tells run that the log grew.
func (r *replication) notify() {
	r.mu.Lock()
	idle := len(r.parked) == 0
	r.mu.Unlock()
	if idle {
		return // only a parked fetch waits for the log to grow: no wake-up per append
	}
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// SlaveState is the master's view of one slave, or of the slowest member
// of its sync set.
type SlaveState struct {
	ID        string
	Connected bool
	AckOffset int64
	LagBytes  int64
	LagTime   time.Duration
	InSync    bool // waited for: in the committed set, or an addition on its way
}

// replicaStateLocked is one slave's state at now, with the log ending at end.
func (r *replication) replicaStateLocked(id string, rp *replica, now time.Time, end int64) SlaveState {
	s := SlaveState{
		ID:        id,
		Connected: rp.everSeen && (r.parkedFor(id) || now.Sub(rp.lastFetch) < 2*r.cfg.FetchWait+500*time.Millisecond),
		AckOffset: rp.ack,
		LagBytes:  max(end-rp.ack, 0),
		InSync:    slices.Contains(r.waitedLocked(), id),
	}
	if s.LagBytes > 0 {
		s.LagTime = now.Sub(rp.caughtUpAt)
	}
	return s
}

func (r *replication) parkedFor(id string) bool {
	for _, p := range r.parked {
		if p.fetch.BrokerID == id {
			return true
		}
	}
	return false
}

// replicas returns every slave's state, in id order.
func (r *replication) replicas() []SlaveState {
	now := r.clock.Now()
	end := r.log.EndOffset()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]SlaveState, 0, len(r.slaves))
	for id, rp := range r.slaves {
		out = append(out, r.replicaStateLocked(id, rp, now, end))
	}
	slices.SortFunc(out, func(a, b SlaveState) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// state returns the slowest member of the sync set (the slowest slave when
// the set is empty): what the heartbeat's single-slave fields report.
func (r *replication) state() SlaveState { return slowest(r.replicas()) }

// slowest is the slowest of the sync set's members among all (of every
// slave when none is in the set): a disconnected one first, then the
// lowest acknowledgement.
func slowest(all []SlaveState) SlaveState {
	var worst SlaveState
	found := false
	inSet := false
	for _, s := range all {
		inSet = inSet || s.InSync
	}
	for _, s := range all {
		if inSet && !s.InSync {
			continue
		}
		if !found || !s.Connected && worst.Connected || s.AckOffset < worst.AckOffset && s.Connected == worst.Connected {
			worst, found = s, true
		}
	}
	return worst
}

// highAcked bounds every HIGH message answered OK in this epoch.
func (r *replication) highAcked() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.confirm
}

// refusesHigh reports whether a HIGH message must be refused before it is
// stored: the committed sync set, with the master, holds fewer copies than
// the group's minimum.
// held is how far the sync set holds the log as the policy asks (what a
// HIGH message up to there is confirmed by). Below the group's minimum it
// is what was confirmed before: a set emptied by a slave's loss does not
// make the master's copy alone count.
func (r *replication) held() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.belowMinLocked() {
		return r.confirm
	}
	return max(r.confirm, r.confirmedLocked())
}

func (r *replication) refusesHigh() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.belowMinLocked()
}

// await registers a HIGH message ending at end; done is called once: OK
// when the sync set holds it as the policy asks, SLAVE_SYNC_TIMEOUT after
// HighWait, NOT_ENOUGH_REPLICAS_AFTER_APPEND if the set is below the
// minimum meanwhile.
func (r *replication) await(end int64, done func(protocol.Status)) { r.awaitN(end, 1, done) }

// awaitN is await for n HIGH messages ending at or below end, answered
// together (done is called once, for all of them).
func (r *replication) awaitN(end int64, n int, done func(protocol.Status)) {
	w := highWaiter{end: end, n: n, done: done}
	r.mu.Lock()
	switch {
	case r.closed:
		r.mu.Unlock()
		r.complete([]highWaiter{w}, protocol.StatusSlaveSyncTimeout)
		return
	case r.belowMinLocked():
		r.mu.Unlock()
		r.complete([]highWaiter{w}, protocol.StatusNotEnoughReplicasAfterAppend)
		return
	}
	if c := r.confirmedLocked(); c > r.confirm {
		r.confirm = c
	}
	if r.confirm >= end {
		r.mu.Unlock()
		r.complete([]highWaiter{w}, protocol.StatusOK)
		return
	}
	w.deadline = r.clock.Now().Add(r.cfg.HighWait)
	r.waiters = append(r.waiters, w)
	r.mu.Unlock()
}

// handleFetch serves a slave's fetch: it records the acknowledgement the
// fetch carries (its Acked: what the slave has appended, never its Offset,
// which may name bytes still in the slave's append pipeline), releases the
// HIGH waiters it covers, and answers with the log bytes from the fetch's
// offset, or parks the fetch until there are some.
func (r *replication) handleFetch(rep replier, body []byte) {
	f, err := protocol.DecodeHAFetchRequest(body)
	if err != nil {
		rep.ReplyError(err)
		return
	}
	r.sess.fence(f.Epoch)
	if f.Check {
		if err := r.checkPrefix(f); err != nil {
			rep.ReplyError(err)
			return
		}
	}
	now := r.clock.Now() // before end: the log ended at most at end then
	end := r.log.EndOffset()
	r.mu.Lock()
	if ref := r.admitLocked(f.BrokerID, f.Epoch); ref != nil {
		r.mu.Unlock()
		r.refuse(rep, ref)
		return
	}
	if f.Offset > end {
		r.mu.Unlock()
		rep.ReplyError(&protocol.Error{Status: protocol.StatusLogDiverged,
			Message: fmt.Sprintf("the slave's log ends at %d, past the master's end %d: it holds records the master does not", f.Offset, end)})
		return
	}
	if rp := r.slaves[f.BrokerID]; !f.Follows && f.Offset < rp.ack && !rp.lost {
		// It asks from below what it acknowledged: its log lost bytes it
		// had (a power loss on its machine). It holds only what it has
		// now, and leaves the sync set. (A fetch that follows another was
		// sent ahead, and acknowledgements sent after it may have passed
		// its Offset; every stream starts with a fetch that does not.)
		r.lg.Warn("a slave lost bytes it had acknowledged; it leaves the sync set", "slave", f.BrokerID,
			"acknowledged", rp.ack, "log-end", f.Offset)
		rp.ack, rp.lost = f.Offset, true
	}
	released, refused := r.ackLocked(f.BrokerID, f.Acked, end, now)
	if f.Follows && !r.closed && !r.followLocked(r.slaves[f.BrokerID], &f) {
		// The answer to the fetch it follows is not built yet: it waits
		// for it (answer resolves it).
		r.parked = append(r.parked, parkedFetch{rep: rep, fetch: f, deadline: now.Add(time.Duration(f.WaitMillis) * time.Millisecond)})
		r.mu.Unlock()
		r.complete(released, protocol.StatusOK)
		r.complete(refused, protocol.StatusNotEnoughReplicasAfterAppend)
		return
	}
	if f.Offset == end && !r.closed {
		r.parked = append(r.parked, parkedFetch{rep: rep, fetch: f, deadline: now.Add(time.Duration(f.WaitMillis) * time.Millisecond)})
		r.mu.Unlock()
		r.complete(released, protocol.StatusOK)
		r.complete(refused, protocol.StatusNotEnoughReplicasAfterAppend)
		r.notify() // the log may have grown since end was read
		return
	}
	r.mu.Unlock()
	r.complete(released, protocol.StatusOK)
	r.complete(refused, protocol.StatusNotEnoughReplicasAfterAppend)
	r.answer(rep, f)
}

// followLocked resolves a fetch that follows another: once the answer to
// that one is built, it asks from where that answer ended. It reports
// whether f was resolved.
func (r *replication) followLocked(rp *replica, f *protocol.HAFetchRequest) bool {
	if rp == nil || !rp.hasLast || rp.lastSeq != f.After {
		return false
	}
	f.Offset, f.Follows = rp.lastEnd, false
	return true
}

// checkPrefix checks that the slave's last record, as its fetch names it,
// is the master's record there: same start, same end (where the fetch
// asks from), same CRC. Otherwise the slave's log is not a prefix of the
// master's, and appending the master's bytes after it would make the two
// differ at offsets consumers read from both: LOG_DIVERGED.
func (r *replication) checkPrefix(f protocol.HAFetchRequest) error {
	end, crc, err := r.log.RecordAt(f.CheckAt)
	if err == nil && end == f.Offset && crc == f.CheckCRC {
		return nil
	}
	r.stats.HADiverged.Add(1)
	why := fmt.Sprintf("the slave's last record (at %d, ending at %d, CRC %08x) is not the master's", f.CheckAt, f.Offset, f.CheckCRC)
	switch {
	case errors.Is(err, storage.ErrOutOfRange):
		why += fmt.Sprintf(": the master's log holds no record there (it ends at %d)", r.log.EndOffset())
	case err != nil:
		r.lg.Warn("reading the log to check a slave's last record failed", "offset", f.CheckAt, "error", err)
		return &protocol.Error{Status: protocol.StatusStoreError, Message: err.Error()}
	default:
		why += fmt.Sprintf(" (the master's record there ends at %d, CRC %08x)", end, crc)
	}
	r.lg.Warn("refusing a slave whose log left the master's", "slave", f.BrokerID, "epoch", f.Epoch, "why", why)
	return &protocol.Error{Status: protocol.StatusLogDiverged, Message: why}
}

// handleAck takes a slave's HA_ACK: how far it has appended. It is checked
// like a fetch (only the registry's slave, in this master's epoch), and an
// acknowledgement past the master's log end counts for nothing. A oneway
// ack gets no answer; one sent as a call gets an empty one.
func (r *replication) handleAck(rep replier, body []byte) {
	a, err := protocol.DecodeHAAck(body)
	if err != nil {
		rep.ReplyError(err)
		return
	}
	r.sess.fence(a.Epoch)
	now := r.clock.Now()
	end := r.log.EndOffset()
	r.mu.Lock()
	if ref := r.admitLocked(a.BrokerID, a.Epoch); ref != nil {
		r.mu.Unlock()
		r.refuse(rep, ref)
		return
	}
	if a.Acked > end {
		r.mu.Unlock()
		rep.ReplyError(&protocol.Error{Status: protocol.StatusInvalid,
			Message: "slave acknowledges past the master's log end: the slave holds records the master lost"})
		return
	}
	released, refused := r.ackLocked(a.BrokerID, a.Acked, end, now)
	r.mu.Unlock()
	r.stats.HAAcks.Add(1)
	r.complete(released, protocol.StatusOK)
	r.complete(refused, protocol.StatusNotEnoughReplicasAfterAppend)
	_ = rep.Reply(nil)
}

// refusal is why a fetch or an acknowledgement is not taken.
type refusal struct {
	err     *protocol.Error
	unknown bool // from a broker this master does not know, in its epoch
	from    string
	epoch   uint32
	slave   string
	serving uint32
}

// admitLocked checks that a fetch or an acknowledgement comes from a
// broker the registry names as one of this group's slaves, in the epoch
// this master serves. Acknowledgements count per broker id, however many
// connections it uses. The check and the use of what was admitted happen
// under one hold of r.mu, so a slave removed meanwhile (setGroup) is never
// credited with an acknowledgement.
func (r *replication) admitLocked(brokerID string, e uint32) *refusal {
	_, known := r.slaves[brokerID]
	switch {
	case e > r.epoch:
		return &refusal{err: &protocol.Error{Status: protocol.StatusNotMaster,
			Message: fmt.Sprintf("this master serves epoch %d; the fetch is for epoch %d", r.epoch, e)}}
	case !known || e != r.epoch:
		ids := slices.Sorted(maps.Keys(r.slaves))
		return &refusal{err: &protocol.Error{Status: protocol.StatusNotAuthorized,
			Message: fmt.Sprintf("only the group's slaves %v in epoch %d may fetch; got %q in epoch %d", ids, r.epoch, brokerID, e)},
			unknown: e == r.epoch && !known, from: brokerID, epoch: e, slave: strings.Join(ids, ","), serving: r.epoch}
	}
	return nil
}

// refuse answers a refused fetch or acknowledgement, outside r.mu.
func (r *replication) refuse(rep replier, ref *refusal) {
	if ref.err.Status == protocol.StatusNotAuthorized {
		if ref.unknown {
			r.sess.kick()
		}
		if r.stats.HAFetchRefused.Add(1) == 1 {
			r.lg.Warn("refusing an HA fetch from a broker that is not this group's slave in this epoch",
				"from", ref.from, "epoch", ref.epoch, "slave", ref.slave, "serving-epoch", ref.serving)
		}
	}
	rep.ReplyError(ref.err)
}

// ackLocked records that slave id has appended up to acked and is heard
// from now (the master's log ends at end), and takes the HIGH waiters that
// releases (or refuses, below the minimum).
func (r *replication) ackLocked(id string, acked, end int64, now time.Time) (released, refused []highWaiter) {
	rp := r.slaves[id]
	if acked > rp.ack {
		rp.ack = acked
	}
	switch {
	case !rp.everSeen || rp.ack >= end:
		// A slave's first contact starts its lag clock; one that has the
		// whole log is caught up now.
		rp.caughtUpAt = now
		rp.offers = rp.offers[:0]
	default:
		i := 0
		for i < len(rp.offers) && rp.offers[i].end <= rp.ack {
			if rp.offers[i].at.After(rp.caughtUpAt) {
				rp.caughtUpAt = rp.offers[i].at
			}
			i++
		}
		rp.offers = append(rp.offers[:0], rp.offers[i:]...)
	}
	rp.everSeen = true
	rp.lastFetch = now
	return r.settleLocked()
}

// offerLocked notes that an answer to slave id was built when the master's
// log ended at end.
func (r *replication) offerLocked(id string, end int64, now time.Time) {
	rp := r.slaves[id]
	if rp == nil || end <= rp.ack {
		return
	}
	if n := len(rp.offers); n > 0 && rp.offers[n-1].end == end {
		rp.offers[n-1].at = now // the log still ended there: the later time counts
		return
	}
	if len(rp.offers) == maxOffers {
		rp.offers = append(rp.offers[:0], rp.offers[1:]...)
	}
	rp.offers = append(rp.offers, offer{end: end, at: now})
}

// releaseLocked takes the waiters confirmed covers.
func (r *replication) releaseLocked() []highWaiter {
	i := 0
	for i < len(r.waiters) && r.waiters[i].end <= r.confirm {
		i++
	}
	if i == 0 {
		return nil
	}
	out := make([]highWaiter, i)
	copy(out, r.waiters[:i])
	r.waiters = append(r.waiters[:0], r.waiters[i:]...)
	return out
}

// complete answers waiters, outside r.mu.
func (r *replication) complete(ws []highWaiter, st protocol.Status) {
	if len(ws) == 0 {
		return
	}
	n := 0
	for _, w := range ws {
		n += w.n
	}
	if st == protocol.StatusOK {
		r.stats.HighAcked.Add(int64(n))
	} else {
		r.stats.HighTimeouts.Add(int64(n))
	}
	for _, w := range ws {
		w.done(st)
	}
}

// answer sends the log bytes from the fetch's offset (possibly none).
func (r *replication) answer(rep replier, f protocol.HAFetchRequest) {
	maxBytes := int(f.MaxBytes)
	if maxBytes <= 0 || maxBytes > r.cfg.FetchBytes {
		maxBytes = r.cfg.FetchBytes
	}
	now := r.clock.Now() // before end: the log ended at most at end then
	end := r.log.EndOffset()
	// The answer is built in a buffer kept for the next ones, the log read
	// straight into it after room for the header: a fresh one per answer
	// (up to 4 MiB, zeroed by the allocator) cost the master more CPU than
	// its own appends once those land on pre-touched pages.
	// The buffer goes to the connection's writer, which sends it without a
	// copy and gives it back once written.
	bp, _ := answerBufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	head := haHeaderLen
	if f.Sequenced {
		head += protocol.HAFetchResponseStartSize
	}
	body := append((*bp)[:0], make([]byte, head)...)
	body, err := r.log.ReadRawTo(body, f.Offset, maxBytes)
	*bp = body
	if err != nil {
		answerBufs.Put(bp)
		r.lg.Warn("reading the log for the slave failed", "offset", f.Offset, "error", err)
		rep.ReplyError(&protocol.Error{Status: protocol.StatusStoreError, Message: err.Error()})
		return
	}
	r.mu.Lock()
	r.offerLocked(f.BrokerID, end, now)
	epoch := r.epoch
	if f.Sequenced {
		r.answeredLocked(f, f.Offset+int64(len(body)-head))
	}
	r.mu.Unlock()
	hdr := protocol.AppendHAFetchResponseHeader(body[:0], end, epoch) // fills the room left for it
	if f.Sequenced {
		protocol.AppendHAFetchResponseStart(hdr, f.Offset)
	}
	if n := len(body) - head; n > 0 {
		r.stats.HAAnswers.Add(1)
		r.stats.HABytes.Add(int64(n))
	}
	_ = rep.ReplyGiven(body, func() { answerBufs.Put(bp) })
}

// answeredLocked records that the answer to sequenced fetch f ends at
// end, and resolves the parked fetch that follows it (run answers it).
func (r *replication) answeredLocked(f protocol.HAFetchRequest, end int64) {
	rp := r.slaves[f.BrokerID]
	if rp == nil {
		return
	}
	rp.lastSeq, rp.lastEnd, rp.hasLast = f.Seq, end, true
	for i := range r.parked {
		if p := &r.parked[i]; p.fetch.Follows && p.fetch.BrokerID == f.BrokerID && r.followLocked(rp, &p.fetch) {
			select {
			case r.wake <- struct{}{}:
			default:
			}
		}
	}
}

// haAnswerSize is the largest answer to a fetch of at most fetchBytes.
func haAnswerSize(fetchBytes int) int {
	return protocol.HAFetchResponseHeaderSize + protocol.HAFetchResponseStartSize + fetchBytes
}

// haWriteBuffer is what the HA server may owe one connection: two answers,
// so that a slave's second fetch is read (and waits at the master) while
// the answer to its first is queued or written.
func haWriteBuffer(fetchBytes int) int {
	return 2 * (protocol.FixedHeaderSize + haAnswerSize(fetchBytes))
}

// haHeaderLen is the length of an HA fetch answer's header.
var haHeaderLen = len(protocol.AppendHAFetchResponseHeader(nil, 0, 0))

// answerBufs holds the buffers answers are built in.
var answerBufs sync.Pool

// run answers parked fetches when data arrives or their wait passes, and
// answers HIGH waiters whose deadline passed, until ctx ends. Then it
// answers every parked fetch and refuses later ones.
func (r *replication) run(ctx context.Context) {
	tick := r.clock.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			r.mu.Lock()
			parked := r.parked
			r.parked = nil
			r.closed = true
			proposal := r.proposal
			r.mu.Unlock()
			if proposal != nil {
				<-proposal // it ends with ctx
			}
			for _, p := range parked {
				p.rep.ReplyError(&protocol.Error{Status: protocol.StatusShuttingDown, Message: "master shutting down"})
			}
			return
		case <-r.wake:
		case <-tick.Chan():
		}
		r.step(ctx)
	}
}

// step answers what is due now, and proposes a change of the sync set if
// one is due.
func (r *replication) step(ctx context.Context) {
	now := r.clock.Now()
	end := r.log.EndOffset()
	r.mu.Lock()
	if req := r.keepSetLocked(now, end); req != nil {
		r.proposeLocked(ctx, req)
	}
	var ready, lost []parkedFetch
	kept := r.parked[:0]
	for _, p := range r.parked {
		switch {
		case p.fetch.Follows && now.After(p.deadline.Add(followGrace)):
			lost = append(lost, p) // the fetch it follows was never answered
		case p.fetch.Follows:
			kept = append(kept, p)
		case end > p.fetch.Offset || now.After(p.deadline):
			ready = append(ready, p)
		default:
			kept = append(kept, p)
		}
	}
	r.parked = kept
	var expired []highWaiter
	for len(r.waiters) > 0 && now.After(r.waiters[0].deadline) {
		expired = append(expired, r.waiters[0])
		r.waiters = r.waiters[1:]
	}
	r.mu.Unlock()
	for _, p := range ready {
		r.answer(p.rep, p.fetch)
	}
	for _, p := range lost {
		p.rep.ReplyError(&protocol.Error{Status: protocol.StatusInvalid, Message: "the fetch this one follows was not answered"})
	}
	r.complete(expired, protocol.StatusSlaveSyncTimeout)
}

// keepSetLocked decides the next change of the sync set, if one is due and
// none is in flight (see replication), and returns it (nil: none).
func (r *replication) keepSetLocked(now time.Time, end int64) *api.AlterSyncSetRequest {
	if r.alter == nil || r.proposal != nil || r.closed || r.epoch == 0 || now.Before(r.retryAt) {
		return nil
	}
	if r.unsure {
		// The last proposal's fate is unknown: send it again, unchanged.
		// Taken, the set moves; refused, the set has moved: either way a
		// later group settles it (setGroupLocked).
		return r.lastReq
	}
	req := func(set []string) *api.AlterSyncSetRequest {
		return &api.AlterSyncSetRequest{Group: r.group, Epoch: r.epoch, Master: r.master, ExpectVersion: r.setVer, InSync: set}
	}
	for _, id := range r.set {
		rp := r.slaves[id]
		if rp == nil {
			continue // no longer a slave: the registry took it out of the set too
		}
		if !rp.lost && r.replicaStateLocked(id, rp, now, end).LagTime <= r.lagTime {
			continue
		}
		rest := slices.DeleteFunc(slices.Clone(r.set), func(s string) bool { return s == id })
		if r.quorum > 0 && r.confirmedOver(rest) < r.confirm && !r.allHold(rest, r.confirm) {
			// Under a quorum the others may not yet hold, k-1 times, what
			// was answered with this one's copy: it leaves once they do (or
			// once every one left holds it, fewer than k-1 of them: the set
			// is then below the minimum, and HIGH refused).
			continue
		}
		r.dropping = id
		return req(rest)
	}
	for _, id := range slices.Sorted(maps.Keys(r.slaves)) {
		rp := r.slaves[id]
		if slices.Contains(r.set, id) || !rp.everSeen || rp.lost || rp.ack < max(r.confirm, r.floor) {
			continue // it must hold what is confirmed, and all this master found in its log
		}
		if rp.ack < end && now.Sub(rp.caughtUpAt) > r.lagTime/4 {
			continue // not caught up: it would hold HIGH messages back
		}
		r.adding = id // waited for from now: it holds every HIGH answered from here on
		return req(append(slices.Clone(r.set), id))
	}
	return nil
}

// allHold reports whether every member ids holds the log up to end.
func (r *replication) allHold(ids []string, end int64) bool {
	for _, id := range ids {
		if rp := r.slaves[id]; rp == nil || rp.lost || rp.ack < end {
			return false
		}
	}
	return true
}

// confirmedOver is what a quorum of the members ids holds (see
// confirmedLocked), or -1.
func (r *replication) confirmedOver(ids []string) int64 {
	need := r.quorum - 1
	acks := make([]int64, 0, len(ids))
	for _, id := range ids {
		if rp := r.slaves[id]; rp != nil && !rp.lost {
			acks = append(acks, rp.ack)
		}
	}
	if need <= 0 {
		return r.log.EndOffset()
	}
	if len(acks) < need {
		return -1
	}
	slices.Sort(acks)
	return acks[len(acks)-need]
}

// proposeLocked sends req to the registry from a goroutine of its own (run
// waits for it); the group the registry answers is taken as setGroup takes
// a heartbeat's. A refused proposal is decided again a second later, from
// the group as the next heartbeat shows it.
func (r *replication) proposeLocked(ctx context.Context, req *api.AlterSyncSetRequest) {
	done := make(chan struct{})
	r.proposal, r.lastReq = done, req
	r.lg.Info("proposing a sync set", "in-sync", req.InSync, "was", r.set, "version", req.ExpectVersion)
	go func() {
		defer close(done)
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		g, err := r.alter(cctx, *req)
		cancel()
		var released, refused []highWaiter
		r.mu.Lock()
		r.proposal = nil
		var pe *protocol.Error
		switch {
		case err == nil:
			// Taken under the same hold as the end of the proposal: no
			// heartbeat's older group can settle it in between.
			released, refused = r.setGroupLocked(g, req.Master)
		case errors.As(err, &pe) && (pe.Status == protocol.StatusInvalid || pe.Status == protocol.StatusNotFound || pe.Status == protocol.StatusNotAuthorized):
			// Refused before anything was applied: nothing to wait for.
			r.adding, r.dropping, r.unsure = "", "", false
			r.retryAt = r.clock.Now().Add(time.Second)
			released, refused = r.settleLocked()
		default:
			// Unknown (a lost answer, a leader change) or a moved set
			// (CONFLICT): it may have been taken. Go on waiting for an
			// addition and for a removal until a later group settles it.
			r.unsure = true
			r.retryAt = r.clock.Now().Add(time.Second)
		}
		r.mu.Unlock()
		if err != nil {
			r.lg.Warn("the registry did not confirm the sync set", "in-sync", req.InSync, "error", err)
		}
		r.complete(released, protocol.StatusOK)
		r.complete(refused, protocol.StatusNotEnoughReplicasAfterAppend)
	}()
}

// failWaiters answers every HIGH message still waiting with st and refuses
// later ones.
func (r *replication) failWaiters(why string, st protocol.Status) {
	r.mu.Lock()
	ws := r.waiters
	r.waiters = nil
	r.closed = true
	r.mu.Unlock()
	if len(ws) > 0 {
		r.lg.Warn("answering HIGH messages without the slave's confirmation", "messages", len(ws), "why", why)
	}
	r.complete(ws, st)
}
