package producer

import (
	"errors"
	"fmt"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// Opt configures a Client: one of this package's options, or one of package
// sdk's (MetaAddrs, TLS, Token, Logger, Metrics), which every SDK client
// takes. Options are sealed (franz-go's style): only ferrymq's packages
// make them, and the compiler refuses another SDK's own options here.
type Opt interface {
	clientcore.Opt
	ProducerOpt()
}

// opt is one of this package's options.
type opt struct{ clientcore.OwnOpt[config] }

// ProducerOpt marks an option New accepts.
func (opt) ProducerOpt() {}

func optFunc(f func(*config)) Opt { return opt{clientcore.Own(f)} }

type config struct {
	// The options every SDK client shares (package sdk's): MetaAddrs,
	// TLS, Token, Logger and Metrics.
	clientcore.Shared
	linger          time.Duration
	maxBatchBytes   int
	maxInflight     int
	maxRecords      int
	maxBytes        int64
	failWhenFull    bool
	deliveryTimeout time.Duration
	requestTimeout  time.Duration
	retryBackoff    time.Duration
	maxBackoff      time.Duration // the cap of a retry's doubling backoff
	routeRefresh    time.Duration
	routePoll       time.Duration
	avoider         routing.Avoider
	clock           clockwork.Clock
	idempotent      bool
	name            string
	moveKeyed       bool
	moveOnUnknown   bool
	failoverWait    time.Duration
	txnCheck        TxnChecker // nil: none (CheckTxns)
	txnTopics       []string
	txnCheckEvery   time.Duration
	idSource        identitySource      // nil: the metaserver
	routeSrc        routeSource         // nil: the metaserver
	dialAddr        func(string) string // nil: brokers' addresses as routed (tests put a proxy between)
}

func defaults() config {
	return config{
		linger:          2 * time.Millisecond,
		maxBatchBytes:   1 << 20,
		maxInflight:     5,
		maxRecords:      100_000,
		maxBytes:        64 << 20,
		deliveryTimeout: 30 * time.Second,
		requestTimeout:  5 * time.Second,
		retryBackoff:    50 * time.Millisecond,
		maxBackoff:      time.Second,
		routeRefresh:    30 * time.Second,
		routePoll:       300 * time.Millisecond,
		failoverWait:    20 * time.Second,
		txnCheckEvery:   10 * time.Second,
		clock:           clockwork.NewRealClock(),
		idempotent:      true,
	}
}

// maxBatchBytes is the most MaxBatchBytes may be: a batch's frame (its fixed
// header and the SEND body's header, epoch and count, besides the messages)
// fits in protocol.MaxFrameSize.
const maxBatchBytes = protocol.MaxFrameSize - protocol.FixedHeaderSize - protocol.SendRequestHeaderSize

// validate checks every option and names each bad one: a negative or zero
// duration or size is an error, never a default.
func (c *config) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("producer: "+format, args...)) }
	c.Shared.Validate(true, bad)
	if c.linger < 0 {
		bad("Linger %v is negative", c.linger)
	}
	if c.maxBatchBytes <= 0 || c.maxBatchBytes > maxBatchBytes {
		bad("MaxBatchBytes %d must be from 1 to %d (a batch must fit in one frame)", c.maxBatchBytes, maxBatchBytes)
	}
	if c.maxInflight <= 0 {
		bad("MaxInflightPerGroup %d must be positive", c.maxInflight)
	}
	if c.maxRecords <= 0 {
		bad("MaxBuffered records %d must be positive", c.maxRecords)
	}
	if c.maxBytes <= 0 {
		bad("MaxBuffered bytes %d must be positive", c.maxBytes)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"DeliveryTimeout", c.deliveryTimeout},
		{"RequestTimeout", c.requestTimeout},
		{"RetryBackoff", c.retryBackoff},
		{"RouteRefresh", c.routeRefresh},
		{"RoutePoll", c.routePoll},
		{"FailoverWait", c.failoverWait},
		{"TxnCheckInterval", c.txnCheckEvery},
	} {
		if d.v <= 0 {
			bad("%s %v must be positive", d.name, d.v)
		}
	}
	if c.txnCheck != nil && (c.name == "" || !c.idempotent || len(c.txnTopics) == 0) {
		bad("CheckTxns needs a named idempotent producer (Identity) and the topics its transactions write")
	}
	if len(c.name) > maxNameLen {
		bad("Identity name of %d bytes over the cap %d", len(c.name), maxNameLen)
	}
	// Relations between options, checked when both sides are valid alone.
	if c.linger >= 0 && c.deliveryTimeout > 0 && c.linger >= c.deliveryTimeout {
		bad("Linger %v must be shorter than DeliveryTimeout %v (a lingering message would expire unsent)", c.linger, c.deliveryTimeout)
	}
	if c.maxBatchBytes > 0 && c.maxBytes > 0 && int64(c.maxBatchBytes) > c.maxBytes {
		bad("MaxBatchBytes %d must not be larger than MaxBuffered bytes %d (a batch could never fill)", c.maxBatchBytes, c.maxBytes)
	}
	return errors.Join(errs...)
}

// maxNameLen caps Identity's name.
const maxNameLen = 255

// Idempotence turns exactly-once, ordered sends on or off. Default on.
//
// On: before its first batch leaves, the producer takes an identity
// (producer id and epoch) from the metaserver, and stamps every message
// with it and a sequence number per queue. A send whose outcome is unknown
// (a timeout, a lost connection, SLAVE_SYNC_TIMEOUT and the other statuses
// of protocol.Status.MaybeStored) is retried on the same queue with the
// same stamp, so the broker answers a message it already stored as a
// duplicate (with the original offsets) instead of storing it again. The
// package documentation states the guarantee.
//
// Off: messages carry no stamp and need no identity; a failed send is
// retried on any queue (keyed messages still wait for their own, see
// MoveKeyedOnFailure), so a retry after an unknown outcome can store a
// message twice.
func Idempotence(on bool) Opt { return optFunc(func(c *config) { c.idempotent = on }) }

// Identity names the producer (at most 255 bytes). Default "": anonymous,
// a fresh producer id per Client. A named producer keeps its id across
// instances: each New takes the next epoch, and brokers refuse the earlier
// instances' messages (ErrFenced) once the later one has written to a
// queue. Use a name for a producer that must be one at a time (a restarted
// service, a standby taking over), so a restart mid-retry cannot store a
// message twice. Ignored with idempotence off.
func Identity(name string) Opt { return optFunc(func(c *config) { c.name = name }) }

// MoveKeyedOnFailure lets a keyed message (Message.Key set) be retried on
// another queue after a failure that says it was not stored. Default false:
// a keyed message waits for its own queue (retried there with backoff)
// until its delivery deadline, so one key's messages keep their order even
// across failures. Setting it trades that order for availability.
func MoveKeyedOnFailure(allow bool) Opt { return optFunc(func(c *config) { c.moveKeyed = allow }) }

// MoveOnUnknownOutcome lets a message whose outcome is unknown (no answer,
// a call given up, or a status of protocol.Status.MaybeStored: TIMEOUT,
// LEASE_LOST, SLAVE_SYNC_TIMEOUT...) leave its queue without its stamp as
// soon as its group refuses it or the route shows the group without a
// writable master, as a message known not stored does. Such a message may
// be stored twice, and its Result.PossibleDuplicate says so. Default
// false: it keeps its stamp and waits for its queue's master (the same
// one, or the slave promoted in its place, which holds the dedupe state),
// which answers it DUPLICATE if it was stored and stores it once
// otherwise; it moves only as FailoverWait says. Either way a keyed
// message moves only if MoveKeyedOnFailure allows it, and a message that
// a keyed one keeping its stamp follows in its queue waits with it (the
// queue's sequence must have no gap). Ignored with idempotence off.
func MoveOnUnknownOutcome(allow bool) Opt {
	return optFunc(func(c *config) { c.moveOnUnknown = allow })
}

// FailoverWait bounds how long a message whose outcome is unknown keeps
// its stamp and its queue while its group cannot answer it (see
// MoveOnUnknownOutcome). Counted from the message's first unknown outcome
// (by the producer's clock); once it has passed, the message's next
// refusal, or a retry that finds the route showing its group without a
// writable master, lets it move to another queue without its stamp
// (flagged Result.PossibleDuplicate), as a message known not stored does.
// It may move without waiting when the newest route shows its group with
// no writable master and no slave, its master (if any) of the epoch the
// unknown attempt went to: nobody can be promoted to answer it. (A master
// of a later epoch, not yet writable, is the slave promoted since: the
// message waits for it.)
// Default 20 s: longer than a master's loss takes to repair at the
// metaserver's defaults (its last heartbeat up to 2 s before it died, the
// promotion 10 s session + 1 s margin after that heartbeat, then the
// producer's poll and the new master's takeover, within a second), with
// room for a metaserver leader change at the same time (a new leader
// starts every session at its takeover). It bounds what failover cannot
// repair: failover off on the metaservers, a dead or lagging slave, a
// group an operator marked read-only, a HIGH message refused SLAVE_LAGGING
// by a master with no slave. A FailoverWait at least DeliveryTimeout never
// moves such a message: it waits until its delivery deadline.
func FailoverWait(d time.Duration) Opt { return optFunc(func(c *config) { c.failoverWait = d }) }

// withIdentitySource replaces the metaserver as the source of producer
// identities (tests).
func withIdentitySource(src identitySource) Opt {
	return optFunc(func(c *config) { c.idSource = src })
}

// withRouteSource replaces the metaserver as the source of routes (tests).
func withRouteSource(src routeSource) Opt { return optFunc(func(c *config) { c.routeSrc = src }) }

// withDialAddr maps a broker's routed address to the one dialed (tests).
func withDialAddr(f func(string) string) Opt { return optFunc(func(c *config) { c.dialAddr = f }) }

// Linger is how long a batch waits for more messages before it is sent,
// when the group already has a batch in flight or none is urgent. A
// synchronous Send does not wait for it, nor does a batch while a sender
// waits for buffer room (MaxBuffered): no message joins it until answers
// free room. Default 2 ms; 0 sends at once.
// It must be shorter than DeliveryTimeout.
func Linger(d time.Duration) Opt { return optFunc(func(c *config) { c.linger = d }) }

// MaxBatchBytes caps the messages of one batch (a single message may be
// larger). Default 1 MiB. It must fit in a frame (protocol.MaxFrameSize,
// less a few bytes) and be at most MaxBuffered's bytes.
func MaxBatchBytes(n int) Opt { return optFunc(func(c *config) { c.maxBatchBytes = n }) }

// MaxInflightPerGroup bounds the batches in flight to one broker group;
// while it is reached, new messages accumulate into the next batch.
// Default 5. A client keeps as many buffers that batches were encoded into
// (each up to about MaxBatchBytes) for its next batches.
func MaxInflightPerGroup(n int) Opt { return optFunc(func(c *config) { c.maxInflight = n }) }

// MaxBuffered bounds the messages (and their bytes) accepted and not yet
// answered. When full, a send blocks until there is room or its context
// ends, unless FailWhenFull is set, and what lingers is sent at once. A
// message's room is freed just before its promise is called. Defaults
// 100,000 and 64 MiB.
func MaxBuffered(records int, bytes int64) Opt {
	return optFunc(func(c *config) { c.maxRecords, c.maxBytes = records, bytes })
}

// FailWhenFull makes a send fail at once with ErrBufferFull instead of
// blocking when the buffer is full.
func FailWhenFull() Opt { return optFunc(func(c *config) { c.failWhenFull = true }) }

// DeliveryTimeout bounds a message's whole delivery, retries included.
// A synchronous Send's context deadline, if sooner, wins. Default 30 s.
func DeliveryTimeout(d time.Duration) Opt { return optFunc(func(c *config) { c.deliveryTimeout = d }) }

// RequestTimeout bounds one SEND request to a broker (and one route
// lookup or identity request to the metaserver). Default 5 s: half the
// metaserver's default session (10 s), and longer than a broker's wait for
// its slave before it answers a HIGH message SLAVE_SYNC_TIMEOUT (3 s), so a
// live broker's answer, not the timeout, settles a slow send. A master that
// stops answering is usually given up sooner: a call is abandoned as soon
// as a route refresh shows its group's master or epoch changed, or the
// group not writable while the call has waited RoutePoll (see RoutePoll).
// A call given up either way has an unknown outcome (protocol.ErrTimeout):
// with idempotence it is retried on the same queue with the same stamp, at
// the queue's master by the newest route.
func RequestTimeout(d time.Duration) Opt { return optFunc(func(c *config) { c.requestTimeout = d }) }

// RetryBackoff is the first retry's backoff; it doubles per attempt, up to
// 1 s, with jitter. Default 50 ms.
func RetryBackoff(d time.Duration) Opt { return optFunc(func(c *config) { c.retryBackoff = d }) }

// RouteRefresh is how often cached routes are refreshed. They are also
// refreshed at once (at most once a second per topic) after a status whose
// row in the status table says so (protocol.Status.RefreshesRoute:
// READ_ONLY, NOT_MASTER, NO_ROUTE, LEASE_LOST) or a send that got no answer
// (a lost connection, a timeout), and polled every RoutePoll while a group
// is in trouble. Default 30 s.
func RouteRefresh(d time.Duration) Opt { return optFunc(func(c *config) { c.routeRefresh = d }) }

// RoutePoll is how often a topic's route is looked up while one of its
// groups is in trouble, so that a failover (a new master, a new epoch) or a
// group's return reaches the producer within about a poll: while any queue
// of the route has no writable master, or a send to one of its groups has
// waited longer than RoutePoll for its answer. Only topics sent to since
// their last periodic refresh are polled. Each wait is drawn from
// [RoutePoll/2, 3*RoutePoll/2), so producers do not poll in step. Once
// every group is writable and answering, the route goes back to
// RouteRefresh. Default 300 ms (a lookup costs the metaserver about 10 µs).
func RoutePoll(d time.Duration) Opt { return optFunc(func(c *config) { c.routePoll = d }) }

// Avoider sets the latency-fault avoidance policy (nil: the default).
// Which broker answers count as faults is the status table's Fault column
// (protocol.Status.Fault); a broken connection or a late answer always does.
// Default: RocketMQ's
// latency table (routing.NewLatencyTable) with probes: an avoided group gets
// one send as a probe 1 s after its last bad answer (then 2 s, then every
// 4 s while probes fail), and a probe answered fast clears it, so a group
// that recovered gets traffic again within 4 s rather than RocketMQ's up
// to 600 s. routing.NewDecayingLatency (a
// decaying latency estimate with two choices) sends fewer messages to a
// group while it is slow (routing's BenchmarkAvoiders), but it herds: a
// group a millisecond slower than the others gets almost nothing, so queues
// fill unevenly. Choose it when latency matters more than balance.
func Avoider(a routing.Avoider) Opt { return optFunc(func(c *config) { c.avoider = a }) }

// withMaxBackoff sets the cap of a retry's backoff (1 s), for tests that
// must tell a woken retry from a timed-out backoff.
func withMaxBackoff(d time.Duration) Opt { return optFunc(func(c *config) { c.maxBackoff = d }) }

// withClock sets the clock of route refreshes (the RouteRefresh period, the
// RoutePoll polls, the at-most-once-a-second refresh after routing errors),
// of how long a call has waited for the poll's give-up rule, of
// FailoverWait, and of the avoider's "now", so tests can move it. Linger,
// retry backoff, request timeouts and delivery deadlines stay on the real
// clock: they bound real waits on sockets. Default: the real clock.
func withClock(clk clockwork.Clock) Opt {
	return optFunc(func(c *config) {
		if clk != nil {
			c.clock = clk
		}
	})
}
