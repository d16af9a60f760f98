package producer

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
)

// TestPeriodicRouteRefresh: cached routes are refreshed every RouteRefresh
// of the producer's clock, and not before: a group turned read-only while
// the producer sends nothing is seen only once the clock has moved 30 s.
func TestPeriodicRouteRefresh(t *testing.T) {
	c := start(t, false, "g1", "g2")
	c.Meta.CreateTopic(t, "tick", "g1", "g2")
	clk := clockwork.NewFakeClock()
	p := newProducer(t, c, withClock(clk))
	ctx := context.Background()
	if _, err := p.Send(ctx, &Message{Topic: "tick", Body: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	// The warm-up may have been answered NO_ROUTE by a broker that had not
	// looked the new topic up yet, which forces a refresh; count from here.
	forced := p.router.forcedRefreshes.Load()
	if _, err := c.Meta.Client(t).SetGroupReadOnly(ctx, "g1", true); err != nil {
		t.Fatal(err)
	}
	// Only the refresher could learn it: 29 s on, it looked and left the
	// route alone.
	passes := p.router.refreshPasses.Load()
	clk.Advance(29 * time.Second)
	testwait.For(t, 5*time.Second, "a refresher pass", func() bool { return p.router.refreshPasses.Load() > passes })
	if !routeWritable(p, "tick", "g1") {
		t.Fatal("the route was refreshed before RouteRefresh passed")
	}
	clk.Advance(time.Second)
	testwait.For(t, 5*time.Second, "the refresher to see g1 read-only", func() bool { return !routeWritable(p, "tick", "g1") })
	if n := p.router.forcedRefreshes.Load() - forced; n != 0 {
		t.Fatalf("%d forced refreshes; only the periodic one should have run", n)
	}
}

// TestForcedRefreshRateLimit: a status whose row says the route is stale
// (READ_ONLY here) refreshes it at once, but at most once a second of the
// producer's clock per topic.
func TestForcedRefreshRateLimit(t *testing.T) {
	c := testcluster.Start(t, testcluster.Opts{MetaEdit: testcluster.SteadyMeta})
	ro := startFakeBroker(t, c.MetaAddr(), "ro")
	ro.status.Store(uint32(protocol.StatusReadOnly)) // the metaserver still has it writable
	startFakeBroker(t, c.MetaAddr(), "ok")
	c.Meta.CreateTopic(t, "rl", "ro", "ok")
	clk := clockwork.NewFakeClock()
	p := newProducer(t, c, withClock(clk), Linger(0), RetryBackoff(time.Millisecond))
	// hitRO sends until one message has been refused by ro (and then
	// stored on ok by its retry). A Send returns after its retry, so the
	// refresh decision for the refusal has been made by then.
	hitRO := func() {
		t.Helper()
		before := ro.batches.Load()
		for i := 0; ro.batches.Load() == before; i++ {
			if i == 100 {
				t.Fatal("100 sends and none went to ro")
			}
			r, err := p.Send(context.Background(), &Message{Topic: "rl", Body: []byte("x")})
			if err != nil {
				t.Fatal(err)
			}
			if r.Group != "ok" {
				t.Fatalf("stored on %s", r.Group)
			}
		}
	}
	hitRO()
	if n := p.router.forcedRefreshes.Load(); n != 1 {
		t.Fatalf("after the first READ_ONLY: %d forced refreshes, want 1", n)
	}
	for range 5 {
		hitRO()
	}
	if n := p.router.forcedRefreshes.Load(); n != 1 {
		t.Fatalf("after more READ_ONLY answers within the same second: %d forced refreshes, want 1", n)
	}
	clk.Advance(time.Second)
	hitRO()
	if n := p.router.forcedRefreshes.Load(); n != 2 {
		t.Fatalf("after a second: %d forced refreshes, want 2", n)
	}
}
