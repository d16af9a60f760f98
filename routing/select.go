package routing

import (
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// ErrNoWritableQueue is returned when a route has no queue whose group takes writes.
var ErrNoWritableQueue = errors.New("routing: no writable queue")

// Avoider is a latency-fault avoidance policy: it learns from every send's
// outcome per broker group and tells the selector which groups to avoid.
// Implementations are safe for concurrent use.
type Avoider interface {
	// Report records the outcome of a send to group: its latency, and
	// whether it failed (a failure counts as the worst latency).
	Report(group string, latency time.Duration, failed bool, now time.Time)
	// Choose returns the index of the group to send to among groups (at
	// least two, distinct, in round-robin order: index 0 is the group whose
	// turn it is).
	Choose(groups []string, now time.Time) int
}

// Selector picks a queue for each send: round-robin over the writable
// queues, skipping groups the Avoider advises against, and never the group
// that just failed when another writable group exists. When every group is
// avoided it takes the least bad one. Safe for concurrent use.
type Selector struct {
	avoider Avoider
	rr      atomic.Uint64
}

// NewSelector returns a selector using avoider (nil: NewLatencyTable(nil)).
func NewSelector(avoider Avoider) *Selector {
	if avoider == nil {
		avoider = NewLatencyTable(nil)
	}
	return &Selector{avoider: avoider}
}

// Avoider returns the selector's policy.
func (s *Selector) Avoider() Avoider { return s.avoider }

// Plan is a route prepared for fast selection: its writable queues and
// their distinct groups. Build it once per route version with NewPlan.
type Plan struct {
	Route    Route
	writable []QueueRoute
	groupOf  []int          // groupOf[i]: index in groups of writable[i]'s group
	groups   []string       // distinct groups of writable queues, in first-seen order
	byGroup  [][]QueueRoute // each group's writable queues
	rr       []atomic.Uint64
}

// NewPlan prepares r for selection.
func NewPlan(r Route) *Plan {
	p := &Plan{Route: r}
	idx := map[string]int{}
	for _, q := range r.Queues {
		if !q.Writable {
			continue
		}
		g, ok := idx[q.Group]
		if !ok {
			g = len(p.groups)
			idx[q.Group] = g
			p.groups = append(p.groups, q.Group)
			p.byGroup = append(p.byGroup, nil)
		}
		p.writable = append(p.writable, q)
		p.groupOf = append(p.groupOf, g)
		p.byGroup[g] = append(p.byGroup[g], q)
	}
	p.rr = make([]atomic.Uint64, len(p.groups))
	return p
}

// Select picks a queue of r. avoid names a group that just failed ("" for
// none). For many sends to one route, build a Plan and use SelectPlan.
func (s *Selector) Select(r *Route, avoid string, now time.Time) (QueueRoute, error) {
	return s.SelectPlan(NewPlan(*r), avoid, now)
}

// SelectPlan picks a queue: the queue under the round-robin cursor, unless
// the avoider prefers another group (offered in ring order from the
// cursor's group), in which case that group's next queue.
func (s *Selector) SelectPlan(p *Plan, avoid string, now time.Time) (QueueRoute, error) {
	if len(p.writable) == 0 {
		return QueueRoute{}, ErrNoWritableQueue
	}
	n := uint64(len(p.writable))
	cursor := int(s.rr.Add(1) % n)
	first := p.groupOf[cursor]
	if len(p.groups) == 1 {
		return p.writable[cursor], nil
	}
	var buf [8]string
	cands := buf[:0]
	var candIdx [8]int
	for i := range p.groups {
		g := (first + i) % len(p.groups)
		if p.groups[g] == avoid {
			continue
		}
		if len(cands) == len(buf) {
			break
		}
		candIdx[len(cands)] = g
		cands = append(cands, p.groups[g])
	}
	if len(cands) == 0 {
		return p.writable[cursor], nil // only the avoided group is writable
	}
	pick := 0
	if len(cands) > 1 {
		pick = s.avoider.Choose(cands, now)
	}
	g := candIdx[pick]
	if g == first {
		return p.writable[cursor], nil
	}
	qs := p.byGroup[g]
	return qs[int(p.rr[g].Add(1)%uint64(len(qs)))], nil
}

// LatencyTable is RocketMQ's policy: a send that took at least
// Latencies[i] makes its group unavailable for Durations[i]; a failure
// counts as the last row. Choose prefers an available group, then the one
// available again soonest.
type LatencyTable struct {
	Latencies []time.Duration
	Durations []time.Duration

	mu    sync.Mutex
	until map[string]time.Time
}

// DefaultLatencyTable is RocketMQ's table (DESIGN.md section 6).
var DefaultLatencyTable = [2][]time.Duration{
	{50 * time.Millisecond, 100 * time.Millisecond, 550 * time.Millisecond, time.Second, 2 * time.Second, 3 * time.Second, 15 * time.Second},
	{0, 0, 30 * time.Second, 60 * time.Second, 120 * time.Second, 180 * time.Second, 600 * time.Second},
}

// NewLatencyTable returns the table policy; scale multiplies every row
// (nil or 1: RocketMQ's figures), so tests can run it in milliseconds.
func NewLatencyTable(scale *float64) *LatencyTable {
	f := 1.0
	if scale != nil {
		f = *scale
	}
	t := &LatencyTable{until: map[string]time.Time{}}
	for i := range DefaultLatencyTable[0] {
		t.Latencies = append(t.Latencies, time.Duration(float64(DefaultLatencyTable[0][i])*f))
		t.Durations = append(t.Durations, time.Duration(float64(DefaultLatencyTable[1][i])*f))
	}
	return t
}

func (t *LatencyTable) Report(group string, latency time.Duration, failed bool, now time.Time) {
	avoid := time.Duration(0)
	if failed {
		avoid = t.Durations[len(t.Durations)-1]
	} else {
		for i := len(t.Latencies) - 1; i >= 0; i-- {
			if latency >= t.Latencies[i] {
				avoid = t.Durations[i]
				break
			}
		}
	}
	t.mu.Lock()
	if t.until == nil {
		t.until = map[string]time.Time{}
	}
	if avoid > 0 {
		t.until[group] = now.Add(avoid)
	} else {
		delete(t.until, group)
	}
	t.mu.Unlock()
}

func (t *LatencyTable) Choose(groups []string, now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	best, bestUntil := 0, time.Time{}
	for i, g := range groups {
		u, ok := t.until[g]
		if !ok || !now.Before(u) {
			return i // available: round-robin order decides
		}
		if i == 0 || u.Before(bestUntil) {
			best, bestUntil = i, u
		}
	}
	return best
}

// DecayingLatency keeps an exponentially weighted moving average of each
// group's send latency, with a failure counted as Penalty; the estimate of
// a group not heard from decays back toward zero with HalfLife, so a group
// that was bad is tried again by itself. Choose takes the group with the
// lower estimate among the first two offered (the group whose turn it is
// and the next one): the "power of two choices", which needs no scan and
// keeps load spread.
type DecayingLatency struct {
	Alpha    float64       // weight of a new sample; default 0.5
	Penalty  time.Duration // latency a failure counts as; default 1 s
	HalfLife time.Duration // decay of an idle group's estimate; default 2 s
	Slack    time.Duration // differences below it do not matter; default 1 ms

	mu  sync.Mutex
	est map[string]ewma
}

type ewma struct {
	v  float64 // nanoseconds
	at time.Time
}

// NewDecayingLatency returns the policy with its defaults.
func NewDecayingLatency() *DecayingLatency {
	return &DecayingLatency{Alpha: 0.5, Penalty: time.Second, HalfLife: 2 * time.Second, Slack: time.Millisecond, est: map[string]ewma{}}
}

func (d *DecayingLatency) decayed(e ewma, now time.Time) float64 {
	age := now.Sub(e.at)
	if age <= 0 || d.HalfLife <= 0 {
		return e.v
	}
	return e.v * math.Exp2(-float64(age)/float64(d.HalfLife))
}

func (d *DecayingLatency) Report(group string, latency time.Duration, failed bool, now time.Time) {
	if failed {
		latency = max(latency, d.Penalty)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.est == nil {
		d.est = map[string]ewma{}
	}
	e, ok := d.est[group]
	if !ok {
		d.est[group] = ewma{v: float64(latency), at: now}
		return
	}
	cur := d.decayed(e, now)
	d.est[group] = ewma{v: cur + d.Alpha*(float64(latency)-cur), at: now}
}

func (d *DecayingLatency) Choose(groups []string, now time.Time) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	best, bestV := 0, math.Inf(1)
	for i, g := range groups[:min(2, len(groups))] {
		v := 0.0
		if e, ok := d.est[g]; ok {
			v = d.decayed(e, now)
		}
		// Estimates within 10% or within Slack of each other count as equal
		// and keep the round-robin order, so load spreads and a group whose
		// bad estimate has decayed is tried again.
		if i == 0 || v < bestV*0.9 && bestV-v > float64(d.Slack) {
			best, bestV = i, v
		}
	}
	return best
}

// Jitter returns d scaled by a random factor in [0.5, 1.5).
func Jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.5 + rand.Float64()))
}
