package broker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/broker/txn"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

// txnLog is the part of the commit log the transactions read and write.
type txnLog interface {
	appender
	QueueRange(topic string, queue uint32) (first, next int64)
	Read(topic string, queue uint32, offset int64, maxBytes int) ([]storage.StoredEntry, error)
	EndOffset() int64
	StartOffset() int64
}

// txns are the broker's transactions (decision `transactions`): the index
// of the log's transaction marks (package txn), brought up to the log
// before every use, and, on the master, the marks it writes.
//
// Why a reader never sees a record of an undecided or aborted transaction:
// the master applies a transaction's open mark for a queue to the index
// before it hands the mark and the record behind it to the commit log, so
// from the moment the record is readable the queue's stable end is at or
// below it; it applies the decision only once the decision mark is written
// (behind every record of the transaction: a record admitted later would be
// appended later, and none is admitted once a decision is under way). A
// reader of another broker (a slave, or this one after a restart) stops at
// the log offset up to which the index applied the marks (followedTo), so
// it cannot read a record whose open mark the index has not seen.
//
// Every method takes mu; the index is brought up to the log (catchUp)
// under it. Marks and the records of transactions are handed to the commit
// log under wmu, taken before mu and held from their admission to their
// append, so that the order in which they are admitted is their order in
// the log; mu is let go before the append, whose completion (on the commit
// log's writer: AppendQueued) takes it.
type txns struct {
	log   txnLog
	lease *writeLease
	repl  func() *replication
	// readable is the slave's readable end (roles; -1: none): marks past
	// it are not applied (nil: no limit).
	readable func() int64
	// registry decides a transaction past its timeout, and group is this
	// broker's group (nil: the master aborts it alone).
	registry txnRegistry
	group    string
	pulls    *longPoll
	stats    *Stats
	clock    clockwork.Clock
	lg       hclog.Logger

	timeout                          time.Duration
	maxMessages, maxBytes            int64
	maxOpenPerProducer, maxOpenTotal int

	// seen is set once a transaction mark or record was met: until then
	// reads take no lock.
	seen atomic.Bool

	wmu sync.Mutex // the order of admissions and appends
	mu  sync.Mutex
	idx *txn.Index
	// followed is the queue offset of TxnTopic's next mark to apply from
	// the log, followedTo the log offset before which every mark is
	// applied.
	followed, followedTo int64
	// deciding holds the transactions whose decision mark is being
	// written, with who waits for its answer.
	deciding map[protocol.TxnID][]func(protocol.TxnEndReply, error)
	// unconfirmed holds, on the master, the committed transactions whose
	// mark the sync set does not hold yet: readers see them as open (a
	// failover to a member without the mark would reopen them).
	unconfirmed map[protocol.TxnID]unconfirmedTxn
	cut         bool // the log was cut back: rebuild the index from the log
}

// txnRegistry is the registry's side of transactions (metaserver/client).
type txnRegistry interface {
	DecideTxn(ctx context.Context, req api.TxnDecideRequest) (api.TxnDecision, error)
	TxnDone(ctx context.Context, req api.TxnDoneRequest) error
}

// unconfirmedTxn is a decision whose mark at log offset at the sync set
// does not hold yet, and the queues its transaction held.
type unconfirmedTxn struct {
	at     int64
	queues []protocol.TxnQueue
}

// newTxns makes the transactions of the broker cfg configures; the long
// poll it wakes is set before the broker starts.
func newTxns(cfg Config, log txnLog, ls *writeLease, repl func() *replication, stats *Stats, lg hclog.Logger) *txns {
	t := &txns{log: log, lease: ls, repl: repl, stats: stats, clock: cfg.Clock, lg: lg, group: cfg.Group,
		timeout: cfg.TxnTimeout, maxMessages: cfg.TxnMaxMessages, maxBytes: cfg.TxnMaxBytes,
		maxOpenPerProducer: cfg.TxnMaxOpenPerProducer, maxOpenTotal: cfg.TxnMaxOpen,
		idx: txn.New(), deciding: map[protocol.TxnID][]func(protocol.TxnEndReply, error){}, unconfirmed: map[protocol.TxnID]unconfirmedTxn{}}
	if first, next := log.QueueRange(protocol.TxnTopic, 0); next > 0 {
		t.followed = first
		t.seen.Store(true)
	}
	return t
}

// truncated is told that the log was cut back: the index is rebuilt
// before its next use.
func (t *txns) truncated() {
	t.mu.Lock()
	t.cut = true
	t.mu.Unlock()
}

// catchUpBytes is how much of TxnTopic one read takes.
const catchUpBytes = 1 << 20

// catchUpLocked applies the marks the log holds past followed, up to the
// log offset readable (-1: none): a slave applies no mark past what the
// sync set holds (a decision there may be lost to a failover; and reads
// stop there anyway). mu is held.
func (t *txns) catchUpLocked(readable int64) error {
	// The end is read before TxnTopic's range: the log publishes its end
	// after its queues, so every mark before end is in the range read
	// next, and a record before end has its open mark before it.
	end := t.log.EndOffset()
	if readable >= 0 {
		end = min(end, readable)
	}
	first, next := t.log.QueueRange(protocol.TxnTopic, 0)
	if t.cut || t.followed > next || t.followed < first {
		// Cut back under the index, or retention deleted marks it never
		// read: start again from the log.
		t.idx, t.followed, t.followedTo, t.cut = txn.New(), first, 0, false
		clear(t.unconfirmed)
	}
	for t.followed < next {
		es, err := t.log.Read(protocol.TxnTopic, 0, t.followed, catchUpBytes)
		if err != nil {
			return fmt.Errorf("read the transaction marks: %w", err)
		}
		if len(es) == 0 {
			break
		}
		for _, e := range es {
			if e.LogOffset >= end {
				t.followedTo = max(t.followedTo, end)
				return nil
			}
			m, err := protocol.DecodeMessage(e.Payload)
			var mark protocol.TxnMark
			if err == nil {
				mark, err = protocol.DecodeTxnMark(m.Body)
			}
			if err != nil {
				return fmt.Errorf("transaction mark at log offset %d: %w", e.LogOffset, err)
			}
			t.noteUnconfirmedLocked(&mark, e.LogOffset)
			t.idx.Apply(&mark, e.LogOffset)
			t.followed = e.QueueOffset + 1
			t.seen.Store(true)
		}
	}
	t.followedTo = max(t.followedTo, end)
	return nil
}

// master is the running replication while this broker is the master (nil:
// it is not).
func (t *txns) master() *replication {
	if t.repl == nil {
		return nil
	}
	return t.repl()
}

// readableEnd is how far a slave may apply marks: its readable end (-1:
// none, and on the master).
func (t *txns) readableEnd() int64 {
	if t.readable == nil || t.master() != nil {
		return -1
	}
	return t.readable()
}

// readLimit brings the index up to the log (to readable, a slave's
// readable end; -1: none) and returns the log offset reads stop at so
// that no record is read whose open mark the index has not applied: -1
// (none) on the master, whose open marks are applied before their records
// are written.
func (t *txns) readLimit(readable int64) int64 {
	if !t.seen.Load() {
		end := t.log.EndOffset()
		if _, next := t.log.QueueRange(protocol.TxnTopic, 0); next == 0 {
			if t.master() != nil {
				return -1
			}
			return end
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.catchUpLocked(readable); err != nil {
		t.lg.Warn("cannot follow the transaction marks; reads stop where they were followed", "error", err)
	}
	if t.master() != nil {
		return -1
	}
	return t.followedTo
}

// stableEnd is where a reader of committed messages stops in a queue whose
// next offset is next: at the first record of an open transaction, or of
// one whose decision the sync set does not hold yet.
func (t *txns) stableEnd(topic string, queue uint32, next int64) int64 {
	if !t.seen.Load() {
		return next
	}
	t.mu.Lock()
	end := t.idx.StableEnd(topic, queue, next)
	woken := t.pruneUnconfirmedLocked()
	for _, u := range t.unconfirmed {
		for _, q := range u.queues {
			if q.Topic == topic && q.Queue == queue {
				end = min(end, q.First)
			}
		}
	}
	t.mu.Unlock()
	if len(woken) > 0 {
		t.pulls.wakeQueues(woken)
	}
	return end
}

// pruneUnconfirmedLocked forgets the unconfirmed decisions the sync set
// holds now (all of them on a broker no longer master) and returns their
// queues, to wake their readers. mu is held.
func (t *txns) pruneUnconfirmedLocked() []protocol.TxnQueue {
	if len(t.unconfirmed) == 0 {
		return nil
	}
	held := int64(math.MaxInt64) // a slave's reads stop at its readable end instead
	if rep := t.master(); rep != nil {
		held = rep.held()
	}
	var woken []protocol.TxnQueue
	for id, u := range t.unconfirmed {
		if held > u.at {
			delete(t.unconfirmed, id)
			woken = append(woken, u.queues...)
		}
	}
	return woken
}

// noteUnconfirmedLocked, on the master, keeps a commit mark at log
// offset at that the sync set does not hold yet among the unconfirmed,
// with its transaction's queues (before the mark is applied). mu is held.
func (t *txns) noteUnconfirmedLocked(mark *protocol.TxnMark, at int64) {
	if mark.Kind != protocol.TxnCommit {
		// An abort shows at once: holding it back would stop the queue's
		// readers for as long as the set is below its minimum.
		return
	}
	rep := t.master()
	open := t.idx.OpenTxn(mark.ID)
	if rep == nil || open == nil || rep.held() > at {
		return
	}
	if t.unconfirmed == nil {
		t.unconfirmed = map[protocol.TxnID]unconfirmedTxn{}
	}
	t.unconfirmed[mark.ID] = unconfirmedTxn{at: at, queues: slices.Clone(open.Queues)}
}

// confirmed lets readers see decision id once the sync set holds it.
func (t *txns) confirmed(id protocol.TxnID) {
	t.mu.Lock()
	u, ok := t.unconfirmed[id]
	delete(t.unconfirmed, id)
	t.mu.Unlock()
	if ok {
		t.pulls.wakeQueues(u.queues)
	}
}

// aborted reports whether the encoded message payload belongs to an
// aborted transaction.
func (t *txns) aborted(payload []byte) bool {
	if !t.seen.Load() {
		return false
	}
	id, ok := protocol.PeekTxn(payload)
	if !ok || id.IsZero() {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.idx.IsAborted(id)
}

// hasTxn reports whether a message of good is in a transaction.
func hasTxn(msgs []protocol.Message, good []int) bool {
	for _, i := range good {
		if msgs[i].Txn != 0 {
			return true
		}
	}
	return false
}

// txnLoad is what a batch adds to a transaction's counts.
type txnLoad struct{ messages, bytes int64 }

// batchTxns is what the messages of one batch admitted so far add to the
// index's view: each transaction's counts, and each producer's newest
// transaction.
type batchTxns struct {
	load   map[protocol.TxnID]txnLoad
	newest map[uint64]protocol.TxnID
}

// admitLocked checks message m of a transaction against its state and the
// limits, with what the batch admitted before it (b, updated). mu is held.
func (t *txns) admitLocked(m *protocol.Message, size int, b *batchTxns) protocol.Status {
	id := protocol.TxnOf(m)
	if _, busy := t.deciding[id]; busy {
		return protocol.StatusTxnFenced
	}
	if st := t.idx.Admit(id); st != protocol.StatusOK {
		return st
	}
	if n, ok := b.newest[id.Producer]; ok && id.Before(n) {
		return protocol.StatusTxnFenced // a newer one of its producer is earlier in the batch
	}
	l, inBatch := b.load[id]
	if open := t.idx.OpenTxn(id); open != nil {
		l.messages += open.Messages
		l.bytes += open.Bytes
	} else if !inBatch {
		fresh, freshOfProducer := 0, 0 // transactions the batch begins
		for bid := range b.load {
			if t.idx.OpenTxn(bid) == nil {
				fresh++
				if bid.Producer == id.Producer {
					freshOfProducer++
				}
			}
		}
		if n, _ := t.idx.Opens(); n+fresh >= t.maxOpenTotal || t.idx.OpenOf(id.Producer)+freshOfProducer >= t.maxOpenPerProducer {
			t.stats.TxnRefused.Add(1)
			return protocol.StatusTxnLimit
		}
	}
	if l.messages+1 > t.maxMessages || l.bytes+int64(size) > t.maxBytes {
		t.stats.TxnRefused.Add(1)
		return protocol.StatusTxnLimit
	}
	add := b.load[id]
	b.load[id] = txnLoad{add.messages + 1, add.bytes + int64(size)}
	if n, ok := b.newest[id.Producer]; !ok || n.Before(id) {
		b.newest[id.Producer] = id
	}
	return protocol.StatusOK
}

// admitBatchLocked checks the good messages of a batch that are in
// transactions (admitLocked) and returns the good ones left; a refused one
// is answered. mu is held.
func (t *txns) admitBatchLocked(msgs []protocol.Message, raws [][]byte, good []int, sb *sendBatch, checks *batchCheck) []int {
	caught := t.catchUpLocked(t.readableEnd())
	b := &batchTxns{load: map[protocol.TxnID]txnLoad{}, newest: map[uint64]protocol.TxnID{}}
	kept := good[:0]
	for _, i := range good {
		m := &msgs[i]
		if m.Txn == 0 {
			kept = append(kept, i)
			continue
		}
		st := protocol.StatusOK
		if caught != nil {
			st = protocol.StatusStoreError
		} else {
			st = t.admitLocked(m, len(raws[i]), b)
		}
		if st != protocol.StatusOK {
			checks.anyRefused = true
			sb.complete(i, protocol.SendResult{Status: st})
			continue
		}
		kept = append(kept, i)
	}
	return kept
}

// openLocked returns the entry of the open mark that must precede m's
// record in the log, applied to the index already (ok false: the
// transaction holds the queue already). mu is held.
func (t *txns) openLocked(m *protocol.Message, size int) (storage.Entry, bool) {
	id := protocol.TxnOf(m)
	topic := storedTopic(m)
	defer t.idx.Count(id, int64(size))
	if t.idx.Holds(id, topic, m.Queue) {
		return storage.Entry{}, false
	}
	began := t.clock.Now().UnixMilli()
	if open := t.idx.OpenTxn(id); open != nil {
		began = open.Began
	}
	_, first := t.log.QueueRange(topic, m.Queue)
	mark := protocol.TxnMark{Kind: protocol.TxnOpen, ID: id, Time: began, Topic: topic, Queue: m.Queue, First: first}
	t.idx.Apply(&mark, t.log.EndOffset())
	t.seen.Store(true)
	return markEntry(&mark), true
}

// markEntry is the commit log entry of a transaction mark.
func markEntry(mark *protocol.TxnMark) storage.Entry {
	msg := protocol.TxnMarkMessage(mark)
	return storage.Entry{Topic: protocol.TxnTopic, Queue: 0, Payload: protocol.AppendMessage(nil, &msg)}
}

// end decides transaction id (commit or abort) as the writable master and
// calls answer once with the decision in force: the one asked for, or the
// one made before. A commit is answered once the sync set holds its mark
// (and so every record of the transaction, before it in the log), like a
// HIGH message: refused NOT_ENOUGH_REPLICAS, before anything is written,
// while the set is below the group's minimum. A commit with seqs is written
// only if the log holds each queue's last sequence (storage.Requirement).
// An abort is written whatever the set, and answered once the set holds it
// or its wait ran out: one lost in a failover is made again at the timeout.
func (t *txns) end(id protocol.TxnID, commit bool, by string, seqs []protocol.TxnSeq, answer func(protocol.TxnEndReply, error)) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	t.mu.Lock()
	rep, done, err := t.endLocked(id, commit)
	if err != nil || done != nil {
		t.mu.Unlock()
		if err != nil {
			answer(protocol.TxnEndReply{}, err)
		} else {
			t.confirm(rep, done.Committed, done.at, func(st error) { answer(done.TxnEndReply, st) })
		}
		return
	}
	if waiters, busy := t.deciding[id]; busy {
		t.deciding[id] = append(waiters, answer)
		t.mu.Unlock()
		return
	}
	var queues []protocol.TxnQueue
	if open := t.idx.OpenTxn(id); open != nil {
		queues = open.Queues
	}
	kind := protocol.TxnAbort
	if commit {
		kind = protocol.TxnCommit
	}
	mark := protocol.TxnMark{Kind: kind, ID: id, Time: t.clock.Now().UnixMilli(), By: by}
	t.deciding[id] = []func(protocol.TxnEndReply, error){answer}
	t.mu.Unlock()
	reply := protocol.TxnEndReply{Committed: commit, By: by, Queues: len(queues)}
	e := markEntry(&mark)
	if commit {
		e.Requires = requirements(id, seqs)
	}
	t.log.AppendQueued([]storage.Entry{e}, false, func(pos []storage.Position, err error) {
		if err == nil && pos[0].Err != nil {
			err = pos[0].Err
		}
		t.decided(id, &mark, queues, pos, err, rep, reply)
	})
}

// prepare answers once the log holds seqs (the last record of transaction
// id its producer was told was stored in each queue) and the sync set
// holds them: a prepared mark, written with the requirements, decides
// nothing; its confirmation covers every record before it. A transaction
// decided before is answered its decision (Prepared false).
func (t *txns) prepare(id protocol.TxnID, seqs []protocol.TxnSeq, answer func(protocol.TxnEndReply, error)) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	t.mu.Lock()
	rep, done, err := t.endLocked(id, true)
	if err == nil && done == nil {
		if _, busy := t.deciding[id]; busy {
			err = &protocol.Error{Status: protocol.StatusTxnFenced, Message: fmt.Sprintf("transaction %s is being decided", id)}
		}
	}
	n := 0
	if open := t.idx.OpenTxn(id); open != nil {
		n = len(open.Queues)
	}
	t.mu.Unlock()
	switch {
	case err != nil:
		answer(protocol.TxnEndReply{}, err)
		return
	case done != nil:
		answer(done.TxnEndReply, nil)
		return
	}
	mark := protocol.TxnMark{Kind: protocol.TxnPrepared, ID: id, Time: t.clock.Now().UnixMilli(), By: protocol.TxnByProducer}
	e := markEntry(&mark)
	e.Requires = requirements(id, seqs)
	t.log.AppendQueued([]storage.Entry{e}, false, func(pos []storage.Position, err error) {
		if err == nil && pos[0].Err != nil {
			err = pos[0].Err
		}
		if err != nil {
			answer(protocol.TxnEndReply{}, markError(id, err))
			return
		}
		t.mu.Lock()
		t.idx.Apply(&mark, pos[0].LogOffset)
		t.mu.Unlock()
		rep.notify()
		t.confirm(rep, true, pos[0].LogOffset, func(e error) { answer(protocol.TxnEndReply{Prepared: true, Queues: n}, e) })
	})
}

// requirements are the storage requirements of a commit's or a prepare's
// seqs.
func requirements(id protocol.TxnID, seqs []protocol.TxnSeq) []storage.Requirement {
	var reqs []storage.Requirement
	for _, q := range seqs {
		reqs = append(reqs, storage.Requirement{Topic: q.Topic, Queue: q.Queue, Producer: id.Producer, Epoch: id.Epoch, Seq: q.Seq})
	}
	return reqs
}

// markError is the answer to a decision or prepare whose mark could not be
// written.
func markError(id protocol.TxnID, err error) error {
	if errors.Is(err, storage.ErrMissingRecords) {
		return &protocol.Error{Status: protocol.StatusTxnIncomplete,
			Message: fmt.Sprintf("transaction %s: messages its producer was told were stored are not in this group's log (a failover lost them): abort it", id)}
	}
	return &protocol.Error{Status: statusOfStoreError(err), Message: "the transaction's mark: " + err.Error()}
}

// doneTxn is the answer to a TXN_END of a transaction decided before (or
// with nothing here), and where its mark is.
type doneTxn struct {
	protocol.TxnEndReply
	at int64 // -1: no mark to wait for
}

// endLocked checks that this broker may decide id now, and answers what
// needs no new mark (done): the decision made before. Else id is open,
// being decided, or unknown here. mu is held.
func (t *txns) endLocked(id protocol.TxnID, commit bool) (rep *replication, done *doneTxn, err error) {
	if err := t.catchUpLocked(t.readableEnd()); err != nil {
		return nil, nil, &protocol.Error{Status: protocol.StatusStoreError, Message: err.Error()}
	}
	rep = t.master()
	switch {
	case rep == nil:
		return nil, nil, &protocol.Error{Status: protocol.StatusNotMaster, Message: "this broker is not its group's master"}
	case !t.lease.valid():
		return nil, nil, &protocol.Error{Status: protocol.StatusReadOnly, Message: "this broker's write lease does not hold"}
	}
	if _, busy := t.deciding[id]; busy {
		return rep, nil, nil
	}
	if committed, at, ok := t.idx.Decision(id); ok {
		return rep, &doneTxn{protocol.TxnEndReply{Committed: committed, Queues: -1}, at}, nil
	}
	// Open, or with nothing here: a mark is written either way, so that a
	// record of it still on its way is refused (TXN_FENCED), not taken as
	// the beginning of an open transaction.
	if commit && rep.refusesHigh() {
		return nil, nil, &protocol.Error{Status: protocol.StatusNotEnoughReplicas,
			Message: "the group's sync set is below its minimum: a commit waits for it (HIGH)"}
	}
	return rep, nil, nil
}

// confirm calls answer once the sync set holds the mark at log offset at
// (at < 0: at once): with the refusal, for a commit the set did not take
// in time; an abort is answered either way.
func (t *txns) confirm(rep *replication, committed bool, at int64, answer func(error)) {
	if at < 0 || rep == nil {
		answer(nil)
		return
	}
	rep.await(at+1, func(st protocol.Status) {
		if st != protocol.StatusOK && committed {
			answer(&protocol.Error{Status: st, Message: "the commit mark is not confirmed by the group's sync set yet"})
			return
		}
		answer(nil)
	})
}

// decided completes a decision's append: it applies the mark, wakes the
// readers of the transaction's queues and answers who waits (confirm).
func (t *txns) decided(id protocol.TxnID, mark *protocol.TxnMark, queues []protocol.TxnQueue, pos []storage.Position, err error,
	rep *replication, reply protocol.TxnEndReply) {
	t.mu.Lock()
	waiters := t.deciding[id]
	delete(t.deciding, id)
	if err == nil {
		t.noteUnconfirmedLocked(mark, pos[0].LogOffset)
		t.idx.Apply(mark, pos[0].LogOffset)
	}
	t.mu.Unlock()
	fail := func(e error) {
		for _, w := range waiters {
			w(protocol.TxnEndReply{}, e)
		}
	}
	if err != nil {
		if !errors.Is(err, storage.ErrMissingRecords) {
			t.lg.Warn("cannot write a transaction's decision", "txn", id.String(), "error", err)
		}
		fail(markError(id, err))
		return
	}
	if mark.Kind == protocol.TxnCommit {
		t.stats.TxnCommits.Add(1)
	} else {
		t.stats.TxnAborts.Add(1)
		if mark.By == protocol.TxnByTimeout {
			t.stats.TxnTimeouts.Add(1)
		}
	}
	t.pulls.wakeQueues(queues)
	rep.notify() // the slaves' parked fetches take the mark at once
	t.confirm(rep, mark.Kind == protocol.TxnCommit, pos[0].LogOffset, func(e error) {
		if e != nil {
			fail(e) // readers wait until the sync set holds the mark (stableEnd)
			return
		}
		t.confirmed(id)
		for _, w := range waiters {
			w(reply, nil)
		}
	})
}

// list is the open transactions (of producer, when not 0) and the recent
// decisions not made by their producers.
func (t *txns) list(producer uint64) ([]protocol.TxnInfo, []protocol.TxnDecided, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.catchUpLocked(t.readableEnd()); err != nil {
		return nil, nil, err
	}
	open, others := t.idx.List(producer)
	return open, others, nil
}

// state is where transaction id is, with the log's marks applied (a
// slave's up to its readable end).
func (t *txns) state(id protocol.TxnID) txn.State {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.catchUpLocked(t.readableEnd()); err != nil {
		t.lg.Warn("cannot follow the transaction marks", "error", err)
	}
	if _, busy := t.deciding[id]; busy {
		return txn.Open
	}
	return t.idx.State(id)
}

// queuesOf is the queues open transaction id holds (nil: not open here).
func (t *txns) queuesOf(id protocol.TxnID) []protocol.TxnQueue {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.catchUpLocked(t.readableEnd()); err != nil {
		return nil
	}
	if open := t.idx.OpenTxn(id); open != nil {
		return append([]protocol.TxnQueue(nil), open.Queues...)
	}
	return nil
}

// retainFrom is where retention may delete the log before, at most
// before: not past the first open mark of an open transaction (a rebuilt
// index would take its records for decided ones).
func (t *txns) retainFrom(before int64) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.catchUpLocked(t.readableEnd()); err != nil {
		t.lg.Warn("cannot follow the transaction marks; retention waits", "error", err)
		return min(before, t.followedTo)
	}
	if at, ok := t.idx.Oldest(); ok {
		return min(before, at)
	}
	return before
}

// txnSweep is how often the master looks for transactions past their
// timeout.
const txnSweep = time.Second

// run decides, as the writable master, the transactions open longer than
// the timeout (expire), and forgets aborted ones retention deleted, until
// ctx ends.
func (t *txns) run(ctx context.Context) {
	tick := t.clock.NewTicker(txnSweep)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.Chan():
		}
		t.sweep(ctx)
	}
}

// sweep is one turn of run.
func (t *txns) sweep(ctx context.Context) {
	if !t.seen.Load() {
		return
	}
	t.mu.Lock()
	err := t.catchUpLocked(t.readableEnd())
	t.idx.Prune(t.log.StartOffset())
	if woken := t.pruneUnconfirmedLocked(); len(woken) > 0 {
		defer t.pulls.wakeQueues(woken)
	}
	n, oldest := t.idx.Opens()
	t.stats.TxnOpen.Store(int64(n))
	t.stats.TxnOldest.Store(oldest)
	var expired []protocol.TxnID
	if err == nil && t.master() != nil && t.lease.valid() {
		for _, id := range t.idx.Expired(t.clock.Now().Add(-t.timeout).UnixMilli()) {
			if _, busy := t.deciding[id]; !busy {
				expired = append(expired, id)
			}
		}
	}
	t.mu.Unlock()
	for _, id := range expired {
		if ctx.Err() != nil {
			return
		}
		t.expire(ctx, id)
	}
}

// registryWait bounds one call of the sweep to the registry, and its wait
// for the decision's mark.
const registryWait = 5 * time.Second

// expire decides transaction id, open past the timeout: the registry
// decides abort unless a decision was made (a transaction on several
// groups that its producer committed there is committed here), then the
// mark is written and the registry told this group applied it. A failure
// leaves it open for the next sweep.
func (t *txns) expire(ctx context.Context, id protocol.TxnID) {
	commit, by := false, protocol.TxnByTimeout
	if t.registry != nil {
		rctx, cancel := context.WithTimeout(ctx, registryWait)
		d, err := t.registry.DecideTxn(rctx, api.TxnDecideRequest{Producer: id.Producer, Epoch: id.Epoch, Number: id.Number,
			By: protocol.TxnByTimeout, Groups: []string{t.group}})
		cancel()
		if err != nil {
			t.lg.Warn("cannot ask the registry to abort a transaction past its timeout; trying again", "txn", id.String(), "error", err)
			return
		}
		commit, by = d.Committed, d.By
	}
	if !commit {
		t.lg.Info("aborting a transaction open past its timeout", "txn", id.String(), "timeout", t.timeout)
	}
	answered := make(chan error, 1)
	t.end(id, commit, by, nil, func(_ protocol.TxnEndReply, err error) { answered <- err })
	var err error
	select {
	case err = <-answered:
	case <-ctx.Done():
		return
	}
	if err != nil {
		t.lg.Warn("cannot decide a transaction past its timeout; trying again", "txn", id.String(), "error", err)
		return
	}
	if t.registry != nil {
		rctx, cancel := context.WithTimeout(ctx, registryWait)
		if err := t.registry.TxnDone(rctx, api.TxnDoneRequest{Producer: id.Producer, Epoch: id.Epoch, Number: id.Number, Groups: []string{t.group}}); err != nil {
			t.lg.Warn("cannot tell the registry a transaction's decision is applied (it expires after 7 days)", "txn", id.String(), "error", err)
		}
		cancel()
	}
}
