package producer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/internal/clientcore"
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
	c     *Client
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
	ctx    context.Context
	cancel context.CancelCauseFunc
	gaveUp bool // under the sink's mu
}

// givenUp is the cause of a call's context when the producer gave the call
// up: the route says its master was replaced or its group cannot take
// writes.
type givenUp struct{ reason string }

func (g *givenUp) Error() string { return g.reason }

// qkey names a queue.
type qkey struct {
	topic string
	queue uint32
}

// line is one queue's waiting records, in order. Records that keep their
// stamp for a retry are at its front, in sequence order.
type line struct {
	key     qkey
	recs    []*record
	bytes   int
	busy    bool   // a run in flight, or a retry's backoff
	queued  bool   // in sink.ready
	gen     uint64 // the identity generation of next
	next    int64  // the queue's next sequence under gen
	fails   int    // consecutive failed runs, for the backoff
	lastErr error  // the last failed run's cause
}

// batch is what one SEND carries: runs of distinct queues.
type batch struct {
	runs  []run
	n     int // records
	addr  string
	epoch uint32 // the group's epoch the batch is sent for
}

// run is one line's records in a batch, in sequence order, all stamped by
// one identity generation (gen; 0: unstamped).
type run struct {
	ln   *line
	recs []*record
	gen  uint64
}

// ended is a record to finish (err nil: with res) or to retry elsewhere.
type ended struct {
	rec *record
	res Result
	err error
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
		s.c.finishAll(done)
		// The slice (a batch's results) serves the next batch.
		clear(done)
		s.mu.Lock()
		if s.done == nil {
			s.done = done[:0]
		}
		s.mu.Unlock()
	}
	for _, e := range retry {
		s.c.retryOrFail(e.rec, e.err)
	}
	for _, t := range refresh {
		s.c.refreshSoon(t)
	}
}

func (c *Client) sink(group string) *sink {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sinks[group]
	if s == nil {
		s = &sink{c: c, group: group, lines: map[qkey]*line{}, calls: map[*call]struct{}{}, changed: make(chan struct{})}
		c.sinks[group] = s
	}
	return s
}

func (s *sink) add(rec *record, urgent bool) {
	s.mu.Lock()
	s.see(rec.view)
	k := qkey{rec.msg.Topic, rec.msg.Queue}
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
	s.sendLocked()
	s.unlock()
}

// observe shows the sink its group as a route just looked up names it.
func (s *sink) observe(v view) {
	s.mu.Lock()
	s.see(v)
	s.unlock()
}

// see takes v as the group's master, epoch and state unless the sink has
// seen a newer route (a larger version or epoch), and gives up the calls in
// flight that the route says cannot succeed: those sent to another master
// or epoch than v's (the master was replaced: it can store nothing more),
// and, when the group is not writable, those that have waited at least
// RoutePoll (a live broker would have answered by now; a hung one never
// will). A call given up has an unknown outcome, like a timeout: its
// records are retried on their queue, at the master of the newest route.
// Under mu.
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
	if len(s.calls) == 0 {
		return
	}
	var now time.Time
	if !v.writable {
		now = s.c.cfg.clock.Now()
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
		case !v.writable && now.Sub(cl.start) >= s.c.cfg.routePoll:
			why = fmt.Sprintf("group %s is not writable in the route and %s has not answered in %v",
				s.group, cl.addr, now.Sub(cl.start))
		default:
			continue
		}
		cl.gaveUp = true
		cl.cancel(&givenUp{why})
		s.c.stats.add(sdkmetrics.ProducerGivenUp)
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
func (s *sink) sendLocked() {
	c := s.c
	cfg := &c.cfg
	for len(s.ready) > 0 && s.inflight < cfg.maxInflight {
		ready := s.urgent || cfg.linger == 0 || s.readyBytes >= cfg.maxBatchBytes ||
			c.flushing.Load() > 0 || c.starved.Load() > 0 || time.Since(s.oldest) >= cfg.linger
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
			// No identity yet, or a new one on its way (renewIdentity kicks
			// every sink when it has it).
			if cur = c.ident.Load(); cur == nil || c.renewing.Load() {
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
		if c.dead.Load() {
			// Closed: no goroutine may start now (Close may be waiting).
			for _, rn := range b.runs {
				for _, r := range rn.recs {
					s.done = append(s.done, ended{rec: r, err: ErrClosed})
				}
				s.release(rn.ln)
			}
			continue
		}
		s.inflight++
		var cl *call
		if b.addr != "" {
			cl = &call{addr: b.addr, epoch: b.epoch, start: c.cfg.clock.Now()}
			cl.ctx, cl.cancel = context.WithCancelCause(context.Background())
			s.calls[cl] = struct{}{}
		}
		c.wg.Add(1)
		go s.send(b, cl)
	}
}

// build takes the next batch from the ready lines, oldest first: per line,
// its stamped records (a retry, which goes whole and first), then new
// records, stamped now with the queue's next sequences. A line whose
// retried records are of an older identity takes no new records with them.
func (s *sink) build(cur *identity) *batch {
	limit := s.c.cfg.maxBatchBytes
	// The runs and their records are carved from a few allocations, not
	// one per run (a topic of many queues has a run per record or so).
	total := 0
	for _, ln := range s.ready {
		total += len(ln.recs)
	}
	b := &batch{addr: s.addr, epoch: s.epoch, runs: make([]run, 0, len(s.ready))}
	var pool []*record
	bytes := 0
	kept := s.ready[:0]
	full := false
	for _, ln := range s.ready {
		if len(ln.recs) == 0 { // emptied by expiry
			ln.queued = false
			continue
		}
		if full {
			kept = append(kept, ln)
			continue
		}
		p, pb := 0, 0
		for p < len(ln.recs) && ln.recs[p].gen != 0 {
			pb += ln.recs[p].size
			p++
		}
		if p > 0 && len(b.runs) > 0 && bytes+pb > limit {
			kept = append(kept, ln) // the retry goes whole, in a later batch
			continue
		}
		gen := uint64(0)
		if p > 0 {
			gen = ln.recs[0].gen
		} else if cur != nil {
			gen = cur.gen
		}
		n, nb := p, pb
		if cur != nil && gen == cur.gen || cur == nil && p == 0 {
			for n < len(ln.recs) && (len(b.runs) == 0 && n == 0 || bytes+nb+ln.recs[n].size <= limit) {
				nb += ln.recs[n].size
				n++
			}
		}
		if n == 0 {
			full = true
			kept = append(kept, ln)
			continue
		}
		if cap(pool)-len(pool) < n {
			pool = make([]*record, 0, max(n, min(total, 1024)))
		}
		at := len(pool)
		pool = append(pool, ln.recs[:n]...)
		recs := pool[at:len(pool):len(pool)]
		total -= n
		if cur != nil {
			if ln.gen != cur.gen {
				ln.gen, ln.next = cur.gen, 0
			}
			for _, r := range recs[p:] {
				r.msg.Producer = protocol.ProducerStamp{ID: cur.id, Epoch: cur.epoch, Seq: ln.next}
				r.gen = cur.gen
				ln.next++
			}
		}
		clear(ln.recs[:n])
		switch {
		case n < len(ln.recs):
			ln.recs = ln.recs[n:]
		case cap(ln.recs) <= 4096:
			// Emptied: the line's next records reuse its array (a queue
			// taking a record per batch would otherwise allocate one per
			// record), unless a backlog made it large.
			ln.recs = ln.recs[:0]
		default:
			ln.recs = nil
		}
		s.readyBytes -= ln.bytes
		ln.bytes -= nb
		ln.busy, ln.queued = true, false
		bytes += nb
		b.runs = append(b.runs, run{ln: ln, recs: recs, gen: gen})
		b.n += n
		if bytes >= limit {
			full = true
		}
	}
	clear(s.ready[len(kept):])
	s.ready = kept
	return b
}

// send sends one batch (cl is its call, nil when the group has no master)
// and settles every run: results, retries, rewinds.
func (s *sink) send(b *batch, cl *call) {
	defer s.c.wg.Done()
	c := s.c
	deadline := time.Now().Add(c.cfg.requestTimeout)
	for _, rn := range b.runs {
		for _, r := range rn.recs {
			if r.deadline.Before(deadline) {
				deadline = r.deadline
			}
		}
	}
	var results []protocol.SendResult
	var err error
	var latency time.Duration
	gaveUp := false
	if cl == nil {
		err = &protocol.Error{Status: protocol.StatusNoRoute, Message: fmt.Sprintf("group %s has no master in the route", s.group)}
	} else if conn := c.conn(b.addr); conn == nil {
		err = transport.ErrClosed
	} else {
		// A SEND body is the group's epoch, a count and the messages,
		// encoded straight from the records (no copy of the messages into a
		// slice first), into a buffer of the right size: records know their
		// encoded size (with a stamp), so appending never grows it.
		need := protocol.SendRequestHeaderSize
		for _, rn := range b.runs {
			for _, r := range rn.recs {
				need += r.size
			}
		}
		body := protocol.AppendSendRequestHeader(c.bodies.get(need), b.epoch, b.n)
		for _, rn := range b.runs {
			for _, r := range rn.recs {
				body = protocol.AppendMessage(body, &r.msg)
			}
		}
		ctx, cancel := context.WithDeadline(cl.ctx, deadline)
		start := time.Now()
		var resp protocol.Frame
		resp, err = conn.Call(ctx, protocol.CodeSend, body)
		latency = time.Since(start)
		c.cfg.Metrics.Observe(sdkmetrics.ProducerSendDuration, latency)
		var g *givenUp
		if err != nil && errors.As(context.Cause(ctx), &g) {
			// An answer that came anyway wins; without one, the outcome is
			// unknown, as after a timeout.
			gaveUp = true
			err = &protocol.Error{Status: protocol.StatusTimeout, Message: "call given up: " + g.reason}
		}
		cancel()
		// The transport copied the body into its write buffer before Call
		// waited, so the buffer is free once Call returns.
		c.bodies.put(body)
		if err == nil {
			results, err = clientcore.DecodeSendAnswer(resp, b.n)
		}
		// A broken connection or a late answer counts against the group; a
		// status the broker answered, for the whole batch or a message, as
		// its row of the status table says.
		fault := false
		if err != nil {
			var pe *protocol.Error
			fault = !errors.As(err, &pe) || pe.Status.Fault()
		} else {
			for _, res := range results {
				if res.Status != protocol.StatusOK && res.Status.Fault() {
					fault = true
					break
				}
			}
		}
		// A call given up because its master was replaced says nothing of
		// the group's new master; and one given up because the group cannot
		// take writes is not chosen anyway.
		if !gaveUp {
			c.sel.Avoider().Report(s.group, latency, fault, c.cfg.clock.Now())
		}
	}

	s.mu.Lock()
	s.inflight--
	if cl != nil {
		delete(s.calls, cl)
		cl.cancel(nil)
	}
	if err != nil && !gaveUp && noAnswer(err) {
		// A master that does not answer may have been replaced: look.
		for _, rn := range b.runs {
			s.refresh = append(s.refresh, rn.ln.key.topic)
		}
	}
	i := 0
	for _, rn := range b.runs {
		var rs []protocol.SendResult
		if err == nil {
			rs = results[i : i+len(rn.recs)]
		}
		i += len(rn.recs)
		s.settle(rn, rs, err, b.addr)
	}
	s.sendLocked()
	s.unlock()
	if c.fenced.Load() {
		c.failAllSinks(ErrFenced)
	}
}

// noAnswer reports whether a call failed with no answer from the broker:
// a lost connection, a timeout.
func noAnswer(err error) bool {
	var pe *protocol.Error
	return !errors.As(err, &pe) || pe.Status == protocol.StatusTimeout
}

// bodyBufs keeps the buffers SEND bodies were encoded into, for the next
// batches: a batch is up to MaxBatchBytes (1 MiB by default), and a buffer
// made anew for each (or kept in a sync.Pool, which every GC empties) costs
// an allocation, page faults on fresh memory and GC work per batch. It
// keeps at most keep buffers (MaxInflightPerGroup), like Kafka's pool of
// batch buffers; an idle producer holds them.
type bodyBufs struct {
	mu    sync.Mutex
	keep  int
	limit int // the largest body a batch of MaxBatchBytes makes
	bufs  [][]byte
}

// get returns an empty buffer of at least n bytes' capacity.
func (p *bodyBufs) get(n int) []byte {
	p.mu.Lock()
	for i := len(p.bufs) - 1; i >= 0; i-- {
		if b := p.bufs[i]; cap(b) >= n {
			p.bufs[i] = p.bufs[len(p.bufs)-1]
			p.bufs[len(p.bufs)-1] = nil
			p.bufs = p.bufs[:len(p.bufs)-1]
			p.mu.Unlock()
			return b[:0]
		}
	}
	p.mu.Unlock()
	// A power of two from 64 KiB, but no more than a full batch needs: a
	// batch near the cap gets a buffer that every later batch fits in.
	size := 64 << 10
	for size < n {
		size *= 2
	}
	if size > p.limit {
		size = max(n, p.limit)
	}
	return make([]byte, 0, size)
}

// put gives a buffer back, dropping it if enough are kept (the smallest
// kept one, if b is larger).
func (p *bodyBufs) put(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.bufs) < p.keep {
		p.bufs = append(p.bufs, b[:0])
		return
	}
	small := 0
	for i := range p.bufs {
		if cap(p.bufs[i]) < cap(p.bufs[small]) {
			small = i
		}
	}
	if len(p.bufs) > 0 && cap(p.bufs[small]) < cap(b) {
		p.bufs[small] = b[:0]
	}
}

// verdict is what an answer says of a record.
type verdict uint8

const (
	stored    verdict = iota // OK or DUPLICATE
	unknown                  // it may be stored: retry with the same stamp on the same queue
	notStored                // refused: the queue's sequence rewinds, the record may move
	failed                   // final
)

func (s *sink) verdictOf(st protocol.Status) verdict {
	switch {
	case st == protocol.StatusOK || st == protocol.StatusDuplicate:
		return stored
	case st == protocol.StatusProducerFenced:
		return failed
	case s.c.cfg.idempotent && st.MaybeStored():
		return unknown
	case st.Retriable():
		return notStored
	}
	return failed
}

// verdictOfErr judges a whole request's failure: a status the broker
// answered for it, or no answer (a lost connection, a deadline, a
// malformed answer), which is an unknown outcome.
func (s *sink) verdictOfErr(err error) verdict {
	var pe *protocol.Error
	switch {
	case errors.As(err, &pe):
		return s.verdictOf(pe.Status)
	case errors.Is(err, transport.ErrClosed), errors.Is(err, protocol.ErrFrameTooLarge):
		return failed
	case clientcore.NeverSent(err):
		if clientcore.Retriable(sendErr(s.group, "", err)) {
			return notStored
		}
		return failed
	case s.c.cfg.idempotent:
		return unknown
	case clientcore.Retriable(sendErr(s.group, "", err)):
		return notStored
	}
	return failed
}

// settle hands a run's records their results, in sequence order:
//   - stored (OK, DUPLICATE): finished;
//   - unknown outcome: kept, with their stamps, at the front of the line,
//     retried there after a backoff;
//   - from the first record refused on: nothing later can have been stored
//     (the broker refuses gaps), so the queue's next sequence rewinds to the
//     first refused record's, but never to a sequence that may be stored.
//     The refused records up to the last one whose stamp may be stored (an
//     earlier attempt's outcome was unknown) and that waits for its queue
//     (keyed, or keepsUnknown) keep their stamps and wait at the front of
//     the line, and the sequence rewinds to just past them; the others lose
//     their stamps: unkeyed ones are dispatched again (they may move),
//     keyed ones wait at the front of the line.
//
// OUT_OF_ORDER_SEQUENCE also takes a new identity, and every refused
// record loses its stamp. Under mu.
func (s *sink) settle(rn run, results []protocol.SendResult, reqErr error, addr string) {
	c := s.c
	ln := rn.ln
	n := len(rn.recs)
	var reqV verdict
	var reqStatus protocol.Status
	if reqErr != nil {
		reqV = s.verdictOfErr(reqErr)
		reqStatus = protocol.StatusOf(reqErr)
		reqErr = sendErr(s.group, addr, reqErr)
	}
	verdictAt := func(i int) (verdict, protocol.Status) {
		if reqErr != nil {
			return reqV, reqStatus
		}
		return s.verdictOf(results[i].Status), results[i].Status
	}
	errAt := func(i int) error {
		if reqErr != nil {
			return reqErr
		}
		return &protocol.Error{Status: results[i].Status, Message: fmt.Sprintf("from group %s at %s", s.group, addr)}
	}
	r0 := n
	for i := range n {
		if v, _ := verdictAt(i); v == notStored || v == failed {
			r0 = i
			break
		}
	}
	var back []*record // to the line's front, in order
	var runErr error
	ooo := false
	storedPast := int64(-1) // past the last sequence stored after r0, or that may be
	var tail []*record
	var tailErr []error
	for i, rec := range rn.recs {
		v, st := verdictAt(i)
		switch {
		case v == stored:
			s.succeed(rec, results[i], addr)
			if i > r0 && rec.gen != 0 {
				storedPast = max(storedPast, rec.msg.Producer.Seq+1)
			}
		case v == failed:
			err := errAt(i)
			if rec.maybe && rec.gen != 0 {
				// An earlier attempt may have stored it: its sequence must
				// never go to another message.
				storedPast = max(storedPast, rec.msg.Producer.Seq+1)
				err = fmt.Errorf("%w (an earlier attempt's outcome was unknown: it may be stored)", err)
			}
			if st == protocol.StatusProducerFenced {
				c.fenced.Store(true)
				err = fmt.Errorf("%w: message %s to %q: %w", ErrFenced, rec.msg.ID, rec.msg.Topic, err)
			} else {
				err = fmt.Errorf("producer: message %s to %q: %w", rec.msg.ID, rec.msg.Topic, err)
			}
			s.done = append(s.done, ended{rec: rec, err: err})
		case i < r0: // unknown, before any refusal
			if st.RefreshesRoute() {
				s.refresh = append(s.refresh, rec.msg.Topic) // LEASE_LOST
			}
			s.markMaybe(rec)
			rec.failed(errAt(i))
			runErr = rec.lastErr
			back = append(back, rec)
		default: // refused, or unknown after a refusal
			if v == unknown {
				s.markMaybe(rec)
			}
			if st == protocol.StatusOutOfOrderSequence && i == r0 {
				// Only a run's first refusal can mean the broker lost our
				// sequence; a later one follows from that refusal.
				ooo = true
			}
			if st.RefreshesRoute() {
				s.refresh = append(s.refresh, rec.msg.Topic)
			}
			tail = append(tail, rec)
			tailErr = append(tailErr, errAt(i))
			runErr = errAt(i)
		}
	}
	// The tail's first records, up to the last one whose stamp may be
	// stored and that waits for its queue with it (keyed, or its group may
	// still answer it: keepsUnknown), keep their stamps (kept of them): the
	// broker dedupes them when they are sent again. Unless the broker lost
	// our sequence (OUT_OF_ORDER_SEQUENCE): then nothing keeps its stamp.
	kept := 0
	if r0 < n && rn.gen != 0 {
		if !ooo {
			var now time.Time
			for i, rec := range tail {
				if !rec.maybe {
					continue
				}
				if now.IsZero() {
					now = c.cfg.clock.Now()
				}
				if c.stays(rec) || s.keepsUnknown(rec, now) {
					kept = i + 1
				}
			}
		}
		if rn.gen == ln.gen {
			// Never below a sequence that may be stored.
			to := max(rn.recs[r0].msg.Producer.Seq, storedPast)
			for _, rec := range tail {
				if rec.maybe {
					to = max(to, rec.msg.Producer.Seq+1)
				}
			}
			ln.next = min(ln.next, to)
		}
		for _, rec := range tail[kept:] {
			c.unstamp(rec)
		}
		if ooo {
			c.stats.add(sdkmetrics.ProducerOutOfOrder)
			if cur := c.ident.Load(); cur != nil && rn.gen == cur.gen && c.renewing.CompareAndSwap(false, true) {
				c.wg.Add(1)
				go c.renewIdentity(rn.gen)
			}
		}
	}
	for i, rec := range tail {
		rec.failed(tailErr[i])
		if i < kept || c.stays(rec) {
			back = append(back, rec)
		} else {
			s.retry = append(s.retry, ended{rec: rec, err: tailErr[i]})
		}
	}
	if len(back) == 0 {
		if runErr == nil {
			ln.fails = 0
		}
		s.release(ln)
		return
	}
	ln.fails++
	ln.lastErr = runErr
	backoff := routing.Jitter(min(c.cfg.retryBackoff<<min(ln.fails-1, 10), c.cfg.maxBackoff))
	now := time.Now()
	keep := make([]*record, 0, len(back)+len(ln.recs))
	for _, rec := range back {
		if now.Add(backoff).After(rec.deadline) {
			rec.attempts++
			s.done = append(s.done, ended{rec: rec, err: deliveryTimeout(rec, rec.lastErr, rec.cause)})
			continue
		}
		rec.attempts++
		c.stats.add(sdkmetrics.ProducerRetries)
		keep = append(keep, rec)
		ln.bytes += rec.size
	}
	ln.recs = append(keep, ln.recs...)
	c.wg.Add(1)
	go s.hold(ln, backoff, s.changed)
}

// markMaybe records that an attempt with rec's stamp had an unknown
// outcome. Under mu.
func (s *sink) markMaybe(rec *record) {
	if !rec.maybe {
		rec.maybe, rec.maybeSince = true, s.c.cfg.clock.Now()
	}
}

// keepsUnknown reports whether a record whose stamp may be stored keeps it
// and waits for its queue, where the group's master (the same, or the
// slave promoted in its place, which holds the dedupe state) answers it
// DUPLICATE if it was stored: unless MoveOnUnknownOutcome, while the
// newest route shows the group with a writable master or with a slave that
// can be promoted, until FailoverWait has passed since the record's first
// unknown outcome (now and that time by the producer's clock). Under mu.
func (s *sink) keepsUnknown(rec *record, now time.Time) bool {
	cfg := &s.c.cfg
	switch {
	case cfg.moveOnUnknown:
		return false
	case !s.writable && s.slave == "":
		return false // no master takes writes, and nobody can be promoted
	}
	return now.Sub(rec.maybeSince) < cfg.failoverWait
}

// succeed finishes a stored record.
func (s *sink) succeed(rec *record, res protocol.SendResult, addr string) {
	dup := res.Status == protocol.StatusDuplicate
	if dup {
		s.c.stats.add(sdkmetrics.ProducerDuplicates)
	}
	st := rec.msg.Producer
	s.done = append(s.done, ended{rec: rec, res: Result{ID: rec.msg.ID, Topic: rec.msg.Topic, Queue: rec.msg.Queue,
		QueueOffset: res.QueueOffset, LogOffset: res.LogOffset, Group: s.group, Broker: addr,
		Duplicate: dup, PossibleDuplicate: rec.possibleDup, ProducerID: st.ID, Epoch: st.Epoch, Seq: st.Seq}})
}

// hold keeps a line busy for a retry's backoff, or until changed closes (a
// new master or epoch, the group writable again, or the queue routed to
// another group: the line goes at once, its backoff reset), then lets it
// go: records whose delivery deadline passed meanwhile fail; if it routes
// the queue to another group (it moved off a retired group), every record
// is dispatched again, keyed ones too, in order, unstamped (the new group
// knows nothing of this producer's sequences), flagged if an attempt's
// outcome was unknown; if the cached route says the queue's group no
// longer takes writes, the records that may move are dispatched again
// (flagged if an attempt's outcome was unknown): the line's records up to
// the last one whose stamp may be stored and that waits for the group
// (keyed, or keepsUnknown) stay, with their stamps; after them, keyed
// records stay and the others may move. Runs under c.wg.
func (s *sink) hold(ln *line, d time.Duration, changed <-chan struct{}) {
	defer s.c.wg.Done()
	t := time.NewTimer(d)
	woken := false
	select {
	case <-t.C:
	case <-changed:
		t.Stop()
		woken = true
	case <-s.c.stop:
		t.Stop()
		return // Close fails what is left
	}
	q, version, known := s.c.queueRoute(ln.key.topic, ln.key.queue)
	s.mu.Lock()
	if woken {
		ln.fails = 0
	}
	if known && q.Group == s.group {
		s.see(viewOf(version, q))
	}
	s.expireLine(ln, time.Now(), ln.lastErr)
	var moved []*record
	if known && q.Group != s.group {
		moved = slices.Clone(ln.recs)
		for _, rec := range moved {
			ln.bytes -= rec.size
			s.c.unstamp(rec)
		}
		clear(ln.recs)
		ln.recs = ln.recs[:0]
	}
	if known && !q.Writable {
		now := s.c.cfg.clock.Now()
		kept := 0
		for i, rec := range ln.recs {
			if rec.maybe && rec.gen != 0 && (s.c.stays(rec) || s.keepsUnknown(rec, now)) {
				kept = i + 1
			}
		}
		keep := ln.recs[:0]
		for i, rec := range ln.recs {
			if i < kept || s.c.stays(rec) {
				keep = append(keep, rec)
				continue
			}
			ln.bytes -= rec.size
			s.c.unstamp(rec)
			err := rec.lastErr
			if err == nil {
				err = &protocol.Error{Status: protocol.StatusReadOnly, Message: fmt.Sprintf("group %s is read-only in the route", s.group)}
			}
			s.retry = append(s.retry, ended{rec: rec, err: err})
		}
		clear(ln.recs[len(keep):])
		ln.recs = keep
	}
	s.release(ln)
	s.sendLocked()
	s.unlock()
	for _, rec := range moved {
		s.c.dispatch(rec, true) // in order: a key's records pass its gate one after the other
	}
}

// wake lets the lines waiting out a retry's backoff go at once (a route
// moved one of the group's queues elsewhere).
func (s *sink) wake() {
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// expireLine fails a line's waiting records whose delivery deadline has
// passed, with cause (or their own last failure) as the reason.
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

// expireLocked is expireLine for every line.
func (s *sink) expireLocked(now time.Time, cause error) {
	for _, ln := range s.lines {
		s.expireLine(ln, now, cause)
	}
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

// failAllSinks ends every waiting record of every sink with err.
func (c *Client) failAllSinks(err error) {
	for _, s := range c.allSinks() {
		s.failAll(err)
	}
}
