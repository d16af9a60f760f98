package producer

import (
	"fmt"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/sdkmetrics"
)

// sink batches the records bound for one broker group. A batch leaves when
// it is full, when it is urgent (a synchronous Send or a Flush), or when the
// oldest record has lingered long enough, and only while fewer than
// MaxInflightPerGroup batches are in flight: under load records pile up
// behind the in-flight batches and leave together.
//
// Records wait in one line per queue. A batch carries at most one run (a
// line's next records, in order) per queue, and a line whose run is in
// flight, or which waits out a retry's backoff, is busy: its records wait.
// So a queue has one run in flight at a time, its records reach the broker
// in order whatever the order of concurrent batches on the wire, and its
// sequence numbers (assigned when a run is built, never at enqueue) are
// exact: a run is answered before the queue's next one is built.
type sink struct {
	sinkDeps
	group string

	mu         sync.Mutex
	lines      map[qkey]*line
	ready      []*line // lines with records and not busy, in the order they became so
	readyBytes int     // the records of ready lines
	oldest     time.Time
	urgent     bool
	inflight   int
	timer      *time.Timer
	// The group as the newest route seen names it (see observe): its
	// master ("" none), slave ("" none), epoch and state, and that route's
	// version.
	addr     string
	slave    string
	epoch    uint32
	writable bool
	version  uint64
	viewed   bool
	calls    map[*call]struct{} // SEND calls in flight
	// changed is closed (and replaced) when a route names a new master or
	// epoch for the group, or shows it writable again: lines waiting out a
	// retry's backoff go at once, since what they waited for has happened.
	changed chan struct{}
	// Work for unlock to do once mu is released (promises, retries and
	// route refreshes never run under it).
	done    []ended
	retry   []ended
	refresh []string
}

// sinkDeps is what a sink works with: the producer's options and clock
// (cfg), its goroutines and end (life), its counters, the buffer its
// records' promises go through, the wire call, and the rest of the
// producer through the narrow host.
type sinkDeps struct {
	cfg   *config
	life  *life
	stats *statCounters
	buf   *buffer
	wire  *wire
	host  sinkHost
}

// sinkHost is what a sink needs of the producer beyond its parts: the
// route lookups, dispatching records again, and the producer's identity.
type sinkHost interface {
	// queueRoute is the cached route of one queue, and the route's version.
	queueRoute(topic string, queue uint32) (q routing.QueueRoute, version uint64, known bool)
	// refreshSoon refreshes a topic's route in the background.
	refreshSoon(topic string)
	// retryOrFail dispatches a record again after a backoff (it may move),
	// or finishes it.
	retryOrFail(rec *record, err error) (scheduled bool)
	// dispatch dispatches a record again at once (its queue moved).
	dispatch(rec *record, urgent bool)
	// batchIdentity is the identity new batches are stamped with; nil
	// while there is none yet or a new one is being taken (the producer
	// kicks every sink when it has it).
	batchIdentity() *identity
	// outOfOrder takes a new identity in the background if gen is still
	// the current one (the broker lost the producer's sequences).
	outOfOrder(gen uint64)
	// fence marks the producer fenced (PRODUCER_FENCED); failIfFenced
	// then fails every sink's waiting records with ErrFenced.
	fence()
	failIfFenced()
}

// view is a group as one route names it.
type view struct {
	version  uint64 // the route's registry version
	master   string
	slave    string
	epoch    uint32
	writable bool
}

func viewOf(version uint64, q routing.QueueRoute) view {
	return view{version: version, master: q.Master, slave: q.Slave, epoch: q.Epoch, writable: q.Writable}
}

// call is a SEND in flight: where it went, since when (by the producer's
// clock), and how to give it up.
type call struct {
	addr   string
	epoch  uint32
	start  time.Time
	h      transport.Handle
	gaveUp bool // under the sink's mu
}

// givenUp is the cause a call is given up with (call.h) when the producer
// gave it up: the route says its master was replaced or its group cannot take
// writes.
type givenUp struct{ reason string }

func (g *givenUp) Error() string { return g.reason }

func newSink(d sinkDeps, group string) *sink {
	return &sink{sinkDeps: d, group: group, lines: map[qkey]*line{}, calls: map[*call]struct{}{}, changed: make(chan struct{})}
}

// unlock releases mu, then finishes, retries and refreshes what the locked
// section decided, in that order.
func (s *sink) unlock() {
	var done []ended
	if len(s.done) > 0 {
		done = s.done
		s.done = nil
	}
	retry, refresh := s.retry, s.refresh
	s.retry, s.refresh = nil, nil
	s.mu.Unlock()
	if len(done) > 0 {
		s.buf.finishAll(done)
		// The slice (a batch's results) serves the next batch.
		clear(done)
		s.mu.Lock()
		if s.done == nil {
			s.done = done[:0]
		}
		s.mu.Unlock()
	}
	for _, e := range retry {
		s.host.retryOrFail(e.rec, e.err)
	}
	for _, t := range refresh {
		s.host.refreshSoon(t)
	}
}

// add takes a dispatched record into its line. caller says the goroutine
// adding it waits for its result (Send's): if the batch carrying rec
// leaves now, this goroutine sends it, once mu is released.
func (s *sink) add(rec *record, urgent, caller bool) {
	s.mu.Lock()
	s.see(rec.view)
	k := rec.lineKey()
	ln := s.lines[k]
	if ln == nil {
		ln = &line{key: k}
		s.lines[k] = ln
	}
	ln.recs = append(ln.recs, rec)
	ln.bytes += rec.size
	if !ln.busy {
		s.makeReady(ln, rec.size)
	}
	s.urgent = s.urgent || urgent
	var own *record
	if caller {
		own = rec
	}
	b, cl := s.startBatches(own)
	s.unlock()
	if b != nil {
		s.send(b, cl)
	}
}

// observe shows the sink its group as a route just looked up names it.
func (s *sink) observe(v view) {
	s.mu.Lock()
	s.see(v)
	s.unlock()
}

// see takes v as the group's master, epoch and state unless the sink has
// seen a newer route (a larger version or epoch), and gives up the calls in
// flight that the route says cannot succeed (see giveUpCalls). Under mu.
func (s *sink) see(v view) {
	if s.viewed && (v.version < s.version || v.epoch < s.epoch) {
		return
	}
	if s.viewed && (v.master != s.addr || v.epoch != s.epoch || v.writable && !s.writable) {
		close(s.changed)
		s.changed = make(chan struct{})
	}
	s.viewed = true
	s.addr, s.slave, s.epoch, s.writable, s.version = v.master, v.slave, v.epoch, v.writable, v.version
	if len(s.calls) > 0 {
		s.giveUpCalls(v)
	}
}

// giveUpCalls gives up the calls in flight that v says cannot succeed:
// those sent to another master or epoch than v's (the master was replaced:
// it can store nothing more), and, when the group is not writable, those
// that have waited at least RoutePoll (a live broker would have answered
// by now; a hung one never will). A call given up has an unknown outcome,
// like a timeout: its records are retried on their queue, at the master of
// the newest route. Under mu.
func (s *sink) giveUpCalls(v view) {
	var now time.Time
	if !v.writable {
		now = s.cfg.clock.Now()
	}
	for cl := range s.calls {
		if cl.gaveUp {
			continue
		}
		var why string
		switch {
		case cl.addr != v.master || cl.epoch != v.epoch:
			master := v.master
			if master == "" {
				master = "none"
			}
			why = fmt.Sprintf("group %s's route changed while the call waited: master %s at epoch %d, the call went to %s at epoch %d",
				s.group, master, v.epoch, cl.addr, cl.epoch)
		case !v.writable && now.Sub(cl.start) >= s.cfg.routePoll:
			why = fmt.Sprintf("group %s is not writable in the route and %s has not answered in %v",
				s.group, cl.addr, now.Sub(cl.start))
		default:
			continue
		}
		cl.gaveUp = true
		cl.h.GiveUp(&givenUp{why})
		s.stats.add(sdkmetrics.ProducerGivenUp)
	}
}

// stalled reports whether a call has waited at least age (by the
// producer's clock).
func (s *sink) stalled(now time.Time, age time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for cl := range s.calls {
		if now.Sub(cl.start) >= age {
			return true
		}
	}
	return false
}

// makeReady counts n more bytes of a line that is not busy as ready to
// leave, and queues the line.
func (s *sink) makeReady(ln *line, n int) {
	if s.readyBytes == 0 {
		s.oldest = time.Now()
	}
	s.readyBytes += n
	if !ln.queued {
		ln.queued = true
		s.ready = append(s.ready, ln)
	}
}

// release ends a line's busy state: its records may leave again.
func (s *sink) release(ln *line) {
	ln.busy = false
	if len(ln.recs) > 0 {
		s.makeReady(ln, ln.bytes)
	}
}

func (s *sink) kick() {
	s.mu.Lock()
	s.sendLocked()
	s.unlock()
}

// sendLocked starts as many batches as may leave now.
func (s *sink) sendLocked() { s.startBatches(nil) }

// startBatches starts as many batches as may leave now, each on a new
// goroutine except the one carrying own (nil: none), which it returns with
// its call for the caller to send once it released mu. Under mu.
func (s *sink) startBatches(own *record) (ob *batch, ocl *call) {
	cfg := s.cfg
	for len(s.ready) > 0 && s.inflight < cfg.maxInflight {
		ready := s.urgent || cfg.linger == 0 || s.readyBytes >= cfg.maxBatchBytes ||
			s.buf.hurry() || time.Since(s.oldest) >= cfg.linger
		if !ready {
			if s.timer == nil {
				s.timer = time.AfterFunc(cfg.linger-time.Since(s.oldest), func() {
					s.mu.Lock()
					s.timer = nil
					s.sendLocked()
					s.unlock()
				})
			}
			return
		}
		var cur *identity
		if cfg.idempotent {
			if cur = s.host.batchIdentity(); cur == nil {
				return
			}
		}
		b := s.build(cur)
		if s.readyBytes == 0 {
			s.urgent = false
		} else {
			s.oldest = time.Now()
		}
		if len(b.runs) == 0 {
			continue // only emptied lines were ready
		}
		if s.life.dead.Load() {
			// Closed: no goroutine may start now (Close may be waiting).
			s.failBatch(b, ErrClosed)
			continue
		}
		s.inflight++
		var cl *call
		if b.addr != "" {
			cl = &call{addr: b.addr, epoch: b.epoch, start: cfg.clock.Now()}
			s.calls[cl] = struct{}{}
		}
		s.life.wg.Add(1)
		if own != nil && b.carries(own) {
			ob, ocl, own = b, cl, nil
			continue
		}
		go s.send(b, cl)
	}
	return ob, ocl
}

// failBatch ends a batch's records with err and frees their lines. Under
// mu.
func (s *sink) failBatch(b *batch, err error) {
	for _, rn := range b.runs {
		for _, r := range rn.recs {
			s.done = append(s.done, ended{rec: r, err: err})
		}
		s.release(rn.ln)
	}
}

// send sends one batch (cl is its call, nil when the group has no master)
// and settles every run: results, retries, rewinds. Runs under life.wg.
func (s *sink) send(b *batch, cl *call) {
	defer s.life.wg.Done()
	a := s.wire.send(s.group, b, cl)

	s.mu.Lock()
	s.inflight--
	if cl != nil {
		delete(s.calls, cl)
	}
	if a.err != nil && !a.gaveUp && noAnswer(a.err) {
		// A master that does not answer may have been replaced: look.
		for _, rn := range b.runs {
			s.refresh = append(s.refresh, rn.ln.key.topic)
		}
	}
	i := 0
	for _, rn := range b.runs {
		var rs []protocol.SendResult
		if a.err == nil {
			rs = a.results[i : i+len(rn.recs)]
		}
		i += len(rn.recs)
		s.settle(rn, rs, a.err, b.addr, b.epoch)
	}
	s.sendLocked()
	s.unlock()
	s.host.failIfFenced()
}

// wake lets the lines waiting out a retry's backoff go at once (a route
// moved one of the group's queues elsewhere).
func (s *sink) wake() {
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// expire fails the waiting records whose delivery deadline has passed,
// with cause (or their own last failure) as the reason.
func (s *sink) expire(now time.Time, cause error) {
	s.mu.Lock()
	for _, ln := range s.lines {
		s.expireLine(ln, now, cause)
	}
	s.unlock()
}

// expireLine fails a line's waiting records whose delivery deadline has
// passed, with cause (or their own last failure) as the reason. Under mu.
func (s *sink) expireLine(ln *line, now time.Time, cause error) {
	keep := ln.recs[:0]
	for _, rec := range ln.recs {
		if now.Before(rec.deadline) {
			keep = append(keep, rec)
			continue
		}
		ln.bytes -= rec.size
		if !ln.busy {
			s.readyBytes -= rec.size
		}
		err := rec.lastErr
		if err == nil {
			err = cause
		}
		if err == nil {
			err = protocol.ErrTimeout
		}
		s.done = append(s.done, ended{rec: rec, err: deliveryTimeout(rec, err, rec.cause)})
	}
	clear(ln.recs[len(keep):])
	ln.recs = keep
}

// failAll ends every waiting record with err.
func (s *sink) failAll(err error) {
	s.mu.Lock()
	for _, ln := range s.lines {
		for _, r := range ln.recs {
			s.done = append(s.done, ended{rec: r, err: err})
		}
		ln.recs, ln.bytes, ln.queued = nil, 0, false
	}
	s.ready, s.readyBytes = nil, 0
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	s.unlock()
}
