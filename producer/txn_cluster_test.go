package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
)

// committedBodies reads every queue of topic, as a reader of committed
// messages, from each group's master, and returns the bodies in queue
// order (queue by queue).
func committedBodies(t *testing.T, c *testcluster.Cluster, topic string, queues int) []string {
	t.Helper()
	route, err := c.Meta.Client(t).Route(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for q := range queues {
		tc := testcluster.Dial(t, c.Master(route.Queues[q].Group).Addr())
		out = append(out, readCommitted(t, tc, topic, uint32(q))...)
	}
	return out
}

func readCommitted(t *testing.T, tc *transport.Client, topic string, queue uint32) []string {
	t.Helper()
	var out []string
	for next := int64(0); ; {
		pr := testcluster.Pull(t, tc, topic, queue, next, 1<<20)
		for _, m := range pr.Messages {
			out = append(out, string(m.Message.Body))
		}
		if pr.NextOffset == next {
			return out
		}
		next = pr.NextOffset
	}
}

// oneCopy lets groups without a slave take HIGH messages and commits (a
// commit waits for the sync set, as HIGH does).
func oneCopy(t *testing.T, c *testcluster.Cluster, groups ...string) {
	t.Helper()
	for _, g := range groups {
		if _, err := c.Meta.Client(t).SetGroupPolicy(context.Background(), api.GroupPolicyRequest{Group: g, MinInSync: 1}); err != nil {
			t.Fatal(err)
		}
	}
}

func mustJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
}

func bodies(prefix string, n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("%s-%d", prefix, i))
	}
	return out
}

// Through a real broker: a transaction's messages are delivered only once
// it committed, all of them; an aborted one's never; a message after the
// end is refused; SendInTxn commits when the work succeeds and aborts when
// it fails; one producer runs one transaction at a time, and only a named
// one runs any.
func TestTxnCommitAndAbort(t *testing.T) {
	c := start(t, false, "g1")
	oneCopy(t, c, "g1")
	c.Meta.CreateTopic(t, "tx", "g1", "g1")
	p := newProducer(t, c, Identity("txp"), Linger(0))
	ctx := context.Background()

	txn, err := p.BeginTxn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.BeginTxn(ctx); !errors.Is(err, ErrTxnInProgress) {
		t.Fatalf("a second BeginTxn: %v", err)
	}
	for _, b := range bodies("c", 10) {
		if _, err := txn.Send(ctx, &Message{Topic: "tx", Body: []byte(b)}); err != nil {
			t.Fatal(err)
		}
	}
	if got := committedBodies(t, c, "tx", 2); len(got) != 0 {
		t.Fatalf("read before the commit: %q", got)
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := committedBodies(t, c, "tx", 2)
	slices.Sort(got)
	if want := bodies("c", 10); !slices.Equal(got, want) {
		t.Fatalf("after the commit: %q, want %q", got, want)
	}
	if _, err := txn.Send(ctx, &Message{Topic: "tx", Body: []byte("late")}); !errors.Is(err, ErrTxnEnded) {
		t.Fatalf("a send after the commit: %v", err)
	}

	ab, err := p.BeginTxn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bodies("a", 5) {
		ab.SendAsync(ctx, &Message{Topic: "tx", Body: []byte(b)}, func(Result, error) {})
	}
	if err := ab.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.SendInTxn(ctx, []*Message{{Topic: "tx", Body: []byte("work-failed")}}, func(context.Context) error {
		return errors.New("the database refused")
	}); err == nil {
		t.Fatal("SendInTxn with failing work succeeded")
	}
	if _, err := p.SendInTxn(ctx, []*Message{{Topic: "tx", Body: []byte("work-ok")}}, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	got = committedBodies(t, c, "tx", 2)
	slices.Sort(got)
	if want := append(bodies("c", 10), "work-ok"); !slices.Equal(got, want) {
		t.Fatalf("after the aborts: %q, want %q", got, want)
	}
	if s := p.Stats(); s.TxnCommits != 2 || s.TxnAborts != 2 {
		t.Fatalf("stats %+v: want 2 commits and 2 aborts", s)
	}
	anon := newProducer(t, c)
	if _, err := anon.BeginTxn(ctx); !errors.Is(err, ErrTxnNeedsIdentity) {
		t.Fatalf("an anonymous producer's BeginTxn: %v", err)
	}

	// Close aborts the open transaction: its readers need not wait for the
	// broker's timeout.
	closing := newProducer(t, c, Identity("closing"), Linger(0))
	left, err := closing.BeginTxn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := left.Send(ctx, &Message{Topic: "tx", Body: []byte("left")}); err != nil {
		t.Fatal(err)
	}
	if err := closing.Close(); err != nil {
		t.Fatal(err)
	}
	var l protocol.TxnList
	resp, err := testcluster.Dial(t, c.Master("g1").Addr()).Call(ctx, protocol.CodeTxnList, []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	mustJSON(t, resp.Body, &l)
	if len(l.Open) != 0 {
		t.Fatalf("open after Close: %+v", l.Open)
	}
}

// A transaction's unkeyed messages follow the first one's group (one
// group, one write); keyed ones go to their queues' groups, and such a
// transaction is prepared on each group and decided by the registry: none
// of it is delivered before the commit, all of it after; an abort over two
// groups delivers nothing.
func TestTxnSpansGroups(t *testing.T) {
	c := start(t, false, "g1", "g2")
	oneCopy(t, c, "g1", "g2")
	c.Meta.CreateTopic(t, "tx", "g1", "g2")
	p := newProducer(t, c, Identity("txp"), Linger(0))
	ctx := context.Background()
	txn, err := p.BeginTxn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]bool{}
	for range 6 {
		r, err := txn.Send(ctx, &Message{Topic: "tx", Body: []byte("one-group")})
		if err != nil {
			t.Fatal(err)
		}
		groups[r.Group] = true
	}
	if len(groups) != 1 {
		t.Fatalf("unkeyed messages of one transaction went to groups %v", groups)
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	two, err := p.BeginTxn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := range 8 { // some keys hash to each of the two queues
		if _, err := two.Send(ctx, &Message{Topic: "tx", Key: fmt.Sprint("k", k), Body: []byte("two-groups")}); err != nil {
			t.Fatal(err)
		}
	}
	if got := committedBodies(t, c, "tx", 2); len(got) != 6 {
		t.Fatalf("read %q before the commit over two groups: want the 6 of the first transaction only", got)
	}
	if err := two.Commit(ctx); err != nil {
		t.Fatalf("a commit over two groups: %v", err)
	}
	if got := committedBodies(t, c, "tx", 2); len(got) != 14 {
		t.Fatalf("read %q after the commit over two groups: want all 14", got)
	}
	d, err := c.Meta.Client(t).TxnDecisions(ctx, api.TxnDecisionsRequest{Producer: two.ID().Producer})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Records) > 1 || len(d.Records) == 1 && (!d.Records[0].Committed || len(d.Records[0].Groups) != 2) {
		t.Fatalf("the registry holds %+v: want the commit over g1 and g2 (or nothing, once both reported)", d.Records)
	}

	// An abort over two groups goes through the registry too.
	three, err := p.BeginTxn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := range 8 {
		if _, err := three.Send(ctx, &Message{Topic: "tx", Key: fmt.Sprint("k", k), Body: []byte("aborted")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := three.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if got := committedBodies(t, c, "tx", 2); len(got) != 14 || slices.Contains(got, "aborted") {
		t.Fatalf("read %q after the abort over two groups", got)
	}
}

// A transaction left open by an instance that went away is resolved by
// the next instance of the same Identity with its checker: committed,
// aborted, or, answered unknown MaxTxnChecks times, aborted by checks.
func TestTxnChecker(t *testing.T) {
	c := start(t, false, "g1")
	oneCopy(t, c, "g1")
	c.Meta.CreateTopic(t, "tx", "g1")
	ctx := context.Background()
	leave := func(name, body string) protocol.TxnID {
		p := newProducer(t, c, Identity(name), Linger(0))
		txn, err := p.BeginTxn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := txn.Send(ctx, &Message{Topic: "tx", Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
		// Left open, as by a process that died: a later instance of the
		// identity fences this one (Close would abort it).
		return txn.ID()
	}
	committed := leave("keep", "kept")
	dropped := leave("drop", "dropped")
	unsure := leave("unsure", "unsure")
	var asked atomic.Int64
	decide := map[string]TxnDecision{"keep": TxnCommit, "drop": TxnAbort, "unsure": TxnUnknown}
	for name, d := range decide {
		newProducer(t, c, Identity(name), TxnCheckInterval(20*time.Millisecond), CheckTxns(func(_ context.Context, tx TxnCheck) TxnDecision {
			asked.Add(1)
			if tx.Group != "g1" || len(tx.Queues) != 1 || tx.Queues[0].Topic != "tx" {
				t.Errorf("check of %+v", tx)
			}
			return d
		}, "tx"))
	}
	tc := testcluster.Dial(t, c.Master("g1").Addr())
	testwait.For(t, 20*time.Second, "every left transaction to be resolved", func() bool {
		var l protocol.TxnList
		resp, err := tc.Call(ctx, protocol.CodeTxnList, []byte("{}"))
		if err != nil {
			t.Fatal(err)
		}
		mustJSON(t, resp.Body, &l)
		return len(l.Open) == 0
	})
	if got := readCommitted(t, tc, "tx", 0); !slices.Equal(got, []string{"kept"}) {
		t.Fatalf("read %q, want only the committed one", got)
	}
	var l protocol.TxnList
	resp, _ := tc.Call(ctx, protocol.CodeTxnList, []byte("{}"))
	mustJSON(t, resp.Body, &l)
	by := map[string]string{}
	for _, d := range l.Decided {
		by[d.ID] = fmt.Sprint(d.Committed, "/", d.By)
	}
	want := map[string]string{committed.String(): "true/checker", dropped.String(): "false/checker", unsure.String(): "false/checks"}
	for id, w := range want {
		if by[id] != w {
			t.Errorf("transaction %s decided %q, want %q (all: %v)", id, by[id], w, by)
		}
	}
	if n := asked.Load(); n < MaxTxnChecks+2 {
		t.Errorf("the checkers were asked %d times, want at least %d", n, MaxTxnChecks+2)
	}
}
