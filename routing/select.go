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

// LatencyTable is RocketMQ's policy with probes: a send that took at least
// Latencies[i] makes its group avoided for Durations[i]; a failure counts as
// the last row. Choose prefers a group not avoided, then the one available
// again soonest.
//
// RocketMQ's durations are long (a failure avoids a group for 600 s), so a
// group that recovered would get nothing for minutes. Probes bring it back:
// while a group is avoided, Choose lets one send through to it
// ProbeInterval after its last bad report, and ProbeInterval doubles with
// each probe that fails again, up to MaxProbeInterval. A probe answered fast
// (below Latencies[0]'s row with an avoid duration, i.e. any answer the
// table does not penalize) clears the group. So a group that is healthy
// again gets traffic within MaxProbeInterval (4 s by default) of
// recovering, as long as sends to it are offered; a group that keeps
// failing gets one send per MaxProbeInterval; and a healthy group is never
// starved, since an avoided group is chosen over an available one only for
// its one probe.
type LatencyTable struct {
	Latencies []time.Duration
	Durations []time.Duration
	// ProbeInterval is how long after a bad report an avoided group gets a
	// probe; it doubles for every probe that fails, up to MaxProbeInterval.
	// 0: DefaultProbeInterval (1 s); negative: no probes (RocketMQ's
	// behavior: the group waits out its whole duration).
	ProbeInterval time.Duration
	// MaxProbeInterval caps the probe interval. 0: DefaultMaxProbeInterval
	// (4 s).
	MaxProbeInterval time.Duration

	mu    sync.Mutex
	state map[string]*penalty
}

// Probe intervals of a LatencyTable whose fields are zero.
const (
	DefaultProbeInterval    = time.Second
	DefaultMaxProbeInterval = 4 * time.Second
)

// penalty is an avoided group's state.
type penalty struct {
	until   time.Time // avoided until
	probeAt time.Time // the next probe may go at or after this
	strikes int       // probes that failed in a row
	probing bool      // a probe was let through and has not been judged
}

// DefaultLatencyTable is RocketMQ's table (DESIGN.md section 6).
var DefaultLatencyTable = [2][]time.Duration{
	{50 * time.Millisecond, 100 * time.Millisecond, 550 * time.Millisecond, time.Second, 2 * time.Second, 3 * time.Second, 15 * time.Second},
	{0, 0, 30 * time.Second, 60 * time.Second, 120 * time.Second, 180 * time.Second, 600 * time.Second},
}

// NewLatencyTable returns the table policy; scale multiplies every row
// (nil or 1: RocketMQ's figures), so tests can run it in milliseconds. The
// probe intervals are the defaults, unscaled.
func NewLatencyTable(scale *float64) *LatencyTable {
	f := 1.0
	if scale != nil {
		f = *scale
	}
	t := &LatencyTable{state: map[string]*penalty{}}
	for i := range DefaultLatencyTable[0] {
		t.Latencies = append(t.Latencies, time.Duration(float64(DefaultLatencyTable[0][i])*f))
		t.Durations = append(t.Durations, time.Duration(float64(DefaultLatencyTable[1][i])*f))
	}
	return t
}

// probeInterval is the wait before a probe after strikes failed probes.
func (t *LatencyTable) probeInterval(strikes int) time.Duration {
	base, limit := t.ProbeInterval, t.MaxProbeInterval
	if base == 0 {
		base = DefaultProbeInterval
	}
	if limit <= 0 {
		limit = DefaultMaxProbeInterval
	}
	limit = max(limit, base)
	d := base << min(strikes, 20)
	if d <= 0 || d > limit {
		d = limit
	}
	return d
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
	defer t.mu.Unlock()
	if avoid <= 0 {
		delete(t.state, group) // a good answer clears the group (a probe's included)
		return
	}
	if t.state == nil {
		t.state = map[string]*penalty{}
	}
	p := t.state[group]
	if p == nil {
		p = &penalty{}
		t.state[group] = p
	}
	if p.probing {
		p.probing = false
		p.strikes++ // taken as the probe's answer: the next probe waits longer
	}
	p.until = now.Add(avoid)
	p.probeAt = now.Add(t.probeInterval(p.strikes))
}

func (t *LatencyTable) Choose(groups []string, now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	best, bestUntil := 0, time.Time{}
	for i, g := range groups {
		p, ok := t.state[g]
		if !ok || !now.Before(p.until) {
			return i // available: round-robin order decides
		}
		if t.ProbeInterval >= 0 && !now.Before(p.probeAt) {
			// Its probe: one send, and the next one only after another
			// interval if this one is never judged (its answer never came:
			// that counts as a failed probe).
			if p.probing {
				p.strikes++
			}
			p.probing = true
			p.probeAt = now.Add(t.probeInterval(p.strikes + 1))
			return i
		}
		if i == 0 || p.until.Before(bestUntil) {
			best, bestUntil = i, p.until
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
