package producer

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/routing"
)

// TestAvoidanceMovesAwayAndBack runs each policy against two fake groups:
// while g1 fails, sends move to g2; once g1 recovers, they come back. The
// avoider's clock is the test's: it moves a millisecond per send, and past
// the avoidance window once g1 recovers.
func TestAvoidanceMovesAwayAndBack(t *testing.T) {
	policies := map[string]func() routing.Avoider{
		"latency-table": func() routing.Avoider {
			// RocketMQ's table, shrunk: a failure avoids a group for 300 ms.
			return &routing.LatencyTable{
				Latencies: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond},
				Durations: []time.Duration{100 * time.Millisecond, 300 * time.Millisecond},
			}
		},
		"decaying-latency": func() routing.Avoider {
			d := routing.NewDecayingLatency()
			d.HalfLife = 50 * time.Millisecond
			d.Slack = 5 * time.Millisecond // loopback jitter under -race is not a slow group
			return d
		},
	}
	for name, policy := range policies {
		t.Run(name, func(t *testing.T) {
			c := testcluster.Start(t, testcluster.Opts{MetaEdit: testcluster.SteadyMeta})
			g1 := startFakeBroker(t, c.MetaAddr(), "g1")
			g2 := startFakeBroker(t, c.MetaAddr(), "g2")
			c.Meta.CreateTopic(t, "avoid", "g1", "g2", "g1", "g2")
			clk := clockwork.NewFakeClock()
			p := newProducer(t, c, Avoider(policy()), RetryBackoff(5*time.Millisecond), Linger(0), withClock(clk))
			ctx := context.Background()
			sendN := func(n int) (g1Share float64) {
				b1 := g1.msgs.Load()
				b2 := g2.msgs.Load()
				var wg sync.WaitGroup
				for range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range n / 4 {
							if _, err := p.Send(ctx, &Message{Topic: "avoid", Body: []byte("x")}); err != nil {
								t.Error(err)
								return
							}
							clk.Advance(time.Millisecond)
						}
					}()
				}
				wg.Wait()
				d1, d2 := g1.msgs.Load()-b1, g2.msgs.Load()-b2
				return float64(d1) / float64(d1+d2)
			}
			healthy := sendN(200)
			g1.failing.Store(true)
			tried := g1.batches.Load()
			failingShare := sendN(200)
			triedWhileFailing := g1.batches.Load() - tried
			g1.failing.Store(false)
			clk.Advance(400 * time.Millisecond) // past the avoidance window
			recovered := sendN(400)
			t.Logf("%s: g1's share healthy %.2f, failing %.2f, recovered %.2f (batches tried on g1 while failing: %d)", name, healthy, failingShare, recovered, triedWhileFailing)
			if healthy < 0.2 {
				t.Fatalf("healthy g1 got only %.2f of the sends", healthy)
			}
			if failingShare != 0 || triedWhileFailing > 20 {
				t.Fatalf("while g1 failed it stored %.2f of the sends and was tried %d times for 200 sends", failingShare, triedWhileFailing)
			}
			if recovered < 0.2 {
				t.Fatalf("after recovering, g1 got only %.2f of the sends", recovered)
			}
		})
	}
}

// TestSlowGroupIsAvoided: a group answering in 60 ms gets far fewer sends
// than a fast one, under both policies.
func TestSlowGroupIsAvoided(t *testing.T) {
	for _, name := range []string{"latency-table", "decaying-latency"} {
		t.Run(name, func(t *testing.T) {
			var a routing.Avoider = &routing.LatencyTable{
				Latencies: []time.Duration{50 * time.Millisecond}, Durations: []time.Duration{time.Second},
			}
			if name == "decaying-latency" {
				a = routing.NewDecayingLatency()
			}
			c := testcluster.Start(t, testcluster.Opts{MetaEdit: testcluster.SteadyMeta})
			slow := startFakeBroker(t, c.MetaAddr(), "slow")
			startFakeBroker(t, c.MetaAddr(), "fast")
			slow.delay.Store(int64(60 * time.Millisecond))
			c.Meta.CreateTopic(t, "slowfast", "slow", "fast")
			// The avoider's clock moves a millisecond per send, however slow
			// the run: the 1 s avoidance window does not pass during it.
			clk := clockwork.NewFakeClock()
			p := newProducer(t, c, Avoider(a), Linger(0), withClock(clk))
			for i := range 100 {
				if _, err := p.Send(context.Background(), &Message{Topic: "slowfast", Body: []byte(fmt.Sprint(i))}); err != nil {
					t.Fatal(err)
				}
				clk.Advance(time.Millisecond)
			}
			t.Logf("%s: slow group took %d of 100 sends", name, slow.msgs.Load())
			if slow.msgs.Load() > 10 {
				t.Fatalf("the slow group took %d of 100 sends", slow.msgs.Load())
			}
		})
	}
}
