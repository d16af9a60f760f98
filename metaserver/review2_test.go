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
	_, eveAbort := eve.DecideTxn(ctx, txnReq(1, false, protocol.TxnByAdmin, "g2"))
	if eveDone == nil || eveAbort == nil {
		t.Fatalf("eve, allowed only payments, reports alice's commit done (%v) then decides it as admin (%v): want both refused", eveDone, eveAbort)
	}
	if d, err := alice.DecideTxn(ctx, txnReq(1, false, protocol.TxnByProducer, "g1", "g2")); err != nil || !d.Committed || len(d.Pending) != 2 {
		t.Fatalf("alice's commit after eve's tries: %+v %v, want kept, both groups pending", d, err)
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
	// Instances A and B of one named producer.
	a, err := cl.InitProducer(ctx, "xform")
	if err != nil {
		t.Fatal(err)
	}
	b, err := cl.InitProducer(ctx, "xform")
	if err != nil || b.ID != a.ID || b.Epoch <= a.Epoch {
		t.Fatalf("second instance %+v (first %+v), %v", b, a, err)
	}
	withOffsets := func(epoch uint16, offset int64) api.TxnDecideRequest {
		r := txnReq(1, true, protocol.TxnByProducer, "g1", "g2")
		r.Producer, r.Epoch = a.ID, epoch
		r.Offsets = &api.CommitRequest{Group: "cg", Member: "m", Generation: hb.Generation, Offsets: []api.QueueOffset{{Topic: "orders", Queue: 0, Offset: offset}}}
		return r
	}
	for _, step := range []struct {
		epoch  uint16
		offset int64
	}{{a.Epoch, 5}, {b.Epoch, 9}} {
		// B exists already here, so A's own decision would be fenced: its
		// commit is decided as B's checker would have.
		req := withOffsets(step.epoch, step.offset)
		if step.epoch == a.Epoch {
			req.By = protocol.TxnByChecker
		}
		if d, err := cl.DecideTxn(ctx, req); err != nil || !d.Committed || !d.Offsets {
			t.Fatalf("transaction %d.%d.1: %+v %v", a.ID, step.epoch, d, err)
		}
		if err := cl.TxnDone(ctx, api.TxnDoneRequest{Producer: a.ID, Epoch: step.epoch, Number: 1, Groups: []string{"g1", "g2"}}); err != nil {
			t.Fatal(err)
		}
	}
	d, err := cl.DecideTxn(ctx, withOffsets(a.Epoch, 5)) // A's commit, retried late: fenced, or answered the kept record
	if err == nil && (!d.Committed || d.By != protocol.TxnByChecker) {
		t.Errorf("A's late retry answered %+v: want the checker's kept decision", d)
	}
	// A producer's own decision, forgotten once its groups reported, is
	// fenced when an older instance asks again.
	older := withOffsets(a.Epoch, 5)
	older.Number = 2
	if _, err := cl.DecideTxn(ctx, older); protocol.StatusOf(err) != protocol.StatusProducerFenced {
		t.Errorf("an older instance's own decision: %v, want PRODUCER_FENCED", err)
	}
	gs, gerr := cl.ConsumerGroups(ctx, "cg")
	if gerr != nil || len(gs) != 1 || len(gs[0].Offsets) != 1 {
		t.Fatalf("consumer groups: %+v %v", gs, gerr)
	}
	if got := gs[0].Offsets[0].Offset; got != 9 {
		t.Fatalf("a late retry of 7.1.1 (answered %+v, %v) moved the group's offset back from 9 to %d", d, err, got)
	}
}
