package producer

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
)

// flakyIDs fails its first call (metaserver unreachable), then hands out 201, 202...
type flakyIDs struct{ calls atomic.Int64 }

func (s *flakyIDs) initProducer(context.Context, string) (uint64, uint16, error) {
	n := s.calls.Add(1)
	if n == 1 {
		return 0, 0, client.ErrNoNode
	}
	return uint64(200 + n), 0, nil
}

// A keyed message whose dispatch fails (no identity yet, or no route) is
// retried, and the same key's next message waits behind it instead of
// overtaking it.
func TestKeyedOrderKeptWhenDispatchFails(t *testing.T) {
	c, fakes := fakeCluster(t, "ro", "g1")
	p := newProducer(t, c, RetryBackoff(20*time.Millisecond), withIdentitySource(&flakyIDs{}))
	pr := newPromises(t)
	for i := range 2 {
		p.SendAsync(context.Background(), &Message{Topic: "ro", Key: "k", Body: []byte(fmt.Sprint("k-", i))}, pr.next(i))
	}
	if err := p.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	pr.wg.Wait()
	if len(pr.errs) != 0 {
		t.Fatal(pr.errs[0])
	}
	stored := fakes["g1"].storedIn("ro", 0)
	for i, m := range stored {
		t.Logf("stored #%d: %s seq %d", i, m.Body, m.Producer.Seq)
	}
	if string(stored[0].Body) != "k-0" {
		t.Fatalf("key k stored out of send order: %q first", stored[0].Body)
	}
}

// A record that may be stored (its first attempt timed out) and whose retry
// then fails for good never gives its sequence to another message: the next
// message is stored under a new sequence, not answered DUPLICATE with the
// first one's offsets.
func TestMaybeStoredSequenceNeverReused(t *testing.T) {
	c, fakes := fakeCluster(t, "fd", "g1")
	fakes["g1"].setInject(byBody("A", func(attempt int) (protocol.Status, injectMode) {
		if attempt == 1 {
			return protocol.StatusTimeout, storeThen
		}
		return protocol.StatusMessageTooLarge, refuse
	}))
	p := newProducer(t, c, RetryBackoff(5*time.Millisecond))
	ctx := context.Background()
	_, errA := p.Send(ctx, &Message{Topic: "fd", Body: []byte("A")})
	t.Logf("A: %v", errA)
	r, err := p.Send(ctx, &Message{Topic: "fd", Body: []byte("N")})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range fakes["g1"].storedIn("fd", r.Queue) {
		t.Logf("stored: %s seq %d", m.Body, m.Producer.Seq)
	}
	if r.Duplicate {
		t.Fatalf("new message N acknowledged as DUPLICATE %+v, but it is not stored", r)
	}
}

// Real broker: a keyed HIGH message refused SLAVE_LAGGING (a check before
// the dedupe) in a queue's first run is not overtaken by the key's next
// message in the same run, although the broker has no state for the
// producer there yet: the broker refuses the later one too.
func TestRefusedFirstRecordNotOvertaken(t *testing.T) {
	c := start(t, false, "g1")
	c.Meta.CreateTopic(t, "mix", "g1")
	warm := newProducer(t, c)
	if _, err := warm.Send(context.Background(), &Message{Topic: "mix", Body: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	p := newProducer(t, c, Linger(100*time.Millisecond), RetryBackoff(20*time.Millisecond))
	pr := newPromises(t)
	p.SendAsync(context.Background(), &Message{Topic: "mix", Key: "k", Body: []byte("k-0"), Reliability: protocol.High}, pr.next(0))
	p.SendAsync(context.Background(), &Message{Topic: "mix", Key: "k", Body: []byte("k-1")}, pr.next(1))
	testwait.For(t, 10*time.Second, "a refusal while the group has no slave", func() bool { return p.Stats().Retries > 0 })
	c.Groups["g1"].StartSlave(t)
	pr.wg.Wait()
	if len(pr.errs) != 0 {
		t.Fatal(pr.errs[0])
	}
	tc := testcluster.Dial(t, c.Master("g1").Addr())
	var order []string
	for _, m := range testcluster.PullAll(t, tc, "mix", 0) {
		order = append(order, fmt.Sprintf("%s/seq%d", m.Message.Body, m.Message.Producer.Seq))
	}
	t.Logf("queue 0: %v", order)
	for _, r := range pr.results {
		t.Logf("%s: seq %d qo %d", r.ID, r.Seq, r.QueueOffset)
	}
	if len(order) < 3 || order[len(order)-2][:3] != "k-0" {
		t.Fatalf("key k out of send order: %v", order)
	}
}
