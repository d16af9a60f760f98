// Package txn is a broker's transaction index: which transactions of its
// log are open, which queue offsets each holds back from readers of
// committed messages, and which were aborted. It is derived from the
// marks of the log's internal queue protocol.TxnTopic alone, applied in
// log order (the slave builds the same index from the same bytes; a
// restart rebuilds it by reading that queue again), and does no I/O.
//
// # Marks
//
// An open mark names a transaction and one queue it writes, with a queue
// offset at or below its first record there (the queue's end when the
// mark was made); it precedes that record in the log. A commit or abort
// mark follows every record of its transaction. So at any point of the
// log, a record of a transaction whose decision mark is not yet applied
// lies at or past some open mark's First in its queue, and:
//
//   - a queue's stable end is the lowest First of the open transactions
//     that write it (its end when none does): below it every record of a
//     transaction is decided, and a reader of committed messages reads
//     only below it;
//   - a record of an aborted transaction is never delivered (Aborted).
//
// A transaction number belongs to one producer id and epoch; a producer's
// transactions are ordered by (epoch, number) (protocol.TxnID.Before), and
// only its newest may take records (Admit).
package txn

import (
	"cmp"
	"slices"

	"github.com/ferrymq/ferrymq/protocol"
)

// recentDecisions is how many decisions the index remembers by id to
// answer a repeated TXN_END (aborted ones are kept until retention passes
// their mark, whatever this says).
const recentDecisions = 1 << 16

// recentByOthers is how many decisions not made by their producer the
// index lists (TXN_LIST's Decided).
const recentByOthers = 256

// State is where a transaction is.
type State uint8

const (
	Unknown   State = iota // never seen here, or forgotten
	Open                   // an open mark applied, no decision
	Committed              // its commit mark applied
	Aborted                // its abort mark applied
)

func (s State) String() string {
	return [...]string{"unknown", "open", "committed", "aborted"}[s]
}

// abortedAt is an aborted transaction and its mark's log offset.
type abortedAt struct {
	id protocol.TxnID
	at int64
}

// decision is a transaction's outcome and where its mark is in the log.
type decision struct {
	committed bool
	at        int64
}

type queueKey struct {
	topic string
	queue uint32
}

// OpenTxn is one open transaction.
type OpenTxn struct {
	ID     protocol.TxnID
	Began  int64 // unix milliseconds, from its first open mark
	At     int64 // the log offset of its first open mark (at or below it)
	Queues []protocol.TxnQueue
	// Messages and Bytes count what the master admitted in this process
	// (Count); a rebuilt index starts them at 0.
	Messages, Bytes int64
	// Prepared: a prepared mark was applied (the registry decides it).
	Prepared bool
}

// Index is the transaction index. It is not safe for concurrent use: its
// owner serializes calls.
type Index struct {
	open   map[protocol.TxnID]*OpenTxn
	queues map[queueKey]map[protocol.TxnID]int64 // the open transactions of a queue, and their First
	newest map[uint64]protocol.TxnID             // per producer id, its newest transaction seen
	// aborted holds every aborted transaction whose records may still be
	// in the log, with the log offset of its abort mark; abortOrder the
	// same in the order applied (log order), for Prune.
	aborted    map[protocol.TxnID]int64
	abortOrder []abortedAt
	// recent remembers recent decisions and their marks' log offsets,
	// oldest first in order.
	recent map[protocol.TxnID]decision
	order  []protocol.TxnID
	others []protocol.TxnDecided // newest last
}

// New returns an empty index.
func New() *Index {
	return &Index{
		open:    map[protocol.TxnID]*OpenTxn{},
		queues:  map[queueKey]map[protocol.TxnID]int64{},
		newest:  map[uint64]protocol.TxnID{},
		aborted: map[protocol.TxnID]int64{},
		recent:  map[protocol.TxnID]decision{},
	}
}

// Apply applies one mark, the record at log offset at. Marks must come in
// log order; a mark of a transaction already decided changes nothing.
func (x *Index) Apply(m *protocol.TxnMark, at int64) {
	id := m.ID
	if _, _, done := x.Decision(id); done {
		return
	}
	switch m.Kind {
	case protocol.TxnOpen:
		if n, ok := x.newest[id.Producer]; !ok || n.Before(id) {
			x.newest[id.Producer] = id
		}
		t := x.open[id]
		if t == nil {
			t = &OpenTxn{ID: id, Began: m.Time, At: at}
			x.open[id] = t
		}
		k := queueKey{m.Topic, m.Queue}
		q := x.queues[k]
		if q == nil {
			q = map[protocol.TxnID]int64{}
			x.queues[k] = q
		}
		if first, ok := q[id]; ok {
			q[id] = min(first, m.First)
			return
		}
		q[id] = m.First
		t.Queues = append(t.Queues, protocol.TxnQueue{Topic: m.Topic, Queue: m.Queue, First: m.First})
	case protocol.TxnPrepared:
		if t := x.open[id]; t != nil {
			t.Prepared = true
		}
	case protocol.TxnCommit, protocol.TxnAbort:
		committed := m.Kind == protocol.TxnCommit
		t := x.open[id]
		if t == nil {
			// Not open here: it wrote nothing here, or its decision was
			// forgotten (recentDecisions). Remembered, so that a late
			// record of it is refused, but it hides no record.
			x.remember(id, decision{committed, at})
			return
		}
		for _, q := range t.Queues {
			k := queueKey{q.Topic, q.Queue}
			delete(x.queues[k], id)
			if len(x.queues[k]) == 0 {
				delete(x.queues, k)
			}
		}
		delete(x.open, id)
		if !committed {
			x.aborted[id] = at
			x.abortOrder = append(x.abortOrder, abortedAt{id, at})
		}
		x.remember(id, decision{committed, at})
		if m.By != protocol.TxnByProducer {
			x.others = append(x.others, protocol.TxnDecided{ID: id.String(), Committed: committed, By: m.By, At: m.Time})
			if len(x.others) > recentByOthers {
				x.others = slices.Delete(x.others, 0, len(x.others)-recentByOthers)
			}
		}
	}
}

func (x *Index) remember(id protocol.TxnID, d decision) {
	x.recent[id] = d
	x.order = append(x.order, id)
	if len(x.order) > recentDecisions {
		old := x.order[0]
		x.order = x.order[1:]
		delete(x.recent, old)
	}
}

// Decision is id's decision and the log offset of its mark, if the index
// knows it.
func (x *Index) Decision(id protocol.TxnID) (committed bool, at int64, ok bool) {
	if d, ok := x.recent[id]; ok {
		return d.committed, d.at, true
	}
	if at, ok := x.aborted[id]; ok {
		return false, at, true
	}
	return false, 0, false
}

// State is where id is, as far as the index knows.
func (x *Index) State(id protocol.TxnID) State {
	if _, ok := x.open[id]; ok {
		return Open
	}
	if committed, _, ok := x.Decision(id); ok {
		if committed {
			return Committed
		}
		return Aborted
	}
	return Unknown
}

// Admit says whether a record of id may be stored: only while id is open
// or new, and no newer transaction of its producer was seen.
func (x *Index) Admit(id protocol.TxnID) protocol.Status {
	if _, _, done := x.Decision(id); done {
		return protocol.StatusTxnFenced
	}
	if n, ok := x.newest[id.Producer]; ok && id.Before(n) {
		return protocol.StatusTxnFenced
	}
	return protocol.StatusOK
}

// Holds reports whether open transaction id has an open mark for the queue.
func (x *Index) Holds(id protocol.TxnID, topic string, queue uint32) bool {
	_, ok := x.queues[queueKey{topic, queue}][id]
	return ok
}

// Count adds a stored record's size to open transaction id's counts.
func (x *Index) Count(id protocol.TxnID, bytes int64) {
	if t := x.open[id]; t != nil {
		t.Messages++
		t.Bytes += bytes
	}
}

// OpenTxn is open transaction id (nil: not open).
func (x *Index) OpenTxn(id protocol.TxnID) *OpenTxn { return x.open[id] }

// OpenOf counts the open transactions of a producer id.
func (x *Index) OpenOf(producer uint64) int {
	n := 0
	for id := range x.open {
		if id.Producer == producer {
			n++
		}
	}
	return n
}

// StableEnd is the end of the queue for a reader of committed messages:
// the lowest First of its open transactions, or end when it has none.
func (x *Index) StableEnd(topic string, queue uint32, end int64) int64 {
	for _, first := range x.queues[queueKey{topic, queue}] {
		end = min(end, first)
	}
	return end
}

// IsAborted reports whether id was aborted.
func (x *Index) IsAborted(id protocol.TxnID) bool {
	_, ok := x.aborted[id]
	return ok
}

// Prune forgets aborted transactions whose abort mark lies before log
// offset start (retention deleted it, and so every record of theirs).
func (x *Index) Prune(start int64) {
	n := 0
	for n < len(x.abortOrder) && x.abortOrder[n].at < start {
		delete(x.aborted, x.abortOrder[n].id)
		n++
	}
	if n > 0 {
		x.abortOrder = slices.Delete(x.abortOrder, 0, n)
	}
}

// List is the open transactions, oldest first (of producer only, when not
// 0), and the recent decisions not made by their producers, newest first.
func (x *Index) List(producer uint64) (open []protocol.TxnInfo, others []protocol.TxnDecided) {
	for _, t := range x.open {
		if producer != 0 && t.ID.Producer != producer {
			continue
		}
		open = append(open, protocol.TxnInfo{ID: t.ID.String(), Producer: t.ID.Producer, Epoch: t.ID.Epoch, Number: t.ID.Number,
			Began: t.Began, Messages: t.Messages, Queues: slices.Clone(t.Queues), Prepared: t.Prepared})
	}
	slices.SortFunc(open, func(a, b protocol.TxnInfo) int {
		return cmp.Or(cmp.Compare(a.Began, b.Began), compareIDs(a, b))
	})
	for i := len(x.others) - 1; i >= 0; i-- {
		others = append(others, x.others[i])
	}
	return open, others
}

func compareIDs(a, b protocol.TxnInfo) int {
	return cmp.Or(cmp.Compare(a.Producer, b.Producer), cmp.Compare(a.Epoch, b.Epoch), cmp.Compare(a.Number, b.Number))
}

// Opens is how many transactions are open, and the earliest Began of them
// (0 with none).
func (x *Index) Opens() (n int, oldest int64) {
	for _, t := range x.open {
		if n == 0 || t.Began < oldest {
			oldest = t.Began
		}
		n++
	}
	return n, oldest
}

// Oldest is the log offset of the oldest open transaction's first open
// mark (ok false: none is open): retention must keep it, or a rebuilt
// index would not know the transaction's records are undecided.
func (x *Index) Oldest() (at int64, ok bool) {
	for _, t := range x.open {
		if !ok || t.At < at {
			at, ok = t.At, true
		}
	}
	return at, ok
}

// Expired lists the open transactions that began at or before cutoff.
func (x *Index) Expired(cutoff int64) []protocol.TxnID {
	var ids []protocol.TxnID
	for id, t := range x.open {
		if t.Began <= cutoff {
			ids = append(ids, id)
		}
	}
	return ids
}
