package producer

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
)

// Review 2, finding 1: a decision recorded by someone who names only one
// group (a master's timeout, a checker, ferryctl txn abort) is deleted once
// that one group reports done, while the transaction is still open on its
// other groups; the next decider there records the other decision.
//
// A transaction is prepared on g1 and g2 and its producer goes away. g1's
// master aborts it at g1's timeout through the registry (groups [g1]) and
// reports g1 done: the registry forgets the abort. The next instance of the
// Identity finds it open on g2; its checker says commit; the registry,
// holding nothing, records a commit: g2 delivers its part, g1 never will.
func TestReview2PartialGroupDecisionForgotten(t *testing.T) {
	c := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1", "g2"}, MetaEdit: testcluster.SteadyMeta,
		BrokerEdit: func(cfg *broker.Config) {
			testcluster.SteadyBroker(cfg)
			if cfg.Group == "g1" {
				cfg.TxnTimeout = time.Second // g1's transactions time out long before g2's (1 min)
			}
		}})
	oneCopy(t, c, "g1", "g2")
	c.Meta.CreateTopic(t, "tx", "g1", "g2")
	ctx := context.Background()

	a := newProducer(t, c, Identity("app"), Linger(0))
	txn, err := a.BeginTxn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]int{}
	for k := range 8 {
		r, err := txn.Send(ctx, &Message{Topic: "tx", Key: fmt.Sprint("k", k), Body: []byte(fmt.Sprint("m", k))})
		if err != nil {
			t.Fatal(err)
		}
		groups[r.Group]++
	}
	if len(groups) != 2 {
		t.Fatalf("the transaction's messages went to %v: the test needs both groups", groups)
	}
	if err := txn.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	// The instance goes away here (its process died after its work).

	mc := c.Meta.Client(t)
	g1 := testcluster.Dial(t, c.Master("g1").Addr())
	testwait.For(t, 20*time.Second, "g1 to abort at its timeout (the registry keeps that decision)", func() bool {
		var l protocol.TxnList
		resp, err := g1.Call(ctx, protocol.CodeTxnList, []byte("{}"))
		if err != nil {
			t.Fatal(err)
		}
		mustJSON(t, resp.Body, &l)
		return len(l.Open) == 0
	})
	if d, err := mc.TxnDecisions(ctx, api.TxnDecisionsRequest{Producer: txn.ID().Producer}); err != nil || len(d.Records) != 1 || d.Records[0].Committed {
		t.Fatalf("the registry holds %+v (%v): want g1's timeout abort, kept", d.Records, err)
	}

	// The next instance's checker says the work committed.
	newProducer(t, c, Identity("app"), TxnCheckInterval(20*time.Millisecond),
		CheckTxns(func(context.Context, TxnCheck) TxnDecision { return TxnCommit }, "tx"))
	g2 := testcluster.Dial(t, c.Master("g2").Addr())
	testwait.For(t, 20*time.Second, "the checker to resolve the transaction on g2", func() bool {
		var l protocol.TxnList
		resp, err := g2.Call(ctx, protocol.CodeTxnList, []byte("{}"))
		if err != nil {
			t.Fatal(err)
		}
		mustJSON(t, resp.Body, &l)
		return len(l.Open) == 0
	})
	got := committedBodies(t, c, "tx", 2)
	if len(got) != 0 && len(got) != 8 {
		slices.Sort(got)
		t.Fatalf("readers of committed messages get %q: %d of the transaction's 8 messages (g1 aborted it, g2 committed it)", got, len(got))
	}
}

// Review 2, finding 7: Close aborts the open transaction, even one that
// SendInTxn prepared and whose work (the application's local transaction)
// is running: a graceful shutdown during the work aborts the messages,
// the work commits, and the next instance's checker, which would have
// said commit, never sees the transaction.
func TestReview2CloseAbortsAPreparedSendInTxn(t *testing.T) {
	c := start(t, false, "g1")
	oneCopy(t, c, "g1")
	c.Meta.CreateTopic(t, "tx", "g1")
	ctx := context.Background()
	p := newProducer(t, c, Identity("app"), Linger(0))
	g1 := testcluster.Dial(t, c.Master("g1").Addr())
	_, err := p.SendInTxn(ctx, []*Message{{Topic: "tx", Body: []byte("order-1")}}, func(context.Context) error {
		if err := p.Close(); err != nil { // a shutdown while the work runs
			t.Error(err)
		}
		return nil // the local transaction commits
	})
	if err == nil {
		t.Fatal("SendInTxn committed through a closed producer")
	}
	// Left open and prepared for the next instance's checker, not aborted.
	var l protocol.TxnList
	resp, cerr := g1.Call(ctx, protocol.CodeTxnList, []byte("{}"))
	if cerr != nil {
		t.Fatal(cerr)
	}
	mustJSON(t, resp.Body, &l)
	if len(l.Open) != 1 || !l.Open[0].Prepared {
		t.Fatalf("after Close during the work: open %+v (SendInTxn: %v), want the transaction open and prepared", l.Open, err)
	}
}
