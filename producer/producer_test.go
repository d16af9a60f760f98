package producer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

func TestSendSyncAndAsync(t *testing.T) {
	c := start(t, true, "g1", "g2")
	c.Meta.CreateTopic(t, "orders", "g1", "g2", "g1", "g2")
	p := newProducer(t, c)
	ctx := context.Background()
	masters := map[string]*transport.Client{}
	for g := range c.Groups {
		masters[g] = testcluster.Dial(t, c.Master(g).Addr())
	}

	// Synchronous sends from many goroutines, NORMAL and HIGH.
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				rel := protocol.Normal
				if i%2 == 0 {
					rel = protocol.High
				}
				body := fmt.Sprintf("sync-%d-%d", w, i)
				r, err := p.Send(ctx, &Message{Topic: "orders", Body: []byte(body), Reliability: rel, Properties: map[string]string{"w": fmt.Sprint(w)}})
				if err != nil {
					t.Error(err)
					return
				}
				got := pull(t, masters[r.Group], r)
				if string(got.Body) != body || got.ID != r.ID || got.Reliability != rel || got.Properties[0].Value != fmt.Sprint(w) {
					t.Errorf("read back %+v for %q", got, body)
				}
			}
		}()
	}
	wg.Wait()

	// Asynchronous sends: every promise called once, every message stored
	// where its result says.
	pr := newPromises(t)
	bodies := map[string]string{}
	var bmu sync.Mutex
	for i := range 500 {
		body := fmt.Sprintf("async-%d", i)
		cb := pr.next(i)
		p.SendAsync(ctx, &Message{Topic: "orders", Body: []byte(body)}, func(r Result, err error) {
			if err == nil {
				bmu.Lock()
				bodies[r.ID] = body
				bmu.Unlock()
			}
			cb(r, err)
		})
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	pr.wg.Wait()
	if len(pr.errs) != 0 || len(pr.results) != 500 {
		t.Fatalf("%d results, errors %v", len(pr.results), pr.errs)
	}
	perGroup := map[string]int{}
	for id, r := range pr.results {
		perGroup[r.Group]++
		if r.Broker != c.Master(r.Group).Addr() || r.Topic != "orders" {
			t.Fatalf("result %+v names the wrong broker or topic", r)
		}
		if got := pull(t, masters[r.Group], r); string(got.Body) != bodies[id] {
			t.Fatalf("message %s stored as %q, want %q", id, got.Body, bodies[id])
		}
	}
	if perGroup["g1"] < 100 || perGroup["g2"] < 100 {
		t.Fatalf("sends not spread over the groups: %v", perGroup)
	}
}

func TestKeyKeepsQueue(t *testing.T) {
	c := start(t, false, "g1", "g2")
	c.Meta.CreateTopic(t, "keyed", "g1", "g2", "g1", "g2")
	p := newProducer(t, c)
	var first Result
	for i := range 20 {
		r, err := p.Send(context.Background(), &Message{Topic: "keyed", Key: "customer-42", Body: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = r
		} else if r.Queue != first.Queue || r.QueueOffset != first.QueueOffset+int64(i) {
			t.Fatalf("keyed message %d went to queue %d offset %d; first was %d/%d", i, r.Queue, r.QueueOffset, first.Queue, first.QueueOffset)
		}
	}
}

func TestReadOnlyGroupIsAvoided(t *testing.T) {
	c := start(t, false, "g1", "g2")
	c.Meta.CreateTopic(t, "ro", "g1", "g2")
	p := newProducer(t, c)
	ctx := context.Background()
	if _, err := p.Send(ctx, &Message{Topic: "ro", Body: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Meta.Client(t).SetGroupReadOnly(ctx, "g1", true); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "g1's master to enforce RO", func() bool { return !c.Master("g1").Writable() })
	for i := range 50 {
		r, err := p.Send(ctx, &Message{Topic: "ro", Body: []byte(fmt.Sprint(i))})
		if err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		if r.Group != "g2" {
			t.Fatalf("send %d went to the read-only group %s", i, r.Group)
		}
	}
	// g1's READ_ONLY answers refreshed the route (not the 30 s refresh):
	// once the producer's route says so, it no longer even tries g1.
	testwait.For(t, 5*time.Second, "the producer's route to show g1 read-only", func() bool { return !routeWritable(p, "ro", "g1") })
	before := c.Master("g1").Stats().Refused.Load()
	for range 20 {
		if _, err := p.Send(ctx, &Message{Topic: "ro", Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	if after := c.Master("g1").Stats().Refused.Load(); after != before {
		t.Fatalf("%d sends still went to the read-only group after the route refresh", after-before)
	}
}

func TestKilledBrokerIsRetriedElsewhere(t *testing.T) {
	c := start(t, false, "g1", "g2")
	c.Meta.CreateTopic(t, "kill", "g1", "g2", "g1", "g2")
	p := newProducer(t, c, RetryBackoff(10*time.Millisecond))
	ctx := context.Background()
	pr := newPromises(t)
	stop := make(chan struct{})
	var sent int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			p.SendAsync(ctx, &Message{Topic: "kill", Body: []byte("m")}, pr.next(sent))
			sent++
			time.Sleep(200 * time.Microsecond) // a steady stream, not a flood
		}
	}()
	called := func() int { n, _ := pr.count(); return n }
	testwait.For(t, 10*time.Second, "100 results before the kill", func() bool { return called() >= 100 })
	_ = c.Master("g1").Close()
	killed := called()
	testwait.For(t, 10*time.Second, "200 more results after the kill", func() bool { return called() >= killed+200 })
	close(stop)
	wg.Wait()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	pr.wg.Wait()
	if len(pr.errs) != 0 {
		t.Fatalf("%d of %d messages failed; first: %v", len(pr.errs), sent, pr.errs[0])
	}
	if len(pr.results) != sent {
		t.Fatalf("%d results for %d messages", len(pr.results), sent)
	}
	late := 0
	for _, r := range pr.results {
		if r.Group == "g2" {
			late++
		}
	}
	t.Logf("%d messages, %d on g2", sent, late)
}

func TestCloseSendsBuffered(t *testing.T) {
	c := start(t, false, "g1")
	c.Meta.CreateTopic(t, "close", "g1")
	// An hour's linger and room for every message in one batch: only Close
	// sends them.
	p, err := New(sdk.MetaAddrs(c.MetaAddr()), Linger(time.Hour), DeliveryTimeout(2*time.Hour), MaxInflightPerGroup(1))
	if err != nil {
		t.Fatal(err)
	}
	pr := newPromises(t)
	for i := range 100 {
		p.SendAsync(context.Background(), &Message{Topic: "close", Body: []byte("b")}, pr.next(i))
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	pr.wg.Wait()
	if len(pr.results) != 100 || len(pr.errs) != 0 {
		t.Fatalf("after Close: %d results, %d errors", len(pr.results), len(pr.errs))
	}
	if _, err := p.Send(context.Background(), &Message{Topic: "close", Body: []byte("late")}); !errors.Is(err, ErrClosed) {
		t.Fatalf("send after Close: %v", err)
	}
}

func TestCloseFailsWhatCannotBeSent(t *testing.T) {
	c := start(t, false, "g1")
	c.Meta.CreateTopic(t, "dead", "g1")
	p, err := New(sdk.MetaAddrs(c.MetaAddr()), DeliveryTimeout(500*time.Millisecond), RetryBackoff(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Send(context.Background(), &Message{Topic: "dead", Body: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	_ = c.Master("g1").Close()
	pr := newPromises(t)
	for i := range 50 {
		p.SendAsync(context.Background(), &Message{Topic: "dead", Body: []byte("x")}, pr.next(i))
	}
	_ = p.Close()
	pr.wg.Wait()
	if len(pr.errs) != 50 || len(pr.results) != 0 {
		t.Fatalf("with the only broker gone: %d errors, %d results", len(pr.errs), len(pr.results))
	}
	// Each ran out of time retrying the lost broker, or was still buffered
	// when Close gave up.
	for _, err := range pr.errs {
		if !errors.Is(err, ErrClosed) && !(errors.Is(err, ErrDeliveryTimeout) && errors.Is(err, ErrConnLost)) {
			t.Fatalf("with the only broker gone: %v", err)
		}
	}
}

// TestFullBufferSendsWhatLingers: a sender waiting for buffer room has the
// sinks send what lingers at once (as Kafka's accumulator does when its
// memory is exhausted): nothing joins a lingering batch until room frees,
// and room frees only when buffered messages are answered. Without it the
// second send would wait out the first one's hour of linger (and fail when
// its context ends).
func TestFullBufferSendsWhatLingers(t *testing.T) {
	c := start(t, false, "g1")
	c.Meta.CreateTopic(t, "t", "g1")
	p := newProducer(t, c, MaxBuffered(1, 1<<20), Linger(time.Hour), DeliveryTimeout(2*time.Hour))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := make(chan error, 1)
	p.SendAsync(ctx, &Message{Topic: "t", Body: []byte("1")}, func(_ Result, err error) { first <- err })
	if _, err := p.Send(ctx, &Message{Topic: "t", Body: []byte("2")}); err != nil {
		t.Fatalf("the second send: %v", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("the first send: %v", err)
	}
}
