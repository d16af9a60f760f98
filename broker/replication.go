package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/protocol"
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
	HighWait      time.Duration // how long a HIGH message waits for the slave
	FetchBytes    int           // cap of one fetch answer
	FetchWait     time.Duration // the slave's fetch interval, for "connected"
	SlaveLagBytes int64
	SlaveLagTime  time.Duration
}

// replication is the master's side of HA sync. The slave fetches raw log
// bytes from its received end and acknowledges what it has appended,
// separately: in an HA_ACK after each append, and in every fetch's Acked.
// HIGH messages wait in a FIFO ordered by log offset (appends complete in
// log order) until an acknowledgement reaches their end, or their deadline.
// A fetch with nothing to return is parked until data arrives or its wait
// passes. run answers parked fetches and expires waiters, so no request
// worker is ever held, and nothing here waits on the slave's socket.
type replication struct {
	log   masterLog
	cfg   replConfig
	stats *Stats
	clock clockwork.Clock
	lg    hclog.Logger
	wake  chan struct{} // capacity 1: new data was appended
	sess  haSession

	mu        sync.Mutex
	slaveID   string    // the only broker whose fetches are served and counted
	epoch     uint32    // the epoch this master serves
	ack       int64     // the slave's acknowledged (appended) end offset
	lastFetch time.Time // when the slave last fetched or acknowledged
	// caughtUpAt is the latest time at which the master's log ended where
	// the slave has now acknowledged (or the slave's first contact): the
	// slave's lag in time is how long ago that was.
	caughtUpAt time.Time
	offers     []offer // answers sent past the acknowledged end, oldest first
	everSeen   bool
	waiters    []highWaiter
	parked     []parkedFetch
	closed     bool
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

type highWaiter struct {
	end      int64
	deadline time.Time
	done     func(protocol.Status)
}

type parkedFetch struct {
	rep      replier
	fetch    protocol.HAFetchRequest
	deadline time.Time
}

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
		wake: make(chan struct{}, 1), caughtUpAt: clock.Now()}
}

// setSlave names the broker whose fetches are served and counted, and the
// epoch this master serves, as the registry has them.
func (r *replication) setSlave(id string, epoch uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if id != r.slaveID && r.slaveID != "" {
		// Another broker: what the old one acknowledged says nothing of it.
		r.everSeen, r.ack = false, 0
	}
	r.slaveID, r.epoch = id, epoch
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

// SlaveState is the master's view of its slave.
type SlaveState struct {
	Connected bool
	AckOffset int64
	LagBytes  int64
	LagTime   time.Duration
}

func (r *replication) state() SlaveState {
	now := r.clock.Now()
	end := r.log.EndOffset()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := SlaveState{
		Connected: r.everSeen && (len(r.parked) > 0 || now.Sub(r.lastFetch) < 2*r.cfg.FetchWait+500*time.Millisecond),
		AckOffset: r.ack,
		LagBytes:  max(end-r.ack, 0),
	}
	if s.LagBytes > 0 {
		s.LagTime = now.Sub(r.caughtUpAt)
	}
	return s
}

// lagging reports whether a HIGH message must be refused at once: no slave,
// or one too far behind.
func (r *replication) lagging() bool {
	s := r.state()
	return !s.Connected || s.LagBytes > r.cfg.SlaveLagBytes || s.LagTime > r.cfg.SlaveLagTime
}

// await registers a HIGH message ending at end; done is called once with OK
// when the slave acknowledges it, or SLAVE_SYNC_TIMEOUT.
func (r *replication) await(end int64, done func(protocol.Status)) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		r.complete([]highWaiter{{done: done}}, protocol.StatusSlaveSyncTimeout)
		return
	}
	if r.ack >= end {
		r.mu.Unlock()
		r.complete([]highWaiter{{done: done}}, protocol.StatusOK)
		return
	}
	r.waiters = append(r.waiters, highWaiter{end: end, deadline: r.clock.Now().Add(r.cfg.HighWait), done: done})
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
	released := r.ackLocked(f.Acked, end, now)
	if f.Offset == end && !r.closed {
		r.parked = append(r.parked, parkedFetch{rep: rep, fetch: f, deadline: now.Add(time.Duration(f.WaitMillis) * time.Millisecond)})
		r.mu.Unlock()
		r.complete(released, protocol.StatusOK)
		r.notify() // the log may have grown since end was read
		return
	}
	r.mu.Unlock()
	r.complete(released, protocol.StatusOK)
	r.answer(rep, f)
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
	released := r.ackLocked(a.Acked, end, now)
	r.mu.Unlock()
	r.stats.HAAcks.Add(1)
	r.complete(released, protocol.StatusOK)
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

// admitLocked checks that a fetch or an acknowledgement comes from the
// broker the registry names as this group's slave, in the epoch this master
// serves. The check and the use of what was admitted happen under one hold
// of r.mu, so a slave replaced meanwhile (setSlave) is never credited with
// another's acknowledgement.
func (r *replication) admitLocked(brokerID string, e uint32) *refusal {
	switch {
	case e > r.epoch:
		return &refusal{err: &protocol.Error{Status: protocol.StatusNotMaster,
			Message: fmt.Sprintf("this master serves epoch %d; the fetch is for epoch %d", r.epoch, e)}}
	case r.slaveID == "" || brokerID != r.slaveID || e != r.epoch:
		return &refusal{err: &protocol.Error{Status: protocol.StatusNotAuthorized,
			Message: fmt.Sprintf("only the group's slave %q in epoch %d may fetch; got %q in epoch %d", r.slaveID, r.epoch, brokerID, e)},
			unknown: e == r.epoch && brokerID != r.slaveID, from: brokerID, epoch: e, slave: r.slaveID, serving: r.epoch}
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

// ackLocked records that the slave has appended up to acked and is heard
// from now (the master's log ends at end), and takes the HIGH waiters that
// releases.
func (r *replication) ackLocked(acked, end int64, now time.Time) []highWaiter {
	if acked > r.ack {
		r.ack = acked
	}
	switch {
	case !r.everSeen || r.ack >= end:
		// A slave's first contact starts its lag clock; one that has the
		// whole log is caught up now.
		r.caughtUpAt = now
		r.offers = r.offers[:0]
	default:
		i := 0
		for i < len(r.offers) && r.offers[i].end <= r.ack {
			if r.offers[i].at.After(r.caughtUpAt) {
				r.caughtUpAt = r.offers[i].at
			}
			i++
		}
		r.offers = append(r.offers[:0], r.offers[i:]...)
	}
	r.everSeen = true
	r.lastFetch = now
	return r.releaseLocked()
}

// offerLocked notes that an answer was built when the master's log ended at end.
func (r *replication) offerLocked(end int64, now time.Time) {
	if end <= r.ack {
		return
	}
	if n := len(r.offers); n > 0 && r.offers[n-1].end == end {
		r.offers[n-1].at = now // the log still ended there: the later time counts
		return
	}
	if len(r.offers) == maxOffers {
		r.offers = append(r.offers[:0], r.offers[1:]...)
	}
	r.offers = append(r.offers, offer{end: end, at: now})
}

// releaseLocked takes the waiters the acknowledgement covers.
func (r *replication) releaseLocked() []highWaiter {
	i := 0
	for i < len(r.waiters) && r.waiters[i].end <= r.ack {
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
	if st == protocol.StatusOK {
		r.stats.HighAcked.Add(int64(len(ws)))
	} else {
		r.stats.HighTimeouts.Add(int64(len(ws)))
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
	body := append((*bp)[:0], make([]byte, haHeaderLen)...)
	body, err := r.log.ReadRawTo(body, f.Offset, maxBytes)
	*bp = body
	if err != nil {
		answerBufs.Put(bp)
		r.lg.Warn("reading the log for the slave failed", "offset", f.Offset, "error", err)
		rep.ReplyError(&protocol.Error{Status: protocol.StatusStoreError, Message: err.Error()})
		return
	}
	r.mu.Lock()
	r.offerLocked(end, now)
	epoch := r.epoch
	r.mu.Unlock()
	protocol.AppendHAFetchResponseHeader(body[:0], end, epoch) // fills the room left for it
	if n := len(body) - haHeaderLen; n > 0 {
		r.stats.HAAnswers.Add(1)
		r.stats.HABytes.Add(int64(n))
	}
	_ = rep.ReplyGiven(body, func() { answerBufs.Put(bp) })
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
			r.mu.Unlock()
			for _, p := range parked {
				p.rep.ReplyError(&protocol.Error{Status: protocol.StatusShuttingDown, Message: "master shutting down"})
			}
			return
		case <-r.wake:
		case <-tick.Chan():
		}
		r.step()
	}
}

// step answers what is due now.
func (r *replication) step() {
	now := r.clock.Now()
	end := r.log.EndOffset()
	r.mu.Lock()
	var ready []parkedFetch
	kept := r.parked[:0]
	for _, p := range r.parked {
		if end > p.fetch.Offset || now.After(p.deadline) {
			ready = append(ready, p)
		} else {
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
	r.complete(expired, protocol.StatusSlaveSyncTimeout)
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
