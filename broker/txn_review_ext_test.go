package broker_test

import (
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"

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

// A delayed message of a transaction (the broker takes one: only the Go
// producer refuses it) is held back while it is pending, but the delayer
// releases a copy without its stamp and transaction number: the copy is
// an ordinary message, delivered to readers of committed messages though
// the transaction is still open, and though it was aborted. (Fails on
// 271018d.)
func TestReviewTxnDelayedMessageReleasedDespiteAbort(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{})
	meta.CreateTopic(t, "tx", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "tx", 0)

	id := protocol.TxnID{Producer: 7, Epoch: 1, Number: 1}
	m := txnMsg("tx", 0, id, 0, "delayed")
	m.Schedule = protocol.Schedule{Kind: protocol.ScheduleDelayed, At: time.Now().Add(200 * time.Millisecond).UnixMilli(), Ref: -1}
	r := tc.Send(t, c, []protocol.Message{m})[0]
	if r.Status != protocol.StatusOK {
		t.Skipf("the broker refuses a delayed message of a transaction: %v", r.Status)
	}
	if rep, err := endTxn(t, c, id, false); err != nil || rep.Committed {
		t.Fatalf("abort: %+v, %v", rep, err)
	}
	testwait.For(t, 10*time.Second, "the delayed message's release", func() bool {
		return len(released(t, c, "tx", 0)) == 1
	})
	got, _ := readQueue(t, c, "tx", 0, false)
	for _, b := range got {
		if b == "delayed" {
			t.Fatalf("a committed reader reads %q: the released copy of a message of aborted transaction %s", got, id)
		}
	}
}
