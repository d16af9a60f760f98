package producer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/protocol"
)

// fakeCluster is a metaserver with fake broker groups, and a topic whose
// queue i lives on groups[i].
func fakeCluster(t *testing.T, topic string, groups ...string) (*testcluster.Cluster, map[string]*fakeBroker) {
	t.Helper()
	c := testcluster.Start(t, testcluster.Opts{MetaEdit: testcluster.SteadyMeta})
	fakes := map[string]*fakeBroker{}
	for _, g := range groups {
		if fakes[g] == nil {
			fakes[g] = startFakeBroker(t, c.MetaAddr(), g)
		}
	}
	c.Meta.CreateTopic(t, topic, groups...)
	return c, fakes
}

// keyFor is a key whose queue, of n, is q.
func keyFor(q, n uint32) string {
	for i := 0; ; i++ {
		if k := fmt.Sprint("key-", i); clientcore.KeyHash(k)%n == q {
			return k
		}
	}
}

// byBody answers a message whose body has prefix by fn, others by the model.
func byBody(prefix string, fn func(attempt int) (protocol.Status, injectMode)) func(*protocol.Message, int) (protocol.Status, injectMode) {
	return func(m *protocol.Message, attempt int) (protocol.Status, injectMode) {
		if strings.HasPrefix(string(m.Body), prefix) {
			return fn(attempt)
		}
		return 0, noInject
	}
}

// A HIGH message answered SLAVE_SYNC_TIMEOUT after it was stored is
// retried on the same queue with the same stamp, and the retry is answered
// DUPLICATE with the original offsets: one copy.
func TestUnknownOutcomeRetriedPinned(t *testing.T) {
	c, fakes := fakeCluster(t, "pin", "g1", "g2")
	for _, f := range fakes {
		f.setInject(byBody("sync", func(attempt int) (protocol.Status, injectMode) {
			if attempt == 1 {
				return protocol.StatusSlaveSyncTimeout, storeThen
			}
			return 0, noInject
		}))
	}
	p := newProducer(t, c, RetryBackoff(5*time.Millisecond))
	r, err := p.Send(context.Background(), &Message{Topic: "pin", Body: []byte("sync"), Reliability: protocol.High})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Duplicate || r.PossibleDuplicate || r.ProducerID == 0 || r.Seq != 0 || r.QueueOffset != 0 {
		t.Fatalf("result %+v: want a duplicate of the first attempt, at offset 0, seq 0", r)
	}
	f := fakes[r.Group]
	recv := f.receivedCopy()
	if len(recv) != 2 {
		t.Fatalf("the broker got %d attempts, want 2", len(recv))
	}
	for _, m := range recv {
		if m.ID != r.ID || m.Queue != r.Queue || m.Producer != (protocol.ProducerStamp{ID: r.ProducerID, Epoch: r.Epoch, Seq: r.Seq}) {
			t.Fatalf("attempt %+v: not the same message, queue and stamp as the result %+v", m, r)
		}
	}
	if n := len(f.storedIn("pin", r.Queue)); n != 1 {
		t.Fatalf("%d copies stored", n)
	}
	for g, o := range fakes {
		if g != r.Group && len(o.receivedCopy()) != 0 {
			t.Fatalf("group %s got the retry", g)
		}
	}
	if st := p.Stats(); st.Duplicates != 1 || st.Retries != 1 || st.PossibleDuplicates != 0 || st.ProducerID != r.ProducerID {
		t.Fatalf("stats %+v", st)
	}
}

// An unkeyed message refused READ_ONLY moves to the other group, and its
// queue's sequence rewinds: the next message there takes the refused one's
// sequence, under the same identity, with no OUT_OF_ORDER_SEQUENCE.
func TestRefusedUnkeyedMovesAndRewinds(t *testing.T) {
	c, fakes := fakeCluster(t, "mv", "g1", "g2")
	fakes["g1"].setInject(byBody("refuse", func(int) (protocol.Status, injectMode) { return protocol.StatusReadOnly, refuse }))
	p := newProducer(t, c, RetryBackoff(5*time.Millisecond))
	ctx := context.Background()
	// Round-robin over two queues: one of two sends goes to g1 first.
	for i := range 2 {
		r, err := p.Send(ctx, &Message{Topic: "mv", Body: []byte(fmt.Sprint("refuse-", i))})
		if err != nil {
			t.Fatal(err)
		}
		if r.Group != "g2" || r.PossibleDuplicate {
			t.Fatalf("result %+v: want moved to g2, not flagged", r)
		}
	}
	recv := fakes["g1"].receivedCopy()
	if len(recv) == 0 {
		t.Fatal("no message went to g1 first")
	}
	refused := recv[0].Producer
	// Plain messages until one lands on g1.
	for i := 0; len(fakes["g1"].storedIn("mv", 0)) == 0; i++ {
		if i == 10 {
			t.Fatal("no plain message reached g1")
		}
		if _, err := p.Send(ctx, &Message{Topic: "mv", Body: []byte(fmt.Sprint("plain-", i))}); err != nil {
			t.Fatal(err)
		}
	}
	got := fakes["g1"].storedIn("mv", 0)[0].Producer
	if got != refused {
		t.Fatalf("the next message on the refused queue has stamp %+v, want the refused one's %+v", got, refused)
	}
	if st := p.Stats(); st.OutOfOrder != 0 || st.PossibleDuplicates != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Keyed messages refused READ_ONLY wait for their queue: retried there
// until it takes them, never moved, stored in send order with exact
// sequences.
func TestRefusedKeyedWaits(t *testing.T) {
	c, fakes := fakeCluster(t, "kw", "g1", "g2")
	fakes["g1"].setInject(byBody("k-", func(attempt int) (protocol.Status, injectMode) {
		if attempt <= 3 {
			return protocol.StatusReadOnly, refuse
		}
		return 0, noInject
	}))
	p := newProducer(t, c, RetryBackoff(5*time.Millisecond))
	key := keyFor(0, 2)
	pr := newPromises(t)
	for i := range 20 {
		p.SendAsync(context.Background(), &Message{Topic: "kw", Key: key, Body: []byte(fmt.Sprint("k-", i))}, pr.next(i))
	}
	if err := p.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	pr.wg.Wait()
	if len(pr.errs) != 0 {
		t.Fatal(pr.errs[0])
	}
	for _, r := range pr.results {
		if r.Group != "g1" || r.Queue != 0 || r.PossibleDuplicate {
			t.Fatalf("keyed result %+v moved", r)
		}
	}
	if n := len(fakes["g2"].receivedCopy()); n != 0 {
		t.Fatalf("%d keyed attempts went to g2", n)
	}
	stored := fakes["g1"].storedIn("kw", 0)
	if len(stored) != 20 {
		t.Fatalf("%d stored", len(stored))
	}
	for i, m := range stored {
		if string(m.Body) != fmt.Sprint("k-", i) || m.Producer.Seq != int64(i) {
			t.Fatalf("stored #%d: %q seq %d", i, m.Body, m.Producer.Seq)
		}
	}
	if st := p.Stats(); st.Retries == 0 || st.OutOfOrder != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A message whose first attempt had an unknown outcome (stored, answered
// TIMEOUT) and which then moves (refused, and allowed to move, keyed as it
// is: MoveKeyedOnFailure and MoveOnUnknownOutcome) is flagged a possible
// duplicate, and counted. It is indeed stored twice.
func TestMovedAfterUnknownIsFlagged(t *testing.T) {
	c, fakes := fakeCluster(t, "fl", "g1", "g2")
	fakes["g1"].setInject(byBody("flag", func(attempt int) (protocol.Status, injectMode) {
		if attempt == 1 {
			return protocol.StatusTimeout, storeThen
		}
		return protocol.StatusNotMaster, refuse
	}))
	p := newProducer(t, c, RetryBackoff(5*time.Millisecond), MoveKeyedOnFailure(true), MoveOnUnknownOutcome(true))
	r, err := p.Send(context.Background(), &Message{Topic: "fl", Key: keyFor(0, 2), Body: []byte("flag")})
	if err != nil {
		t.Fatal(err)
	}
	if r.Group != "g2" || !r.PossibleDuplicate || r.Duplicate {
		t.Fatalf("result %+v: want moved to g2 and flagged", r)
	}
	if a, b := len(fakes["g1"].storedIn("fl", 0)), len(fakes["g2"].storedIn("fl", 1)); a != 1 || b != 1 {
		t.Fatalf("stored %d on g1, %d on g2: want the possible duplicate on both", a, b)
	}
	if st := p.Stats(); st.PossibleDuplicates != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// countingIDs hands out ids 101, 102, ... at epoch 0.
type countingIDs struct{ calls atomic.Int64 }

func (s *countingIDs) initProducer(context.Context, string) (uint64, uint16, error) {
	return uint64(100 + s.calls.Add(1)), 0, nil
}

// OUT_OF_ORDER_SEQUENCE takes a new identity and restarts the queue at 0.
func TestOutOfOrderRenewsIdentity(t *testing.T) {
	c, fakes := fakeCluster(t, "oo", "g1")
	fakes["g1"].setInject(byBody("gap", func(attempt int) (protocol.Status, injectMode) {
		if attempt == 1 {
			return protocol.StatusOutOfOrderSequence, refuse
		}
		return 0, noInject
	}))
	ids := &countingIDs{}
	p := newProducer(t, c, RetryBackoff(5*time.Millisecond), withIdentitySource(ids))
	ctx := context.Background()
	first, err := p.Send(ctx, &Message{Topic: "oo", Body: []byte("first")})
	if err != nil {
		t.Fatal(err)
	}
	r, err := p.Send(ctx, &Message{Topic: "oo", Body: []byte("gap")})
	if err != nil {
		t.Fatal(err)
	}
	after, err := p.Send(ctx, &Message{Topic: "oo", Body: []byte("after")})
	if err != nil {
		t.Fatal(err)
	}
	if first.ProducerID != 101 || first.Seq != 0 || r.ProducerID != 102 || r.Seq != 0 || after.ProducerID != 102 || after.Seq != 1 {
		t.Fatalf("stamps %d/%d, %d/%d, %d/%d: want 101/0, then a new identity 102 from 0",
			first.ProducerID, first.Seq, r.ProducerID, r.Seq, after.ProducerID, after.Seq)
	}
	if st := p.Stats(); ids.calls.Load() != 2 || st.OutOfOrder != 1 || st.Renewals != 1 || st.ProducerID != 102 {
		t.Fatalf("%d identities; stats %+v", ids.calls.Load(), st)
	}
}

// A message whose outcome is unknown (a TIMEOUT; its master had not
// stored it) and that then meets OUT_OF_ORDER_SEQUENCE (a new master after
// a failover lacks a message the old one acknowledged before it) does not
// keep waiting with its stamp, which that broker will never take: it is
// re-stamped under the new identity and stored, flagged as a possible
// duplicate (a copy may be in the old master's cut tail; the queue's log
// has none, since the broker lacks an earlier sequence of ours there).
func TestUnknownThenOutOfOrderRestamps(t *testing.T) {
	c, fakes := fakeCluster(t, "uoo", "g1")
	fakes["g1"].setInject(byBody("m", func(attempt int) (protocol.Status, injectMode) {
		switch attempt {
		case 1:
			return protocol.StatusTimeout, refuse
		case 2:
			return protocol.StatusOutOfOrderSequence, refuse
		}
		return 0, noInject
	}))
	ids := &countingIDs{}
	p := newProducer(t, c, RetryBackoff(5*time.Millisecond), withIdentitySource(ids))
	r, err := p.Send(context.Background(), &Message{Topic: "uoo", Body: []byte("m")})
	if err != nil {
		t.Fatal(err)
	}
	if r.ProducerID != 102 || r.Seq != 0 || !r.PossibleDuplicate || r.Duplicate {
		t.Fatalf("result %+v: want re-stamped under the new identity 102 at seq 0, flagged", r)
	}
	if n := len(fakes["g1"].storedIn("uoo", 0)); n != 1 {
		t.Fatalf("%d stored", n)
	}
	if st := p.Stats(); st.OutOfOrder != 1 || st.Renewals != 1 || st.PossibleDuplicates != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A later instance of a named producer fences the earlier one: its next
// message fails with ErrFenced, and so does every later send.
func TestFencedFails(t *testing.T) {
	c, _ := fakeCluster(t, "fe", "g1")
	ctx := context.Background()
	p1 := newProducer(t, c, Identity("svc"))
	r1, err := p1.Send(ctx, &Message{Topic: "fe", Body: []byte("a")})
	if err != nil {
		t.Fatal(err)
	}
	p2 := newProducer(t, c, Identity("svc"))
	r2, err := p2.Send(ctx, &Message{Topic: "fe", Body: []byte("b")})
	if err != nil {
		t.Fatal(err)
	}
	if r2.ProducerID != r1.ProducerID || r2.Epoch <= r1.Epoch {
		t.Fatalf("second instance %d/%d, first %d/%d: want the same id at a higher epoch", r2.ProducerID, r2.Epoch, r1.ProducerID, r1.Epoch)
	}
	_, err = p1.Send(ctx, &Message{Topic: "fe", Body: []byte("c")})
	if !errors.Is(err, ErrFenced) || !errors.Is(err, &protocol.Error{Status: protocol.StatusProducerFenced}) {
		t.Fatalf("the fenced instance's send: %v", err)
	}
	if _, err := p1.Send(ctx, &Message{Topic: "fe", Body: []byte("d")}); !errors.Is(err, ErrFenced) {
		t.Fatalf("a send after fencing: %v", err)
	}
}

// With idempotence off, messages carry no stamp and no identity is taken.
func TestIdempotenceOff(t *testing.T) {
	c, fakes := fakeCluster(t, "off", "g1")
	ids := &countingIDs{}
	p := newProducer(t, c, Idempotence(false), withIdentitySource(ids))
	r, err := p.Send(context.Background(), &Message{Topic: "off", Body: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if r.ProducerID != 0 || ids.calls.Load() != 0 || p.Stats().ProducerID != 0 {
		t.Fatalf("result %+v, %d identities", r, ids.calls.Load())
	}
	for _, m := range fakes["g1"].receivedCopy() {
		if !m.Producer.IsZero() {
			t.Fatalf("stamped: %+v", m.Producer)
		}
	}
}

// A DUPLICATE answer is a success carrying the original's offsets.
func TestDuplicateIsSuccess(t *testing.T) {
	c, fakes := fakeCluster(t, "dup", "g1")
	fakes["g1"].setInject(byBody("dup", func(int) (protocol.Status, injectMode) { return protocol.StatusDuplicate, refuse }))
	p := newProducer(t, c)
	r, err := p.Send(context.Background(), &Message{Topic: "dup", Body: []byte("dup")})
	if err != nil || !r.Duplicate || r.QueueOffset != -1 {
		t.Fatalf("result %+v, %v: want a duplicate with an unknown offset", r, err)
	}
	if p.Stats().Duplicates != 1 {
		t.Fatalf("stats %+v", p.Stats())
	}
}

// Fault-free pipelined sends, five batches in flight per group over many
// queues and small batches, against real brokers: read back with PULL,
// every queue holds its messages in send order with sequences 0, 1, 2...,
// and every key's messages are in send order.
func TestPipelinedOrder(t *testing.T) {
	c := start(t, false, "g1", "g2")
	groups := []string{"g1", "g2", "g1", "g2", "g1", "g2", "g1", "g2", "g1", "g2", "g1", "g2"}
	c.Meta.CreateTopic(t, "pipe", groups...)
	p := newProducer(t, c, MaxInflightPerGroup(5), MaxBatchBytes(2048), Linger(0))
	// A broker answers its first message of a new topic NO_ROUTE (its route
	// cache looks the topic up): warm every queue up, so that nothing fails
	// below and even unkeyed messages keep their order.
	for q := range groups {
		if _, err := p.Send(context.Background(), &Message{Topic: "pipe", Key: keyFor(uint32(q), uint32(len(groups))), Body: []byte("warm")}); err != nil {
			t.Fatal(err)
		}
	}
	const n, keys = 6000, 40
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		m := &Message{Topic: "pipe", Body: []byte(fmt.Sprintf("%d/%d", i%keys, i))}
		if i%3 != 0 {
			m.Key = fmt.Sprint("k", i%keys)
		}
		p.SendAsync(context.Background(), m, func(_ Result, err error) {
			defer wg.Done()
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	if err := p.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d failed; first: %v", len(errs), errs[0])
	}
	total := 0
	lastOfKey := map[string]int{}
	route, _ := cachedRoute(p, "pipe")
	for _, qr := range route.Queues {
		q := qr.Queue
		tc := testcluster.Dial(t, c.Master(qr.Group).Addr())
		msgs := testcluster.PullAll(t, tc, "pipe", q)
		last := -1
		for j, sm := range msgs {
			m := sm.Message
			if m.Producer.Seq != int64(j) {
				t.Fatalf("queue %d: offset %d has seq %d", q, j, m.Producer.Seq)
			}
			if string(m.Body) == "warm" {
				continue
			}
			total++
			var k, i int
			if _, err := fmt.Sscanf(string(m.Body), "%d/%d", &k, &i); err != nil {
				t.Fatal(err)
			}
			if i <= last {
				t.Fatalf("queue %d: message %d stored after %d", q, i, last)
			}
			last = i
			if key := keyOf(m); key != "" {
				if prev, ok := lastOfKey[key]; ok && i <= prev {
					t.Fatalf("key %s: message %d stored after %d", key, i, prev)
				}
				lastOfKey[key] = i
			}
		}
	}
	if total != n {
		t.Fatalf("%d stored, want %d", total, n)
	}
}

func keyOf(m protocol.Message) string {
	for _, p := range m.Properties {
		if p.Key == "key" {
			return p.Value
		}
	}
	return ""
}
