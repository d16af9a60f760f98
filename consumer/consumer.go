package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
)

// Message is a message as consumed.
type Message struct {
	Topic  string
	Queue  uint32
	Offset int64 // its offset in its queue
	ID     string
	// Key is the producer's key (the property "key"); it is not repeated in
	// Properties.
	Key string
	// Tag is the producer's tag ("" none).
	Tag        string
	Properties map[string]string
	Body       []byte
	// StoreTime is when the broker stored it; Timestamp is when the
	// producer built it.
	StoreTime time.Time
	Timestamp time.Time
	// ProducerID and Seq are the producer's stamp: its id and the message's
	// sequence in its queue for that producer (ProducerID 0: unstamped).
	ProducerID uint64
	Seq        int64
	// Deliveries counts this consumer's deliveries of the message: 1 the
	// first time, 2 at the first redelivery after a failure, and so on. A
	// message delivered again after a rebalance or a restart (its offset was
	// not committed) starts at 1 again.
	Deliveries int
	// Recovered marks a message a new master appended again from the tail
	// a failover cut from its old master's log (a NORMAL message the old
	// master acknowledged that its slave never copied): it comes after what
	// its queue took since the failover, the one exception to per-key order.
	// Properties holds its origin under protocol.RecoveredProperty.
	Recovered bool
	// DueAt is set on a delayed message (sent with the producer's
	// DeliverAt or DeliverAfter): when it was due, to the millisecond.
	// ReleasedAt is when its broker released it into the queue (its
	// StoreTime), never before DueAt by the broker's clock; the difference
	// is how late it was released. DelayedHandle names the pending record
	// it was released from (the Handle its producer's Result gave). All
	// three are zero on any other message.
	DueAt         time.Time
	ReleasedAt    time.Time
	DelayedHandle protocol.Handle

	part *part // the queue it came from
	size int64 // what it counts against the prefetch budget
}

// Handler handles one message. Returning nil marks it processed; an error
// (or a panic) has it delivered again after a backoff, up to MaxRetries
// times, and then sent to the dead-letter topic. Calls for one queue come
// one at a time, in offset order; calls for different queues run
// concurrently. ctx ends when Run's context ends or the message's queue is
// taken from this member (a rebalance): a handler should stop then, its
// message will be delivered to the queue's next owner.
type Handler func(ctx context.Context, m *Message) error

// BatchHandler handles up to MaxPollRecords messages of one queue, in
// offset order. Returning nil marks them all processed; an error (or a
// panic) delivers the whole batch again after a backoff, up to MaxRetries
// times, and then sends each of its messages to the dead-letter topic.
type BatchHandler func(ctx context.Context, msgs []*Message) error

// mode is how a consumer hands messages out.
type mode int32

const (
	modeNone mode = iota
	modeRun
	modePoll
)

// qkey names a queue.
type qkey struct {
	topic string
	queue uint32
}

func (k qkey) String() string { return fmt.Sprintf("%s/%d", k.topic, k.queue) }

// Consumer is a member of a consumer group. It is safe for concurrent use.
type Consumer struct {
	cfg    config
	group  string
	topics []string
	meta   *client.Client // nil when tests replace every use of it

	mode     atomic.Int32
	startMu  sync.Mutex
	started  bool
	handle   func(ctx context.Context, p *part, msgs []*Message) error // Run's handler
	batch    bool
	runCtx   context.Context
	stopRun  context.CancelFunc
	bg       context.Context // ends at Close: bounds background calls
	cancelBg context.CancelFunc

	// filter is the group's filter as the last heartbeat's reply named it
	// ("": every message), which PULLs name.
	filter atomic.Pointer[string]

	mu       sync.Mutex
	gen      uint64
	parts    map[qkey]*part
	lastWork map[qkey]chan struct{} // the last worker of each queue, for the next to wait on
	pollNext int                    // where Poll's round-robin starts
	closed   bool

	// routes is the subscribed topics' route cache, pool the brokers'
	// connections (PULLs and dead letters): the client core's.
	routes *clientcore.Routes[struct{}]
	pool   *clientcore.Pool
	// dlqIDs numbers dead letters: their ids are dlqPrefix-N.
	dlqPrefix string
	dlqIDs    atomic.Uint64

	avail      chan struct{} // a fetcher appended messages (Poll waits on it)
	kick       chan struct{} // heartbeat now (a commit was refused as stale)
	commitReq  chan commitReq
	stopMember chan struct{}
	memberDone chan struct{}
	closing    chan struct{}
	failed     chan struct{} // closed when failErr is set
	failErr    error         // a heartbeat refused for good (INVALID, UNKNOWN_TOPIC)
	closeOnce  sync.Once
	closeErr   error

	fetchWG   sync.WaitGroup // fetchers
	workWG    sync.WaitGroup // Run's workers
	releaseWG sync.WaitGroup // revocations waiting for their last handler call (lease.go)

	// incarnation is this instance's (its start time in unix ns): the
	// registry hands a queue to one member incarnation at a time and fences
	// older incarnations of the same member id.
	incarnation uint64
	// lease is when this member must stop delivering: its last answered
	// heartbeat's send plus its session, less a margin (nil: none yet).
	lease atomic.Pointer[time.Time]
	// leaseWake, when not nil, is closed at the next renewal (waitLease).
	leaseMu   sync.Mutex
	leaseWake chan struct{}
	// relMu guards released: queues this member let go (their last handler
	// call returned, their offset committed) that its next heartbeat reports.
	relMu    sync.Mutex
	released []api.QueueRef
	// lettingGo are the queues being stopped (letGo) and not yet reported.
	lettingGo map[qkey]bool

	stats counters
}

type commitReq struct {
	ctx  context.Context
	done chan error
}

// New returns a member of group consuming topics. It checks every option
// at once and contacts nothing: the member joins the group at the first Run
// or Poll.
func New(group string, topics []string, opts ...Opt) (*Consumer, error) {
	cfg := defaults()
	cfg.member = defaultMember()
	cfg.Shared = clientcore.Apply(&cfg, opts)
	var errs []error
	if group == "" || len(group) > protocol.MaxTopicLen {
		errs = append(errs, fmt.Errorf("consumer: group %q must be 1 to %d bytes", group, protocol.MaxTopicLen))
	}
	if len(topics) == 0 {
		errs = append(errs, errors.New("consumer: no topics"))
	}
	seen := map[string]bool{}
	var uniq []string
	for _, t := range topics {
		switch {
		case t == "" || len(t) > protocol.MaxTopicLen:
			errs = append(errs, fmt.Errorf("consumer: topic %q must be 1 to %d bytes", t, protocol.MaxTopicLen))
		case !seen[t]:
			seen[t] = true
			uniq = append(uniq, t)
		}
	}
	sort.Strings(uniq)
	if cfg.deadLetter == "" {
		cfg.deadLetter = "%DLQ%" + group
	}
	if len(cfg.deadLetter) > protocol.MaxTopicLen {
		errs = append(errs, fmt.Errorf("consumer: dead-letter topic %q over %d bytes", cfg.deadLetter, protocol.MaxTopicLen))
	}
	if cfg.nonBlocking {
		cfg.retryTopic = protocol.RetryPrefix + group
		// Its retries are stored pending under the internal topic
		// protocol.DelayTopic(retry topic), which must fit too.
		if len(protocol.DelayTopic(cfg.retryTopic)) > protocol.MaxTopicLen {
			errs = append(errs, fmt.Errorf("consumer: NonBlockingRetries: the retry topic %q is too long: group names of at most %d bytes have one",
				cfg.retryTopic, protocol.MaxTopicLen-len(protocol.DelayTopic(protocol.RetryPrefix))))
		} else if !seen[cfg.retryTopic] {
			uniq = append(uniq, cfg.retryTopic)
			sort.Strings(uniq)
		}
	}
	if err := cfg.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	cfg.retryWaits = cfg.waits()
	c := &Consumer{
		cfg: cfg, group: group, topics: uniq,
		parts: map[qkey]*part{}, lastWork: map[qkey]chan struct{}{},
		avail: make(chan struct{}, 1), kick: make(chan struct{}, 1), commitReq: make(chan commitReq),
		stopMember: make(chan struct{}), memberDone: make(chan struct{}), closing: make(chan struct{}),
		failed: make(chan struct{}), incarnation: uint64(time.Now().UnixNano()),
	}
	if cfg.coord == nil || cfg.router == nil || cfg.dlq == nil {
		meta, err := client.New(client.Config{Addrs: cfg.MetaAddrs, CallTimeout: cfg.requestTimeout, Token: cfg.Token, Transport: transport.ClientConfig{TLS: cfg.TLS}})
		if err != nil {
			return nil, err
		}
		c.meta = meta
		if cfg.coord == nil {
			c.cfg.coord = meta
		}
		if cfg.router == nil {
			c.cfg.router = meta
		}
	}
	c.pool = clientcore.NewPool(clientcore.PoolConfig{Transport: transport.ClientConfig{TLS: cfg.TLS, Login: auth.TokenLogin(cfg.Token)}})
	if c.cfg.puller == nil {
		c.cfg.puller = brokerPuller{c.pool}
	}
	if c.cfg.dlq == nil {
		c.cfg.dlq = newCoreDLQ(c.meta, c.pool, cfg.requestTimeout)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	c.dlqPrefix = hex.EncodeToString(b[:])
	c.routes = clientcore.NewRoutes(clientcore.RoutesConfig[struct{}]{Lookup: c.cfg.router.RouteExisting,
		TTL: routeMaxAge, MinRefresh: routeMinRefresh, Clock: c.cfg.clock})
	c.bg, c.cancelBg = context.WithCancel(context.Background())
	return c, nil
}

// Group is the consumer's group.
func (c *Consumer) Group() string { return c.group }

// MemberID is this member's id in its group.
func (c *Consumer) MemberID() string { return c.cfg.member }

// Run joins the group and hands every message of the member's queues to h,
// one at a time per queue (queues run concurrently), until ctx ends, the
// consumer is closed, or the metaserver refuses the member for good (a
// subscribed topic deleted, an invalid option: the error). A message's offset is committed once h returned nil
// for it and for every message before it in its queue (or they were
// dead-lettered). Run returns ctx's error when ctx ends, nil after Close.
// It may be called once per Consumer; call Close afterwards, which commits
// what was processed and leaves the group.
func (c *Consumer) Run(ctx context.Context, h Handler) error {
	if h == nil {
		return errors.New("consumer: nil handler")
	}
	return c.run(ctx, false, func(ctx context.Context, _ *part, msgs []*Message) error { return h(ctx, msgs[0]) })
}

// RunBatch is Run with a handler of up to MaxPollRecords messages of one
// queue at a time.
func (c *Consumer) RunBatch(ctx context.Context, h BatchHandler) error {
	if h == nil {
		return errors.New("consumer: nil handler")
	}
	return c.run(ctx, true, func(ctx context.Context, _ *part, msgs []*Message) error { return h(ctx, msgs) })
}

func (c *Consumer) run(ctx context.Context, batch bool, h func(context.Context, *part, []*Message) error) error {
	if !c.mode.CompareAndSwap(int32(modeNone), int32(modeRun)) {
		return ErrBusy
	}
	c.handle, c.batch = h, batch
	c.runCtx, c.stopRun = context.WithCancel(ctx)
	defer c.stopRun()
	if err := c.start(ctx); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.closing:
		return nil
	case <-c.failed:
		return c.failErr
	}
}

// fail records a heartbeat error that retrying will not cure; Run and Poll
// return it.
func (c *Consumer) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failErr == nil {
		c.failErr = err
		close(c.failed)
	}
}

// Poll joins the group (on its first call) and returns up to
// MaxPollRecords fetched messages, from several queues, in offset order
// per queue. It waits until there are some, ctx ends (its error), or the
// consumer is closed (ErrClosed). Mark each message processed with
// MarkProcessed once it is handled: a queue's offset is committed (by the
// periodic commit, Commit, a revocation or Close) up to its first message
// not marked. Poll style has no retries and no dead letters: a message
// never marked is delivered again only after a rebalance or a restart.
func (c *Consumer) Poll(ctx context.Context) ([]*Message, error) {
	if c.cfg.nonBlocking {
		return nil, errPollNonBlocking
	}
	if !c.mode.CompareAndSwap(int32(modeNone), int32(modePoll)) && mode(c.mode.Load()) != modePoll {
		return nil, ErrBusy
	}
	if err := c.start(ctx); err != nil {
		return nil, err
	}
	for {
		if msgs := c.takeAny(c.cfg.maxPollRecords); len(msgs) > 0 {
			return msgs, nil
		}
		select {
		case <-c.avail:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.closing:
			return nil, ErrClosed
		case <-c.failed:
			return nil, c.failErr
		}
	}
}

// takeAny takes up to max buffered messages from the queues, round-robin;
// none while the member's lease has lapsed (lease.go).
func (c *Consumer) takeAny(max int) []*Message {
	if !c.leaseValid() {
		signal(c.kick)
		return nil
	}
	c.mu.Lock()
	parts := make([]*part, 0, len(c.parts))
	for _, p := range c.parts {
		parts = append(parts, p)
	}
	start := c.pollNext
	c.pollNext++
	c.mu.Unlock()
	if len(parts) == 0 {
		return nil
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].key.String() < parts[j].key.String() })
	var out []*Message
	for i := range parts {
		if len(out) >= max {
			break
		}
		out = parts[(start+i)%len(parts)].take(out, max-len(out))
	}
	if len(out) > 0 {
		// Others may be waiting too, and messages are left.
		select {
		case c.avail <- struct{}{}:
		default:
		}
	}
	return out
}

// MarkProcessed marks a message handed out by Poll as processed: its
// queue's offset may be committed past it once every earlier message of
// the queue is marked too. A message of a queue the member no longer holds
// is ignored (it will be delivered to the queue's new owner).
func (c *Consumer) MarkProcessed(m *Message) {
	if m != nil && m.part != nil {
		m.part.done(m.Offset, m.Offset)
	}
}

// Commit commits every processed offset now, in one call, and returns when
// the metaserver has it. An error matching ErrRebalanced means the group
// moved on: the member takes its new assignment, and what it held of a
// queue it lost will be delivered again to the new owner.
func (c *Consumer) Commit(ctx context.Context) error {
	if !c.isStarted() {
		return nil
	}
	req := commitReq{ctx: ctx, done: make(chan error, 1)}
	select {
	case c.commitReq <- req:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.closing:
		return ErrClosed
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Consumer) isStarted() bool {
	c.startMu.Lock()
	defer c.startMu.Unlock()
	return c.started
}

// start checks the topics and starts the membership loop, once.
func (c *Consumer) start(ctx context.Context) error {
	c.startMu.Lock()
	defer c.startMu.Unlock()
	if c.started {
		return nil
	}
	select {
	case <-c.closing:
		return ErrClosed
	default:
	}
	for _, t := range c.topics {
		cctx, cancel := context.WithTimeout(ctx, c.cfg.requestTimeout)
		err := c.checkTopic(cctx, t)
		cancel()
		if err != nil {
			return metaErr(fmt.Sprintf("route of %q", t), err)
		}
	}
	c.started = true
	go c.memberLoop()
	return nil
}

// Close stops consuming: it stops the fetchers, waits for the handler calls
// under way to return, commits what was processed, leaves the group at once
// (its queues go to the other members without waiting for the session to
// run out) and returns when every goroutine of the consumer is gone.
func (c *Consumer) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.close() })
	return c.closeErr
}

func (c *Consumer) close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.startMu.Lock()
	started := c.started
	close(c.closing)
	c.startMu.Unlock()
	var errs []error
	if started {
		close(c.stopMember)
		<-c.memberDone
		c.mu.Lock()
		parts := make([]*part, 0, len(c.parts))
		for _, p := range c.parts {
			parts = append(parts, p)
		}
		c.mu.Unlock()
		for _, p := range parts {
			p.stopFetch()
		}
		c.workWG.Wait() // handler calls under way finish
		c.releaseWG.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.requestTimeout)
		if err := c.closeCommit(ctx, parts); err != nil {
			errs = append(errs, err)
		}
		cancel()
		if err := c.leave(); err != nil {
			c.cfg.Logger.Warn("could not leave the group; its queues move when the session ends", "group", c.group, "err", err)
			errs = append(errs, metaErr("leave", err))
		}
		for _, p := range parts {
			p.stop()
		}
	}
	if c.stopRun != nil {
		c.stopRun()
	}
	c.cancelBg()
	c.fetchWG.Wait()
	c.workWG.Wait()
	_ = c.pool.Close()
	if c.meta != nil {
		_ = c.meta.Close()
	}
	return errors.Join(errs...)
}

// closeCommit commits what was processed before leaving: the member holds
// its queues until it leaves (or lets them go), so its commits count
// whatever generation the group moved to meanwhile.
func (c *Consumer) closeCommit(ctx context.Context, parts []*part) error {
	return c.commitParts(ctx, parts)
}

// leave leaves the group, retrying what can be retried (a metaserver
// leader change under way, a lost connection) within RequestTimeout.
func (c *Consumer) leave() error {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.requestTimeout)
	defer cancel()
	backoff := 20 * time.Millisecond
	for {
		_, err := c.cfg.coord.ConsumerHeartbeat(ctx, c.heartbeatReq(true, c.toRelease()))
		if err == nil || permanent(err) || ctx.Err() != nil {
			return err
		}
		t := c.cfg.clock.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.Chan():
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// Stats is a snapshot of the consumer's counters and queues.
type Stats struct {
	Member     string
	Generation uint64
	Queues     []QueueStats // by topic and queue
	// Fetches counts PULLs answered, FetchErrors those that failed,
	// FromSlave those answered by a slave, Messages the messages fetched.
	Fetches, FetchErrors, FromSlave, Messages int64
	// Commits counts CommitOffsets calls that succeeded, CommitErrors those
	// that failed (STALE_GENERATION included).
	Commits, CommitErrors int64
	// Rebalances counts the generations the member moved to; Heartbeats
	// the heartbeats the metaserver answered; Rewinds the queues sent back
	// by a failover's new master (the member had read the old master's
	// tail, which the new one never had).
	Rebalances, Heartbeats, Rewinds int64
	// HandlerErrors counts failed deliveries (Panics of them panicked),
	// Redeliveries the deliveries after a failure, DeadLetters the messages
	// sent to the dead-letter topic, RetriesStored the messages stored in
	// the retry topic (NonBlockingRetries).
	HandlerErrors, Panics, Redeliveries, DeadLetters, RetriesStored int64
}

// QueueStats is one queue the member holds.
type QueueStats struct {
	Topic string
	Queue uint32
	// Committed is the group's committed offset (-1: none yet); Processed
	// is where the member's commit would put it (-1: the start is not known
	// yet); MaxOffset is the queue's end at the last PULL answer (-1: none
	// yet).
	Committed, Processed, MaxOffset int64
	// Lag is MaxOffset - Processed (-1 when either is unknown): messages
	// stored and not processed.
	Lag int64
	// Buffered counts messages fetched and not yet handed out.
	Buffered int
}

type counters struct {
	fetches, fetchErrors, fromSlave, messages        atomic.Int64
	commits, commitErrors, rebalances, heartbeats    atomic.Int64
	rewinds, retriesStored                           atomic.Int64
	handlerErrors, panics, redeliveries, deadLetters atomic.Int64
}

// Stats returns the consumer's counters and its queues' offsets.
func (c *Consumer) Stats() Stats {
	c.mu.Lock()
	s := Stats{Member: c.cfg.member, Generation: c.gen}
	parts := make([]*part, 0, len(c.parts))
	for _, p := range c.parts {
		parts = append(parts, p)
	}
	c.mu.Unlock()
	for _, p := range parts {
		s.Queues = append(s.Queues, p.stats())
	}
	slices.SortFunc(s.Queues, func(a, b QueueStats) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		return int(a.Queue) - int(b.Queue)
	})
	st := &c.stats
	s.Fetches, s.FetchErrors, s.FromSlave, s.Messages = st.fetches.Load(), st.fetchErrors.Load(), st.fromSlave.Load(), st.messages.Load()
	s.Commits, s.CommitErrors, s.Rebalances, s.Heartbeats = st.commits.Load(), st.commitErrors.Load(), st.rebalances.Load(), st.heartbeats.Load()
	s.Rewinds, s.RetriesStored = st.rewinds.Load(), st.retriesStored.Load()
	s.HandlerErrors, s.Panics, s.Redeliveries, s.DeadLetters = st.handlerErrors.Load(), st.panics.Load(), st.redeliveries.Load(), st.deadLetters.Load()
	return s
}
