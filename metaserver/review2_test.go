package metaserver_test

import (
	"context"
	"testing"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
)

// Review 2, finding 2: TXN_DECIDE and TXN_DONE check only that the caller
// may produce to some topic: a principal allowed one unrelated topic
// reports another producer's committed transaction done before its groups
// applied it (the registry forgets the commit), then records an abort of
// it as "admin" (which only admin may do at a broker): the groups not yet
// told apply the abort at their timeout, the others the commit.
func TestReview2TxnDecisionsOfAnyProducer(t *testing.T) {
	am := startAuthMeta(t, 1)
	ctx := context.Background()
	alice := am.principal(t, "alice", "produce:orders")
	eve := am.principal(t, "eve", "produce:payments")

	if d, err := alice.DecideTxn(ctx, txnReq(1, true, protocol.TxnByProducer, "g1", "g2")); err != nil || !d.Committed {
		t.Fatalf("alice commits her transaction: %+v %v", d, err)
	}
	eveDone := eve.TxnDone(ctx, api.TxnDoneRequest{Producer: 7, Epoch: 1, Number: 1, Groups: []string{"g1", "g2"}})
	d, eveAbort := eve.DecideTxn(ctx, txnReq(1, false, protocol.TxnByAdmin, "g2"))
	if eveDone == nil || eveAbort == nil || !d.Committed {
		t.Fatalf("eve, allowed only payments, reports alice's commit done (%v) then decides it: %+v (%v), want both refused and the commit kept",
			eveDone, d, eveAbort)
	}
}
