package metaserver_test

import (
	"context"
	"testing"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
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

// Review 2, finding 6: once every group reported done, the registry
// forgets a decision, and a late TXN_DECIDE of the same transaction is
// recorded anew and commits its offsets again. Instance A (epoch 1)
// commits transaction 1 with the consumer member's offset 5 and loses the
// answer; its groups learn the commit at their timeout and report done.
// The application goes on with instance B (epoch 2, same consumer member),
// which commits offset 9. A's Commit, retried (an error other than
// ErrTxnAborted leaves the transaction open, to be committed again), finds
// every group committed, asks the registry again, and moves the group's
// offset back to 5: the inputs between are consumed and produced twice.
func TestReview2LateRetryCommitsOffsetsAgain(t *testing.T) {
	m := startMeta(t, 1, nil)
	cl := m.Client(t)
	ctx := context.Background()
	heartbeat(t, cl, "g1", routing.RoleMaster, nil)
	m.CreateTopic(t, "orders", "g1")
	hb, err := cl.ConsumerHeartbeat(ctx, api.ConsumerHeartbeat{Group: "cg", Member: "m", Topics: []string{"orders"}})
	if err != nil {
		t.Fatal(err)
	}
	withOffsets := func(epoch uint16, offset int64) api.TxnDecideRequest {
		r := txnReq(1, true, protocol.TxnByProducer, "g1", "g2")
		r.Epoch = epoch
		r.Offsets = &api.CommitRequest{Group: "cg", Member: "m", Generation: hb.Generation, Offsets: []api.QueueOffset{{Topic: "orders", Queue: 0, Offset: offset}}}
		return r
	}
	for _, step := range []struct {
		epoch  uint16
		offset int64
	}{{1, 5}, {2, 9}} {
		if d, err := cl.DecideTxn(ctx, withOffsets(step.epoch, step.offset)); err != nil || !d.Committed || !d.Offsets {
			t.Fatalf("transaction 7.%d.1: %+v %v", step.epoch, d, err)
		}
		if err := cl.TxnDone(ctx, api.TxnDoneRequest{Producer: 7, Epoch: step.epoch, Number: 1, Groups: []string{"g1", "g2"}}); err != nil {
			t.Fatal(err)
		}
	}
	d, err := cl.DecideTxn(ctx, withOffsets(1, 5)) // A's commit, retried late
	gs, gerr := cl.ConsumerGroups(ctx, "cg")
	if gerr != nil || len(gs) != 1 || len(gs[0].Offsets) != 1 {
		t.Fatalf("consumer groups: %+v %v", gs, gerr)
	}
	if got := gs[0].Offsets[0].Offset; got != 9 {
		t.Fatalf("a late retry of 7.1.1 (answered %+v, %v) moved the group's offset back from 9 to %d", d, err, got)
	}
}
