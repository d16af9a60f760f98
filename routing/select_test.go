package routing

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func twoGroupRoute() Route {
	return Route{Topic: "t", Queues: []QueueRoute{
		{Queue: 0, Group: "g1", Writable: true}, {Queue: 1, Group: "g2", Writable: true},
		{Queue: 2, Group: "g1", Writable: true}, {Queue: 3, Group: "g2", Writable: true},
		{Queue: 4, Group: "g3", Writable: false},
	}}
}

func TestSelectorRoundRobinSkipsReadOnly(t *testing.T) {
	s := NewSelector(nil)
	r := twoGroupRoute()
	seen := map[uint32]int{}
	now := time.Now()
	for range 400 {
		q, err := s.Select(&r, "", now)
		if err != nil {
			t.Fatal(err)
		}
		if q.Group == "g3" {
			t.Fatal("picked a read-only group")
		}
		seen[q.Queue]++
	}
	for q := uint32(0); q < 4; q++ {
		if seen[q] < 80 {
			t.Fatalf("queue %d picked %d times of 400: %v", q, seen[q], seen)
		}
	}
	ro := Route{Queues: []QueueRoute{{Group: "g1"}}}
	if _, err := s.Select(&ro, "", now); err != ErrNoWritableQueue {
		t.Fatalf("no writable queue: %v", err)
	}
}

func TestSelectorNeverRetriesTheFailedGroup(t *testing.T) {
	for name, a := range map[string]Avoider{"table": NewLatencyTable(nil), "decaying": NewDecayingLatency()} {
		s := NewSelector(a)
		r := twoGroupRoute()
		for range 100 {
			if q, _ := s.Select(&r, "g1", time.Now()); q.Group != "g1" && q.Group != "g2" || q.Group == "g1" {
				t.Fatalf("%s: retry went back to the failed group", name)
			}
		}
		// With one writable group, it is the only choice.
		one := Route{Queues: []QueueRoute{{Group: "g1", Writable: true}}}
		if q, err := s.Select(&one, "g1", time.Now()); err != nil || q.Group != "g1" {
			t.Fatalf("%s: single group: %v %v", name, q, err)
		}
	}
}

func TestLatencyTable(t *testing.T) {
	tab := NewLatencyTable(nil)
	now := time.Now()
	tab.Report("slow", 600*time.Millisecond, false, now) // >= 550 ms: 30 s
	tab.Report("fast", 10*time.Millisecond, false, now)
	if got := tab.Choose([]string{"slow", "fast"}, now.Add(500*time.Millisecond)); got != 1 {
		t.Fatal("chose the slow group while it is avoided")
	}
	// Its probe is due a second after the report: it is let through once.
	if got := tab.Choose([]string{"slow", "fast"}, now.Add(time.Second)); got != 0 {
		t.Fatal("the slow group got no probe")
	}
	if got := tab.Choose([]string{"slow", "fast"}, now.Add(time.Second)); got != 1 {
		t.Fatal("the slow group got a second probe at once")
	}
	if got := tab.Choose([]string{"slow", "fast"}, now.Add(31*time.Second)); got != 0 {
		t.Fatal("the slow group is not tried again after its window")
	}
	tab.Report("fast", 0, true, now) // a failure: 600 s
	tab.Report("slow", 600*time.Millisecond, false, now)
	// Both avoided, no probe due: the one available again soonest.
	if got := tab.Choose([]string{"fast", "slow"}, now.Add(500*time.Millisecond)); got != 1 {
		t.Fatal("fallback did not take the least bad group")
	}
	// Without probes, a group waits out its whole duration.
	noProbe := NewLatencyTable(nil)
	noProbe.ProbeInterval = -1
	noProbe.Report("bad", 0, true, now)
	for _, d := range []time.Duration{time.Second, time.Minute, 599 * time.Second} {
		if noProbe.Choose([]string{"bad", "ok"}, now.Add(d)) != 1 {
			t.Fatalf("without probes the failed group was chosen %v after its failure", d)
		}
	}
}

// simulate runs sends on a virtual clock, one per step, to two groups
// offered in alternating round-robin order; bad(now) says whether a send to
// "bad" fails at that time ("good" never fails). It returns the times at
// which "bad" was chosen.
func simulate(tab *LatencyTable, start time.Time, steps int, step time.Duration, bad func(time.Time) bool) []time.Time {
	var hits []time.Time
	groups := [2][]string{{"bad", "good"}, {"good", "bad"}}
	now := start
	for i := range steps {
		g := groups[i%2][tab.Choose(groups[i%2], now)]
		if g == "bad" {
			hits = append(hits, now)
			tab.Report("bad", time.Millisecond, bad(now), now)
		} else {
			tab.Report("good", time.Millisecond, false, now)
		}
		now = now.Add(step)
	}
	return hits
}

// A group that failed is avoided, and once it is healthy again it gets
// traffic within MaxProbeInterval, not RocketMQ's 600 s.
func TestLatencyTableRecoveredGroupComesBack(t *testing.T) {
	tab := NewLatencyTable(nil)
	t0 := time.Unix(1000, 0)
	tab.Report("bad", 0, true, t0)
	healthyAt := t0.Add(30 * time.Second) // failing for 30 s, then healthy
	hits := simulate(tab, t0, 60_000, time.Millisecond, func(now time.Time) bool { return now.Before(healthyAt) })
	var during, after []time.Time
	for _, h := range hits {
		if h.Before(healthyAt) {
			during = append(during, h)
		} else {
			after = append(after, h)
		}
	}
	// While it fails: probes only, at most one per second, fewer as they
	// keep failing.
	if len(during) == 0 || len(during) > 30 {
		t.Fatalf("while failing for 30 s the group was chosen %d times; want a few probes", len(during))
	}
	if len(after) == 0 {
		t.Fatal("the recovered group got no traffic in 30 s")
	}
	if wait := after[0].Sub(healthyAt); wait > DefaultMaxProbeInterval {
		t.Fatalf("the recovered group got its first send %v after recovering; the bound is %v", wait, DefaultMaxProbeInterval)
	}
	// Once its probe succeeded it takes its round-robin share.
	if share := float64(len(after)) / 30_000; share < 0.4 {
		t.Fatalf("after recovering the group took %.2f of the sends", share)
	}
}

// With one healthy and one failing group, the healthy one gets every send
// but the failing one's probes: it is never starved, and the failing group,
// failing again at every probe, stays avoided (its probes thin out to one
// per MaxProbeInterval).
func TestLatencyTableFailingGroupStaysAvoided(t *testing.T) {
	tab := NewLatencyTable(nil)
	t0 := time.Unix(1000, 0)
	tab.Report("bad", 0, true, t0)
	const steps = 120_000 // 120 s
	hits := simulate(tab, t0, steps, time.Millisecond, func(time.Time) bool { return true })
	// 1 s, 2 s, 4 s, then every 4 s: at most about 32 probes in 120 s.
	if len(hits) < 5 || len(hits) > 33 {
		t.Fatalf("the failing group was chosen %d times in 120 s; want its probes only (about 30)", len(hits))
	}
	for i := 1; i < len(hits); i++ {
		if gap := hits[i].Sub(hits[i-1]); gap < DefaultProbeInterval {
			t.Fatalf("probes %v apart", gap)
		}
	}
	if gap := hits[len(hits)-1].Sub(hits[len(hits)-2]); gap != DefaultMaxProbeInterval {
		t.Fatalf("repeated failures: probes %v apart, want the cap %v", gap, DefaultMaxProbeInterval)
	}
	// The healthy group took everything else, from both round-robin orders.
	s := NewSelector(tab)
	r := Route{Queues: []QueueRoute{{Queue: 0, Group: "bad", Writable: true}, {Queue: 1, Group: "good", Writable: true}}}
	now := t0.Add(steps * time.Millisecond)
	good := 0
	for range 1000 {
		q, _ := s.Select(&r, "", now)
		if q.Group == "good" {
			good++
		}
	}
	if good < 999 {
		t.Fatalf("the healthy group got %d of 1000 sends while the other failed", good)
	}
}

// A probe that never answers (a hung broker) does not open the group: the
// next probe goes an interval later.
func TestLatencyTableUnansweredProbe(t *testing.T) {
	tab := NewLatencyTable(nil)
	t0 := time.Unix(1000, 0)
	tab.Report("bad", 0, true, t0)
	n := 0
	for now := t0; now.Before(t0.Add(10 * time.Second)); now = now.Add(time.Millisecond) {
		if tab.Choose([]string{"bad", "good"}, now) == 0 {
			n++ // no Report: the probe hangs
		}
	}
	if n < 2 || n > 4 {
		t.Fatalf("%d probes in 10 s with none answered; want one at 1 s, then every 2-4 s", n)
	}
}

func TestDecayingLatency(t *testing.T) {
	d := NewDecayingLatency()
	now := time.Now()
	for range 5 {
		d.Report("g1", 100*time.Millisecond, false, now)
		d.Report("g2", time.Millisecond, false, now)
	}
	if d.Choose([]string{"g1", "g2"}, now) != 1 || d.Choose([]string{"g2", "g1"}, now) != 0 {
		t.Fatal("did not prefer the faster group")
	}
	d.Report("g2", 0, true, now)
	if d.Choose([]string{"g1", "g2"}, now) != 0 {
		t.Fatal("a failure did not count against g2")
	}
	// Idle estimates decay: after a long quiet both look alike, and round-robin order wins.
	if d.Choose([]string{"g2", "g1"}, now.Add(time.Minute)) != 0 {
		t.Fatal("a failed group is never tried again")
	}
}

// noAvoid is plain round-robin, for comparison.
type noAvoid struct{}

func (noAvoid) Report(string, time.Duration, bool, time.Time) {}
func (noAvoid) Choose([]string, time.Time) int                { return 0 }

// BenchmarkAvoiders simulates 100,000 sends on a virtual clock to four
// groups; one of them turns slow (80-300 ms) for 2 s out of every 10 s and
// fails 2% of its sends meanwhile. It reports the mean and p99 latency a
// producer sees and the share of sends that hit the bad group while it was bad.
//
//	go test -run '^$' -bench BenchmarkAvoiders ./routing
func BenchmarkAvoiders(b *testing.B) {
	policies := []struct {
		name string
		make func() Avoider
	}{
		{"round-robin", func() Avoider { return noAvoid{} }},
		{"latency-table", func() Avoider { return NewLatencyTable(nil) }},
		{"decaying-p2c", func() Avoider { return NewDecayingLatency() }},
	}
	route := Route{Topic: "t"}
	for i := range 8 {
		route.Queues = append(route.Queues, QueueRoute{Queue: uint32(i), Group: []string{"g0", "g1", "g2", "bad"}[i%4], Writable: true})
	}
	for _, p := range policies {
		b.Run(p.name, func(b *testing.B) {
			var mean, p99, badShare float64
			for range b.N {
				rng := rand.New(rand.NewPCG(1, 2))
				s := NewSelector(p.make())
				now := time.Unix(0, 0)
				lats := make([]time.Duration, 0, 100_000)
				badHits, badWindow := 0, 0
				for range 100_000 {
					q, _ := s.Select(&route, "", now)
					lat := time.Duration(500+rng.IntN(1000)) * time.Microsecond
					failed := false
					slowNow := now.UnixNano()%int64(10*time.Second) < int64(2*time.Second)
					if slowNow {
						badWindow++
					}
					if q.Group == "bad" && slowNow {
						badHits++
						lat = time.Duration(80+rng.IntN(220)) * time.Millisecond
						failed = rng.IntN(50) == 0
					}
					s.Avoider().Report(q.Group, lat, failed, now.Add(lat))
					lats = append(lats, lat)
					// 64 sends in flight: the clock moves by a 64th of each.
					now = now.Add(lat / 64)
				}
				slices.Sort(lats)
				var sum time.Duration
				for _, l := range lats {
					sum += l
				}
				mean = float64(sum.Microseconds()) / float64(len(lats))
				p99 = float64(lats[len(lats)*99/100].Microseconds())
				badShare = float64(badHits) / float64(max(badWindow, 1))
			}
			b.ReportMetric(mean, "mean-µs")
			b.ReportMetric(p99, "p99-µs")
			b.ReportMetric(badShare, "bad-share")
		})
	}
}
