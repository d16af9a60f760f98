package broker_test

import (
	"testing"

	"github.com/ferrymq/ferrymq/protocol"

	tc "github.com/ferrymq/ferrymq/internal/testcluster"
)

// Review 2, finding 3: a TXN_END of a transaction with nothing here writes
// its mark, and the mark makes its id its producer's newest: an abort of a
// made-up future id (a typo in ferryctl txn abort, or any principal
// allowed to send to some topic: TXN_END of a transaction with nothing
// here needs no more) fences the producer's open transaction and every
// later one on the group, for as long as the mark is in the log.
func TestReview2TxnEndOfAFutureTxnFencesItsProducer(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{})
	meta.CreateTopic(t, "tx", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "tx", 0)

	t1 := protocol.TxnID{Producer: 7, Epoch: 1, Number: 1}
	if r := tc.Send(t, c, []protocol.Message{txnMsg("tx", 0, t1, 0, "a1")})[0]; r.Status != protocol.StatusOK {
		t.Fatalf("send a1: %v", r.Status)
	}
	made := protocol.TxnID{Producer: 7, Epoch: 65535, Number: 1 << 62}
	if rep, err := endTxn(t, c, made, false); err != nil {
		t.Fatalf("abort of a transaction never begun: %+v %v", rep, err)
	}
	r := tc.Send(t, c, []protocol.Message{txnMsg("tx", 0, t1, 1, "a2")})[0]
	t2 := protocol.TxnID{Producer: 7, Epoch: 1, Number: 2}
	r2 := tc.Send(t, c, []protocol.Message{txnMsg("tx", 0, t2, 2, "b1")})[0]
	if r.Status != protocol.StatusOK || r2.Status != protocol.StatusOK {
		t.Fatalf("after an abort of %s, which never began: its producer's open transaction's next message %v, its next transaction's %v; want both stored",
			made, r.Status, r2.Status)
	}
}
