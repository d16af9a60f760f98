package txn

import (
	"testing"

	"github.com/ferrymq/ferrymq/protocol"
)

// An aborted transaction is remembered until retention deletes its abort
// mark (Prune), then forgotten; a committed one is not in the aborted set;
// the oldest open mark is what retention must keep.
func TestPruneAndOldest(t *testing.T) {
	x := New()
	id := func(n uint64) protocol.TxnID { return protocol.TxnID{Producer: 1, Epoch: 1, Number: n} }
	for n := uint64(1); n <= 4; n++ {
		x.Apply(&protocol.TxnMark{Kind: protocol.TxnOpen, ID: id(n), Topic: "t", First: int64(n)}, int64(n*100))
	}
	if at, ok := x.Oldest(); !ok || at != 100 {
		t.Fatalf("Oldest %d %v, want 100", at, ok)
	}
	x.Apply(&protocol.TxnMark{Kind: protocol.TxnAbort, ID: id(1)}, 500)
	x.Apply(&protocol.TxnMark{Kind: protocol.TxnCommit, ID: id(2)}, 600)
	x.Apply(&protocol.TxnMark{Kind: protocol.TxnAbort, ID: id(3)}, 700)
	if at, ok := x.Oldest(); !ok || at != 400 {
		t.Fatalf("Oldest %d %v after decisions, want 400", at, ok)
	}
	if !x.IsAborted(id(1)) || x.IsAborted(id(2)) || !x.IsAborted(id(3)) {
		t.Fatal("aborted set wrong")
	}
	x.Prune(600)
	if x.IsAborted(id(1)) || !x.IsAborted(id(3)) {
		t.Fatal("Prune(600) must forget the abort at 500 and keep the one at 700")
	}
	if x.State(id(1)) != Aborted { // still in the recent decisions
		t.Fatalf("state of a pruned abort: %v", x.State(id(1)))
	}
	x.Prune(701)
	if x.IsAborted(id(3)) || len(x.abortOrder) != 0 {
		t.Fatal("Prune(701) must forget every abort")
	}
	if st := x.StableEnd("t", 0, 99); st != 4 {
		t.Fatalf("stable end %d, want 4 (the open transaction's first)", st)
	}
}
