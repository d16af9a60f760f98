package consumer

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/sdk"
)

// txnEnv is a cluster (no coordinator fake: the registry checks the
// offsets) with topic "in" of queues on g1 and "out", taking commits
// without a slave.
func txnEnv(t *testing.T, inQueues int) *env {
	t.Helper()
	e := startEnv(t, []string{"g1"}, false)
	groups := make([]string, inQueues)
	for i := range groups {
		groups[i] = "g1"
	}
	e.cl.Meta.CreateTopic(t, "in", groups...)
	e.cl.Meta.CreateTopic(t, "out", "g1")
	// A commit waits for the group's sync set: one copy suffices here.
	if _, err := e.meta.SetGroupPolicy(context.Background(), api.GroupPolicyRequest{Group: "g1", MinInSync: 1}); err != nil {
		t.Fatal(err)
	}
	return e
}

func txnProducer(t *testing.T, e *env, name string) *producer.Client {
	t.Helper()
	p, err := producer.New(sdk.MetaAddrs(e.cl.MetaAddr()), producer.Identity(name), producer.DeliveryTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// transform sends one output per input in a transaction carrying the
// inputs' offsets, and commits it (or aborts it, abort set).
func transform(t *testing.T, c *Consumer, p *producer.Client, batch []*Message, abort bool) (*api.CommitRequest, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := c.TxnOffsets(batch...)
	if err != nil {
		return nil, err
	}
	txn, err := p.BeginTxn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range batch {
		if _, err := txn.Send(ctx, &producer.Message{Topic: "out", Body: m.Body, Properties: map[string]string{"input": m.ID}}); err != nil {
			t.Fatal(err)
		}
	}
	txn.CommitOffsets(offs)
	if abort {
		if err := txn.Abort(ctx); err != nil {
			t.Fatal(err)
		}
		return offs, producer.ErrTxnAborted
	}
	return offs, txn.Commit(ctx)
}

// pollN polls until it has n messages (bounded).
func pollN(t *testing.T, c *Consumer, n int) []*Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*Message
	for len(out) < n {
		ms, err := c.Poll(ctx)
		if err != nil {
			t.Fatalf("poll (%d of %d): %v", len(out), n, err)
		}
		out = append(out, ms...)
	}
	return out
}

func bodiesOf(ms []*Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, string(m.Body))
	}
	slices.Sort(out)
	return out
}

// TestTxnOffsets: a consume-transform-produce loop through a real
// registry. The group's offset moves only when a transaction carrying it
// commits (not with the member's own commit of unmarked messages); an
// aborted transaction's inputs are delivered again, and committed with the
// next; after TxnCommitted the consumer's Close does not move the offset
// back, and a second member starts past the committed inputs.
func TestTxnOffsets(t *testing.T) {
	e := txnEnv(t, 1)
	send(t, e, "in", "in", 10)
	p := txnProducer(t, e, "xform")
	c := e.consumer(t, "xform", []string{"in"}, ManualCommit(), MaxPollRecords(10))
	if _, err := c.TxnOffsets(); err == nil {
		t.Fatal("TxnOffsets before Poll: no error")
	}
	batch := pollN(t, c, 10)

	// The member's own commit does not pass the transaction's inputs.
	if err := c.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if off := e.committed(t, "xform", "in", 0); off > 0 {
		t.Fatalf("committed %d before any transaction", off)
	}

	// Aborted: nothing committed, the inputs come again.
	req, err := transform(t, c, p, batch, true)
	if !errors.Is(err, producer.ErrTxnAborted) {
		t.Fatal(err)
	}
	if got := req.Offsets; len(got) != 1 || got[0].Offset != 10 || req.Incarnation != 0 || req.Generation == 0 {
		t.Fatalf("offsets %+v", req)
	}
	c.TxnAborted(req)
	if _, err := c.TxnOffsets(batch...); !errors.Is(err, ErrQueueLost) {
		t.Fatalf("TxnOffsets of a void batch: %v", err)
	}
	again := pollN(t, c, 10)
	if !slices.Equal(bodiesOf(again), bodiesOf(batch)) {
		t.Fatalf("delivered again %v, want %v", bodiesOf(again), bodiesOf(batch))
	}
	if off := e.committed(t, "xform", "in", 0); off > 0 {
		t.Fatalf("committed %d after an abort", off)
	}

	// Committed: the offset moves with it.
	req, err = transform(t, c, p, again, false)
	if err != nil {
		t.Fatal(err)
	}
	c.TxnCommitted(req)
	if off := e.committed(t, "xform", "in", 0); off != 10 {
		t.Fatalf("committed %d after the transaction, want 10", off)
	}
	if _, err := c.TxnOffsets(again...); err == nil {
		t.Fatal("TxnOffsets of committed inputs: no error")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if off := e.committed(t, "xform", "in", 0); off != 10 {
		t.Fatalf("committed %d after Close, want 10", off)
	}

	// The next member starts past them.
	send(t, e, "in", "later", 1)
	d := e.consumer(t, "xform", []string{"in"}, ManualCommit())
	if next := pollN(t, d, 1); len(next) != 1 || string(next[0].Body) != "later-0" {
		t.Fatalf("next member got %v", bodiesOf(next))
	}
}

// TestTxnOffsetsNeedPoll: a consumer whose own commits could pass a
// transaction's inputs (auto commit) gets no transaction offsets.
func TestTxnOffsetsNeedPoll(t *testing.T) {
	e := txnEnv(t, 1)
	send(t, e, "in", "in", 1)
	c := e.consumer(t, "auto", []string{"in"})
	ms := pollN(t, c, 1)
	if _, err := c.TxnOffsets(ms...); !errors.Is(err, errTxnNeedsPoll) {
		t.Fatalf("TxnOffsets with auto commit: %v", err)
	}
}

// TestTxnOffsetsQueueLost: a member whose queue another member took gets
// ErrQueueLost for its messages, and a transaction carrying offsets built
// before the move is refused by the registry (the producer's Commit
// aborts it): the new owner transforms those inputs, once. The batch is
// void: the member delivers its kept queue's messages again.
func TestTxnOffsetsQueueLost(t *testing.T) {
	e := txnEnv(t, 2)
	send(t, e, "in", "in", 20)
	p := txnProducer(t, e, "xform")
	a := e.consumer(t, "xform", []string{"in"}, MemberID("a"), ManualCommit())
	batch := pollN(t, a, 20) // both queues' messages
	req, err := a.TxnOffsets(batch...)
	if err != nil {
		t.Fatal(err)
	}
	if len(req.Offsets) != 2 {
		t.Fatalf("offsets of %d queues, want 2", len(req.Offsets))
	}

	b := e.consumer(t, "xform", []string{"in"}, MemberID("b"), ManualCommit())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	polled := make(chan []*Message, 1)
	go func() {
		ms, _ := b.Poll(ctx) // joins; its queue comes once a let it go
		polled <- ms
	}()
	waitFor(t, 10*time.Second, "b to take a queue from a", func() bool { return len(queuesOf(a)) == 1 })
	if _, err := a.TxnOffsets(batch...); !errors.Is(err, ErrQueueLost) {
		t.Fatalf("TxnOffsets of a lost queue: %v", err)
	}
	// The batch is void: a delivers its messages of the queue it kept
	// again, and transforms them in a transaction that commits.
	var kept []string
	for q := range queuesOf(a) {
		for _, m := range batch {
			if m.Queue == q.queue {
				kept = append(kept, string(m.Body))
			}
		}
	}
	slices.Sort(kept)
	again := pollN(t, a, len(kept))
	if got := bodiesOf(again); !slices.Equal(got, kept) {
		t.Fatalf("a delivered again %v, want its kept queue's %v", got, kept)
	}
	keptReq, err := transform(t, a, p, again, false)
	if err != nil {
		t.Fatal(err)
	}
	a.TxnCommitted(keptReq)

	tctx, tcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer tcancel()
	txn, err := p.BeginTxn(tctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := txn.Send(tctx, &producer.Message{Topic: "out", Body: []byte("zombie")}); err != nil {
		t.Fatal(err)
	}
	txn.CommitOffsets(req)
	if err := txn.Commit(tctx); !errors.Is(err, producer.ErrTxnAborted) {
		t.Fatalf("commit with a lost queue's offsets: %v, want ErrTxnAborted", err)
	}
	a.TxnAborted(req)
	for _, o := range req.Offsets {
		kept := queuesOf(a)[qkey{o.Topic, o.Queue}]
		if off := e.committed(t, "xform", "in", o.Queue); kept && off != o.Offset || !kept && off > 0 {
			t.Fatalf("queue %d (kept by a: %v) committed %d after a's transactions", o.Queue, kept, off)
		}
	}
	var got []*Message
	select {
	case got = <-polled:
	case <-time.After(10 * time.Second):
		t.Fatal("b received nothing")
	}
	if len(got) == 0 {
		t.Fatal("b's poll ended empty")
	}
	// b's queue's inputs are b's to transform: from the start.
	if got[0].Offset != 0 {
		t.Fatalf("b starts at offset %d, want 0", got[0].Offset)
	}
}
