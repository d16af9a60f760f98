package producer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// fakeRoutes is the producer's route source in the failover tests: the
// test sets each topic's route (a metaserver promoting a slave, marking a
// group read-only) and counts the lookups.
type fakeRoutes struct {
	mu      sync.Mutex
	routes  map[string]routing.Route
	version uint64
	lookups atomic.Int64
}

func newFakeRoutes() *fakeRoutes { return &fakeRoutes{routes: map[string]routing.Route{}} }

// set gives topic a new route, at the next registry version.
func (f *fakeRoutes) set(topic string, qs ...routing.QueueRoute) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.version++
	f.routes[topic] = routing.Route{Topic: topic, Version: f.version, Queues: qs}
}

func (f *fakeRoutes) route(_ context.Context, topic string) (routing.Route, error) {
	f.lookups.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.routes[topic]
	if !ok {
		return routing.Route{}, &protocol.Error{Status: protocol.StatusUnknownTopic, Message: topic}
	}
	return r, nil
}

// newFakeProducer is a producer with no metaserver: routes from rt,
// identities counted from 101. Closed by Cleanup.
func newFakeProducer(t *testing.T, rt *fakeRoutes, opts ...Opt) *Client {
	t.Helper()
	base := []Opt{MetaAddrs("127.0.0.1:1"), withRouteSource(rt), withIdentitySource(&countingIDs{})}
	p, err := New(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// waitPromises waits until every promise of pr was called.
func waitPromises(t *testing.T, pr *promises, n int) {
	t.Helper()
	testwait.For(t, 10*time.Second, fmt.Sprintf("%d results", n), func() bool {
		called, _ := pr.count()
		return called == n
	})
}

// (a) A master that stops answering (SIGSTOP: the connection stays open,
// nothing comes back) is replaced: the route names a new master at a new
// epoch. The call to the old master is given up as soon as a poll shows the
// new route (the call had waited a poll, so the route was being polled), not
// at the request timeout (a minute here), and its messages are retried on
// their queue with their stamps at the new master, in order and exactly
// once: answered DUPLICATE if the old master had stored them (and the new
// one has them, as a promoted slave would), stored if it had not.
func TestHungMasterGivenUpOnRouteChange(t *testing.T) {
	for _, mode := range []hangMode{hangBefore, hangAfter} {
		name := map[hangMode]string{hangBefore: "not-stored", hangAfter: "stored"}[mode]
		t.Run(name, func(t *testing.T) {
			g1 := startFakeBroker(t, "", "g1")
			old := g1.first
			promoted := g1.listen(t) // the slave, with everything the master had
			rt := newFakeRoutes()
			rt.set("fo", routing.QueueRoute{Queue: 0, Group: "g1", Master: old.addr, Slave: promoted.addr, Epoch: 1, Writable: true})
			clk := clockwork.NewFakeClock()
			p := newFakeProducer(t, rt, withClock(clk), Linger(0), RetryBackoff(5*time.Millisecond), RequestTimeout(time.Minute))
			ctx := context.Background()
			if _, err := p.Send(ctx, &Message{Topic: "fo", Body: []byte("warm")}); err != nil {
				t.Fatal(err)
			}
			old.hang.Store(int32(mode))
			const n = 6
			pr := newPromises(t)
			for i := range n {
				p.SendAsync(ctx, &Message{Topic: "fo", Body: []byte(fmt.Sprint("m-", i))}, pr.next(i))
			}
			testwait.For(t, 5*time.Second, "the old master to take a batch", func() bool { return old.reqs.Load() == 2 })

			// The metaserver promotes the slave. The call has waited more
			// than a poll by the producer's clock: the refresher polls the
			// route, sees the new master and epoch, and gives the call up.
			rt.set("fo", routing.QueueRoute{Queue: 0, Group: "g1", Master: promoted.addr, Epoch: 2, Writable: true})
			polls := p.routePolls.Load()
			clk.Advance(time.Second)
			testwait.For(t, 5*time.Second, "the hung call to be given up", func() bool { return p.Stats().GivenUp == 1 })
			if p.routePolls.Load() == polls {
				t.Fatal("given up without a poll")
			}
			waitPromises(t, pr, n)
			if len(pr.errs) != 0 {
				t.Fatalf("%d failed; first: %v", len(pr.errs), pr.errs[0])
			}
			dups := 0
			for _, r := range pr.results {
				if r.Broker != promoted.addr || r.PossibleDuplicate {
					t.Fatalf("result %+v: want stored by the new master %s, not flagged", r, promoted.addr)
				}
				if r.Duplicate {
					dups++
				}
			}
			// Stored once each, in send order, with consecutive sequences.
			stored := g1.storedIn("fo", 0)
			if len(stored) != n+1 {
				t.Fatalf("%d messages stored, want %d", len(stored), n+1)
			}
			for i, m := range stored[1:] {
				if want := fmt.Sprint("m-", i); string(m.Body) != want || m.Producer.Seq != int64(i+1) {
					t.Fatalf("stored #%d: %q seq %d, want %q seq %d", i+1, m.Body, m.Producer.Seq, want, i+1)
				}
			}
			if mode == hangAfter && dups == 0 || mode == hangBefore && dups != 0 {
				t.Fatalf("%d answered DUPLICATE", dups)
			}
			for _, e := range old.epochsCopy() {
				if e != 1 {
					t.Fatalf("the old master got epoch %d", e)
				}
			}
			for _, e := range promoted.epochsCopy() {
				if e != 2 {
					t.Fatalf("the new master got epoch %d", e)
				}
			}
			if old.reqs.Load() != 2 {
				t.Fatalf("the old master got %d requests: the retry went back to it", old.reqs.Load())
			}
		})
	}
}

// A call that hangs while its group turns read-only (same master, no
// promotion yet) is given up once it has waited a poll; a keyed message
// keeps its queue and stamp, and goes to the master that is promoted next.
func TestHungCallGivenUpWhenGroupNotWritable(t *testing.T) {
	g1 := startFakeBroker(t, "", "g1")
	g2 := startFakeBroker(t, "", "g2")
	old := g1.first
	promoted := g1.listen(t)
	rt := newFakeRoutes()
	q1 := routing.QueueRoute{Queue: 1, Group: "g2", Master: g2.first.addr, Epoch: 1, Writable: true}
	rt.set("ro", routing.QueueRoute{Queue: 0, Group: "g1", Master: old.addr, Epoch: 1, Writable: true}, q1)
	clk := clockwork.NewFakeClock()
	p := newFakeProducer(t, rt, withClock(clk), Linger(0), RetryBackoff(5*time.Millisecond), RequestTimeout(time.Minute))
	ctx := context.Background()
	key := keyFor(0, 2)
	if _, err := p.Send(ctx, &Message{Topic: "ro", Key: key, Body: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	old.hang.Store(int32(hangAfter))
	pr := newPromises(t)
	p.SendAsync(ctx, &Message{Topic: "ro", Key: key, Body: []byte("k")}, pr.next(0))
	testwait.For(t, 5*time.Second, "the old master to take a batch", func() bool { return old.reqs.Load() == 2 })
	// The master's session expired: read-only, no promotion yet.
	rt.set("ro", routing.QueueRoute{Queue: 0, Group: "g1", Master: old.addr, Epoch: 1, Writable: false}, q1)
	clk.Advance(time.Second)
	testwait.For(t, 5*time.Second, "the hung call to be given up", func() bool { return p.Stats().GivenUp >= 1 })
	// Promotion: the next poll (the route has a read-only group, so it is
	// polled) brings the new master.
	rt.set("ro", routing.QueueRoute{Queue: 0, Group: "g1", Master: promoted.addr, Epoch: 2, Writable: true}, q1)
	// The keyed message's retry may have gone to the old master again, from
	// the route cached before the pass that brings the new one, and been
	// registered after that pass looked: the pass after gives it up. So
	// move the clock a poll at a time until the message is answered.
	testwait.For(t, 10*time.Second, "the message to be answered by the promoted master", func() bool {
		if called, _ := pr.count(); called == 1 {
			return true
		}
		passes := p.refreshPasses.Load()
		clk.Advance(time.Second)
		testwait.For(t, 5*time.Second, "a refresher pass", func() bool { return p.refreshPasses.Load() > passes })
		return false
	})
	if len(pr.errs) != 0 {
		t.Fatal(pr.errs[0])
	}
	for _, r := range pr.results {
		if r.Queue != 0 || r.Broker != promoted.addr || !r.Duplicate || r.PossibleDuplicate {
			t.Fatalf("result %+v: want queue 0 at the new master, a duplicate of the stored attempt", r)
		}
	}
	if n := len(g1.storedIn("ro", 0)); n != 2 {
		t.Fatalf("%d stored, want 2", n)
	}
}

// (b) While a queue of a route the producer uses has no writable master,
// the route is polled at every refresher pass (every RoutePoll, by the
// producer's clock), so the group's return is seen within a pass; then the
// polling stops.
func TestRoutePolledWhileNotWritable(t *testing.T) {
	g1 := startFakeBroker(t, "", "g1")
	g2 := startFakeBroker(t, "", "g2")
	rt := newFakeRoutes()
	q0 := routing.QueueRoute{Queue: 0, Group: "g1", Master: g1.first.addr, Epoch: 1, Writable: true}
	rt.set("pw", q0, routing.QueueRoute{Queue: 1, Group: "g2", Master: g2.first.addr, Epoch: 1, Writable: false})
	clk := clockwork.NewFakeClock()
	p := newFakeProducer(t, rt, withClock(clk), Linger(0))
	ctx := context.Background()
	if r, err := p.Send(ctx, &Message{Topic: "pw", Body: []byte("x")}); err != nil || r.Group != "g1" {
		t.Fatalf("%+v %v", r, err)
	}
	step := func() {
		t.Helper()
		before := p.refreshPasses.Load()
		clk.Advance(time.Second) // past one RoutePoll (300 ms, jittered up to 450 ms)
		testwait.For(t, 5*time.Second, "a refresher pass", func() bool { return p.refreshPasses.Load() > before })
	}
	polls, lookups := p.routePolls.Load(), rt.lookups.Load()
	for range 3 {
		step()
	}
	if n := p.routePolls.Load() - polls; n != 3 {
		t.Fatalf("%d polls in 3 passes while g2 was not writable, want 3", n)
	}
	if n := rt.lookups.Load() - lookups; n != 3 {
		t.Fatalf("%d lookups in 3 passes, want 3", n)
	}
	// g2 is writable again (a new master): the next poll sees it.
	rt.set("pw", q0, routing.QueueRoute{Queue: 1, Group: "g2", Master: g2.first.addr, Epoch: 2, Writable: true})
	step()
	if !routeWritable(p, "pw", "g2") {
		t.Fatal("the poll after g2's return did not bring it")
	}
	polls, lookups = p.routePolls.Load(), rt.lookups.Load()
	for range 5 {
		step()
	}
	if p.routePolls.Load() != polls || rt.lookups.Load() != lookups {
		t.Fatalf("still polling once every group was writable: %d polls, %d lookups",
			p.routePolls.Load()-polls, rt.lookups.Load()-lookups)
	}
	// And sends reach g2 again, epoch 2 on the wire.
	for i := 0; g2.msgs.Load() == 0; i++ {
		if i == 20 {
			t.Fatal("no send reached g2")
		}
		if _, err := p.Send(ctx, &Message{Topic: "pw", Body: []byte("y")}); err != nil {
			t.Fatal(err)
		}
	}
	if e := g2.first.epochsCopy(); e[len(e)-1] != 2 {
		t.Fatalf("g2 got epochs %v", e)
	}
}

// (c) With no route change (the producer's clock never moves, so nothing is
// polled), a hung call ends at RequestTimeout: an unknown outcome, retried
// with its stamp on the same queue, stored once, and the route is looked up
// (a send with no answer may mean a new master).
func TestHungCallTimesOut(t *testing.T) {
	for _, mode := range []hangMode{hangBefore, hangAfter} {
		name := map[hangMode]string{hangBefore: "not-stored", hangAfter: "stored"}[mode]
		t.Run(name, func(t *testing.T) {
			g1 := startFakeBroker(t, "", "g1")
			rt := newFakeRoutes()
			rt.set("to", routing.QueueRoute{Queue: 0, Group: "g1", Master: g1.first.addr, Epoch: 1, Writable: true})
			clk := clockwork.NewFakeClock()
			p := newFakeProducer(t, rt, withClock(clk), Linger(0), RetryBackoff(5*time.Millisecond), RequestTimeout(200*time.Millisecond))
			ctx := context.Background()
			if _, err := p.Send(ctx, &Message{Topic: "to", Body: []byte("warm")}); err != nil {
				t.Fatal(err)
			}
			g1.first.hang.Store(int32(mode))
			pr := newPromises(t)
			p.SendAsync(ctx, &Message{Topic: "to", Body: []byte("slow")}, pr.next(0))
			testwait.For(t, 5*time.Second, "the master to take the batch", func() bool { return g1.first.reqs.Load() == 2 })
			g1.first.hang.Store(int32(answer)) // the retry is answered
			waitPromises(t, pr, 1)
			if len(pr.errs) != 0 {
				t.Fatal(pr.errs[0])
			}
			for _, r := range pr.results {
				if r.Duplicate != (mode == hangAfter) || r.PossibleDuplicate || r.Seq != 1 {
					t.Fatalf("result %+v", r)
				}
			}
			if n := len(g1.storedIn("to", 0)); n != 2 {
				t.Fatalf("%d stored, want 2", n)
			}
			st := p.Stats()
			if st.GivenUp != 0 || st.Retries != 1 {
				t.Fatalf("stats %+v: want one retry after the timeout, nothing given up", st)
			}
			if p.forcedRefreshes.Load() == 0 {
				t.Fatal("a send with no answer did not refresh the route")
			}
		})
	}
}

// A queue waiting out a retry's backoff goes at once when a route names a
// new master or epoch for its group (or shows it writable again): what it
// waited for has happened. Here the backoff is an hour, so only the wake
// can deliver the message within the test.
func TestBackoffEndsWhenTheRouteChanges(t *testing.T) {
	g1 := startFakeBroker(t, "", "g1")
	old := g1.first
	promoted := g1.listen(t)
	rt := newFakeRoutes()
	rt.set("wake", routing.QueueRoute{Queue: 0, Group: "g1", Master: old.addr, Epoch: 1, Writable: true})
	clk := clockwork.NewFakeClock()
	p := newFakeProducer(t, rt, withClock(clk), Linger(0), RetryBackoff(time.Hour), withMaxBackoff(time.Hour),
		DeliveryTimeout(2*time.Hour), RouteRefresh(time.Minute))
	ctx := context.Background()
	key := keyFor(0, 1)
	// The first attempt is refused BUSY (retriable; no route refresh): the
	// keyed message waits out its backoff on its queue.
	g1.setInject(func(m *protocol.Message, attempt int) (protocol.Status, injectMode) {
		if attempt == 1 {
			return protocol.StatusBusy, refuse
		}
		return protocol.StatusOK, noInject
	})
	pr := newPromises(t)
	p.SendAsync(ctx, &Message{Topic: "wake", Key: key, Body: []byte("k")}, pr.next(0))
	testwait.For(t, 5*time.Second, "the refused first attempt", func() bool { return p.Stats().Retries == 1 })

	// The slave is promoted; the periodic refresh brings the new route.
	rt.set("wake", routing.QueueRoute{Queue: 0, Group: "g1", Master: promoted.addr, Epoch: 2, Writable: true})
	clk.Advance(time.Minute)
	waitPromises(t, pr, 1)
	if len(pr.errs) != 0 {
		t.Fatal(pr.errs[0])
	}
	for _, r := range pr.results {
		if r.Broker != promoted.addr {
			t.Fatalf("result %+v: want the new master %s", r, promoted.addr)
		}
	}
}
