package console

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// The charts: a sampler in the console reads, every sampleEvery on the
// console's clock, each broker group's master's log end (from the
// registry's heartbeats) and each consumer group's total lag (the
// registry's committed offsets against the queues' log ends, a QUEUE_COUNT
// each), with the console's own credential, and keeps the last
// sampleWindow of them in memory. Pages draw them as small inline SVG
// lines, server-side, to who may see the page (and a consumer group's lag
// to who may describe or consume that group).
const (
	sampleEvery  = 5 * time.Second
	sampleWindow = 10 * time.Minute
	// maxSeries bounds the broker groups and the consumer groups sampled
	// (the first by name); maxLagQueues bounds the queues whose ends one
	// sample reads.
	maxSeries    = 500
	maxLagQueues = 2000
	chartW       = 240
	chartH       = 40
)

// point is one sample.
type point struct {
	at time.Time
	v  float64
}

// series is a bounded line of samples, oldest first.
type series struct{ pts []point }

// plus adds o's points to s's at the same times (the sampler takes every
// series of a sample at one time), keeping s in time order.
func (s *series) plus(o *series) {
	for _, p := range o.pts {
		i := sort.Search(len(s.pts), func(i int) bool { return !s.pts[i].at.Before(p.at) })
		if i < len(s.pts) && s.pts[i].at.Equal(p.at) {
			s.pts[i].v += p.v
			continue
		}
		s.pts = slices.Insert(s.pts, i, p)
	}
}

func (s *series) add(p point) {
	s.pts = append(s.pts, p)
	cut := 0
	for cut < len(s.pts) && p.at.Sub(s.pts[cut].at) > sampleWindow {
		cut++
	}
	if most := int(sampleWindow/sampleEvery) + 1; len(s.pts)-cut > most {
		cut = len(s.pts) - most
	}
	s.pts = append(s.pts[:0], s.pts[cut:]...)
}

// logEnd is a broker group's master's last log end seen.
type logEnd struct {
	master string
	end    int64
	at     time.Time
}

// sampler keeps the charts' samples.
type sampler struct {
	clock  clockwork.Clock
	cfg    Config
	cl     *client.Client
	token  string
	cancel context.CancelFunc
	done   chan struct{}
	// samples counts the samples taken (tests wait on it).
	samples atomic.Int64

	mu    sync.Mutex
	rates map[string]*series // broker group: bytes stored a second
	lags  map[string]*series // consumer group: total lag
	ends  map[string]logEnd
	err   string // the last sample's failure ("": none)
}

// startSampler starts sampling with cl (presenting token to brokers); stop
// ends it.
func startSampler(cfg Config, cl *client.Client, token string) *sampler {
	ctx, cancel := context.WithCancel(context.Background())
	s := &sampler{clock: cfg.Clock, cfg: cfg, cl: cl, token: token, cancel: cancel, done: make(chan struct{}),
		rates: map[string]*series{}, lags: map[string]*series{}, ends: map[string]logEnd{}}
	t := s.clock.NewTicker(sampleEvery)
	go func() {
		defer close(s.done)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.Chan():
				s.sample(ctx)
			}
		}
	}()
	return s
}

func (s *sampler) stop() {
	s.cancel()
	<-s.done
}

// sample takes one sample of every series, within the console's call time.
func (s *sampler) sample(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
	defer cancel()
	now := s.clock.Now()
	var errs []error
	groups, err := s.cl.Groups(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("broker groups: %w", err))
	}
	lags, err := s.lagsNow(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("consumer groups: %w", err))
	}
	s.mu.Lock()
	s.addRates(groups, now)
	for group, topics := range lags {
		for topic, lag := range topics {
			s.serie(s.lags, lagKey(group, topic)).add(point{now, float64(lag)})
		}
	}
	forget(s.lags, now)
	s.err = ""
	if err := errors.Join(errs...); err != nil {
		s.err = err.Error()
	}
	s.mu.Unlock()
	s.samples.Add(1)
}

// addRates adds each group's bytes stored a second since its master's last
// log end seen (none after a change of master: the ends are not of one log).
func (s *sampler) addRates(groups []api.GroupInfo, now time.Time) {
	sort.Slice(groups, func(i, j int) bool { return groups[i].Name < groups[j].Name })
	for _, g := range groups[:min(len(groups), maxSeries)] {
		cur := logEnd{master: g.Master.ID, end: g.Last.LogEnd, at: now}
		prev, ok := s.ends[g.Name]
		s.ends[g.Name] = cur
		if !ok || prev.master != cur.master || cur.end < prev.end || !now.After(prev.at) {
			continue
		}
		s.serie(s.rates, g.Name).add(point{now, float64(cur.end-prev.end) / now.Sub(prev.at).Seconds()})
	}
	forget(s.rates, now)
	for name, e := range s.ends {
		if now.Sub(e.at) > sampleWindow {
			delete(s.ends, name)
		}
	}
}

func (s *sampler) serie(m map[string]*series, name string) *series {
	sr := m[name]
	if sr == nil {
		sr = &series{}
		m[name] = sr
	}
	return sr
}

// forget drops the series with no sample in the window (a group gone).
func forget(m map[string]*series, now time.Time) {
	for name, sr := range m {
		if len(sr.pts) == 0 || now.Sub(sr.pts[len(sr.pts)-1].at) > sampleWindow {
			delete(m, name)
		}
	}
}

// lagKey names the series of a consumer group's lag on one topic.
func lagKey(group, topic string) string { return group + "\x00" + topic }

// lagsNow is the lag, per topic, of the first maxSeries consumer groups,
// reading at most maxLagQueues queues' ends; a group with a queue not read
// is left out of this sample.
func (s *sampler) lagsNow(ctx context.Context) (map[string]map[string]int64, error) {
	infos, err := s.cl.ConsumerGroups(ctx, "")
	if err != nil {
		return nil, err
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].Name < infos[j].Name })
	infos = infos[:min(len(infos), maxSeries)]
	r := &rangeReader{s: s, ctx: ctx, ranges: map[string][2]int64{}, conns: map[string]*transport.Client{}}
	defer r.close()
	routes := map[string]routing.Route{}
	out := map[string]map[string]int64{}
groups:
	for _, info := range infos {
		committed := map[string]int64{}
		for _, o := range info.Offsets {
			committed[fmt.Sprint(o.Topic, "/", o.Queue)] = o.Offset
		}
		lags := map[string]int64{}
		for _, t := range groupTopics(info) {
			var lag int64
			rt, ok := routes[t]
			if !ok {
				if rt, err = s.cl.RouteExisting(ctx, t); errors.Is(err, protocol.ErrUnknownTopic) {
					continue
				} else if err != nil {
					return out, err
				}
				routes[t] = rt
			}
			for _, qr := range rt.Queues {
				lo, hi, ok := r.get(t, qr)
				if !ok {
					continue groups
				}
				if c, ok := committed[fmt.Sprint(t, "/", qr.Queue)]; ok {
					lag += max(hi-c, 0)
				} else {
					lag += hi - lo
				}
			}
			lags[t] = lag
		}
		out[info.Name] = lags
	}
	return out, r.err
}

// rangeReader reads queues' log ranges for one sample: each once, on one
// connection per broker, at most maxLagQueues.
type rangeReader struct {
	s      *sampler
	ctx    context.Context
	ranges map[string][2]int64
	conns  map[string]*transport.Client
	reads  int
	err    error // the first failure
}

func (r *rangeReader) get(topic string, qr routing.QueueRoute) (lo, hi int64, ok bool) {
	k := fmt.Sprint(topic, "/", qr.Queue)
	if v, ok := r.ranges[k]; ok {
		return v[0], v[1], true
	}
	addr := qr.Master
	if addr == "" {
		addr = qr.Slave
	}
	if addr == "" || r.reads >= maxLagQueues {
		return 0, 0, false
	}
	r.reads++
	c := r.conns[addr]
	if c == nil {
		c = transport.NewClient(addr, transport.ClientConfig{TLS: r.s.cfg.TLS, Login: auth.TokenLogin(r.s.token), CallTimeout: r.s.cfg.CallTimeout})
		r.conns[addr] = c
	}
	lo, hi, err := countRange(r.ctx, c, topic, qr.Queue)
	if err != nil {
		if r.err == nil {
			r.err = fmt.Errorf("%s queue %d: %w", topic, qr.Queue, err)
		}
		return 0, 0, false
	}
	r.ranges[k] = [2]int64{lo, hi}
	return lo, hi, true
}

func (r *rangeReader) close() {
	for _, c := range r.conns {
		_ = c.Close()
	}
}

// chart is a small inline SVG line of samples.
type chart struct {
	ID, Title, Last, Note string
	Points                string // the polyline's points ("": no line, Note says why)
	W, H                  int
}

// drawn is the chart of sr (nil: no samples yet) at now.
func drawn(id, title, unit string, sr *series, now time.Time, note string) chart {
	c := chart{ID: id, Title: title, W: chartW, H: chartH, Last: "-", Note: note}
	if sr == nil || len(sr.pts) == 0 {
		if c.Note == "" {
			c.Note = "no samples yet (one every 5 s)"
		}
		return c
	}
	top := 1.0
	for _, p := range sr.pts {
		top = max(top, p.v)
	}
	from := now.Add(-sampleWindow)
	var xy []string
	for _, p := range sr.pts {
		x := min(max(float64(chartW)*float64(p.at.Sub(from))/float64(sampleWindow), 2), chartW)
		y := float64(chartH-2) - float64(chartH-4)*p.v/top
		if len(sr.pts) == 1 { // one sample: a short dash
			xy = append(xy, fmt.Sprintf("%.1f,%.1f", x-2, y))
		}
		xy = append(xy, fmt.Sprintf("%.1f,%.1f", x, y))
	}
	c.Points = strings.Join(xy, " ")
	c.Last = fmt.Sprintf("%.0f%s", sr.pts[len(sr.pts)-1].v, unit)
	return c
}

// chartNote says why the charts have nothing to show ("": nothing wrong).
func (c *Console) chartNote() string {
	if c.sampler == nil {
		return "no charts: authorization is on and the console has no cluster token (-auth-cluster-token-file) to sample with"
	}
	c.sampler.mu.Lock()
	defer c.sampler.mu.Unlock()
	if c.sampler.err != "" {
		return "the last sample failed: " + c.sampler.err
	}
	return ""
}

// groupCharts are the bytes-stored-a-second charts of broker groups (the
// page showing them checked its own permission: describe).
func (q *query) groupCharts(groups []string) []chart {
	note := q.c.chartNote()
	out := make([]chart, 0, len(groups))
	now := q.c.cfg.Clock.Now()
	for _, g := range groups {
		out = append(out, drawn("rate-"+g, g+" bytes stored a second", " B/s", q.c.series(func(s *sampler) *series { return s.rates[g] }), now, note))
	}
	return out
}

// lagCharts are the lag charts of the consumer groups: each sums the
// group's lag on the topics the principal may see it for (describe: all;
// a consumer: those its permission names with the group), as the group's
// table does; a group with none is left out.
func (q *query) lagCharts(groups []string) []chart {
	note := q.c.chartNote()
	var out []chart
	now := q.c.cfg.Clock.Now()
	all := q.allow(protocol.CodeConsumerGroups, auth.Target{}) == nil
	for _, g := range groups {
		if q.allow(protocol.CodeConsumerGroups, auth.Target{Group: g}) != nil {
			continue
		}
		sum := q.c.series(func(s *sampler) *series {
			var total series
			for k, sr := range s.lags {
				group, topic, _ := strings.Cut(k, "\x00")
				if group == g && (all || q.allow(protocol.CodeCommitOffsets, auth.Target{Topics: []string{topic}, Group: g}) == nil) {
					total.plus(sr)
				}
			}
			return &total
		})
		out = append(out, drawn("lag-"+g, g+" lag (messages)", "", sum, now, note))
	}
	return out
}

// series is a copy of the sampler's series pick returns (nil: none).
func (c *Console) series(pick func(*sampler) *series) *series {
	if c.sampler == nil {
		return nil
	}
	c.sampler.mu.Lock()
	defer c.sampler.mu.Unlock()
	sr := pick(c.sampler)
	if sr == nil {
		return nil
	}
	return &series{pts: append([]point(nil), sr.pts...)}
}

// sampledLagGroups is the names of the first n consumer groups sampled, by
// name.
func (c *Console) sampledLagGroups(n int) []string {
	if c.sampler == nil {
		return nil
	}
	c.sampler.mu.Lock()
	seen := map[string]bool{}
	for k := range c.sampler.lags {
		group, _, _ := strings.Cut(k, "\x00")
		seen[group] = true
	}
	c.sampler.mu.Unlock()
	names := slices.Sorted(maps.Keys(seen))
	return names[:min(len(names), n)]
}
