package broker_test

import (
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"

	"github.com/ferrymq/ferrymq/broker"
	tc "github.com/ferrymq/ferrymq/internal/testcluster"
)

// Review of the transactions (3ac3ab4..271018d).

// A TXN_END that the master answers as decided must keep every later
// record of that transaction out (no record is admitted after its
// decision): a producer whose first send timed out aborts, is answered
// "aborted", and the send, late on the wire, then lands. The master
// answers the abort of a transaction it holds nothing of without a mark,
// so the late record is admitted and opens the transaction again: it holds
// back every committed reader of the queue until the timeout aborts it.
// (Fails on 271018d.)
func TestReviewTxnLateRecordAfterAnsweredAbort(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{})
	meta.CreateTopic(t, "tx", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "tx", 0)

	id := protocol.TxnID{Producer: 7, Epoch: 1, Number: 1}
	if rep, err := endTxn(t, c, id, false); err != nil || rep.Committed {
		t.Fatalf("abort: %+v, %v", rep, err)
	}
	r := tc.Send(t, c, []protocol.Message{txnMsg("tx", 0, id, 0, "late")})[0]
	after := tc.Send(t, c, []protocol.Message{tc.Msg("tx", 0, protocol.Normal, "plain")})[0]
	got, _ := readQueue(t, c, "tx", 0, false)
	if r.Status != protocol.StatusTxnFenced {
		t.Errorf("a record of %s after its abort was answered: %v, want TXN_FENCED", id, r.Status)
	}
	if after.Status == protocol.StatusOK && len(got) != 2 {
		t.Errorf("a committed reader reads %q: the aborted transaction, open again, holds back the later message", got)
	}
}

// A delayed message of a transaction is released only once its
// transaction committed: an aborted one's is cancelled (never released),
// and an open one's stays pending past its time, until the commit.
func TestTxnDelayedReleasedOnlyIfCommitted(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true})
	meta.CreateTopic(t, "tx", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "tx", 0)

	due := time.Now().Add(100 * time.Millisecond).UnixMilli()
	send := func(id protocol.TxnID, body string) protocol.DelayedRef {
		m := txnMsg("tx", 0, id, 0, body)
		m.Schedule = protocol.Schedule{Kind: protocol.ScheduleDelayed, At: due, Ref: -1}
		r := tc.Send(t, c, []protocol.Message{m})[0]
		if r.Status != protocol.StatusOK {
			t.Fatalf("a delayed message of %s: %v", id, r.Status)
		}
		return protocol.DelayedRef{Offset: r.LogOffset, DueAt: due}
	}
	state := func(ref protocol.DelayedRef) string {
		var st protocol.DelayedState
		if err := callDelayed(t, c, protocol.CodeDelayedState, ref, &st); err != nil {
			t.Fatal(err)
		}
		return st.State
	}
	aborted := protocol.TxnID{Producer: 7, Epoch: 1, Number: 1}
	open := protocol.TxnID{Producer: 8, Epoch: 1, Number: 1}
	ra := send(aborted, "aborted")
	ro := send(open, "committed later") // due at the same time: the delayer looks at both
	if rep, err := endTxn(t, c, aborted, false); err != nil || rep.Committed {
		t.Fatalf("abort: %+v, %v", rep, err)
	}
	testwait.For(t, 10*time.Second, "the aborted transaction's delayed message to be cancelled", func() bool {
		return state(ra) == protocol.DelayCancelled
	})
	if st := state(ro); st != protocol.DelayPending {
		t.Fatalf("the open transaction's delayed message, due with the cancelled one: %s, want pending", st)
	}
	if got := released(t, c, "tx", 0); len(got) != 0 {
		t.Fatalf("released before the commit: %d copies", len(got))
	}
	if rep, err := endTxn(t, c, open, true); err != nil || !rep.Committed {
		t.Fatalf("commit: %+v, %v", rep, err)
	}
	testwait.For(t, 10*time.Second, "the committed transaction's delayed message's release", func() bool {
		return state(ro) == protocol.DelayReleased
	})
	got, _ := readQueue(t, c, "tx", 0, false)
	wantBodies(t, "a committed reader", got, "probe", "committed later")
	if cp := released(t, c, "tx", 0); len(cp) != 1 || cp[0].Message.Txn != 0 || !cp[0].Message.Producer.IsZero() {
		t.Fatalf("released copies %+v: want one, plain", cp)
	}
}

// A former master's cut tail is appended again by the new master (RECOVER)
// past the transactions' admission: its marks and records go straight to
// the log. The new master drops a tail record whose message id it holds
// past the cut, and every open mark of a transaction has the same id
// ("txn/<id>/open"), whatever its queue: here the tail's open mark of
// queue 1 is dropped (the new master wrote transaction T's open mark of
// queue 2) and T's record of queue 1 is appended without one, so a reader
// of committed messages reads it while T is open. (Fails on 271018d.)
func TestReviewTxnRecoveredTailLosesAnOpenMark(t *testing.T) {
	meta := tc.StartMeta(t, 1, func(c *metaserver.Config) { c.FailoverMargin = 200 * time.Millisecond })
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true})
	meta.CreateTopic(t, "tx", "g1", "g1", "g1")
	mc := tc.Dial(t, g.Master.Addr())
	warmRoute(t, mc, "tx", 0, 1, 2)
	id := protocol.TxnID{Producer: 7, Epoch: 1, Number: 1}
	sendAll(t, mc, protocol.StatusOK, txnMsg("tx", 0, id, 0, "r0"))
	testwait.For(t, 10*time.Second, "the slave to copy T's first record", func() bool {
		return g.Slave.Store().EndOffset() == g.Master.Store().EndOffset()
	})
	_ = g.Slave.Close()
	sendAll(t, mc, protocol.StatusOK, txnMsg("tx", 1, id, 0, "r1")) // the old master alone: its open mark of queue 1, r1
	_ = g.Master.Close()

	nm := tc.StartBroker(t, g.Config(routing.RoleSlave))
	testwait.For(t, 15*time.Second, "the slave to be promoted", func() bool { return nm.IsMaster() && nm.Writable() })
	nc := tc.Dial(t, nm.Addr())
	warmRoute(t, nc, "tx", 2)
	sendAll(t, nc, protocol.StatusOK, txnMsg("tx", 2, id, 0, "r2")) // T goes on at the new master: its open mark of queue 2

	old := tc.StartBroker(t, g.Config(routing.RoleMaster))
	testwait.For(t, 15*time.Second, "the old master to hand its tail over", func() bool {
		return old.Stats().TailsHandedOver.Load() == 1
	})
	if l := listTxns(t, nc); len(l.Open) != 1 || l.Open[0].ID != id.String() {
		t.Fatalf("open transactions %+v, want %s", l.Open, id)
	}
	got, _ := readQueue(t, nc, "tx", 1, false)
	for _, b := range got {
		if b == "r1" {
			t.Fatalf("a committed reader of queue 1 reads %q: r1 of open transaction %s (open: %+v)", got, id, listTxns(t, nc).Open[0].Queues)
		}
	}
}

// A producer's older transaction takes no record once a newer one was
// seen; in one SEND batch, the newer one's first record is not "seen"
// until the batch's open marks are made, after every message of it was
// admitted: [T2's first record, T1's record] stores both, T1's after
// T2's open mark. (Fails on 271018d.)
func TestReviewTxnOlderAdmittedInTheNewersBatch(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{})
	meta.CreateTopic(t, "tx", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "tx", 0)
	t1 := protocol.TxnID{Producer: 7, Epoch: 1, Number: 1}
	t2 := protocol.TxnID{Producer: 7, Epoch: 1, Number: 2}
	sendAll(t, c, protocol.StatusOK, txnMsg("tx", 0, t1, 0, "a1"))
	rs := tc.Send(t, c, []protocol.Message{txnMsg("tx", 0, t2, 1, "b1"), txnMsg("tx", 0, t1, 2, "a2")})
	if rs[0].Status != protocol.StatusOK {
		t.Fatalf("T2's first record: %v", rs[0].Status)
	}
	if rs[1].Status != protocol.StatusTxnFenced {
		t.Errorf("T1's record after T2's first, in one batch: %v, want TXN_FENCED", rs[1].Status)
	}
}

// TxnMaxOpen bounds the group's open transactions: with a limit of 2 and
// T1 open, T2 may open. Admission counts every transaction the batch
// wrote so far as new, T1 too (it is counted open already): T2's first
// record is refused TXN_LIMIT when it follows one of T1 in its batch,
// and taken alone. (Fails on 271018d.)
func TestReviewTxnMaxOpenCountsAnOpenOneTwice(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Edit: func(c *broker.Config) { c.TxnMaxOpen = 2 }})
	meta.CreateTopic(t, "tx", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "tx", 0)
	t1 := protocol.TxnID{Producer: 7, Epoch: 1, Number: 1}
	t2 := protocol.TxnID{Producer: 8, Epoch: 1, Number: 1}
	sendAll(t, c, protocol.StatusOK, txnMsg("tx", 0, t1, 0, "a1"))
	rs := tc.Send(t, c, []protocol.Message{txnMsg("tx", 0, t1, 1, "a2"), txnMsg("tx", 0, t2, 0, "b1")})
	if rs[0].Status != protocol.StatusOK || rs[1].Status != protocol.StatusOK {
		t.Errorf("T1's second record and T2's first, 2 open of 2: %v, %v; want OK, OK", rs[0].Status, rs[1].Status)
	}
}
