package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/internal/ops"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// groupSummaryJSON is one line of `groups`.
type groupSummaryJSON struct {
	Name       string   `json:"name"`
	Generation uint64   `json:"generation"`
	Members    int      `json:"members"`
	Topics     []string `json:"topics"`
	// TotalLag is the sum of the queues' lags; null when a queue's log end
	// could not be read (LagError says why).
	TotalLag *int64 `json:"total_lag"`
	LagError string `json:"lag_error,omitempty"`
}

// groupDescribeJSON is what `group describe --json` prints.
type groupDescribeJSON struct {
	Name       string         `json:"name"`
	Generation uint64         `json:"generation"`
	Topics     []string       `json:"topics"`
	Members    []memberJSON   `json:"members"`
	Queues     []queueLagJSON `json:"queues"`
	TotalLag   *int64         `json:"total_lag"`
	// Filter is the group's filter ("": every message) and FilterBy who
	// set it; TotalToReceive sums the queues' ToReceive.
	Filter         string `json:"filter,omitempty"`
	FilterBy       string `json:"filter_by,omitempty"`
	TotalToReceive *int64 `json:"total_to_receive,omitempty"`
}

type memberJSON struct {
	ID                 string            `json:"id"`
	Topics             []string          `json:"topics"`
	HeartbeatAgeMillis int64             `json:"heartbeat_age_ms"`
	Queues             []api.QueueOffset `json:"queues"`
}

// queueLagJSON is one queue of a group: who holds it, what the group
// committed and how far the queue's log goes.
type queueLagJSON struct {
	Topic string `json:"topic"`
	Queue uint32 `json:"queue"`
	// Owner is the member holding the queue in the current generation
	// ("" when none does).
	Owner string `json:"owner"`
	// Committed is the group's committed offset (the next to consume), -1
	// when nothing was committed.
	Committed int64 `json:"committed"`
	// LogStart and LogEnd are the queue's oldest offset and its next offset
	// to be written, from the broker; null when it could not be read.
	LogStart *int64 `json:"log_start"`
	LogEnd   *int64 `json:"log_end"`
	// Lag is LogEnd - Committed, or LogEnd - LogStart with nothing
	// committed; null when the log could not be read.
	Lag *int64 `json:"lag"`
	// ToReceive (a group with a filter) is how many messages of the lag
	// the filter can take, by the broker's index: at most (what a filter
	// asks of properties is not judged); null when it could not be read.
	ToReceive *int64 `json:"to_receive,omitempty"`
	Error     string `json:"error,omitempty"`
}

func newGroupsCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "groups",
		Short: "List the consumer groups: generation, members, topics and total lag",
		Args:  usageArgs(cobra.NoArgs),
		RunE: g.metaRunCmd(func(ctx context.Context, cmd *cobra.Command, cl *client.Client, _ []string) error {
			infos, err := cl.ConsumerGroups(ctx, "")
			if err != nil {
				return err
			}
			sort.Slice(infos, func(i, j int) bool { return infos[i].Name < infos[j].Name })
			stderr := &lockedWriter{w: cmd.ErrOrStderr()}
			routes := newRouteCache(cl)
			out := make([]groupSummaryJSON, 0, len(infos))
			var rows [][]string
			for _, info := range infos {
				queues, err := groupQueues(ctx, routes, info, stderr)
				if err != nil {
					return err
				}
				s := groupSummaryJSON{Name: info.Name, Generation: info.Generation, Members: len(info.Members), Topics: groupTopics(info)}
				s.TotalLag, s.LagError = totalLag(queues)
				if s.LagError != "" {
					fmt.Fprintf(stderr, "ferryctl: group %s: %s\n", info.Name, s.LagError)
				}
				out = append(out, s)
				rows = append(rows, []string{s.Name, fmt.Sprint(s.Generation), fmt.Sprint(s.Members), orDash(strings.Join(s.Topics, ",")), optInt(s.TotalLag)})
			}
			return g.printer().print(out, []string{"GROUP", "GENERATION", "MEMBERS", "TOPICS", "LAG"}, rows)
		}),
	}
}

func newGroupCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{Use: "group", Short: "Inspect a consumer group, reset its offsets, set its filter, or delete it"}
	cmd.AddCommand(newGroupDescribeCommand(g), newGroupResetOffsetsCommand(g), newGroupSetFilterCommand(g), newGroupDeleteCommand(g))
	return cmd
}

func newGroupSetFilterCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "set-filter GROUP EXPR",
		Short: "Set the filter of the messages a consumer group receives (\"*\": every message)",
		Long: `Set the filter of tags and properties (such as "A || B" or
"(A || B) AND region = 'eu'") of the messages the consumer group receives,
creating the group if it does not exist. Every member receives by it: its
live members take it from their next heartbeat, and a member that asks for
another filter is refused. Messages the filter does not take are skipped,
and the group's committed offsets pass them.`,
		Args: usageArgs(cobra.ExactArgs(2)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			if err := checkConsumerGroup(args[0]); err != nil {
				return usageError{fmt.Errorf("group %q: %w", args[0], err)}
			}
			if err := checkFilter(args[1]); err != nil {
				return usageError{err}
			}
			info, err := cl.SetGroupFilter(ctx, args[0], args[1])
			if err != nil {
				return err
			}
			out := groupFilterJSON{Group: info.Name, Filter: info.Filter, FilterBy: info.FilterBy}
			return g.printer().print(out, []string{"GROUP", "FILTER", "SET-BY"}, [][]string{{out.Group, out.Filter, out.FilterBy}})
		}),
	}
	return cmd
}

// groupFilterJSON is what 'group set-filter' prints with --json.
type groupFilterJSON struct {
	Group    string `json:"group"`
	Filter   string `json:"filter"`
	FilterBy string `json:"filter_by"`
}

func newGroupDeleteCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "delete GROUP",
		Short: "Delete a consumer group and its committed offsets (refused while it has live members)",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			if err := cl.DeleteConsumerGroup(ctx, args[0]); err != nil {
				return err
			}
			return g.printer().print(groupDeleted{Group: args[0], Deleted: true}, []string{"GROUP", "DELETED"}, [][]string{{args[0], "yes"}})
		}),
	}
}

// groupDeleted is what 'group delete' prints with --json.
type groupDeleted struct {
	Group   string `json:"group"`
	Deleted bool   `json:"deleted"`
}

func newGroupDescribeCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "describe GROUP",
		Short: "A consumer group's members and, per queue, its owner, committed offset, log end and lag",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: g.metaRunCmd(func(ctx context.Context, cmd *cobra.Command, cl *client.Client, args []string) error {
			info, err := consumerGroup(ctx, cl, args[0])
			if err != nil {
				return err
			}
			stderr := &lockedWriter{w: cmd.ErrOrStderr()}
			queues, err := groupQueues(ctx, newRouteCache(cl), info, stderr)
			if err != nil {
				return err
			}
			d := groupDescribeJSON{Name: info.Name, Generation: info.Generation, Topics: groupTopics(info), Members: []memberJSON{}, Queues: queues,
				Filter: info.Filter, FilterBy: info.FilterBy}
			d.TotalLag, _ = totalLag(queues)
			if info.Filter != "" && info.Filter != "*" {
				d.TotalToReceive = totalToReceive(queues)
			}
			members := slices.Clone(info.Members)
			sort.Slice(members, func(i, j int) bool { return members[i].ID < members[j].ID })
			for _, m := range members {
				d.Members = append(d.Members, memberJSON{ID: m.ID, Topics: m.Topics, HeartbeatAgeMillis: m.HeartbeatAgeMillis, Queues: m.Queues})
			}
			if g.json {
				return g.printer().print(d, nil, nil)
			}
			return printGroupDescribe(g.out, d)
		}),
	}
}

func printGroupDescribe(w io.Writer, d groupDescribeJSON) error {
	fmt.Fprintf(w, "group %s  generation %d  topics %s  members %d  total lag %s\n", d.Name, d.Generation,
		orDash(strings.Join(d.Topics, ",")), len(d.Members), optInt(d.TotalLag))
	filtered := d.TotalToReceive != nil
	if d.Filter != "" {
		fmt.Fprintf(w, "filter %s  (set by %s)", d.Filter, d.FilterBy)
		if filtered {
			fmt.Fprintf(w, "  to receive at most %s", optInt(d.TotalToReceive))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	tp := tablePrinter{w}
	if len(d.Members) == 0 {
		fmt.Fprintln(w, "no live members")
	} else {
		var rows [][]string
		for _, m := range d.Members {
			age := "-"
			if m.HeartbeatAgeMillis >= 0 {
				age = (time.Duration(m.HeartbeatAgeMillis) * time.Millisecond).String() + " ago"
			}
			rows = append(rows, []string{m.ID, age, orDash(formatQueues(m.Queues))})
		}
		if err := tp.print(nil, []string{"MEMBER", "HEARTBEAT", "QUEUES"}, rows); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	var rows [][]string
	for _, q := range d.Queues {
		committed := "-"
		if q.Committed >= 0 {
			committed = fmt.Sprint(q.Committed)
		}
		row := []string{q.Topic, fmt.Sprint(q.Queue), orDash(q.Owner), committed, optInt(q.LogStart), optInt(q.LogEnd), optInt(q.Lag)}
		if filtered {
			row = append(row, optInt(q.ToReceive))
		}
		rows = append(rows, row)
	}
	header := []string{"TOPIC", "QUEUE", "OWNER", "COMMITTED", "LOG-START", "LOG-END", "LAG"}
	if filtered {
		header = append(header, "TO-RECEIVE")
	}
	return tp.print(nil, header, rows)
}

// formatQueues writes queues as "topic:0,2 other:1".
func formatQueues(qs []api.QueueOffset) string {
	byTopic := map[string][]uint32{}
	var topics []string
	for _, q := range qs {
		if _, ok := byTopic[q.Topic]; !ok {
			topics = append(topics, q.Topic)
		}
		byTopic[q.Topic] = append(byTopic[q.Topic], q.Queue)
	}
	sort.Strings(topics)
	var parts []string
	for _, t := range topics {
		ids := byTopic[t]
		slices.Sort(ids)
		s := make([]string, len(ids))
		for i, id := range ids {
			s[i] = fmt.Sprint(id)
		}
		parts = append(parts, t+":"+strings.Join(s, ","))
	}
	return strings.Join(parts, " ")
}

func optInt(v *int64) string {
	if v == nil {
		return "?"
	}
	return fmt.Sprint(*v)
}

// consumerGroup returns one group (ops.ConsumerGroup).
func consumerGroup(ctx context.Context, cl *client.Client, name string) (api.ConsumerGroupInfo, error) {
	return ops.ConsumerGroup(ctx, cl, name)
}

// groupTopics is the topics a group subscribes to, or, when it has no
// members, the topics it has offsets for.
func groupTopics(info api.ConsumerGroupInfo) []string {
	set := map[string]bool{}
	for _, t := range info.Topics {
		set[t] = true
	}
	for _, m := range info.Members {
		for _, t := range m.Topics {
			set[t] = true
		}
	}
	for _, o := range info.Offsets {
		set[o.Topic] = true
	}
	out := make([]string, 0, len(set))
	for t := range set {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

type queueKey struct {
	topic string
	queue uint32
}

// routeCache looks each topic's route up once.
type routeCache struct {
	cl     *client.Client
	routes map[string]routing.Route
	errs   map[string]error
}

func newRouteCache(cl *client.Client) *routeCache {
	return &routeCache{cl: cl, routes: map[string]routing.Route{}, errs: map[string]error{}}
}

// get returns a topic's route; an unknown topic is not an error here (ok
// false), any other failure is.
func (c *routeCache) get(ctx context.Context, topic string) (routing.Route, bool, error) {
	if r, ok := c.routes[topic]; ok {
		return r, true, nil
	}
	if err, ok := c.errs[topic]; ok {
		return routing.Route{}, false, err
	}
	r, err := c.cl.RouteExisting(ctx, topic)
	if errors.Is(err, protocol.ErrUnknownTopic) {
		c.errs[topic] = nil
		return routing.Route{}, false, nil
	}
	if err != nil {
		return routing.Route{}, false, err
	}
	c.routes[topic] = r
	return r, true, nil
}

// groupQueues returns every queue of the group's topics (and any other
// queue it has an offset for) with its owner, committed offset, log range
// and lag, reading the log ranges from the brokers.
func groupQueues(ctx context.Context, routes *routeCache, info api.ConsumerGroupInfo, stderr io.Writer) ([]queueLagJSON, error) {
	byKey := map[queueKey]*queueLagJSON{}
	add := func(k queueKey) *queueLagJSON {
		q := byKey[k]
		if q == nil {
			q = &queueLagJSON{Topic: k.topic, Queue: k.queue, Committed: -1}
			byKey[k] = q
		}
		return q
	}
	qroutes := map[queueKey]routing.QueueRoute{}
	for _, t := range groupTopics(info) {
		r, ok, err := routes.get(ctx, t)
		if err != nil {
			return nil, fmt.Errorf("route of %s: %w", t, err)
		}
		if !ok {
			continue
		}
		for _, qr := range r.Queues {
			k := queueKey{t, qr.Queue}
			add(k)
			qroutes[k] = qr
		}
	}
	for _, o := range info.Offsets {
		add(queueKey{o.Topic, o.Queue}).Committed = o.Offset
	}
	for _, m := range info.Members {
		for _, q := range m.Queues {
			add(queueKey{q.Topic, q.Queue}).Owner = m.ID
		}
	}
	out := make([]*queueLagJSON, 0, len(byKey))
	for _, q := range byKey {
		out = append(out, q)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Queue < out[j].Queue
	})
	parallel(len(out), func(i int) {
		q := out[i]
		qr, ok := qroutes[queueKey{q.Topic, q.Queue}]
		if !ok {
			q.Error = fmt.Sprintf("topic %s has no queue %d", q.Topic, q.Queue)
			return
		}
		minOff, maxOff, err := queueRange(ctx, qr, q.Topic, max(q.Committed, 0), stderr)
		if err != nil {
			q.Error = err.Error()
			fmt.Fprintf(stderr, "ferryctl: %s queue %d: %v\n", q.Topic, q.Queue, err)
			return
		}
		lag := maxOff - minOff
		if q.Committed >= 0 {
			lag = max(maxOff-q.Committed, 0)
		}
		q.LogStart, q.LogEnd, q.Lag = &minOff, &maxOff, &lag
		if info.Filter == "" || info.Filter == "*" {
			return
		}
		from := max(q.Committed, minOff)
		n, err := queueCount(ctx, qr, protocol.QueueCountRequest{Topic: q.Topic, Queue: q.Queue, From: from, To: maxOff, Filter: info.Filter}, stderr)
		if err != nil {
			q.Error = err.Error()
			fmt.Fprintf(stderr, "ferryctl: %s queue %d: %v\n", q.Topic, q.Queue, err)
			return
		}
		q.ToReceive = &n
	})
	res := make([]queueLagJSON, len(out))
	for i, q := range out {
		res[i] = *q
	}
	return res, nil
}

// totalLag sums the queues' lags; nil and why when one is unknown.
func totalLag(qs []queueLagJSON) (*int64, string) {
	var sum int64
	for _, q := range qs {
		if q.Lag == nil {
			return nil, fmt.Sprintf("lag unknown: %s queue %d: %s", q.Topic, q.Queue, q.Error)
		}
		sum += *q.Lag
	}
	return &sum, ""
}

// totalToReceive sums the queues' ToReceive; nil when one is unknown.
func totalToReceive(qs []queueLagJSON) *int64 {
	var sum int64
	for _, q := range qs {
		if q.ToReceive == nil {
			return nil
		}
		sum += *q.ToReceive
	}
	return &sum
}

// queueCount asks a queue's broker how many messages of a range a filter
// can take (QUEUE_COUNT). A count the broker's scan bound cut short counts
// the rest of the range as taken: the figure stays at most.
func queueCount(ctx context.Context, qr routing.QueueRoute, q protocol.QueueCountRequest, stderr io.Writer) (int64, error) {
	var n int64
	err := onQueueBroker(ctx, qr, q.Topic, stderr, func(ctx context.Context, tc *transport.Client) error {
		body, _ := json.Marshal(q)
		resp, err := tc.Call(ctx, protocol.CodeQueueCount, body)
		if err != nil {
			return err
		}
		var c protocol.QueueCount
		if err := json.Unmarshal(resp.Body, &c); err != nil {
			return fmt.Errorf("QUEUE_COUNT answer: %w", err)
		}
		n = c.Count + max(q.To-c.ScannedTo, 0)
		return nil
	})
	return n, err
}

// queueRange reads a queue's oldest offset and its next offset to be
// written from its master (or slave): one PULL of at most one message at
// offset, whose answer's header carries both.
func queueRange(ctx context.Context, qr routing.QueueRoute, topic string, offset int64, stderr io.Writer) (minOff, maxOff int64, err error) {
	err = onQueueBroker(ctx, qr, topic, stderr, func(ctx context.Context, tc *transport.Client) error {
		pr, err := pullOnce(ctx, tc, &protocol.PullRequest{Topic: topic, Queue: qr.Queue, Offset: offset, MaxBytes: 1})
		minOff, maxOff = pr.MinOffset, pr.MaxOffset
		return err
	})
	return minOff, maxOff, err
}

// parallel runs fn(0..n-1), at most 8 at a time.
func parallel(n int, fn func(i int)) {
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			fn(i)
		}()
	}
	wg.Wait()
}

// lockedWriter serializes writes from goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
