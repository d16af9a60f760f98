package producer

import (
	"errors"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdkmetrics"
)

// verdict is what an answer says of a record.
type verdict uint8

const (
	stored    verdict = iota // OK or DUPLICATE
	unknown                  // it may be stored: retry with the same stamp on the same queue
	notStored                // refused: the queue's sequence rewinds, the record may move
	failed                   // final
)

func verdictOf(cfg *config, st protocol.Status) verdict {
	switch {
	case st == protocol.StatusOK || st == protocol.StatusDuplicate:
		return stored
	case st == protocol.StatusProducerFenced:
		return failed
	case cfg.idempotent && st.MaybeStored():
		return unknown
	case st.Retriable():
		return notStored
	}
	return failed
}

// verdictOfErr judges a whole request's failure: a status the broker
// answered for it, or no answer (a lost connection, a deadline, a
// malformed answer), which is an unknown outcome.
func verdictOfErr(cfg *config, group string, err error) verdict {
	var pe *protocol.Error
	switch {
	case errors.As(err, &pe):
		return verdictOf(cfg, pe.Status)
	case errors.Is(err, transport.ErrClosed), errors.Is(err, protocol.ErrFrameTooLarge):
		return failed
	case clientcore.NeverSent(err):
		if clientcore.Retriable(sendErr(group, "", err)) {
			return notStored
		}
		return failed
	case cfg.idempotent:
		return unknown
	case clientcore.Retriable(sendErr(group, "", err)):
		return notStored
	}
	return failed
}

// settlement hands a run's records their results, in sequence order:
//   - stored (OK, DUPLICATE): finished;
//   - unknown outcome: kept, with their stamps, at the front of the line,
//     retried there after a backoff;
//   - from the first record refused on (r0): nothing later can have been
//     stored (the broker refuses gaps), so the queue's next sequence
//     rewinds to the first refused record's, but never to a sequence that
//     may be stored. The refused records up to the last one whose stamp may
//     be stored (an earlier attempt's outcome was unknown) and that waits
//     for its queue (keyed, or keepsUnknown) keep their stamps and wait at
//     the front of the line, and the sequence rewinds to just past them;
//     the others lose their stamps: unkeyed ones are dispatched again (they
//     may move), keyed ones wait at the front of the line.
//
// OUT_OF_ORDER_SEQUENCE also takes a new identity, and every refused
// record loses its stamp. It runs under the sink's mu, in the steps of
// settle.
type settlement struct {
	s       *sink
	rn      run
	results []protocol.SendResult
	addr    string
	epoch   uint32 // the group's epoch the batch was sent for
	// The whole call's failure: its error (naming the group), verdict and
	// status; reqErr nil if the broker answered each message.
	reqErr error
	reqV   verdict
	reqSt  protocol.Status

	r0         int       // the first refused record (or a final failure); the run's length if none
	back       []*record // to the line's front, in order
	runErr     error     // the run's last failure
	ooo        bool      // the broker lost our sequence
	storedPast int64     // past the last sequence stored after r0, or that may be
	tail       []*record // refused, or unknown after a refusal
	tailErr    []error
	kept       int // tail's first records that keep their stamps
}

// settle settles one run of an answered (or failed) batch. Under mu.
func (s *sink) settle(rn run, results []protocol.SendResult, reqErr error, addr string, epoch uint32) {
	st := settlement{s: s, rn: rn, results: results, addr: addr, epoch: epoch, storedPast: -1}
	if reqErr != nil {
		st.reqV = verdictOfErr(s.cfg, s.group, reqErr)
		st.reqSt = protocol.StatusOf(reqErr)
		st.reqErr = sendErr(s.group, addr, reqErr)
	}
	st.findRefusal()
	for i, rec := range rn.recs {
		st.judge(i, rec)
	}
	if st.r0 < len(rn.recs) && rn.gen != 0 {
		st.keepStamps()
		st.rewind()
		st.renewIfLost()
	}
	st.routeTail()
	st.requeue()
}

// verdictAt is record i's verdict and status.
func (st *settlement) verdictAt(i int) (verdict, protocol.Status) {
	if st.reqErr != nil {
		return st.reqV, st.reqSt
	}
	return verdictOf(st.s.cfg, st.results[i].Status), st.results[i].Status
}

// errAt is record i's failure.
func (st *settlement) errAt(i int) error {
	if st.reqErr != nil {
		return st.reqErr
	}
	return &protocol.Error{Status: st.results[i].Status, Message: fmt.Sprintf("from group %s at %s", st.s.group, st.addr)}
}

// findRefusal sets r0: the first record refused or failed.
func (st *settlement) findRefusal() {
	st.r0 = len(st.rn.recs)
	for i := range st.rn.recs {
		if v, _ := st.verdictAt(i); v == notStored || v == failed {
			st.r0 = i
			return
		}
	}
}

// judge acts on record i's verdict: finishes it (stored, failed), keeps
// it for its line's front (unknown before any refusal), or puts it in the
// tail (refused, or unknown after a refusal).
func (st *settlement) judge(i int, rec *record) {
	s := st.s
	v, status := st.verdictAt(i)
	switch {
	case v == stored:
		s.succeed(rec, st.results[i], st.addr)
		if i > st.r0 && rec.gen != 0 {
			st.storedPast = max(st.storedPast, rec.msg.Producer.Seq+1)
		}
	case v == failed:
		s.done = append(s.done, ended{rec: rec, err: st.finalErr(i, rec, status)})
	case i < st.r0: // unknown, before any refusal
		if status.RefreshesRoute() {
			s.refresh = append(s.refresh, rec.msg.Topic) // LEASE_LOST
		}
		s.markMaybe(rec, st.epoch)
		rec.failed(st.errAt(i))
		st.runErr = rec.lastErr
		st.back = append(st.back, rec)
	default: // refused, or unknown after a refusal
		if v == unknown {
			s.markMaybe(rec, st.epoch)
		}
		if status == protocol.StatusOutOfOrderSequence && i == st.r0 {
			// Only a run's first refusal can mean the broker lost our
			// sequence; a later one follows from that refusal.
			st.ooo = true
		}
		if status.RefreshesRoute() {
			s.refresh = append(s.refresh, rec.msg.Topic)
		}
		st.tail = append(st.tail, rec)
		st.tailErr = append(st.tailErr, st.errAt(i))
		st.runErr = st.errAt(i)
	}
}

// finalErr is the error a record that failed for good ends with; a
// PRODUCER_FENCED fences the producer.
func (st *settlement) finalErr(i int, rec *record, status protocol.Status) error {
	err := st.errAt(i)
	if rec.maybe && rec.gen != 0 {
		// An earlier attempt may have stored it: its sequence must never
		// go to another message.
		st.storedPast = max(st.storedPast, rec.msg.Producer.Seq+1)
		err = fmt.Errorf("%w (an earlier attempt's outcome was unknown: it may be stored)", err)
	}
	if status == protocol.StatusProducerFenced {
		st.s.host.fence()
		return fmt.Errorf("%w: message %s to %q: %w", ErrFenced, rec.msg.ID, rec.msg.Topic, err)
	}
	return fmt.Errorf("producer: message %s to %q: %w", rec.msg.ID, rec.msg.Topic, err)
}

// keepStamps sets kept: the tail's first records, up to the last one whose
// stamp may be stored and that waits for its queue with it (keyed, or its
// group may still answer it: keepsUnknown), keep their stamps: the broker
// dedupes them when they are sent again. Unless the broker lost our
// sequence (OUT_OF_ORDER_SEQUENCE): then nothing keeps its stamp. The
// others lose theirs in rewind.
func (st *settlement) keepStamps() {
	s := st.s
	if !st.ooo {
		var now time.Time
		for i, rec := range st.tail {
			if !rec.maybe {
				continue
			}
			if now.IsZero() {
				now = s.cfg.clock.Now()
			}
			if s.cfg.stays(rec) || s.keepsUnknown(rec, now) {
				st.kept = i + 1
			}
		}
	}
}

// rewind moves the queue's next sequence back to the first refused
// record's, never below a sequence that may be stored, then drops the
// stamps of the tail's records that do not keep theirs (after the rewind
// has read them).
func (st *settlement) rewind() {
	ln := st.rn.ln
	if st.rn.gen == ln.gen {
		to := max(st.rn.recs[st.r0].msg.Producer.Seq, st.storedPast)
		for _, rec := range st.tail {
			if rec.maybe {
				to = max(to, rec.msg.Producer.Seq+1)
			}
		}
		ln.next = min(ln.next, to)
	}
	for _, rec := range st.tail[st.kept:] {
		rec.unstamp(st.s.stats)
	}
}

// renewIfLost takes a new identity when the broker lost our sequence.
func (st *settlement) renewIfLost() {
	if st.ooo {
		st.s.stats.add(sdkmetrics.ProducerOutOfOrder)
		st.s.host.outOfOrder(st.rn.gen)
	}
}

// routeTail sends the tail's records back to the line's front (those
// keeping their stamps, and keyed ones that wait for their queue) or to
// be dispatched again.
func (st *settlement) routeTail() {
	s := st.s
	for i, rec := range st.tail {
		rec.failed(st.tailErr[i])
		if i < st.kept || s.cfg.stays(rec) {
			st.back = append(st.back, rec)
		} else {
			s.retry = append(s.retry, ended{rec: rec, err: st.tailErr[i]})
		}
	}
}

// requeue frees the line if nothing goes back to it; otherwise puts the
// records going back at its front (failing those whose delivery deadline
// the backoff would pass) and holds the line for the backoff.
func (st *settlement) requeue() {
	s, ln := st.s, st.rn.ln
	if len(st.back) == 0 {
		if st.runErr == nil {
			ln.fails = 0
		}
		s.release(ln)
		return
	}
	ln.fails++
	ln.lastErr = st.runErr
	backoff := s.cfg.backoff(ln.fails, s.cfg.maxBackoff)
	now := time.Now()
	keep := make([]*record, 0, len(st.back)+len(ln.recs))
	for _, rec := range st.back {
		rec.attempts++
		if now.Add(backoff).After(rec.deadline) {
			s.done = append(s.done, ended{rec: rec, err: deliveryTimeout(rec, rec.lastErr, rec.cause)})
			continue
		}
		s.stats.add(sdkmetrics.ProducerRetries)
		keep = append(keep, rec)
		ln.bytes += rec.size
	}
	ln.recs = append(keep, ln.recs...)
	s.life.wg.Add(1)
	go s.hold(ln, backoff, s.changed)
}

// markMaybe records that an attempt with rec's stamp, sent for the group's
// epoch, had an unknown outcome. Under mu.
func (s *sink) markMaybe(rec *record, epoch uint32) {
	if !rec.maybe {
		rec.maybe, rec.maybeSince = true, s.cfg.clock.Now()
	}
	rec.maybeEpoch = max(rec.maybeEpoch, epoch)
}

// keepsUnknown reports whether a record whose stamp may be stored keeps it
// and waits for its queue, where the group's master (the same, or the
// slave promoted in its place, which holds the dedupe state) answers it
// DUPLICATE if it was stored: unless MoveOnUnknownOutcome, while the
// newest route shows the group with a writable master, with a slave that
// can be promoted, or with a master of a later epoch than the record's
// unknown attempts (the slave promoted since, not yet taking writes: it
// will answer), until FailoverWait has passed since the record's first
// unknown outcome (now and that time by the producer's clock). Under mu.
func (s *sink) keepsUnknown(rec *record, now time.Time) bool {
	switch {
	case s.cfg.moveOnUnknown:
		return false
	case !s.writable && s.slave == "" && (s.addr == "" || s.epoch <= rec.maybeEpoch):
		return false // no master takes writes, and nobody can be promoted
	}
	return now.Sub(rec.maybeSince) < s.cfg.failoverWait
}

// succeed finishes a stored record.
func (s *sink) succeed(rec *record, res protocol.SendResult, addr string) {
	dup := res.Status == protocol.StatusDuplicate
	if dup {
		s.stats.add(sdkmetrics.ProducerDuplicates)
	}
	st := rec.msg.Producer
	r := Result{ID: rec.msg.ID, Topic: rec.msg.Topic, Queue: rec.msg.Queue,
		QueueOffset: res.QueueOffset, LogOffset: res.LogOffset, Group: s.group, Broker: addr,
		Duplicate: dup, PossibleDuplicate: rec.possibleDup, ProducerID: st.ID, Epoch: st.Epoch, Seq: st.Seq,
		Handle: protocol.Handle{Group: s.group, Offset: res.LogOffset}}
	if rec.delayed() {
		r.Delayed, r.DueAt = true, time.UnixMilli(rec.msg.Schedule.At)
		r.Handle.DueAt = rec.msg.Schedule.At
	}
	s.done = append(s.done, ended{rec: rec, res: r})
}
