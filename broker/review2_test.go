package broker_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"

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

// Review 2, finding 4: the master applies a commit mark to what readers
// see once it is written, before the sync set holds it (the commit is
// answered only then). A reader of committed messages reads the
// transaction on the master; the master goes away before its slave copied
// the mark; the slave, promoted, holds the transaction open (every record
// of it, but no commit) and aborts it at its timeout: what the reader read
// as committed never is.
func TestReview2CommitReadBeforeTheSyncSetHoldsIt(t *testing.T) {
	meta := tc.StartMeta(t, 1, func(c *metaserver.Config) { c.FailoverMargin = 200 * time.Millisecond })
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true, Edit: func(c *broker.Config) { c.TxnTimeout = 2 * time.Second }})
	meta.CreateTopic(t, "tx", "g1")
	mc := tc.Dial(t, g.Master.Addr())
	warmRoute(t, mc, "tx", 0)

	t1 := protocol.TxnID{Producer: 7, Epoch: 1, Number: 1}
	if r := tc.Send(t, mc, []protocol.Message{txnMsg("tx", 0, t1, 0, "a1")})[0]; r.Status != protocol.StatusOK {
		t.Fatalf("send a1: %v", r.Status)
	}
	testwait.For(t, 10*time.Second, "the slave to copy the record and its open mark", func() bool {
		return g.Slave.Store().EndOffset() == g.Master.Store().EndOffset()
	})
	_ = g.Slave.Close() // it holds every record of t1, not yet its commit

	rep, err := endTxn(t, mc, t1, true)
	read, _ := readQueue(t, mc, "tx", 0, false)
	t.Logf("commit on the master alone: %+v %v; a reader of committed messages reads %q there", rep, err, read)

	masterEnd := g.Master.Store().EndOffset()
	mcl := meta.Client(t)
	testwait.For(t, 10*time.Second, "the master to report its log end", func() bool {
		groups, err := mcl.Groups(context.Background())
		return err == nil && len(groups) == 1 && groups[0].Last.LogEnd == masterEnd
	})
	_ = g.Master.Close()
	slave := tc.StartBroker(t, g.Config(routing.RoleSlave))
	testwait.For(t, 15*time.Second, "the slave to be promoted and take writes", func() bool { return slave.IsMaster() && slave.Writable() })
	sc := tc.Dial(t, slave.Addr())
	testwait.For(t, 20*time.Second, "the new master to decide t1", func() bool { return len(listTxns(t, sc).Open) == 0 })
	after, _ := readQueue(t, sc, "tx", 0, false)
	if slices.Contains(read, "a1") && !slices.Contains(after, "a1") {
		t.Fatalf("a reader of committed messages read %q on the master before the sync set held the commit; after the failover the transaction is aborted (readers read %q)", read, after)
	}
}
