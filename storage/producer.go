package storage

import (
	"errors"
	"strings"
	"sync/atomic"
)

// ProducerStamp identifies an entry for deduplication: producer id (0 =
// unstamped), epoch, sequence in its queue.
type ProducerStamp struct {
	ID    uint64
	Epoch uint16
	Seq   int64
}

// Refusals of a stamped entry, in Position.Err.
var (
	// ErrOutOfOrderSequence: the entry's sequence would leave a gap after
	// the last one stored for its producer and queue, or a new epoch does
	// not start at 0. Nothing was stored for it; the producer may retry
	// once the entries before it are stored.
	ErrOutOfOrderSequence = errors.New("storage: out of order sequence")
	// ErrProducerFenced: the entry's epoch is older than the one stored for
	// its producer and queue; a newer instance of the producer has taken over.
	ErrProducerFenced = errors.New("storage: producer fenced by a newer epoch")
)

// ProducerStats counts the deduplication state and what it did.
type ProducerStats struct {
	Tracked    int   // (producer, queue) pairs remembered
	Duplicates int64 // entries answered as duplicates since Open
	Refused    int64 // entries refused (out of order or fenced) since Open
}

// ProducerStats returns the deduplication counters.
func (l *Log) ProducerStats() ProducerStats {
	return ProducerStats{
		Tracked:    int(l.prod.trackedPub.Load()),
		Duplicates: l.prod.duplicates.Load(),
		Refused:    l.prod.refused.Load(),
	}
}

const (
	// producerRuns is how many runs of sequences a (producer, queue) pair
	// remembers for answering duplicates (Kafka keeps 5 batches).
	producerRuns = 5
	// producerSweepMillis is the least record time between two sweeps of
	// idle producers.
	producerSweepMillis = 60_000
)

// seqRun is a run of consecutive sequences stored at consecutive queue
// offsets.
type seqRun struct {
	firstSeq, lastSeq int64
	firstQO           int64 // queue offset of firstSeq
}

// producerState is what the log remembers of one producer in one queue:
// 136 bytes (a 144-byte allocation).
type producerState struct {
	lastSeen int64  // record time (unix ms) of its newest record
	gen      uint32 // the group in which it was last saved for undo
	epoch    uint16
	n        uint8 // runs held
	head     uint8 // index of the newest run
	runs     [producerRuns]seqRun
}

func (s *producerState) newest() *seqRun { return &s.runs[s.head] }

// reset forgets every run: the producer starts over in epoch with seq at qo.
func (s *producerState) reset(epoch uint16, seq, qo int64) {
	s.epoch = epoch
	s.n, s.head = 1, 0
	s.runs[0] = seqRun{firstSeq: seq, lastSeq: seq, firstQO: qo}
}

// add records seq stored at qo in the same epoch: it extends the newest run
// if it continues it, else starts a new run (dropping the oldest).
func (s *producerState) add(seq, qo int64) {
	r := s.newest()
	if seq == r.lastSeq+1 && qo == r.firstQO+(r.lastSeq-r.firstSeq)+1 {
		r.lastSeq = seq
		return
	}
	s.head = (s.head + 1) % producerRuns
	if s.n < producerRuns {
		s.n++
	}
	s.runs[s.head] = seqRun{firstSeq: seq, lastSeq: seq, firstQO: qo}
}

// find returns the queue offset of seq if a remembered run holds it,
// newest runs first.
func (s *producerState) find(seq int64) (int64, bool) {
	for i := range int(s.n) {
		r := &s.runs[(int(s.head)-i+producerRuns)%producerRuns]
		if seq >= r.firstSeq && seq <= r.lastSeq {
			return r.firstQO + seq - r.firstSeq, true
		}
	}
	return 0, false
}

// producerKey names one producer in one queue, for undo records.
type producerKey struct {
	q  queueKey
	id uint64
}

type undoRec struct {
	k       producerKey
	st      *producerState
	old     producerState
	existed bool
}

// producerTable is the deduplication state of a log: a pure function of its
// records (their stamps, queue offsets and store times), rebuilt by
// recovery and kept by AppendRaw, so a slave and a restarted broker hold
// what the master held. Only the writer goroutine (and Open, before it
// starts) touches it; the counters are atomic for ProducerStats.
type producerTable struct {
	idle      int64 // ProducerIdle in milliseconds
	stamp     func([]byte) (ProducerStamp, bool)
	queues    map[queueKey]map[uint64]*producerState
	tracked   int
	lastSweep int64 // record time of the last sweep
	swept     bool

	// Undo of a group being placed: the first change to each state saves
	// its old value, so a group whose write fails leaves no trace. Sweeps
	// wait for the group's commit, at the latest record time it applied.
	inGroup bool
	gen     uint32
	undo    []undoRec
	latest  int64
	pending bool // latest is set

	trackedPub atomic.Int64
	duplicates atomic.Int64
	refused    atomic.Int64
}

func (t *producerTable) init(cfg Config) {
	t.idle = cfg.ProducerIdle.Milliseconds()
	t.stamp = cfg.ProducerStamp
	t.queues = make(map[queueKey]map[uint64]*producerState)
}

// find returns the producers of queue k and the state of id among them,
// each nil if there is none. The state may be idle: see check.
func (t *producerTable) find(k queueKey, id uint64) (map[uint64]*producerState, *producerState) {
	ids := t.queues[k]
	return ids, ids[id]
}

// verdict of a stamped entry.
type verdict int

const (
	accept verdict = iota
	duplicate
	refuse
)

// check applies the rules to a stamped entry at record time now, given the
// state find returned. For a duplicate it returns the original's queue
// offset, or -1 when the original is older than the remembered runs; for a
// refusal, the error. A state idle for longer than ProducerIdle counts as
// none, swept or not, so what a check sees never depends on when sweeps ran.
func (t *producerTable) check(st *producerState, ps ProducerStamp, now int64) (verdict, int64, error) {
	switch {
	case st == nil || now-st.lastSeen > t.idle:
		return accept, 0, nil
	case ps.Epoch < st.epoch:
		return refuse, 0, ErrProducerFenced
	case ps.Epoch > st.epoch:
		if ps.Seq == 0 {
			return accept, 0, nil
		}
		return refuse, 0, ErrOutOfOrderSequence
	}
	last := st.newest().lastSeq
	switch {
	case ps.Seq <= last:
		if qo, ok := st.find(ps.Seq); ok {
			return duplicate, qo, nil
		}
		return duplicate, -1, nil
	case ps.Seq == last+1:
		return accept, 0, nil
	}
	return refuse, 0, ErrOutOfOrderSequence
}

// holds reports whether the state has every requirement's producer in its
// queue at its epoch with its sequence stored, at record time now (a state
// idle past ProducerIdle counts as none, as in check).
func (t *producerTable) holds(reqs []Requirement, now int64) bool {
	for _, q := range reqs {
		st := t.queues[queueKey{q.Topic, q.Queue}][q.Producer]
		if st == nil || now-st.lastSeen > t.idle || st.epoch != q.Epoch || st.newest().lastSeq < q.Seq {
			return false
		}
	}
	return true
}

// apply records a stamped record stored in queue k at queue offset qo with
// record time now, without checks: a state that is missing, forgotten or of
// another epoch starts over at this record, else the record joins its runs.
// It is both what an accepted entry does and how recovery and AppendRaw
// replay the log.
func (t *producerTable) apply(k queueKey, ps ProducerStamp, qo, now int64) {
	ids, st := t.find(k, ps.ID)
	t.applyTo(ids, st, k, ps, qo, now)
}

// applyTo is apply given what find returned.
func (t *producerTable) applyTo(ids map[uint64]*producerState, st *producerState, k queueKey, ps ProducerStamp, qo, now int64) {
	if ids == nil {
		ids = make(map[uint64]*producerState)
		t.queues[queueKey{strings.Clone(k.topic), k.queue}] = ids // not the caller's string: it may pin a buffer
	}
	if st == nil {
		st = &producerState{}
		ids[ps.ID] = st
		t.tracked++
		if t.inGroup {
			st.gen = t.gen
			t.undo = append(t.undo, undoRec{k: producerKey{k, ps.ID}, st: st})
		}
	} else if t.inGroup && st.gen != t.gen {
		t.undo = append(t.undo, undoRec{k: producerKey{k, ps.ID}, st: st, old: *st, existed: true})
		st.gen = t.gen
	}
	if now-st.lastSeen > t.idle || st.n == 0 || ps.Epoch != st.epoch {
		st.reset(ps.Epoch, ps.Seq, qo)
	} else {
		st.add(ps.Seq, qo)
	}
	st.lastSeen = max(st.lastSeen, now)
	t.note(now)
}

// note records that the group being placed holds a record of time now.
func (t *producerTable) note(now int64) {
	if t.inGroup && (!t.pending || now > t.latest) {
		t.latest, t.pending = now, true
	}
}

// replay applies the stamp of a stored record, if it has one.
func (t *producerTable) replay(k queueKey, payload []byte, qo, storeTime int64) {
	if t.stamp == nil {
		return
	}
	ps, ok := t.stamp(payload)
	if !ok || ps.ID == 0 {
		return
	}
	if !t.inGroup {
		t.sweep(storeTime)
	}
	t.apply(k, ps, qo, storeTime)
}

// sweep drops the states idle longer than ProducerIdle at record time now,
// at most once a minute of record time. It only frees memory: lookup already
// treats those states as forgotten.
func (t *producerTable) sweep(now int64) {
	if t.swept && now-t.lastSweep < producerSweepMillis {
		return
	}
	t.swept, t.lastSweep = true, now
	for k, ids := range t.queues {
		for id, st := range ids {
			if now-st.lastSeen > t.idle {
				delete(ids, id)
				t.tracked--
			}
		}
		if len(ids) == 0 {
			delete(t.queues, k)
		}
	}
	t.trackedPub.Store(int64(t.tracked))
}

// begin starts a group: changes from here on can be undone.
func (t *producerTable) begin() {
	t.inGroup = true
	t.gen++
	if t.gen == 0 { // wrapped: no state may look saved already
		for _, ids := range t.queues {
			for _, st := range ids {
				st.gen = 0
			}
		}
		t.gen = 1
	}
}

// commit keeps the group's changes, then sweeps at the group's latest
// record time.
func (t *producerTable) commit() {
	t.inGroup = false
	clear(t.undo)
	t.undo = t.undo[:0]
	if t.pending {
		t.pending = false
		t.sweep(t.latest)
	}
	t.trackedPub.Store(int64(t.tracked))
}

// rollback undoes the group's changes.
func (t *producerTable) rollback() {
	for i := len(t.undo) - 1; i >= 0; i-- {
		u := &t.undo[i]
		if u.existed {
			*u.st = u.old
			continue
		}
		ids := t.queues[u.k.q]
		delete(ids, u.k.id)
		t.tracked--
		if len(ids) == 0 {
			delete(t.queues, u.k.q)
		}
	}
	t.pending = false
	t.commit()
}
