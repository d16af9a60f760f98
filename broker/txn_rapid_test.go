package broker

import (
	"fmt"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"
	"pgregory.net/rapid"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

// txnModel is what the log holds, as the test wrote it: per queue its
// records in offset order (the transaction each belongs to, 0 for none),
// and each transaction's state.
type txnModel struct {
	queues [2][]txnRec
	state  map[uint64]string // "open", "committed", "aborted"
	opened map[[2]uint64]bool
}

type txnRec struct {
	txn  uint64
	body string
}

// want is what a reader reads of queue q: a reader of committed messages
// up to the first record of an open transaction, skipping aborted ones;
// a reader of uncommitted ones all but the aborted.
func (m *txnModel) want(q int, uncommitted bool) []string {
	var out []string
	for _, r := range m.queues[q] {
		st := m.state[r.txn]
		if r.txn != 0 && st == "open" && !uncommitted {
			break
		}
		if r.txn == 0 || st != "aborted" {
			out = append(out, r.body)
		}
	}
	return out
}

// The read-committed rules, over any sequence of plain messages,
// transactions' messages in two queues, commits, aborts and restarts (the
// index rebuilt from the log, as a slave and a restarted broker build
// it): a reader of committed messages reads exactly the plain messages and
// those of committed transactions, in queue order, up to the first message
// of the oldest open transaction; never one of an aborted or open one; its
// offsets are the queue's (the marks take none), so it reads each message
// once and its last next offset is where it stopped. A reader of
// uncommitted messages reads all but the aborted.
func TestTxnReadRulesModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		dir := t.TempDir()
		open := func() (*storage.Log, *txns, pullStore) {
			l, err := storage.Open(storage.Config{Dir: dir, SegmentSize: 1 << 20, Logger: hclog.NewNullLogger(), Fingerprint: protocol.EncodedTagFingerprint})
			if err != nil {
				rt.Fatal(err)
			}
			cfg := Config{Clock: clockwork.NewFakeClock()}.withDefaults()
			tx := newTxns(cfg, l, &writeLease{}, func() *replication { return nil }, &Stats{}, hclog.NewNullLogger())
			return l, tx, pullStore{Log: l, epoch: func() uint32 { return 1 }, txns: tx}
		}
		l, _, store := open()
		defer func() { _ = l.Close() }()
		m := &txnModel{state: map[uint64]string{}, opened: map[[2]uint64]bool{}}
		n := 0
		appendAll := func(es ...storage.Entry) {
			if _, err := l.Append(es, false); err != nil {
				rt.Fatal(err)
			}
		}
		msg := func(q int, txn uint64) storage.Entry {
			n++
			body := fmt.Sprintf("m%d", n)
			mm := protocol.Message{ID: body, Topic: "t", Queue: uint32(q), Body: []byte(body)}
			if txn != 0 {
				mm.Producer = protocol.ProducerStamp{ID: 9, Epoch: 1, Seq: int64(n)}
				mm.Txn = txn
			}
			m.queues[q] = append(m.queues[q], txnRec{txn: txn, body: body})
			return storage.Entry{Topic: "t", Queue: uint32(q), Payload: protocol.AppendMessage(nil, &mm)}
		}
		id := func(txn uint64) protocol.TxnID { return protocol.TxnID{Producer: 9, Epoch: 1, Number: txn} }
		check := func(what string) {
			for q := range 2 {
				for _, unc := range []bool{false, true} {
					got, next := readAll(rt, store, q, unc)
					if want := m.want(q, unc); !slices.Equal(got, want) {
						rt.Fatalf("%s: queue %d (uncommitted %v) read %q, want %q", what, q, unc, got, want)
					}
					if !unc {
						// Stopped at the first open record, or at the end.
						stop := int64(len(m.queues[q]))
						for i, r := range m.queues[q] {
							if r.txn != 0 && m.state[r.txn] == "open" {
								stop = int64(i)
								break
							}
						}
						if next != stop {
							rt.Fatalf("%s: queue %d: a committed reader's next offset %d, want %d", what, q, next, stop)
						}
					}
				}
			}
		}
		txns := rapid.Uint64Range(1, 5)
		rt.Repeat(map[string]func(*rapid.T){
			"plain": func(rt *rapid.T) { appendAll(msg(rapid.IntRange(0, 1).Draw(rt, "q"), 0)) },
			"txn message": func(rt *rapid.T) {
				txn, q := txns.Draw(rt, "txn"), rapid.IntRange(0, 1).Draw(rt, "q")
				if st := m.state[txn]; st != "" && st != "open" {
					rt.Skip("decided")
				}
				var es []storage.Entry
				if !m.opened[[2]uint64{txn, uint64(q)}] {
					// As the master: the open mark names the queue's end, right before the record.
					_, first := l.QueueRange("t", uint32(q))
					mark := protocol.TxnMark{Kind: protocol.TxnOpen, ID: id(txn), Time: 1, Topic: "t", Queue: uint32(q), First: first}
					es = append(es, markEntry(&mark))
					m.opened[[2]uint64{txn, uint64(q)}] = true
				}
				m.state[txn] = "open"
				appendAll(append(es, msg(q, txn))...)
			},
			"decide": func(rt *rapid.T) {
				txn := txns.Draw(rt, "txn")
				if m.state[txn] != "open" {
					rt.Skip("not open")
				}
				commit := rapid.Bool().Draw(rt, "commit")
				kind, st := protocol.TxnAbort, "aborted"
				if commit {
					kind, st = protocol.TxnCommit, "committed"
				}
				mark := protocol.TxnMark{Kind: kind, ID: id(txn), Time: 2, By: protocol.TxnByProducer}
				appendAll(markEntry(&mark))
				m.state[txn] = st
			},
			"restart": func(rt *rapid.T) {
				if err := l.Close(); err != nil {
					rt.Fatal(err)
				}
				l, _, store = open()
			},
			"": func(rt *rapid.T) { check("after the step") },
		})
	})
}

// readAll reads queue q of "t" from offset 0 until the answers stop
// moving, and returns the bodies and the last next offset.
func readAll(rt *rapid.T, store queueReader, q int, uncommitted bool) ([]string, int64) {
	var out []string
	next := int64(0)
	for range 100 {
		rep := make(chanReplier, 1)
		handlePull(store, func(uint32) bool { return false }, nil, rep,
			protocol.PullRequest{Topic: "t", Queue: uint32(q), Offset: next, MaxBytes: 64, ReadUncommitted: uncommitted})
		r := <-rep
		if r.err != nil {
			rt.Fatalf("pull: %v", r.err)
		}
		pr, err := protocol.DecodePullResponse(r.body)
		if err != nil {
			rt.Fatal(err)
		}
		for _, sm := range pr.Messages {
			out = append(out, string(sm.Message.Body))
		}
		if pr.NextOffset == next {
			return out, next
		}
		next = pr.NextOffset
	}
	rt.Fatal("the reads never stopped")
	return nil, 0
}
