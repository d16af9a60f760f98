package producer

import (
	"slices"

	"github.com/ferrymq/ferrymq/protocol"
)

// qkey names a queue, or, with delayed, the internal queue of its pending
// delayed messages (protocol.DelayTopic(topic), the same queue number, in
// the same group): the broker keeps a producer's sequences of that queue
// apart from the queue's own, so a sink keeps a line for each.
type qkey struct {
	topic   string
	queue   uint32
	delayed bool
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

// carries reports whether rec is one of the batch's records.
func (b *batch) carries(rec *record) bool {
	for _, rn := range b.runs {
		if rn.ln.key == rec.lineKey() && slices.Contains(rn.recs, rec) {
			return true
		}
	}
	return false
}

// build takes the next batch from the ready lines, oldest first: per line,
// its stamped records (a retry, which goes whole and first), then new
// records, stamped now with the queue's next sequences (see batcher.take).
// Under mu.
func (s *sink) build(cur *identity) *batch {
	bb := batcher{cur: cur, limit: s.cfg.maxBatchBytes}
	for _, ln := range s.ready {
		bb.total += len(ln.recs)
	}
	bb.b = &batch{addr: s.addr, epoch: s.epoch, runs: make([]run, 0, len(s.ready))}
	kept := s.ready[:0]
	for _, ln := range s.ready {
		if len(ln.recs) == 0 { // emptied by expiry
			ln.queued = false
			continue
		}
		if bb.full || !bb.take(s, ln) {
			kept = append(kept, ln)
		}
	}
	clear(s.ready[len(kept):])
	s.ready = kept
	return bb.b
}

// batcher is one build's state: the batch so far and its bytes, the
// identity new records are stamped with, the records of ready lines not
// yet taken, and the array the runs' records are carved from.
type batcher struct {
	b     *batch
	cur   *identity
	limit int
	bytes int
	total int
	pool  []*record
	full  bool
}

// take adds a line's next run to the batch, if it fits, and reports
// whether it did. A line whose retried records are of an older identity
// takes no new records with them. The line is busy until its run is
// settled.
func (bb *batcher) take(s *sink, ln *line) bool {
	p, pb := 0, 0 // the stamped records at the front: a retry
	for p < len(ln.recs) && ln.recs[p].gen != 0 {
		pb += ln.recs[p].size
		p++
	}
	if p > 0 && len(bb.b.runs) > 0 && bb.bytes+pb > bb.limit {
		return false // the retry goes whole, in a later batch
	}
	gen := uint64(0)
	if p > 0 {
		gen = ln.recs[0].gen
	} else if bb.cur != nil {
		gen = bb.cur.gen
	}
	n, nb := p, pb
	if bb.cur != nil && gen == bb.cur.gen || bb.cur == nil && p == 0 {
		for n < len(ln.recs) && (len(bb.b.runs) == 0 && n == 0 || bb.bytes+nb+ln.recs[n].size <= bb.limit) {
			nb += ln.recs[n].size
			n++
		}
	}
	if n == 0 {
		bb.full = true
		return false
	}
	recs := bb.carve(ln.recs[:n])
	if bb.cur != nil {
		ln.stamp(recs[p:], bb.cur)
	}
	ln.drop(n)
	s.readyBytes -= ln.bytes
	ln.bytes -= nb
	ln.busy, ln.queued = true, false
	bb.bytes += nb
	bb.b.runs = append(bb.b.runs, run{ln: ln, recs: recs, gen: gen})
	bb.b.n += n
	if bb.bytes >= bb.limit {
		bb.full = true
	}
	return true
}

// carve copies recs into the batch's record array: the runs and their
// records are carved from a few allocations, not one per run (a topic of
// many queues has a run per record or so).
func (bb *batcher) carve(recs []*record) []*record {
	n := len(recs)
	if cap(bb.pool)-len(bb.pool) < n {
		bb.pool = make([]*record, 0, max(n, min(bb.total, 1024)))
	}
	at := len(bb.pool)
	bb.pool = append(bb.pool, recs...)
	bb.total -= n
	return bb.pool[at:len(bb.pool):len(bb.pool)]
}

// stamp gives new records the queue's next sequences under cur (a new
// identity restarts the queue at 0).
func (ln *line) stamp(recs []*record, cur *identity) {
	if ln.gen != cur.gen {
		ln.gen, ln.next = cur.gen, 0
	}
	for _, r := range recs {
		r.msg.Producer = protocol.ProducerStamp{ID: cur.id, Epoch: cur.epoch, Seq: ln.next}
		r.gen = cur.gen
		ln.next++
		if r.txn != nil {
			r.msg.Txn = r.txn.id.Number
			r.txn.stamped(cur)
		}
	}
}

// drop removes the line's first n records (taken into a run).
func (ln *line) drop(n int) {
	clear(ln.recs[:n])
	switch {
	case n < len(ln.recs):
		ln.recs = ln.recs[n:]
	case cap(ln.recs) <= 4096:
		// Emptied: the line's next records reuse its array (a queue taking
		// a record per batch would otherwise allocate one per record),
		// unless a backlog made it large.
		ln.recs = ln.recs[:0]
	default:
		ln.recs = nil
	}
}
