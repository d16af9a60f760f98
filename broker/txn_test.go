package broker_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"

	tc "github.com/ferrymq/ferrymq/internal/testcluster"
)

// txnMsg is message body of transaction (producer, epoch, number) at the
// producer's sequence seq in its queue.
func txnMsg(topic string, queue uint32, id protocol.TxnID, seq int64, body string) protocol.Message {
	m := tc.Msg(topic, queue, protocol.Normal, body)
	m.Producer = protocol.ProducerStamp{ID: id.Producer, Epoch: id.Epoch, Seq: seq}
	m.Txn = id.Number
	return m
}

// readQueue reads a queue from offset 0 to its readable end as a reader
// of committed (or, with uncommitted, every undecided) messages: the
// bodies read, and the next offset the last answer gave.
func readQueue(t *testing.T, c *transport.Client, topic string, queue uint32, uncommitted bool) (bodies []string, next int64) {
	t.Helper()
	for range 1000 {
		resp, err := c.Call(context.Background(), protocol.CodePull, protocol.AppendPullRequest(nil,
			&protocol.PullRequest{Topic: topic, Queue: queue, Offset: next, MaxBytes: 64 << 10, ReadUncommitted: uncommitted}))
		if err != nil {
			t.Fatal(err)
		}
		pr, err := protocol.DecodePullResponse(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range pr.Messages {
			if m.QueueOffset < next {
				t.Fatalf("offset %d read again (next was %d)", m.QueueOffset, next)
			}
			bodies = append(bodies, string(m.Message.Body))
		}
		if pr.NextOffset == next {
			return bodies, next
		}
		next = pr.NextOffset
	}
	t.Fatal("the queue never ended")
	return nil, 0
}

func endTxn(t *testing.T, c *transport.Client, id protocol.TxnID, commit bool) (protocol.TxnEndReply, error) {
	t.Helper()
	var out protocol.TxnEndReply
	err := callDelayed(t, c, protocol.CodeTxnEnd, protocol.TxnEndRequest{Producer: id.Producer, Epoch: id.Epoch, Number: id.Number, Commit: commit}, &out)
	return out, err
}

func listTxns(t *testing.T, c *transport.Client) protocol.TxnList {
	t.Helper()
	var out protocol.TxnList
	if err := callDelayed(t, c, protocol.CodeTxnList, protocol.TxnListRequest{}, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func wantBodies(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s read %q, want %q", what, got, want)
	}
}

// A reader of committed messages reads a queue only up to the first record
// of an open transaction, then, once it is committed, every record of it
// in place (the marks take no offset: offsets stay dense); it never reads
// a record of an aborted one, and its next offset passes them. A reader of
// uncommitted messages reads open ones too, never aborted ones. A late
// write of a decided transaction, or of one older than its producer's
// newest, is refused. The slave and a restarted master read the same.
func TestTxnReadCommitted(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true})
	meta.CreateTopic(t, "tx", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "tx", 0) // the probe is offset 0

	t1 := protocol.TxnID{Producer: 7, Epoch: 1, Number: 1}
	send := func(msgs ...protocol.Message) []protocol.SendResult { return tc.Send(t, c, msgs) }
	for i, r := range send(txnMsg("tx", 0, t1, 0, "a1"), tc.Msg("tx", 0, protocol.Normal, "plain1"), txnMsg("tx", 0, t1, 1, "a2")) {
		if r.Status != protocol.StatusOK || r.QueueOffset != int64(i+1) {
			t.Fatalf("send %d: %+v", i, r)
		}
	}
	got, next := readQueue(t, c, "tx", 0, false)
	wantBodies(t, "a committed reader while t1 is open", got, "probe")
	if next != 1 {
		t.Fatalf("next offset %d at the open transaction, want 1", next)
	}
	got, _ = readQueue(t, c, "tx", 0, true)
	wantBodies(t, "an uncommitted reader", got, "probe", "a1", "plain1", "a2")
	l := listTxns(t, c)
	if len(l.Open) != 1 || l.Open[0].ID != t1.String() || l.Open[0].Queues[0].First != 1 || l.Open[0].Messages != 2 {
		t.Fatalf("open transactions %+v", l.Open)
	}

	if rep, err := endTxn(t, c, t1, true); err != nil || !rep.Committed || rep.Queues != 1 {
		t.Fatalf("commit t1: %+v, %v", rep, err)
	}
	got, next = readQueue(t, c, "tx", 0, false)
	wantBodies(t, "a committed reader after the commit", got, "probe", "a1", "plain1", "a2")
	if next != 4 {
		t.Fatalf("next offset %d after 4 messages: the marks took offsets", next)
	}
	if rep, err := endTxn(t, c, t1, false); err != nil || !rep.Committed {
		t.Fatalf("abort after the commit: %+v, %v; want the commit", rep, err)
	}

	t2 := protocol.TxnID{Producer: 7, Epoch: 1, Number: 2}
	send(txnMsg("tx", 0, t2, 2, "b1"), tc.Msg("tx", 0, protocol.Normal, "plain2"), txnMsg("tx", 0, t2, 3, "b2"))
	if r := send(txnMsg("tx", 0, t1, 4, "late"))[0]; r.Status != protocol.StatusTxnFenced {
		t.Fatalf("a write of decided t1: %v, want TXN_FENCED", r.Status)
	}
	if rep, err := endTxn(t, c, t2, false); err != nil || rep.Committed {
		t.Fatalf("abort t2: %+v, %v", rep, err)
	}
	if r := send(txnMsg("tx", 0, t2, 4, "late"))[0]; r.Status != protocol.StatusTxnFenced {
		t.Fatalf("a write of aborted t2: %v, want TXN_FENCED", r.Status)
	}
	want := []string{"probe", "a1", "plain1", "a2", "plain2"}
	for _, who := range []struct {
		name string
		c    *transport.Client
	}{{"the master", c}, {"the slave", tc.Dial(t, g.Slave.Addr())}} {
		testwait.For(t, 5*time.Second, who.name+" to read past the aborted transaction", func() bool {
			got, next := readQueue(t, who.c, "tx", 0, false)
			return slices.Equal(got, want) && next == 7
		})
		got, _ := readQueue(t, who.c, "tx", 0, true)
		wantBodies(t, who.name+"'s uncommitted reader after the abort", got, want...)
	}

	// A restart rebuilds the index from the log: t3 stays open, t2 aborted.
	t3 := protocol.TxnID{Producer: 8, Epoch: 1, Number: 1}
	send(txnMsg("tx", 0, t3, 0, "c1"))
	g.Master.Close()
	g.Master = tc.StartBroker(t, g.Config("master"))
	testwait.For(t, 10*time.Second, "the restarted master to take writes", g.Master.Writable)
	c = tc.Dial(t, g.Master.Addr())
	// Decisions its slave has not acknowledged to it since the restart
	// stay hidden until the slave's first fetch says it holds them.
	testwait.For(t, 10*time.Second, "a committed reader after the restart to read the decided transactions", func() bool {
		got, _ := readQueue(t, c, "tx", 0, false)
		return slices.Equal(got, want)
	})
	if rep, err := endTxn(t, c, t3, true); err != nil || !rep.Committed {
		t.Fatalf("commit t3 after the restart: %+v, %v", rep, err)
	}
	got, _ = readQueue(t, c, "tx", 0, false)
	wantBodies(t, "a committed reader after t3's commit", got, append(want, "c1")...)
}

// The master aborts a transaction open longer than its timeout, and says
// who decided it; a commit that comes later learns of the abort.
func TestTxnTimeoutAborts(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Edit: func(c *broker.Config) { c.TxnTimeout = 200 * time.Millisecond }})
	meta.CreateTopic(t, "tx", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "tx", 0)
	id := protocol.TxnID{Producer: 9, Epoch: 3, Number: 5}
	tc.Send(t, c, []protocol.Message{txnMsg("tx", 0, id, 0, "x")})
	testwait.For(t, 10*time.Second, "the transaction to be aborted at its timeout", func() bool {
		l := listTxns(t, c)
		return len(l.Open) == 0 && len(l.Decided) == 1
	})
	if d := listTxns(t, c).Decided[0]; d.ID != id.String() || d.Committed || d.By != protocol.TxnByTimeout {
		t.Fatalf("decided %+v, want %s aborted by timeout", d, id)
	}
	if rep, err := endTxn(t, c, id, true); err != nil || rep.Committed {
		t.Fatalf("a commit after the timeout: %+v, %v; want the abort", rep, err)
	}
	got, _ := readQueue(t, c, "tx", 0, false)
	wantBodies(t, "a committed reader", got, "probe")
}

// Limits: messages and bytes per transaction, open transactions per
// producer; a TXN_END for a transaction that wrote nothing here records
// nothing; a slave refuses TXN_END.
func TestTxnLimits(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true, Edit: func(c *broker.Config) {
		c.TxnMaxMessages, c.TxnMaxOpenPerProducer = 3, 2
	}})
	meta.CreateTopic(t, "tx", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "tx", 0)
	a := protocol.TxnID{Producer: 5, Epoch: 1, Number: 1}
	var statuses []protocol.Status
	for _, r := range tc.Send(t, c, []protocol.Message{txnMsg("tx", 0, a, 0, "1"), txnMsg("tx", 0, a, 1, "2"), txnMsg("tx", 0, a, 2, "3"), txnMsg("tx", 0, a, 3, "4")}) {
		statuses = append(statuses, r.Status)
	}
	if !slices.Equal(statuses, []protocol.Status{protocol.StatusOK, protocol.StatusOK, protocol.StatusOK, protocol.StatusTxnLimit}) {
		t.Fatalf("four messages in a transaction of at most 3: %v", statuses)
	}
	// Another producer instance's transactions count for the same id.
	b := protocol.TxnID{Producer: 5, Epoch: 2, Number: 1}
	if r := tc.Send(t, c, []protocol.Message{txnMsg("tx", 0, b, 0, "b")})[0]; r.Status != protocol.StatusOK {
		t.Fatalf("a second open transaction: %v", r.Status)
	}
	cc := protocol.TxnID{Producer: 5, Epoch: 2, Number: 2}
	if r := tc.Send(t, c, []protocol.Message{txnMsg("tx", 0, cc, 1, "c")})[0]; r.Status != protocol.StatusTxnLimit {
		t.Fatalf("a third open transaction of one producer: %v, want TXN_LIMIT", r.Status)
	}
	nothing := protocol.TxnID{Producer: 6, Epoch: 1, Number: 1}
	if rep, err := endTxn(t, c, nothing, true); err != nil || rep.Queues != 0 {
		t.Fatalf("TXN_END of a transaction with nothing here: %+v, %v", rep, err)
	}
	if _, err := endTxn(t, tc.Dial(t, g.Slave.Addr()), a, true); !errors.Is(err, protocol.ErrNotMaster) {
		t.Fatalf("TXN_END at the slave: %v, want NOT_MASTER", err)
	}
	if l := listTxns(t, c); len(l.Open) != 2 {
		t.Fatalf("open %+v, want two", l.Open)
	}
}

// A commit requires the log to hold the last message its producer was told
// was stored in each queue (else TXN_INCOMPLETE, and the transaction stays
// open); a commit waits for the sync set, so a group below its minimum
// refuses it before writing anything, while an abort goes through.
func TestTxnCommitChecks(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true})
	lone := tc.StartGroup(t, meta.Addrs(), "g2", tc.GroupOpts{})
	meta.CreateTopic(t, "tx", "g1", "g2")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "tx", 0)
	id := protocol.TxnID{Producer: 4, Epoch: 1, Number: 1}
	tc.Send(t, c, []protocol.Message{txnMsg("tx", 0, id, 0, "x"), txnMsg("tx", 0, id, 1, "y")})
	end := func(c *transport.Client, id protocol.TxnID, commit bool, seqs ...protocol.TxnSeq) (protocol.TxnEndReply, error) {
		var out protocol.TxnEndReply
		err := callDelayed(t, c, protocol.CodeTxnEnd, protocol.TxnEndRequest{Producer: id.Producer, Epoch: id.Epoch, Number: id.Number,
			Commit: commit, Seqs: seqs}, &out)
		return out, err
	}
	if _, err := end(c, id, true, protocol.TxnSeq{Topic: "tx", Queue: 0, Seq: 2}); protocol.StatusOf(err) != protocol.StatusTxnIncomplete {
		t.Fatalf("a commit naming a sequence the log lacks: %v, want TXN_INCOMPLETE", err)
	}
	if l := listTxns(t, c); len(l.Open) != 1 {
		t.Fatalf("after the refused commit: open %+v, want it still open", l.Open)
	}
	if rep, err := end(c, id, true, protocol.TxnSeq{Topic: "tx", Queue: 0, Seq: 1}); err != nil || !rep.Committed {
		t.Fatalf("a commit naming what the log holds: %+v, %v", rep, err)
	}
	got, _ := readQueue(t, c, "tx", 0, false)
	wantBodies(t, "after the commit", got, "probe", "x", "y")

	lc := tc.Dial(t, lone.Master.Addr())
	warmRoute(t, lc, "tx", 1)
	id2 := protocol.TxnID{Producer: 4, Epoch: 1, Number: 2}
	tc.Send(t, lc, []protocol.Message{txnMsg("tx", 1, id2, 0, "z")})
	if _, err := end(lc, id2, true); protocol.StatusOf(err) != protocol.StatusNotEnoughReplicas {
		t.Fatalf("a commit in a group below its minimum copies: %v, want NOT_ENOUGH_REPLICAS", err)
	}
	if rep, err := end(lc, id2, false); err != nil || rep.Committed || rep.Queues != 1 {
		t.Fatalf("an abort in a group below its minimum copies: %+v, %v", rep, err)
	}
}
