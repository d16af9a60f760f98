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
	"github.com/ferrymq/ferrymq/sdk"
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
	base := []Opt{sdk.MetaAddrs("127.0.0.1:1"), withRouteSource(rt), withIdentitySource(&countingIDs{})}
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
			polls := p.router.routePolls.Load()
			clk.Advance(time.Second)
			testwait.For(t, 5*time.Second, "the hung call to be given up", func() bool { return p.Stats().GivenUp == 1 })
			if p.router.routePolls.Load() == polls {
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
		passes := p.router.refreshPasses.Load()
		clk.Advance(time.Second)
		testwait.For(t, 5*time.Second, "a refresher pass", func() bool { return p.router.refreshPasses.Load() > passes })
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
		before := p.router.refreshPasses.Load()
		clk.Advance(time.Second) // past one RoutePoll (300 ms, jittered up to 450 ms)
		testwait.For(t, 5*time.Second, "a refresher pass", func() bool { return p.router.refreshPasses.Load() > before })
	}
	polls, lookups := p.router.routePolls.Load(), rt.lookups.Load()
	for range 3 {
		step()
	}
	if n := p.router.routePolls.Load() - polls; n != 3 {
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
	polls, lookups = p.router.routePolls.Load(), rt.lookups.Load()
	for range 5 {
		step()
	}
	if p.router.routePolls.Load() != polls || rt.lookups.Load() != lookups {
		t.Fatalf("still polling once every group was writable: %d polls, %d lookups",
			p.router.routePolls.Load()-polls, rt.lookups.Load()-lookups)
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
			if p.router.forcedRefreshes.Load() == 0 {
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

// unknownOnG1 starts the scene of the unknown-outcome tests: topic "uo"
// with queue 0 on g1 and queue 1 on g2, g2 not writable in the producer's
// cached route at first so that an unkeyed message goes to g1. g1's master
// hangs (mode) on the message m, then the metaserver marks g1 read-only
// (naming slave as its slave, "" for none) and g2 writable; the producer's
// next poll gives the hung call up: m's outcome is unknown, and g2 is
// where it could move.
type unknownScene struct {
	p         *Client
	clk       *clockwork.FakeClock
	rt        *fakeRoutes
	g1, g2    *fakeBroker
	old, next *fakeAddr // g1's master and its slave (promoted with everything the master had)
	q1        routing.QueueRoute
	pr        *promises
}

func unknownOnG1(t *testing.T, mode hangMode, slave bool, opts ...Opt) *unknownScene {
	t.Helper()
	sc := &unknownScene{g1: startFakeBroker(t, "", "g1"), g2: startFakeBroker(t, "", "g2"), rt: newFakeRoutes(), clk: clockwork.NewFakeClock()}
	sc.old, sc.next = sc.g1.first, sc.g1.listen(t)
	sc.q1 = routing.QueueRoute{Queue: 1, Group: "g2", Master: sc.g2.first.addr, Epoch: 1, Writable: true}
	q0 := routing.QueueRoute{Queue: 0, Group: "g1", Master: sc.old.addr, Slave: sc.next.addr, Epoch: 1, Writable: true}
	g2ro := sc.q1
	g2ro.Writable = false
	sc.rt.set("uo", q0, g2ro)
	base := []Opt{withClock(sc.clk), Linger(0), RetryBackoff(5 * time.Millisecond), withMaxBackoff(20 * time.Millisecond), RequestTimeout(time.Minute)}
	sc.p = newFakeProducer(t, sc.rt, append(base, opts...)...)
	ctx := context.Background()
	if r, err := sc.p.Send(ctx, &Message{Topic: "uo", Body: []byte("warm")}); err != nil || r.Group != "g1" {
		t.Fatalf("warm-up: %+v %v", r, err)
	}
	sc.old.hang.Store(int32(mode))
	sc.pr = newPromises(t)
	sc.p.SendAsync(ctx, &Message{Topic: "uo", Body: []byte("m")}, sc.pr.next(0))
	testwait.For(t, 5*time.Second, "g1's master to take m", func() bool { return sc.old.reqs.Load() == 2 })

	q0.Writable = false
	if !slave {
		q0.Slave = ""
	}
	sc.rt.set("uo", q0, sc.q1)
	sc.clk.Advance(time.Second)
	testwait.For(t, 5*time.Second, "the hung call to be given up", func() bool { return sc.p.Stats().GivenUp == 1 })
	return sc
}

// waitsOnG1 waits until m, after its unknown outcome, was sent to g1's
// master again (it keeps its queue) or went to g2, and fails in the latter
// case.
func (sc *unknownScene) waitsOnG1(t *testing.T) {
	t.Helper()
	testwait.For(t, 5*time.Second, "m sent again, to g1 or g2", func() bool {
		return sc.old.reqs.Load() == 3 || sc.g2.batches.Load() > 0
	})
	if n := sc.g2.batches.Load(); n != 0 {
		t.Fatalf("m went to g2 (%d batches) while g1 could still be failed over", n)
	}
	if called, _ := sc.pr.count(); called != 0 {
		t.Fatalf("m answered before g1 had a master")
	}
}

// result is m's one result.
func (sc *unknownScene) result(t *testing.T) Result {
	t.Helper()
	waitPromises(t, sc.pr, 1)
	if len(sc.pr.errs) != 0 {
		t.Fatal(sc.pr.errs[0])
	}
	for _, r := range sc.pr.results {
		return r
	}
	panic("unreachable")
}

// An unkeyed message whose outcome is unknown (its master stopped
// answering and the call was given up) keeps its stamp and its queue while
// its group is read-only with a slave that can be promoted, instead of
// moving to the writable group; the promoted slave, which holds the dedupe
// state, answers it DUPLICATE if the old master had stored it and stores
// it otherwise: one copy, not flagged.
func TestUnknownOutcomeWaitsForTheNewMaster(t *testing.T) {
	for _, mode := range []hangMode{hangBefore, hangAfter} {
		name := map[hangMode]string{hangBefore: "not-stored", hangAfter: "stored"}[mode]
		t.Run(name, func(t *testing.T) {
			sc := unknownOnG1(t, mode, true)
			sc.waitsOnG1(t)
			// The metaserver promotes the slave; the next poll brings it.
			sc.rt.set("uo", routing.QueueRoute{Queue: 0, Group: "g1", Master: sc.next.addr, Epoch: 2, Writable: true}, sc.q1)
			sc.clk.Advance(time.Second)
			r := sc.result(t)
			if r.Group != "g1" || r.Queue != 0 || r.Broker != sc.next.addr || r.PossibleDuplicate || r.Duplicate != (mode == hangAfter) {
				t.Fatalf("result %+v: want queue 0 at the promoted master %s, duplicate %v, not flagged", r, sc.next.addr, mode == hangAfter)
			}
			if n := len(sc.g1.storedIn("uo", 0)); n != 2 {
				t.Fatalf("%d stored on g1, want warm and m", n)
			}
			if n := len(sc.g2.receivedCopy()); n != 0 {
				t.Fatalf("g2 got %d messages", n)
			}
			if st := sc.p.Stats(); st.PossibleDuplicates != 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// An unknown-outcome message moves (without its stamp, flagged as a
// possible duplicate) when its group cannot answer it: the route shows it
// read-only with no slave to promote; or it had a slave, but FailoverWait
// passed since the unknown outcome (failover off, a dead slave...); or at
// the user's option, MoveOnUnknownOutcome. The old master had stored it:
// it is stored twice, as the flag says.
func TestUnknownOutcomeMoves(t *testing.T) {
	cases := []struct {
		name  string
		slave bool
		opts  []Opt
		wait  time.Duration // > 0: m waits on g1 until the clock has moved this far
	}{
		{"no slave to promote", false, nil, 0},
		{"failover wait passed", true, []Opt{FailoverWait(10 * time.Second)}, 10 * time.Second},
		{"MoveOnUnknownOutcome", true, []Opt{MoveOnUnknownOutcome(true)}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sc := unknownOnG1(t, hangAfter, tc.slave, tc.opts...)
			if tc.wait > 0 {
				sc.waitsOnG1(t)
				// The call to g1's master hangs again; past the wait, the
				// next poll gives it up, and m may move.
				sc.clk.Advance(tc.wait)
			}
			r := sc.result(t)
			if r.Group != "g2" || !r.PossibleDuplicate || r.Duplicate {
				t.Fatalf("result %+v: want moved to g2, flagged", r)
			}
			if a, b := len(sc.g1.storedIn("uo", 0)), len(sc.g2.storedIn("uo", 1)); a != 2 || b != 1 {
				t.Fatalf("stored %d on g1 (with warm), %d on g2: want m on both", a, b)
			}
			if st := sc.p.Stats(); st.PossibleDuplicates != 1 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// A message whose first attempt had an unknown outcome (stored, answered
// TIMEOUT) and whose retries are then refused (READ_ONLY: a master whose
// lease ran out before the route says so) keeps its stamp and its queue
// while the route shows its group writable, although another group could
// take it; once the master takes it again it answers DUPLICATE: one copy.
func TestRefusedAfterUnknownWaits(t *testing.T) {
	g1, g2 := startFakeBroker(t, "", "g1"), startFakeBroker(t, "", "g2")
	g1.setInject(byBody("m", func(attempt int) (protocol.Status, injectMode) {
		switch {
		case attempt == 1:
			return protocol.StatusTimeout, storeThen
		case attempt <= 4:
			return protocol.StatusReadOnly, refuse
		}
		return 0, noInject
	}))
	rt := newFakeRoutes()
	q0 := routing.QueueRoute{Queue: 0, Group: "g1", Master: g1.first.addr, Epoch: 1, Writable: true}
	q1 := routing.QueueRoute{Queue: 1, Group: "g2", Master: g2.first.addr, Epoch: 1, Writable: false}
	rt.set("rw", q0, q1)
	clk := clockwork.NewFakeClock()
	p := newFakeProducer(t, rt, withClock(clk), Linger(0), RetryBackoff(5*time.Millisecond), withMaxBackoff(20*time.Millisecond))
	ctx := context.Background()
	if _, err := p.Send(ctx, &Message{Topic: "rw", Body: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	// g2 takes writes again: the READ_ONLY refusals refresh the route, so
	// the producer sees it while m is retried.
	q1.Writable = true
	rt.set("rw", q0, q1)
	r, err := p.Send(ctx, &Message{Topic: "rw", Body: []byte("m")})
	if err != nil {
		t.Fatal(err)
	}
	if !routeWritable(p, "rw", "g2") {
		t.Fatal("the producer never saw g2 writable: the test shows nothing")
	}
	if r.Group != "g1" || !r.Duplicate || r.PossibleDuplicate || r.Seq != 1 {
		t.Fatalf("result %+v: want g1's duplicate of the first attempt (seq 1), not flagged", r)
	}
	if n := len(g2.receivedCopy()); n != 0 {
		t.Fatalf("g2 got %d messages", n)
	}
	if n := len(g1.storedIn("rw", 0)); n != 2 {
		t.Fatalf("%d stored on g1, want warm and m", n)
	}
	if st := p.Stats(); st.PossibleDuplicates != 0 || st.OutOfOrder != 0 {
		t.Fatalf("stats %+v", st)
	}
}
