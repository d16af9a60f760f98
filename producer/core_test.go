package producer

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/sdk"
	"github.com/ferrymq/ferrymq/sdkmetrics"
)

// gatedRoutes holds every lookup until gate closes.
type gatedRoutes struct {
	*fakeRoutes
	gate chan struct{}
}

func (g gatedRoutes) route(ctx context.Context, topic string) (routing.Route, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return routing.Route{}, ctx.Err()
	}
	return g.fakeRoutes.route(ctx, topic)
}

// Records that find no route for their topic share one lookup (the client
// core's route cache): a burst of sends to a new topic costs the
// metaserver one RPC, not one per record.
func TestNewTopicLookedUpOnce(t *testing.T) {
	addr := startNullBroker(t)
	rt := newFakeRoutes()
	rt.set("fresh", routing.QueueRoute{Queue: 0, Group: "g1", Master: addr, Epoch: 1, Writable: true})
	gated := gatedRoutes{rt, make(chan struct{})}
	p, err := New(sdk.MetaAddrs("127.0.0.1:1"), withRouteSource(gated), withIdentitySource(&countingIDs{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	// Senders on n goroutines: a record without a route waits on its
	// sender's goroutine for the lookup.
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go p.SendAsync(context.Background(), &Message{Topic: "fresh", Body: fmt.Appendf(nil, "m%d", i)}, func(_ Result, err error) {
			defer wg.Done()
			if err != nil {
				errs <- err
			}
		})
	}
	testwait.For(t, 5*time.Second, "every record to wait for the route", func() bool {
		_, joined := p.router.cache.Lookups()
		return joined == n-1
	})
	if made, _ := p.router.cache.Lookups(); made != 1 {
		t.Fatalf("%d records without a route made %d lookups, want 1", n, made)
	}
	close(gated.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := rt.lookups.Load(); got != 1 {
		t.Fatalf("the metaserver got %d lookups, want 1", got)
	}
}

// onFirstAttempt answers a message's first attempt st (as mode says), and
// leaves the later ones to the model.
func onFirstAttempt(st protocol.Status, mode injectMode) func(attempt int) (protocol.Status, injectMode) {
	return func(attempt int) (protocol.Status, injectMode) {
		if attempt == 1 {
			return st, mode
		}
		return 0, noInject
	}
}

// recordingHooks counts what a client reports through sdk.Metrics.
type recordingHooks struct {
	mu       sync.Mutex
	counts   [sdkmetrics.NumCounters]int64
	observed int
}

func (h *recordingHooks) Add(c sdkmetrics.Counter, n int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[c] += n
}

func (h *recordingHooks) Observe(k sdkmetrics.Histogram, d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if k == sdkmetrics.ProducerSendDuration && d > 0 {
		h.observed++
	}
}

// The producer reports every Stats counter's move and every SEND request's
// duration to its Metrics hooks (it imports no metrics library): here a
// lost answer's retry, answered DUPLICATE.
func TestMetricsHooks(t *testing.T) {
	c, fakes := fakeCluster(t, "hooked", "g1")
	fakes["g1"].setInject(byBody("lost", onFirstAttempt(protocol.StatusSlaveSyncTimeout, storeThen)))
	h := &recordingHooks{}
	p := newProducer(t, c, RetryBackoff(5*time.Millisecond), sdk.Metrics(h))
	for _, body := range []string{"lost", "plain"} {
		if _, err := p.Send(context.Background(), &Message{Topic: "hooked", Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	st := p.Stats()
	h.mu.Lock()
	defer h.mu.Unlock()
	want := [sdkmetrics.NumCounters]int64{
		sdkmetrics.ProducerDuplicates: st.Duplicates, sdkmetrics.ProducerPossibleDuplicates: st.PossibleDuplicates,
		sdkmetrics.ProducerOutOfOrder: st.OutOfOrder, sdkmetrics.ProducerRetries: st.Retries,
		sdkmetrics.ProducerRenewals: st.Renewals, sdkmetrics.ProducerGivenUp: st.GivenUp,
	}
	if st.Duplicates != 1 || st.Retries != 1 || h.counts != want {
		t.Fatalf("hooks counted %v, Stats %+v: want the same, with one duplicate and one retry", h.counts, st)
	}
	// Three SEND requests: the lost answer, its retry, the plain message.
	if sends := len(fakes["g1"].receivedCopy()); h.observed != sends || sends != 3 {
		t.Fatalf("%d send durations observed for %d SEND requests, want 3", h.observed, sends)
	}
}
