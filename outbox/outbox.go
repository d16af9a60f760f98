package outbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// IDProperty is the property every message the outbox sends carries: its
// outbox id (Message.ID). A consumer may dedupe on it; the relay finds a
// message it may have sent by it.
const IDProperty = "OUTBOX_ID"

var (
	// ErrClosed: the outbox is closed.
	ErrClosed = errors.New("outbox: closed")
	// ErrRunning: Run or Start was called again (a relay runs once per
	// Outbox).
	ErrRunning = errors.New("outbox: the relay was started already")
)

// Message is a message stored in the outbox: producer.Message's fields but
// the delayed ones, and an ID.
type Message struct {
	// ID is the message's outbox id, unique in the table (a second Add of
	// an id still in the table fails). "" : Add makes one ("ob-" and 32 hex
	// digits). It is sent as the property IDProperty, and as the Key when
	// Key is "" (see the package doc).
	ID          string
	Topic       string
	Key         string
	Tag         string
	Properties  map[string]string
	Body        []byte
	Reliability protocol.Reliability
}

// FailedRow is a row the relay will not send again by itself: the broker
// refused its message as one that can never be stored (INVALID,
// MESSAGE_TOO_LARGE). It stays in the table with failed_at and last_error
// set; clearing failed_at (UPDATE ... SET failed_at = NULL) makes the relay
// try it again.
type FailedRow struct {
	RowID int64
	ID    string
	Topic string
	Err   error
}

// Stats are the relay's counters since New.
type Stats struct {
	Sent     int64 // messages the broker answered OK
	Resolved int64 // attempted rows found stored by a lookup (or answered DUPLICATE), deleted without a second copy
	Retried  int64 // sends or lookups that failed and left their row for a later pass
	Failed   int64 // rows marked failed (FailedRow)
	Passes   int64 // passes that took at least one row
	// PossibleDuplicates: messages the producer stored with
	// Result.PossibleDuplicate (its own cases, see package producer).
	PossibleDuplicates int64
}

// Opt configures an Outbox.
type Opt interface{ apply(*config) }

type optFunc func(*config)

func (f optFunc) apply(c *config) { f(c) }

type config struct {
	dialect      Dialect
	table        string
	client       []sdk.Opt
	producerOpts []producer.Opt
	batch        int
	poll         time.Duration
	leaseTTL     time.Duration
	margin       time.Duration
	backoff      time.Duration
	maxBackoff   time.Duration
	onFailed     func(FailedRow)
	logger       *slog.Logger

	// Tests only: called after a pass's sends all answered, before their
	// rows are deleted; true stops the relay there, as a crash would.
	afterSend func(sent int) bool
}

func defaults() config {
	return config{dialect: SQLite, table: "ferrymq_outbox", batch: 100, poll: time.Second, leaseTTL: 10 * time.Second,
		margin: 5 * time.Minute, backoff: 500 * time.Millisecond, maxBackoff: 30 * time.Second}
}

// WithDialect sets the database's dialect. Default SQLite.
func WithDialect(d Dialect) Opt { return optFunc(func(c *config) { c.dialect = d }) }

// Table names the outbox table (letters, digits, '_'); the lease is kept in
// TABLE_lease. Default "ferrymq_outbox".
func Table(name string) Opt { return optFunc(func(c *config) { c.table = name }) }

// Client gives the options of the relay's producer and lookups: the
// metaservers (sdk.MetaAddrs, required), sdk.Token, sdk.TLS, sdk.Logger
// and sdk.Metrics. The principal of the token needs produce and consume
// on the outbox's topics (consume: the relay looks its messages up; see
// the package doc's Limits).
func Client(opts ...sdk.Opt) Opt {
	return optFunc(func(c *config) { c.client = append(c.client, opts...) })
}

// ProducerOptions adds options of the relay's producer (Linger,
// DeliveryTimeout...). Identity is the outbox's name, whatever they say.
func ProducerOptions(opts ...producer.Opt) Opt {
	return optFunc(func(c *config) { c.producerOpts = append(c.producerOpts, opts...) })
}

// BatchSize is how many rows a pass takes at most. Default 100.
func BatchSize(n int) Opt { return optFunc(func(c *config) { c.batch = n }) }

// PollInterval is how often the relay looks for rows without being
// notified (rows left by a process that died, rows due after a backoff).
// Default 1 s.
func PollInterval(d time.Duration) Opt { return optFunc(func(c *config) { c.poll = d }) }

// LeaseTTL is how long the relay's lease on the table lasts unrenewed: a
// relay that dies is replaced that long after its last pass began. A
// pass's sends end a quarter of it before the lease does. Default 10 s.
func LeaseTTL(d time.Duration) Opt { return optFunc(func(c *config) { c.leaseTTL = d }) }

// LookupMargin widens the window a lookup searches before a row's first
// attempt (by the database's clock), for the skew between the database's
// and the brokers' clocks. Default 5 min.
func LookupMargin(d time.Duration) Opt { return optFunc(func(c *config) { c.margin = d }) }

// Backoff is the wait before a failed row is tried again, doubled at each
// attempt up to max. Default 500 ms, up to 30 s.
func Backoff(first, max time.Duration) Opt {
	return optFunc(func(c *config) { c.backoff, c.maxBackoff = first, max })
}

// OnFailed is called (on the relay's goroutine) for each row marked failed.
// Default: none (the row is logged at Error and counted in Stats.Failed).
func OnFailed(f func(FailedRow)) Opt { return optFunc(func(c *config) { c.onFailed = f }) }

var tableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,56}$`)

func (c *config) validate(name string) error {
	var errs []error
	if name == "" || len(name) > protocol.MaxTopicLen {
		errs = append(errs, fmt.Errorf("outbox: the producer name %q must be 1 to %d bytes", name, protocol.MaxTopicLen))
	}
	if !c.dialect.valid() {
		errs = append(errs, fmt.Errorf("outbox: unknown %v", c.dialect))
	}
	if !tableName.MatchString(c.table) {
		errs = append(errs, fmt.Errorf("outbox: table %q: want letters, digits and '_', not a digit first, at most 57", c.table))
	}
	if c.batch < 1 || c.batch > protocol.MaxLookupLimit {
		errs = append(errs, fmt.Errorf("outbox: BatchSize %d: want 1 to %d", c.batch, protocol.MaxLookupLimit))
	}
	if c.poll <= 0 || c.leaseTTL < 100*time.Millisecond || c.margin < 0 || c.backoff <= 0 || c.maxBackoff < c.backoff {
		errs = append(errs, fmt.Errorf("outbox: PollInterval %v, LeaseTTL %v (at least 100 ms), LookupMargin %v, Backoff %v to %v: want them positive, the backoff's max at least its first",
			c.poll, c.leaseTTL, c.margin, c.backoff, c.maxBackoff))
	}
	return errors.Join(errs...)
}

// Outbox stores messages in an application's transactions and relays them
// after the commit. Add is safe for concurrent use; one relay runs at a
// time per Outbox (Run or Start).
type Outbox struct {
	db     *sql.DB
	name   string
	cfg    config
	shared clientcore.Shared
	owner  string // this relay's lease owner id
	q      queries

	notify chan struct{}
	flushq chan chan struct{}

	closed atomic.Bool
	mu     sync.Mutex // guards stop and done: set once, by Run or Start
	stop   context.CancelFunc
	done   chan struct{}

	stats struct{ sent, resolved, retried, failed, passes, possibleDups atomic.Int64 }
}

// New returns an outbox on db whose relay sends through a producer named
// name (producer.Identity(name)): every relay of the same table uses the
// same name, and nothing else may use it (not another table's relays: they
// would fence each other). It checks every option at once, the producer's
// included; it does not touch the database (EnsureTable creates the
// tables) or the cluster.
func New(db *sql.DB, name string, opts ...Opt) (*Outbox, error) {
	cfg := defaults()
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	var errs []error
	if db == nil {
		errs = append(errs, errors.New("outbox: nil db"))
	}
	if err := cfg.validate(name); err != nil {
		errs = append(errs, err)
	}
	shared := clientcore.Apply[sdk.Opt, struct{}](&struct{}{}, cfg.client)
	if len(shared.MetaAddrs) == 0 {
		errs = append(errs, errors.New("outbox: no metaservers: give Client(sdk.MetaAddrs(...))"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	cfg.logger = shared.Logger
	var b [8]byte
	_, _ = rand.Read(b[:])
	o := &Outbox{db: db, name: name, cfg: cfg, shared: shared, owner: hex.EncodeToString(b[:]),
		q: newQueries(cfg.dialect, cfg.table), notify: make(chan struct{}, 1), flushq: make(chan chan struct{})}
	// The relay makes a producer for each lease it takes: one made here
	// (it dials nothing until it sends) checks the options now.
	p, err := producer.New(o.producerOpts()...)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	_ = p.Close()
	return o, nil
}

// EnsureTable creates the outbox's tables if they do not exist.
func (o *Outbox) EnsureTable(ctx context.Context) error {
	for _, s := range o.cfg.dialect.schema(o.cfg.table) {
		if _, err := o.db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("outbox: create table %s: %w", o.cfg.table, err)
		}
	}
	return nil
}

// Add stores m in the application's transaction tx and returns its outbox
// id: the message is sent iff tx commits. It checks what can be checked
// before the send (a topic, no reserved property); the broker checks the
// rest (size, tag), and a message it refuses for good is kept as a
// FailedRow. Call Notify after the commit for the relay to send it at once.
func (o *Outbox) Add(ctx context.Context, tx *sql.Tx, m *Message) (string, error) {
	if m == nil || m.Topic == "" || len(m.Topic) > protocol.MaxTopicLen {
		return "", fmt.Errorf("outbox: %w: a message needs a topic of 1 to %d bytes", protocol.ErrInvalid, protocol.MaxTopicLen)
	}
	if _, ok := m.Properties[IDProperty]; ok {
		return "", fmt.Errorf("outbox: %w: property %s is the outbox's", protocol.ErrInvalid, IDProperty)
	}
	id := m.ID
	if id == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		id = "ob-" + hex.EncodeToString(b[:])
	}
	props, err := json.Marshal(m.Properties)
	if err != nil {
		return "", fmt.Errorf("outbox: properties of %s: %w", id, err)
	}
	body := m.Body
	if body == nil {
		body = []byte{}
	}
	if _, err := tx.ExecContext(ctx, o.q.insert, id, m.Topic, m.Key, m.Tag, string(props), body, int(m.Reliability)); err != nil {
		return "", fmt.Errorf("outbox: add %s: %w", id, err)
	}
	return id, nil
}

// Notify wakes the relay up: call it after committing a transaction that
// added messages. It never blocks.
func (o *Outbox) Notify() {
	select {
	case o.notify <- struct{}{}:
	default:
	}
}

// Flush asks the relay for passes until no row is ready (rows failed or
// waiting for a backoff are not), and waits for them. It needs the relay
// running (Run or Start) and holding the lease (while another relay of the
// table holds it, this one sends nothing): ctx bounds the wait.
func (o *Outbox) Flush(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case o.flushq <- done:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Start runs the relay on a goroutine until Close.
func (o *Outbox) Start() error {
	ctx, done, err := o.begin(context.Background())
	if err != nil {
		return err
	}
	go func() {
		defer close(done)
		if err := o.relay(ctx); err != nil && !errors.Is(err, context.Canceled) {
			o.cfg.logger.Error("outbox relay stopped", "error", err)
		}
	}()
	return nil
}

// Run runs the relay until ctx ends (it returns ctx's error) or Close
// (nil). Failures of the database or the cluster do not end it: they are
// logged, and the next pass tries again.
func (o *Outbox) Run(ctx context.Context) error {
	ctx, done, err := o.begin(ctx)
	if err != nil {
		return err
	}
	defer close(done)
	err = o.relay(ctx)
	if o.closed.Load() && errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// begin marks the relay running, once, unless the outbox is closed.
func (o *Outbox) begin(parent context.Context) (context.Context, chan struct{}, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed.Load() {
		return nil, nil, ErrClosed
	}
	if o.done != nil {
		return nil, nil, ErrRunning
	}
	ctx, cancel := context.WithCancel(parent)
	o.stop, o.done = cancel, make(chan struct{})
	return ctx, o.done, nil
}

// Close stops the relay, waits for its pass to end (its sends are answered
// and their rows deleted), and gives its lease up so that another relay
// takes over at once. Rows not sent stay for the next relay.
func (o *Outbox) Close() error {
	o.mu.Lock()
	if o.closed.Swap(true) {
		o.mu.Unlock()
		return nil
	}
	stop, done := o.stop, o.done
	o.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
	return nil
}

// Stats returns the relay's counters.
func (o *Outbox) Stats() Stats {
	s := &o.stats
	return Stats{Sent: s.sent.Load(), Resolved: s.resolved.Load(), Retried: s.retried.Load(), Failed: s.failed.Load(), Passes: s.passes.Load(),
		PossibleDuplicates: s.possibleDups.Load()}
}
