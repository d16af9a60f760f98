package producer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// Message is what a user sends.
type Message struct {
	Topic string
	// Key, if set, picks the queue by its hash and is stored as the
	// property "key". One key's messages are stored in send order: a keyed
	// message that fails waits for its queue (unless MoveKeyedOnFailure),
	// and the key's later messages wait behind it.
	Key string
	// Tag is the message's one tag (1 to 64 letters, digits or "._-:/"),
	// which consumer groups can filter on; "" none.
	Tag         string
	Properties  map[string]string
	Body        []byte
	Reliability protocol.Reliability
	// DeliverAt and DeliverAfter make the message a delayed one: the broker
	// stores it at once, pending, and releases it into its queue (where
	// consumers read it) at DeliverAt, or DeliverAfter from when Send or
	// SendAsync is called (by the producer's clock). Give at most one: both,
	// a negative DeliverAfter or a DeliverAt before 1970 is refused with
	// protocol.ErrInvalid before anything is sent. A time in the past is
	// due at once; a delay beyond the broker's maximum (default 90 days) is
	// refused with protocol.ErrInvalid, and a topic whose pending messages
	// reached the group's quota with protocol.ErrDelayQuota. The zero
	// values send an ordinary message. A delayed message may be cancelled
	// until it is released (Client.Cancel with Result.Handle). Delayed
	// messages of one key are released in send order among those due at
	// the same time.
	DeliverAt    time.Time
	DeliverAfter time.Duration
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

	// Handle names the stored record: Group and LogOffset (Offset -1 for a
	// duplicate whose original the broker no longer knows). For a delayed
	// message it names the pending record and its due time, which
	// Client.Cancel and Client.DelayedState take (they find the message
	// after retention moved it); QueueOffset is then its offset in the
	// internal queue of pending messages, not in Queue (the message gets
	// its offset in Queue when it is released).
	Handle protocol.Handle
	// Delayed: the message was sent with DeliverAt or DeliverAfter; DueAt
	// is when it is due (to the millisecond), the zero time otherwise.
	Delayed bool
	DueAt   time.Time
}

// Client is a producer. It is safe for concurrent use. Its parts: buf
// (the records' buffer room and promises), router (queue choice and route
// freshness), wire (the SEND call), and a sink per broker group (batching,
// the in-flight window and settlement; see sink).
type Client struct {
	cfg    config
	meta   *client.Client
	prefix string
	seq    atomic.Uint64
	gates  keyGates // keyed records' order before they reach a sink

	life   life
	buf    *buffer
	router *router
	wire   *wire
	sinks  sinkSet
	stats  statCounters

	// Idempotence: the current identity (nil until the first send), the
	// lock that serializes taking one, whether a new one is being taken
	// (sinks build nothing meanwhile), and whether a later instance fenced
	// this one.
	ident    atomic.Pointer[identity]
	identMu  sync.Mutex
	renewing atomic.Bool
	fenced   atomic.Bool

	// Transactions: the open one (nil: none), the last number given under
	// any identity (numbers only grow), and the checker's state.
	txnMu  sync.Mutex
	txn    *Txn
	txnNum uint64
	checks txnChecks
}

// life is the producer's goroutines and its end, shared by its parts.
type life struct {
	closed atomic.Bool // no new sends (set once, by Close)
	dead   atomic.Bool // Close gave up waiting: everything left fails
	stop   chan struct{}
	ctx    context.Context // cancelled when stop closes: bounds background lookups
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// sinkSet is the producer's sinks, one per broker group, made on first
// use.
type sinkSet struct {
	mu sync.Mutex
	m  map[string]*sink
}

// all is a snapshot of the sinks.
func (ss *sinkSet) all() []*sink {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := make([]*sink, 0, len(ss.m))
	for _, s := range ss.m {
		out = append(out, s)
	}
	return out
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
	c := &Client{cfg: cfg, meta: meta, prefix: hex.EncodeToString(b[:]), stats: statCounters{hooks: cfg.Metrics}}
	c.sinks.m = map[string]*sink{}
	c.life.stop = make(chan struct{})
	c.life.ctx, c.life.cancel = context.WithCancel(context.Background())
	c.buf = newBuffer(&c.cfg, c.life.stop, c.kickSinks)
	c.router = newRouter(&c.cfg, &c.life, &c.sinks)
	c.wire = newWire(&c.cfg, &c.life, c.router.sel.Avoider())
	c.life.wg.Add(1)
	go c.router.refresher()
	if cfg.txnCheck != nil {
		c.life.wg.Add(1)
		go c.runTxnChecks()
	}
	return c, nil
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
	c.sendIn(ctx, m, nil, urgent, promise)
}

// sendIn sends m, in transaction txn when it is not nil.
func (c *Client) sendIn(ctx context.Context, m *Message, txn *Txn, urgent bool, promise func(Result, error)) {
	if c.life.closed.Load() {
		promise(Result{}, ErrClosed)
		return
	}
	if c.fenced.Load() {
		promise(Result{}, ErrFenced)
		return
	}
	var idBuf [40]byte
	rec, err := newRecord(ctx, m, string(messageID(idBuf[:0], c.prefix, c.seq.Add(1))), &c.cfg, promise)
	if err != nil {
		promise(Result{}, err)
		return
	}
	rec.txn = txn
	if err := c.buf.acquire(ctx, rec.size); err != nil {
		promise(Result{}, err)
		return
	}
	c.dispatchBy(rec, urgent, urgent)
}

// sink returns the group's sink, making it on first use.
func (c *Client) sink(group string) *sink {
	c.sinks.mu.Lock()
	defer c.sinks.mu.Unlock()
	s := c.sinks.m[group]
	if s == nil {
		s = newSink(sinkDeps{cfg: &c.cfg, life: &c.life, stats: &c.stats, buf: c.buf, wire: c.wire, host: c}, group)
		c.sinks.m[group] = s
	}
	return s
}

// kickSinks has every sink send what may leave now.
func (c *Client) kickSinks() {
	for _, s := range c.sinks.all() {
		s.kick()
	}
}

// failAllSinks ends every waiting record of every sink with err.
func (c *Client) failAllSinks(err error) {
	for _, s := range c.sinks.all() {
		s.failAll(err)
	}
}

// Flush sends everything buffered now (not waiting for Linger) and waits
// until every message sent before it has its result, or ctx ends.
func (c *Client) Flush(ctx context.Context) error {
	if err := c.buf.drain(ctx); err != nil {
		return fmt.Errorf("producer: flush: %w", err)
	}
	return nil
}

// Close stops taking messages, sends everything buffered (waiting up to the
// delivery timeout), aborts the open transaction if any and not prepared
// (best effort),
// fails what is still left with ErrClosed, and stops every goroutine and
// connection.
func (c *Client) Close() error {
	if !c.life.closed.CompareAndSwap(false, true) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.deliveryTimeout)
	flushErr := c.Flush(ctx)
	cancel()
	c.txnMu.Lock()
	open := c.txn
	c.txnMu.Unlock()
	if open != nil && !open.isPrepared() {
		// Best effort: its readers need not wait for the broker's timeout.
		// A prepared one is left to the next instance's checker: its work
		// may be committing now.
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.requestTimeout)
		_ = open.Abort(ctx)
		cancel()
	}

	c.sinks.mu.Lock()
	c.life.dead.Store(true)
	c.sinks.mu.Unlock()
	close(c.life.stop)
	c.life.cancel()
	c.failAllSinks(ErrClosed)
	_ = c.wire.pool.Close() // fails batches still in flight
	c.life.wg.Wait()
	_ = c.meta.Close()
	if flushErr != nil {
		return fmt.Errorf("producer: close: messages still buffered failed with ErrClosed: %w", flushErr)
	}
	return nil
}

// The sink's host (sinkHost): what a sink asks of the producer.

func (c *Client) queueRoute(topic string, queue uint32) (routing.QueueRoute, uint64, bool) {
	return c.router.queueRoute(topic, queue)
}

func (c *Client) refreshSoon(topic string) { c.router.refreshSoon(topic) }

func (c *Client) batchIdentity() *identity {
	if cur := c.ident.Load(); cur != nil && !c.renewing.Load() {
		return cur
	}
	return nil
}

func (c *Client) outOfOrder(gen uint64) {
	if cur := c.ident.Load(); cur != nil && gen == cur.gen && c.renewing.CompareAndSwap(false, true) {
		c.life.wg.Add(1)
		go c.renewIdentity(gen)
	}
}

func (c *Client) fence() { c.fenced.Store(true) }

func (c *Client) failIfFenced() {
	if c.fenced.Load() {
		c.failAllSinks(ErrFenced)
	}
}
