package broker

import (
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/broker/txn"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

// Review of the transactions (commits 3ac3ab4..271018d): the read side of
// a broker that did not write the marks itself (a slave, a restarted
// master), over a real commit log.

// reviewTxns is the transactions of a broker that only reads log (no
// lease, no replication: a slave's).
func reviewTxns(log txnLog) *txns {
	t := &txns{log: log, lg: hclog.NewNullLogger(), idx: txn.New(),
		deciding: map[protocol.TxnID][]func(protocol.TxnEndReply, error){}}
	t.seen.Store(true)
	return t
}

// txnEntries are the commit log entries a master writes for the first
// record of transaction id in topic's queue 0: its open mark, then the
// record.
func txnEntries(id protocol.TxnID, topic string, first int64, body string) []storage.Entry {
	open := protocol.TxnMark{Kind: protocol.TxnOpen, ID: id, Topic: topic, Queue: 0, First: first}
	m := protocol.Message{ID: "m-" + body, Topic: topic, Queue: 0, Body: []byte(body),
		Producer: protocol.ProducerStamp{ID: id.Producer, Epoch: id.Epoch, Seq: 0}, Txn: id.Number}
	return []storage.Entry{markEntry(&open), {Topic: topic, Queue: 0, Payload: protocol.AppendMessage(nil, &m)}}
}

func decisionEntry(id protocol.TxnID, commit bool) storage.Entry {
	kind := protocol.TxnAbort
	if commit {
		kind = protocol.TxnCommit
	}
	return markEntry(&protocol.TxnMark{Kind: kind, ID: id, By: protocol.TxnByProducer})
}

// racingLog is a commit log to which the follower appends an open mark and
// its record right after the index's catch-up read TxnTopic's range, as a
// slave's follower can at any moment.
type racingLog struct {
	*storage.Log
	t      *testing.T
	append []storage.Entry // appended once, after the next QueueRange of TxnTopic
}

func (l *racingLog) QueueRange(topic string, queue uint32) (int64, int64) {
	first, next := l.Log.QueueRange(topic, queue)
	if topic == protocol.TxnTopic && l.append != nil {
		es := l.append
		l.append = nil
		if _, err := l.Log.Append(es, false); err != nil {
			l.t.Fatal(err)
		}
	}
	return first, next
}

// A slave's reader of committed messages must never read a record whose
// open mark the index has not applied: catchUpLocked reads TxnTopic's
// range, then the log's end, so a group of [open mark, record] the
// follower appends in between lies below followedTo while its mark is
// unapplied, and the record reads as committed. (Fails on 271018d.)
func TestReviewTxnCatchUpRaceShowsAnOpenRecord(t *testing.T) {
	l := openLog(t)
	id := protocol.TxnID{Producer: 7, Epoch: 1, Number: 1}
	// A first mark, so that the index has followed TxnTopic before.
	other := protocol.TxnID{Producer: 8, Epoch: 1, Number: 1}
	if _, err := l.Append(append(txnEntries(other, "other", 0, "o1"), decisionEntry(other, true)), false); err != nil {
		t.Fatal(err)
	}
	rl := &racingLog{Log: l, t: t}
	tx := reviewTxns(rl)
	ps := pullStore{Log: l, txns: tx, epoch: func() uint32 { return 1 }}

	rl.append = txnEntries(id, "tx", 0, "open record") // the follower appends while the index catches up
	rep := make(chanReplier, 1)
	serveRead(ps, rep, protocol.PullRequest{Topic: "tx", Queue: 0, Offset: 0, MaxBytes: 1 << 20}, false)
	a := <-rep
	if a.err != nil {
		t.Fatal(a.err)
	}
	pr, err := protocol.DecodePullResponse(a.body)
	if err != nil {
		t.Fatal(err)
	}
	if _, qnext := l.QueueRange("tx", 0); qnext != 1 {
		t.Fatalf("the follower's append is not in: next %d", qnext)
	}
	for _, m := range pr.Messages {
		t.Errorf("a committed reader read %q at queue offset %d, a record of open transaction %s (its open mark unapplied, the read limit %d past it)",
			m.Message.Body, m.QueueOffset, id, tx.followedTo)
	}
}

// A slave's reader of committed messages stops at the slave's readable
// end (the sync set's acknowledgement) so that it never reads what a
// failover to another member would not have: a commit mark past that end
// must not make the transaction's records, below it, readable, since the
// member promoted may lack the mark and abort the transaction at its
// timeout. The index applies every mark of the slave's log whatever the
// readable end. (Fails on 271018d.)
func TestReviewTxnSlaveAppliesCommitPastReadableEnd(t *testing.T) {
	l := openLog(t)
	id := protocol.TxnID{Producer: 7, Epoch: 1, Number: 1}
	pos, err := l.Append(txnEntries(id, "tx", 0, "r1"), false)
	if err != nil {
		t.Fatal(err)
	}
	readable := pos[1].End // the sync set holds the open mark and the record
	if _, err := l.Append([]storage.Entry{decisionEntry(id, true)}, false); err != nil {
		t.Fatal(err)
	}
	tx := reviewTxns(l)
	ps := pullStore{Log: l, txns: tx, epoch: func() uint32 { return 1 }, readable: func() int64 { return readable }}
	if next := readableNext(ps, "tx", 0, false); next != 0 {
		t.Fatalf("a slave's committed reader may read up to queue offset %d: the record of %s, whose commit mark (past the readable end %d) the sync set does not hold",
			next, id, readable)
	}
}

// A HIGH decision is answered only once the sync set holds its mark. The
// first TXN_END wrote the commit mark, and the sync set did not confirm it
// in time (the producer got SLAVE_SYNC_TIMEOUT, and its Commit says the
// transaction stays open: call Commit again). The repeated HIGH TXN_END
// finds the transaction committed in the index and is answered OK at once,
// with nothing waiting for the sync set: a failover to a member without
// the mark then aborts what the producer was told is committed. (Fails on
// 271018d; a fix awaits the mark's end on the replication, which this
// test's zero replication does not model.)
func TestReviewTxnRepeatedHighCommitSkipsTheSyncSet(t *testing.T) {
	l := openLog(t)
	id := protocol.TxnID{Producer: 7, Epoch: 1, Number: 1}
	entries := append(txnEntries(id, "tx", 0, "r1"), decisionEntry(id, true)) // the first TXN_END's mark, unconfirmed
	if _, err := l.Append(entries, false); err != nil {
		t.Fatal(err)
	}
	lease := &writeLease{clock: clockwork.NewRealClock(), session: time.Hour}
	lease.renew(time.Now(), true, true, 1, time.Hour)
	lease.ready.Store(1)
	if !lease.valid() {
		t.Fatal("the test's lease does not hold")
	}
	tx := reviewTxns(l)
	repl := modelRepl(l, clockwork.NewFakeClock())
	tx.lease, tx.repl = lease, func() *replication { return repl }
	answered := make(chan error, 1)
	tx.end(id, true, protocol.TxnByProducer, nil, func(rep protocol.TxnEndReply, err error) {
		if err == nil && !rep.Committed {
			err = errors.New("answered not committed")
		}
		answered <- err
	})
	select {
	case err := <-answered:
		if err == nil {
			t.Fatal("a repeated HIGH commit is answered OK though nothing confirmed that the sync set holds its mark")
		}
	default:
	}
}

// BenchmarkReviewPullWithTxns is the cost of one PULL of 100 ordinary
// records, without the transactions and once a transaction mark was seen
// (the index caught up, one mutex taken per record for Aborted).
func BenchmarkReviewPullWithTxns(b *testing.B) {
	l, err := storage.Open(storage.Config{Dir: b.TempDir(), SegmentSize: 1 << 24, Logger: hclog.NewNullLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	var es []storage.Entry
	for i := range 100 {
		m := protocol.Message{ID: "m", Topic: "q", Body: make([]byte, 100+i%2)}
		es = append(es, storage.Entry{Topic: "q", Payload: protocol.AppendMessage(nil, &m)})
	}
	id := protocol.TxnID{Producer: 1, Epoch: 1, Number: 1}
	es = append(es, append(txnEntries(id, "other", 0, "x"), decisionEntry(id, true))...)
	if _, err := l.Append(es, false); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		txns *txns
	}{{"none", nil}, {"seen", reviewTxns(l)}} {
		ps := pullStore{Log: l, txns: c.txns, epoch: func() uint32 { return 1 }}
		b.Run(c.name, func(b *testing.B) {
			rep := make(chanReplier, 1)
			for range b.N {
				serveRead(ps, rep, protocol.PullRequest{Topic: "q", MaxBytes: 1 << 20}, false)
				<-rep
			}
		})
	}
}

// The same race on the fast path of a broker that has seen no mark yet (a
// slave copying its group's first transaction): readLimit finds TxnTopic
// empty and sets no limit, and the follower's [open mark, record] lands
// before the read, which takes the record. (Fails on 271018d.)
func TestReviewTxnFirstMarkRaceShowsAnOpenRecord(t *testing.T) {
	l := openLog(t)
	if _, err := l.Append([]storage.Entry{{Topic: "tx", Payload: protocol.AppendMessage(nil, &protocol.Message{ID: "p", Topic: "tx", Body: []byte("plain")})}}, false); err != nil {
		t.Fatal(err)
	}
	rl := &racingLog{Log: l, t: t}
	tx := reviewTxns(rl)
	tx.seen.Store(false)
	ps := pullStore{Log: l, txns: tx, epoch: func() uint32 { return 1 }}
	id := protocol.TxnID{Producer: 7, Epoch: 1, Number: 1}
	rl.append = txnEntries(id, "tx", 1, "open record")
	rep := make(chanReplier, 1)
	serveRead(ps, rep, protocol.PullRequest{Topic: "tx", Queue: 0, Offset: 1, MaxBytes: 1 << 20}, false)
	a := <-rep
	if a.err != nil {
		t.Fatal(a.err)
	}
	pr, err := protocol.DecodePullResponse(a.body)
	if err != nil {
		t.Fatal(err)
	}
	if _, qnext := l.QueueRange("tx", 0); qnext != 2 {
		t.Fatalf("the follower's append is not in: next %d", qnext)
	}
	for _, m := range pr.Messages {
		t.Errorf("a committed reader read %q at queue offset %d, a record of open transaction %s", m.Message.Body, m.QueueOffset, id)
	}
}
