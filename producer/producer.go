package producer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/sdkmetrics"
)

// Message is what a user sends.
type Message struct {
	Topic string
	// Key, if set, picks the queue by its hash and is stored as the
	// property "key". One key's messages are stored in send order: a keyed
	// message that fails waits for its queue (unless MoveKeyedOnFailure),
	// and the key's later messages wait behind it.
	Key         string
	Properties  map[string]string
	Body        []byte
	Reliability protocol.Reliability
}

// Result is where a message was stored.
type Result struct {
	ID          string // the producer-made message id
	Topic       string
	Queue       uint32
	QueueOffset int64  // -1 for a duplicate whose original the broker no longer knows
	LogOffset   int64  // -1 for a duplicate whose original the broker no longer knows
	Group       string // the broker group
	Broker      string // the master's address

	// Duplicate: the broker had already stored this message (an earlier
	// attempt whose answer was lost or late); the offsets are the
	// original's, and it was not stored again.
	Duplicate bool
	// PossibleDuplicate: an earlier attempt's outcome was unknown, and the
	// message was then sent without that attempt's stamp (moved to another
	// queue when its group could not answer it, see FailoverWait and
	// MoveOnUnknownOutcome; or re-stamped after the broker's state was
	// lost), so it may be stored twice: here and where the earlier attempt
	// went. Stats counts these.
	PossibleDuplicate bool
	// The message's stamp: producer id, epoch and sequence in its queue.
	// ProducerID is 0 with idempotence off.
	ProducerID uint64
	Epoch      uint16
	Seq        int64
}

// Client is a producer. It is safe for concurrent use.
type Client struct {
	cfg    config
	meta   *client.Client
	sel    *routing.Selector
	prefix string
	seq    atomic.Uint64
	gates  keyGates // keyed records' order before they reach a sink

	// routes is the route cache (the client core's); pool the brokers'
	// connections.
	routes *clientcore.Routes[*topicPlan]
	pool   *clientcore.Pool

	mu     sync.Mutex
	sinks  map[string]*sink
	closed bool        // no new sends
	dead   atomic.Bool // Close gave up waiting: everything left fails

	bodies bodyBufs // SEND bodies' encode buffers

	bufMu      sync.Mutex
	bufRecords int
	bufBytes   int64
	waiters    int
	space      chan struct{} // closed when room frees and someone waits

	// Idempotence: the current identity (nil until the first send), the
	// lock that serializes taking one, whether a new one is being taken
	// (sinks build nothing meanwhile), and whether a later instance fenced
	// this one.
	ident    atomic.Pointer[identity]
	identMu  sync.Mutex
	renewing atomic.Bool
	fenced   atomic.Bool
	stats    statCounters

	flushing atomic.Int32
	// starved counts senders waiting for buffer room: while one waits,
	// sinks send what is ready without lingering (nothing joins it until
	// room frees, which needs answers to what is buffered).
	starved atomic.Int32
	// For tests: route refreshes started by routing errors (refreshSoon),
	// passes of the refresher done (stale routes refreshed, troubled ones
	// polled), and the polls (lookups of routes in trouble).
	forcedRefreshes atomic.Int64
	refreshPasses   atomic.Int64
	routePolls      atomic.Int64
	// refreshTimer drives the refresher; made in New so that a test's clock
	// has it before the first Advance.
	refreshTimer clockwork.Timer
	stop         chan struct{}
	ctx          context.Context // cancelled when stop closes: bounds background lookups
	cancel       context.CancelFunc
	wg           sync.WaitGroup
}

// topicPlan is what the producer makes of a topic's cached route (the
// route cache's Value): the plan the selector picks queues by, and whether
// a queue has no writable master (the route is polled while it is used).
type topicPlan struct {
	plan       *plan
	unwritable bool
	// used: sent to since the last periodic refresh. One flag per topic,
	// handed from each entry to the next.
	used *atomic.Bool
}

// derivePlan makes a stored route's topicPlan.
func derivePlan(_ string, r routing.Route, _ clientcore.Source, prev *clientcore.Entry[*topicPlan]) *topicPlan {
	tp := &topicPlan{plan: newPlan(r)}
	if prev != nil {
		tp.used = prev.Value.used
	} else {
		tp.used = new(atomic.Bool)
		tp.used.Store(true)
	}
	for _, q := range r.Queues {
		if !q.Writable || q.Master == "" {
			tp.unwritable = true
			break
		}
	}
	return tp
}

// markUsed records that records wait for the topic's route.
func (tp *topicPlan) markUsed() {
	if !tp.used.Load() { // most sends find it set: no write
		tp.used.Store(true)
	}
}

// New returns a producer. It checks every option at once.
func New(opts ...Opt) (*Client, error) {
	cfg := defaults()
	cfg.Shared = clientcore.Apply(&cfg, opts)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.avoider == nil {
		cfg.avoider = routing.NewLatencyTable(nil)
	}
	meta, err := client.New(client.Config{Addrs: cfg.MetaAddrs, Token: cfg.Token, Transport: transport.ClientConfig{TLS: cfg.TLS}})
	if err != nil {
		return nil, err
	}
	if cfg.idSource == nil {
		cfg.idSource = metaIdentity{meta}
	}
	if cfg.routeSrc == nil {
		cfg.routeSrc = metaRoutes{meta}
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	c := &Client{
		cfg: cfg, meta: meta, sel: routing.NewSelector(cfg.avoider), prefix: hex.EncodeToString(b[:]),
		sinks: map[string]*sink{}, stats: statCounters{hooks: cfg.Metrics},
		space: make(chan struct{}), stop: make(chan struct{}), bodies: bodyBufs{keep: cfg.maxInflight, limit: cfg.maxBatchBytes + protocol.SendRequestHeaderSize},
	}
	c.routes = clientcore.NewRoutes(clientcore.RoutesConfig[*topicPlan]{
		Lookup: cfg.routeSrc.route, Derive: derivePlan, Stored: c.routeStored,
		TTL: cfg.routeRefresh, MinRefresh: time.Second, Clock: cfg.clock,
	})
	c.pool = clientcore.NewPool(clientcore.PoolConfig{
		Transport: transport.ClientConfig{CallTimeout: cfg.requestTimeout, TLS: cfg.TLS, Login: auth.TokenLogin(cfg.Token)},
		Dial:      cfg.dialAddr,
	})
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.refreshTimer = cfg.clock.NewTimer(c.pollWait())
	c.wg.Add(1)
	go c.refresher()
	return c, nil
}

// record is one message on its way, with its one promise.
type record struct {
	msg      protocol.Message
	size     int
	ctx      context.Context
	deadline time.Time
	key      string
	promise  func(Result, error)
	done     atomic.Bool

	// Set by dispatch, read by the batch that carries the record.
	group    string
	view     view // the group's master, epoch and state in the route the record was dispatched by
	attempts int
	lastErr  error
	// cause is the last failure before lastErr that was not a timeout: when
	// the last attempt ran into the delivery deadline (a TIMEOUT), it says
	// why the message was still not delivered.
	cause error

	// Idempotence, under the sink's mu while the record is in a sink:
	// gen is the identity generation of rec.msg.Producer (0: unstamped);
	// maybe says an attempt with this stamp had an unknown outcome, and
	// maybeSince when the first did (by the producer's clock; FailoverWait
	// counts from it); possibleDup says an earlier stamp's did and the
	// record left it.
	gen         uint64
	maybe       bool
	maybeSince  time.Time
	possibleDup bool
}

// failed records err as the record's latest failure (see cause).
func (r *record) failed(err error) {
	if r.lastErr != nil && !errors.Is(r.lastErr, protocol.ErrTimeout) {
		r.cause = r.lastErr
	}
	r.lastErr = err
}

// stays reports whether a failed record must wait for its own queue.
func (c *Client) stays(rec *record) bool { return rec.key != "" && !c.cfg.moveKeyed }

// unstamp drops a record's stamp, flagging it a possible duplicate if an
// attempt with that stamp had an unknown outcome.
func (c *Client) unstamp(rec *record) {
	if rec.maybe && !rec.possibleDup {
		rec.possibleDup = true
		c.stats.add(sdkmetrics.ProducerPossibleDuplicates)
	}
	rec.maybe, rec.maybeSince = false, time.Time{}
	rec.gen = 0
	rec.msg.Producer = protocol.ProducerStamp{}
}

// Send sends one message and waits for its result. It does not wait for
// Linger. An error names the cause, for errors.Is: a status
// (protocol.ErrInvalid and the like), ErrDeliveryTimeout with the last
// retriable cause (ErrConnLost, ErrUnreachable, protocol.ErrReadOnly...),
// ErrClosed, ErrBufferFull, or the context's error if it ended before the
// message was handed to a broker (see Errors in the package documentation).
func (c *Client) Send(ctx context.Context, m *Message) (Result, error) {
	type out struct {
		r   Result
		err error
	}
	ch := make(chan out, 1)
	c.send(ctx, m, true, func(r Result, err error) { ch <- out{r, err} })
	o := <-ch
	return o.r, o.err
}

// SendAsync sends one message in the background and calls promise exactly
// once with its result or error, from an internal goroutine (or, for an
// error found at once, before SendAsync returns). Promises should be quick.
// ctx bounds waiting for buffer room and for the message to be handed to a
// broker.
func (c *Client) SendAsync(ctx context.Context, m *Message, promise func(Result, error)) {
	c.send(ctx, m, false, promise)
}

func (c *Client) send(ctx context.Context, m *Message, urgent bool, promise func(Result, error)) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		promise(Result{}, ErrClosed)
		return
	}
	if c.fenced.Load() {
		promise(Result{}, ErrFenced)
		return
	}
	now := time.Now()
	var idBuf [40]byte
	id := append(append(idBuf[:0], c.prefix...), '-')
	id = strconv.AppendUint(id, c.seq.Add(1), 36)
	rec := &record{ctx: ctx, key: m.Key, promise: promise}
	rec.msg = protocol.Message{
		ID:          string(id),
		Topic:       m.Topic,
		Reliability: m.Reliability,
		Timestamp:   now.UnixMilli(),
		Body:        m.Body,
	}
	if len(m.Properties) > 0 || m.Key != "" {
		rec.msg.Properties = clientcore.Properties(m.Properties, m.Key)
	}
	if err := rec.msg.Validate(); err != nil {
		promise(Result{}, fmt.Errorf("producer: message to %q: %w", m.Topic, err))
		return
	}
	if c.cfg.idempotent {
		// Its stamp is part of its size in a batch.
		rec.msg.Producer.ID = 1
		rec.size = rec.msg.EncodedSize()
		rec.msg.Producer.ID = 0
	} else {
		rec.size = rec.msg.EncodedSize()
	}
	rec.deadline = now.Add(c.cfg.deliveryTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(rec.deadline) {
		rec.deadline = dl
	}
	if err := c.acquire(ctx, rec.size); err != nil {
		promise(Result{}, err)
		return
	}
	c.dispatch(rec, urgent)
}

// acquire takes buffer room for one message. When there is none, the
// sinks send what lingers at once (as Kafka's accumulator does when its
// memory is exhausted): the sender adds nothing more until answers free
// room, so lingering would only delay them.
func (c *Client) acquire(ctx context.Context, size int) error {
	c.bufMu.Lock()
	defer c.bufMu.Unlock()
	room := func() bool {
		return c.bufRecords < c.cfg.maxRecords && (c.bufRecords == 0 || c.bufBytes+int64(size) <= c.cfg.maxBytes)
	}
	if !room() {
		if c.cfg.failWhenFull {
			return fmt.Errorf("%w: %d messages, %d bytes buffered", ErrBufferFull, c.cfg.maxRecords, c.cfg.maxBytes)
		}
		c.starved.Add(1)
		defer c.starved.Add(-1)
		c.bufMu.Unlock()
		c.kickSinks()
		c.bufMu.Lock()
	}
	if err := c.waitBuf(ctx, room); err != nil {
		return fmt.Errorf("producer: waiting for buffer room: %w", err)
	}
	c.bufRecords++
	c.bufBytes += int64(size)
	return nil
}

// kickSinks has every sink send what may leave now.
func (c *Client) kickSinks() {
	for _, s := range c.allSinks() {
		s.kick()
	}
}

// waitBuf waits until ready holds, ctx ends or the producer stops. bufMu is
// held on entry and on return; releaseBuf wakes the waiters.
func (c *Client) waitBuf(ctx context.Context, ready func() bool) error {
	for !ready() {
		c.waiters++
		ch := c.space
		c.bufMu.Unlock()
		var err error
		select {
		case <-ch:
		case <-ctx.Done():
			err = ctx.Err()
		case <-c.stop:
			err = ErrClosed
		}
		c.bufMu.Lock()
		c.waiters--
		if err != nil {
			return err
		}
	}
	return nil
}

// releaseBuf frees the room of n records of bytes in all, waking the
// goroutines waiting for room once.
func (c *Client) releaseBuf(n, bytes int) {
	c.bufMu.Lock()
	c.bufRecords -= n
	c.bufBytes -= int64(bytes)
	if c.waiters > 0 {
		close(c.space)
		c.space = make(chan struct{})
	}
	c.bufMu.Unlock()
}

// finish completes a record exactly once.
func (c *Client) finish(rec *record, res Result, err error) {
	if !rec.done.CompareAndSwap(false, true) {
		return
	}
	c.releaseBuf(1, rec.size)
	rec.promise(res, err)
}

// finishAll completes records as finish does, releasing their buffer room
// in one go (one wake-up for a sender waiting for room, not one per
// record) before calling their promises, in order. It may clear entries
// of es.
func (c *Client) finishAll(es []ended) {
	n, bytes := 0, 0
	for i := range es {
		if !es[i].rec.done.CompareAndSwap(false, true) {
			es[i].rec = nil // finished already
			continue
		}
		n++
		bytes += es[i].rec.size
	}
	if n == 0 {
		return
	}
	c.releaseBuf(n, bytes)
	for _, e := range es {
		if e.rec != nil {
			e.rec.promise(e.res, e.err)
		}
	}
}

// dispatch picks a queue for the record and hands it to that group's sink.
// A keyed record that must stay on its key's queue passes its key's gate
// first, so it never overtakes an earlier record of its key that is still
// waiting for a route or an identity.
func (c *Client) dispatch(rec *record, urgent bool) {
	if !c.stays(rec) {
		c.dispatchOne(rec, urgent)
		return
	}
	if !c.gates.pass(rec) {
		return // behind an earlier record of its key; dispatched when that one is
	}
	settled := c.dispatchOne(rec, urgent)
	for _, w := range c.gates.after(rec, settled) {
		c.dispatch(w, urgent)
	}
}

// dispatchOne is dispatch without the key's gate. It reports whether the
// record is settled: handed to a sink, or finished; false means a retry of
// the dispatch is scheduled.
func (c *Client) dispatchOne(rec *record, urgent bool) (settled bool) {
	if c.dead.Load() {
		err := fmt.Errorf("%w: message %s to %q", ErrClosed, rec.msg.ID, rec.msg.Topic)
		if rec.lastErr != nil {
			err = fmt.Errorf("%w: message %s to %q (last attempt: %w)", ErrClosed, rec.msg.ID, rec.msg.Topic, rec.lastErr)
		}
		c.finish(rec, Result{}, err)
		return true
	}
	if err := rec.ctx.Err(); err != nil {
		if rec.lastErr != nil {
			err = fmt.Errorf("%w (last attempt: %w)", err, rec.lastErr)
		}
		c.finish(rec, Result{}, fmt.Errorf("producer: message %s to %q not sent: %w", rec.msg.ID, rec.msg.Topic, err))
		return true
	}
	if c.fenced.Load() {
		c.finish(rec, Result{}, fmt.Errorf("%w: message %s to %q", ErrFenced, rec.msg.ID, rec.msg.Topic))
		return true
	}
	plan, err := c.route(rec)
	if err != nil {
		return !c.retryOrFail(rec, err)
	}
	q, err := c.pick(plan, rec)
	if err != nil {
		// No writable queue: the topic's groups are read-only (or have no
		// master), or it has no queues at all. Both refresh the route.
		st := protocol.StatusReadOnly
		if len(plan.Route.Queues) == 0 {
			st = protocol.StatusNoRoute
		}
		return !c.retryOrFail(rec, &protocol.Error{Status: st, Message: fmt.Sprintf("topic %q: %v", rec.msg.Topic, err)})
	}
	if c.cfg.idempotent {
		// The identity is taken before the record's first batch can leave.
		if err := c.ensureIdentity(rec); err != nil {
			return !c.retryOrFail(rec, err)
		}
	}
	rec.msg.Queue, rec.group, rec.view = q.Queue, q.Group, viewOf(plan.Route.Version, q)
	c.sink(q.Group).add(rec, urgent)
	return true
}

// keyGates keep each key's records in send order before they reach a sink
// (in a sink, a key's records wait in their queue's line in order). While a
// record of a key waits to retry its dispatch (no route or identity yet),
// later records of the key queue behind it and are dispatched, in order,
// once it is settled.
type keyGates struct {
	mu    sync.Mutex
	gates map[string]*keyGate // topic + "\x00" + key
}

type keyGate struct {
	head    *record
	waiting []*record
}

func gateKey(rec *record) string { return rec.msg.Topic + "\x00" + rec.key }

// pass reports whether rec may be dispatched now; if not, it waits in its
// key's gate.
func (g *keyGates) pass(rec *record) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	gt := g.gates[gateKey(rec)]
	if gt == nil || gt.head == rec {
		return true
	}
	gt.waiting = append(gt.waiting, rec)
	return false
}

// after records the outcome of rec's dispatch: unsettled, rec heads its
// key's gate; settled, the gate it headed opens and its waiting records are
// returned, in order, to be dispatched.
func (g *keyGates) after(rec *record, settled bool) []*record {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := gateKey(rec)
	gt := g.gates[k]
	if !settled {
		if gt == nil {
			if g.gates == nil {
				g.gates = map[string]*keyGate{}
			}
			g.gates[k] = &keyGate{head: rec}
		}
		return nil
	}
	if gt == nil || gt.head != rec {
		return nil
	}
	delete(g.gates, k)
	return gt.waiting
}

// pick chooses the record's queue: a keyed record's is its key's (unless
// MoveKeyedOnFailure lets it leave a queue that is not writable or just
// failed), whether or not it is writable now: the record then waits there.
func (c *Client) pick(plan *plan, rec *record) (routing.QueueRoute, error) {
	if qs := plan.Route.Queues; rec.key != "" && len(qs) > 0 {
		q := qs[clientcore.KeyHash(rec.key)%uint32(len(qs))]
		if !c.cfg.moveKeyed || q.Writable && q.Group != lastGroup(rec) {
			return q, nil
		}
	}
	var now time.Time // a plan of one group takes its queues in turn: no clock read per message
	if !plan.oneGroup {
		now = c.cfg.clock.Now()
	}
	return c.sel.SelectPlan(plan.Plan, lastGroup(rec), now)
}

// plan is a route prepared for selection, and whether its writable queues
// are all of one group (then the selector needs no time: there is no group
// to avoid or choose).
type plan struct {
	*routing.Plan
	oneGroup bool
}

func newPlan(r routing.Route) *plan {
	p := &plan{Plan: routing.NewPlan(r), oneGroup: true}
	group := ""
	for _, q := range r.Queues {
		if !q.Writable {
			continue
		}
		if group != "" && q.Group != group {
			p.oneGroup = false
			break
		}
		group = q.Group
	}
	return p
}

// routeSource looks routes up: the metaserver, or a fake in tests.
type routeSource interface {
	route(ctx context.Context, topic string) (routing.Route, error)
}

type metaRoutes struct{ meta *client.Client }

func (m metaRoutes) route(ctx context.Context, topic string) (routing.Route, error) {
	return m.meta.Route(ctx, topic)
}

// queueRoute is the cached route of one queue, and the route's version.
func (c *Client) queueRoute(topic string, queue uint32) (routing.QueueRoute, uint64, bool) {
	e := c.routes.Get(topic)
	if e == nil || !e.Known {
		return routing.QueueRoute{}, 0, false
	}
	e.Value.markUsed() // records wait for this queue
	for _, q := range e.Route.Queues {
		if q.Queue == queue {
			return q, e.Route.Version, true
		}
	}
	return routing.QueueRoute{}, 0, false
}

func lastGroup(rec *record) string {
	if rec.attempts == 0 {
		return ""
	}
	return rec.group
}

// retryOrFail schedules another attempt with backoff and jitter, or ends the
// record when the error is final or its delivery deadline would pass. A
// status that says the route is stale refreshes it first.
// retryOrFail schedules another dispatch of rec after a backoff and reports
// true, or finishes it and reports false.
func (c *Client) retryOrFail(rec *record, err error) (scheduled bool) {
	rec.failed(err)
	var pe *protocol.Error
	if errors.As(err, &pe) && pe.Status.RefreshesRoute() {
		c.refreshSoon(rec.msg.Topic)
	}
	if !clientcore.Retriable(err) && !(c.cfg.idempotent && maybeStored(err)) {
		c.finish(rec, Result{}, fmt.Errorf("producer: message %s to %q: %w", rec.msg.ID, rec.msg.Topic, err))
		return false
	}
	rec.attempts++
	backoff := routing.Jitter(min(c.cfg.retryBackoff<<min(rec.attempts-1, 10), time.Second))
	if time.Now().Add(backoff).After(rec.deadline) {
		c.finish(rec, Result{}, deliveryTimeout(rec, err, rec.cause))
		return false
	}
	c.stats.add(sdkmetrics.ProducerRetries)
	c.wg.Add(1)
	t := time.NewTimer(backoff)
	go func() {
		defer c.wg.Done()
		defer t.Stop()
		select {
		case <-t.C:
		case <-c.stop:
		}
		c.dispatch(rec, true)
	}()
	return true
}

// deliveryTimeout is the error of a record whose retries ran out of time:
// err is the last attempt's cause, prev the one before.
func deliveryTimeout(rec *record, err, prev error) error {
	if prev != nil && errors.Is(err, protocol.ErrTimeout) && !errors.Is(prev, protocol.ErrTimeout) {
		// The last attempt ran into the delivery deadline: the attempt
		// before says why the message was still not delivered.
		err = fmt.Errorf("%w (the attempt before: %w)", err, prev)
	}
	return fmt.Errorf("%w: message %s to %q (attempts: %d): %w",
		ErrDeliveryTimeout, rec.msg.ID, rec.msg.Topic, rec.attempts, err)
}

// route returns the cached route of the record's topic, looking it up on
// first use (one lookup per topic at a time, however many records miss).
// The lookup ends by the record's delivery deadline.
func (c *Client) route(rec *record) (*plan, error) {
	topic := rec.msg.Topic
	if e := c.routes.Get(topic); e != nil && e.Known {
		e.Value.markUsed()
		return e.Value.plan, nil
	}
	deadline := time.Now().Add(c.cfg.requestTimeout)
	if rec.deadline.Before(deadline) {
		deadline = rec.deadline
	}
	lctx, cancel := context.WithDeadline(rec.ctx, deadline)
	defer cancel()
	e, err := c.routes.Lookup(lctx, topic)
	if err != nil {
		return nil, lookupErr(err)
	}
	e.Value.markUsed()
	return e.Value.plan, nil
}

// routeStored shows each group's sink the group's master, epoch and state
// in a route the cache just stored (a sink gives up calls to a master the
// route no longer names), and wakes the sinks of groups a queue moved off.
func (c *Client) routeStored(_ string, prev, next *clientcore.Entry[*topicPlan]) {
	type seen struct {
		s *sink
		v view
	}
	var sinks []seen
	var left []*sink // sinks of groups a queue moved off
	r := next.Route
	c.mu.Lock()
	if prev != nil {
		for _, old := range prev.Route.Queues {
			if int(old.Queue) < len(r.Queues) && r.Queues[old.Queue].Group != old.Group {
				if s := c.sinks[old.Group]; s != nil && !slices.Contains(left, s) {
					left = append(left, s)
				}
			}
		}
	}
queues:
	for i, q := range r.Queues {
		for _, p := range r.Queues[:i] {
			if p.Group == q.Group {
				continue queues // a group's first queue speaks for it
			}
		}
		if s := c.sinks[q.Group]; s != nil {
			sinks = append(sinks, seen{s, viewOf(r.Version, q)})
		}
	}
	c.mu.Unlock()
	for _, x := range sinks {
		x.s.observe(x.v)
	}
	for _, s := range left {
		s.wake()
	}
}

// refreshSoon refreshes a topic's route in the background, at most once a
// second per topic (by the producer's clock).
func (c *Client) refreshSoon(topic string) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed || !c.routes.MarkStale(topic) {
		return
	}
	c.forcedRefreshes.Add(1)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.refresh(topic)
	}()
}

func (c *Client) refresh(topic string) {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.requestTimeout)
	defer cancel()
	if _, err := c.routes.Lookup(ctx, topic); err != nil {
		c.cfg.Logger.Warn("route refresh failed", "topic", topic, "error", err)
	}
}

// refresher refreshes routes older than RouteRefresh, and polls the routes
// in trouble (by the producer's clock), every RoutePoll, jittered. A route
// is in trouble while one of its queues has no writable master, or while a
// call to one of its groups has waited longer than RoutePoll; it is polled
// only if it was sent to since its last periodic refresh.
func (c *Client) refresher() {
	defer c.wg.Done()
	defer c.refreshTimer.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-c.refreshTimer.Chan():
		}
		now := c.cfg.clock.Now()
		stalled := c.stalledGroups(now)
		var stale, poll []string
		c.routes.Range(func(t string, e *clientcore.Entry[*topicPlan]) {
			switch {
			case !e.Known:
			case now.Sub(e.Fetched) >= c.cfg.routeRefresh:
				stale = append(stale, t)
				e.Value.used.Store(false)
			case e.Value.used.Load() && (e.Value.unwritable || usesAny(&e.Route, stalled)):
				poll = append(poll, t)
			}
		})
		for _, t := range stale {
			c.refresh(t)
		}
		for _, t := range poll {
			c.routePolls.Add(1)
			c.refresh(t)
		}
		// Reset before the pass is counted: a test that waits for the pass
		// and then moves its clock moves it past this timer.
		c.refreshTimer.Reset(c.pollWait())
		c.refreshPasses.Add(1)
	}
}

// pollWait is the refresher's next wait: RoutePoll (or RouteRefresh, if
// shorter), jittered.
func (c *Client) pollWait() time.Duration {
	return routing.Jitter(min(c.cfg.routePoll, c.cfg.routeRefresh))
}

// stalledGroups names the groups with a call that has waited at least
// RoutePoll for its answer.
func (c *Client) stalledGroups(now time.Time) map[string]bool {
	var out map[string]bool
	for _, s := range c.allSinks() {
		if s.stalled(now, c.cfg.routePoll) {
			if out == nil {
				out = map[string]bool{}
			}
			out[s.group] = true
		}
	}
	return out
}

// usesAny reports whether r routes a queue to one of groups.
func usesAny(r *routing.Route, groups map[string]bool) bool {
	if len(groups) == 0 {
		return false
	}
	for _, q := range r.Queues {
		if groups[q.Group] {
			return true
		}
	}
	return false
}

// conn returns the connection to a broker, or nil once the producer is dead.
func (c *Client) conn(addr string) *transport.Client {
	if c.dead.Load() {
		return nil
	}
	tc, err := c.pool.Get(addr)
	if err != nil {
		return nil
	}
	return tc
}

// Flush sends everything buffered now (not waiting for Linger) and waits
// until every message sent before it has its result, or ctx ends.
func (c *Client) Flush(ctx context.Context) error {
	c.flushing.Add(1)
	defer c.flushing.Add(-1)
	c.mu.Lock()
	sinks := make([]*sink, 0, len(c.sinks))
	for _, s := range c.sinks {
		sinks = append(sinks, s)
	}
	c.mu.Unlock()
	for _, s := range sinks {
		s.kick()
	}
	c.bufMu.Lock()
	defer c.bufMu.Unlock()
	if err := c.waitBuf(ctx, func() bool { return c.bufRecords == 0 }); err != nil {
		return fmt.Errorf("producer: flush: %w", err)
	}
	return nil
}

// Close stops taking messages, sends everything buffered (waiting up to the
// delivery timeout), fails what is still left with ErrClosed, and stops
// every goroutine and connection.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.deliveryTimeout)
	flushErr := c.Flush(ctx)
	cancel()

	c.mu.Lock()
	c.dead.Store(true)
	sinks := make([]*sink, 0, len(c.sinks))
	for _, s := range c.sinks {
		sinks = append(sinks, s)
	}
	c.mu.Unlock()
	close(c.stop)
	c.cancel()
	for _, s := range sinks {
		s.failAll(ErrClosed)
	}
	_ = c.pool.Close() // fails batches still in flight
	c.wg.Wait()
	_ = c.meta.Close()
	if flushErr != nil {
		return fmt.Errorf("producer: close: messages still buffered failed with ErrClosed: %w", flushErr)
	}
	return nil
}
