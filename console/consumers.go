package console

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/ops"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// maxConsumerName is the longest consumer group name the registry takes.
const maxConsumerName = 255

// consumerGroupParam reads a consumer group's name from the values' field
// name: required, and a name the registry takes.
func consumerGroupParam(v url.Values, name string) (string, error) {
	g := v.Get(name)
	if g == "" {
		return "", bad("say which consumer group (%s)", name)
	}
	if err := protocol.ValidateName("consumer group", g, maxConsumerName, "._-"); err != nil {
		return "", bad("%v", err)
	}
	return g, nil
}

// consumersData is the consumer groups page's: a page of the groups the
// principal may see, each with its total lag.
type consumersData struct {
	Groups []consumerRow
	Pager  pager
	Filter string
	// Named: the principal may not list every group (it lacks describe):
	// the page shows the groups its consume permissions name.
	Named  bool
	Charts []chart
}

type consumerRow struct {
	Name       string
	Generation uint64
	Members    int
	Topics     []string
	TotalLag   int64 // -1: unknown (LagError says why)
	LagError   string
}

func consumersPage(q *query) (any, error) {
	infos, named, err := q.visibleGroups()
	if err != nil {
		return nil, err
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].Name < infos[j].Name })
	shown, p, err := pageOf(q, infos, func(g api.ConsumerGroupInfo) string { return g.Name })
	if err != nil {
		return nil, err
	}
	d := consumersData{Pager: p, Filter: q.r.URL.Query().Get("q"), Named: named}
	routes, bs := newRoutes(q), q.brokers()
	defer bs.close()
	d.Groups = make([]consumerRow, len(shown))
	for i, info := range shown {
		queues, err := q.groupQueues(routes, bs, info)
		if err != nil {
			return nil, err
		}
		row := consumerRow{Name: info.Name, Generation: info.Generation, Members: len(info.Members), Topics: groupTopics(info)}
		row.TotalLag, row.LagError = totalLag(queues)
		d.Groups[i] = row
	}
	names := make([]string, len(d.Groups))
	for i, g := range d.Groups {
		names[i] = g.Name
	}
	d.Charts = q.lagCharts(names)
	return d, nil
}

// visibleGroups is every consumer group for a principal that may list them
// all (describe, admin); for one that may not, the groups its consume
// permissions name exactly (a pattern names none to list), those that
// exist.
func (q *query) visibleGroups() (infos []api.ConsumerGroupInfo, named bool, err error) {
	if q.allow(protocol.CodeConsumerGroups, auth.Target{}) == nil {
		release, err := q.slot()
		if err != nil {
			return nil, false, err
		}
		defer release()
		infos, err = q.meta().ConsumerGroups(q.ctx, "")
		return infos, false, err
	}
	seen := map[string]bool{}
	for _, perm := range q.s.principal.Permissions {
		g := string(perm.Group)
		if perm.Kind != auth.KindConsume || g == "" || strings.HasSuffix(g, "*") || seen[g] {
			continue
		}
		seen[g] = true
		info, err := q.consumerGroup(g)
		if errors.Is(err, protocol.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, true, err
		}
		infos = append(infos, info)
	}
	return infos, true, nil
}

// consumerGroup reads one group from the registry (a call slot).
func (q *query) consumerGroup(name string) (api.ConsumerGroupInfo, error) {
	release, err := q.slot()
	if err != nil {
		return api.ConsumerGroupInfo{}, err
	}
	defer release()
	return ops.ConsumerGroup(q.ctx, q.meta(), name)
}

// groupTopics is the topics a group subscribes to, its members', and those
// it has offsets for, sorted.
func groupTopics(info api.ConsumerGroupInfo) []string {
	var all []string
	all = append(all, info.Topics...)
	for _, m := range info.Members {
		all = append(all, m.Topics...)
	}
	for _, o := range info.Offsets {
		all = append(all, o.Topic)
	}
	return distinct(all)
}

// routes looks each topic's route up once per page.
type routes struct {
	q    *query
	mu   sync.Mutex
	byT  map[string]routing.Route
	errs map[string]error
}

func newRoutes(q *query) *routes {
	return &routes{q: q, byT: map[string]routing.Route{}, errs: map[string]error{}}
}

// get returns a topic's route; ok false for a topic that no longer exists.
func (r *routes) get(topic string) (routing.Route, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rt, ok := r.byT[topic]; ok {
		return rt, true, nil
	}
	if err, ok := r.errs[topic]; ok {
		return routing.Route{}, false, err
	}
	release, err := r.q.slot()
	if err != nil {
		return routing.Route{}, false, err
	}
	rt, err := r.q.routes().RouteExisting(r.q.ctx, topic)
	release()
	if errors.Is(err, protocol.ErrUnknownTopic) {
		r.errs[topic] = nil
		return routing.Route{}, false, nil
	}
	if err != nil {
		return routing.Route{}, false, err
	}
	r.byT[topic] = rt
	return rt, true, nil
}

// queueLag is one queue of a consumer group: who holds it, what the group
// committed, and the queue's log range and the group's lag when read.
type queueLag struct {
	Topic     string
	Queue     uint32
	Owner     string
	Committed int64 // -1: nothing committed
	Start     int64 // -1 (with End, Lag): not read
	End       int64
	Lag       int64
	Error     string
	route     routing.QueueRoute
	routed    bool
}

// groupQueues is every queue of the group's topics (and any other it has
// an offset for), with its owner and committed offset, sorted; rangesOf
// reads their log ranges.
func (q *query) groupQueues(rs *routes, bs *brokers, info api.ConsumerGroupInfo) ([]queueLag, error) {
	type key struct {
		topic string
		queue uint32
	}
	byKey := map[key]*queueLag{}
	add := func(k key) *queueLag {
		ql := byKey[k]
		if ql == nil {
			ql = &queueLag{Topic: k.topic, Queue: k.queue, Committed: -1, Start: -1, End: -1, Lag: -1}
			byKey[k] = ql
		}
		return ql
	}
	for _, t := range groupTopics(info) {
		rt, ok, err := rs.get(t)
		if err != nil {
			return nil, fmt.Errorf("the route of %s: %w", t, err)
		}
		for _, qr := range rt.Queues {
			if ok {
				ql := add(key{t, qr.Queue})
				ql.route, ql.routed = qr, true
			}
		}
	}
	for _, o := range info.Offsets {
		add(key{o.Topic, o.Queue}).Committed = o.Offset
	}
	for _, m := range info.Members {
		for _, mq := range m.Queues {
			add(key{mq.Topic, mq.Queue}).Owner = m.ID
		}
	}
	out := make([]queueLag, 0, len(byKey))
	for _, ql := range byKey {
		out = append(out, *ql)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Queue < out[j].Queue
	})
	q.readLags(bs, out)
	return out, nil
}

// readLags reads the log range of each queue the principal may count the
// messages of (describe, or consume on its topic), a call slot each, and
// the group's lag on it: the log end less the committed offset, or the
// messages held when nothing is committed.
func (q *query) readLags(bs *brokers, qs []queueLag) {
	var wg sync.WaitGroup
	for i := range qs {
		ql := &qs[i]
		switch {
		case !ql.routed:
			ql.Error = fmt.Sprintf("topic %s has no queue %d", ql.Topic, ql.Queue)
			continue
		case q.allow(protocol.CodeQueueCount, auth.Topic(ql.Topic)) != nil:
			ql.Error = "the lag needs describe, or consume on " + ql.Topic
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			lo, hi, err := bs.queueRange(ql.Topic, ql.route)
			if err != nil {
				ql.Error = err.Error()
				return
			}
			ql.Start, ql.End = lo, hi
			ql.Lag = hi - lo
			if ql.Committed >= 0 {
				ql.Lag = max(hi-ql.Committed, 0)
			}
		}()
	}
	wg.Wait()
}

// totalLag sums the queues' lags; -1 and why when one is unknown.
func totalLag(qs []queueLag) (int64, string) {
	var sum int64
	for _, ql := range qs {
		if ql.Lag < 0 {
			return -1, fmt.Sprintf("%s queue %d: %s", ql.Topic, ql.Queue, ql.Error)
		}
		sum += ql.Lag
	}
	return sum, ""
}

// consumerData is one consumer group's page.
type consumerData struct {
	Name, Filter, FilterBy string
	Generation             uint64
	Topics                 []string
	Members                []api.ConsumerMemberInfo
	Queues                 []queueLag
	Pager                  pager
	TotalLag               int64
	LagError               string
	MayReset               bool
	Reset                  *resetView // the reset form or its preview (?reset=TOPIC)
	ResetDone              string     // the topic whose offsets were just reset (?reset-done=)
	CSRF                   string
	Charts                 []chart
}

func consumerPage(q *query) (any, error) {
	v := q.r.URL.Query()
	name, err := consumerGroupParam(v, "group")
	if err != nil {
		return nil, err
	}
	if err := q.allow(protocol.CodeConsumerGroups, auth.Target{Group: name}); err != nil {
		return nil, err
	}
	var resetTopic string
	if v.Has("reset-done") {
		if _, err := topicParam(v, "reset-done"); err != nil {
			return nil, err
		}
	}
	if v.Has("reset") {
		if resetTopic, err = topicParam(v, "reset"); err != nil {
			return nil, err
		}
	}
	info, err := q.consumerGroup(name)
	if err != nil {
		return nil, unknownIsBad(err)
	}
	d := consumerData{Name: info.Name, Filter: info.Filter, FilterBy: info.FilterBy, Generation: info.Generation,
		Topics: groupTopics(info), Members: slices.Clone(info.Members), CSRF: q.s.csrf, TotalLag: -1,
		MayReset: q.allow(protocol.CodeResetOffsets, auth.Target{Group: name}) == nil}
	d.ResetDone = v.Get("reset-done")
	sort.Slice(d.Members, func(i, j int) bool { return d.Members[i].ID < d.Members[j].ID })
	bs := q.brokers()
	defer bs.close()
	queues, err := q.groupQueues(newRoutes(q), bs, info)
	if err != nil {
		return nil, err
	}
	if d.Queues, d.Pager, err = pageOf(q, queues, func(ql queueLag) string { return ql.Topic }); err != nil {
		return nil, err
	}
	d.TotalLag, d.LagError = totalLag(queues)
	if resetTopic != "" {
		if !d.MayReset {
			return nil, q.allow(protocol.CodeResetOffsets, auth.Target{Group: name})
		}
		if d.Reset, err = q.resetView(bs, info, resetTopic, v); err != nil {
			return nil, err
		}
	}
	d.Charts = q.lagCharts([]string{name})
	return d, nil
}
