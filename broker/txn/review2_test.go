package txn

import (
	"testing"

	"github.com/ferrymq/ferrymq/protocol"
)

// Review 2, finding 8: the index forgets a committed transaction's
// decision after recentDecisions later ones; a TXN_END then finds it
// unknown and writes a new mark (endLocked: "a mark is written either
// way"), and an abort mark of a transaction the index forgot makes every
// record of it aborted: a transaction committed and read long ago
// disappears for every later reader (a new consumer group, a reset). A
// late abort comes from ferryctl txn abort of the wrong id, a checker or
// zombie late, or the registry's decision recorded anew once the first
// was done (finding 1).
func TestReview2ForgottenCommitAbortedLater(t *testing.T) {
	x := New()
	id := protocol.TxnID{Producer: 1, Epoch: 1, Number: 1}
	at := int64(0)
	apply := func(m protocol.TxnMark) {
		x.Apply(&m, at)
		at += 100
	}
	apply(protocol.TxnMark{Kind: protocol.TxnOpen, ID: id, Topic: "t", Queue: 0, First: 0})
	apply(protocol.TxnMark{Kind: protocol.TxnCommit, ID: id, By: protocol.TxnByProducer})
	for n := range uint64(recentDecisions) {
		other := protocol.TxnID{Producer: 2, Epoch: 1, Number: n + 1}
		apply(protocol.TxnMark{Kind: protocol.TxnOpen, ID: other, Topic: "t", Queue: 1, First: int64(n)})
		apply(protocol.TxnMark{Kind: protocol.TxnCommit, ID: other, By: protocol.TxnByProducer})
	}
	apply(protocol.TxnMark{Kind: protocol.TxnAbort, ID: id, By: protocol.TxnByAdmin})
	if x.IsAborted(id) {
		t.Fatalf("a late abort made committed transaction %s aborted: readers now skip its records", id)
	}
}
