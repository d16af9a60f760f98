package consumer

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/protocol"
)

// Opt configures a Consumer: one of this package's options, or one of
// package sdk's (MetaAddrs, TLS, Token, Logger, Metrics), which every SDK
// client takes. Options are sealed (franz-go's style): only ferrymq's
// packages make them, and the compiler refuses another SDK's own options
// here.
type Opt interface {
	clientcore.Opt
	ConsumerOpt()
}

// opt is one of this package's options.
type opt struct{ clientcore.OwnOpt[config] }

// ConsumerOpt marks an option New accepts.
func (opt) ConsumerOpt() {}

func optFunc(f func(*config)) Opt { return opt{clientcore.Own(f)} }

// Start is where a queue with no committed offset starts.
type Start uint8

const (
	// Earliest starts at the queue's oldest stored message.
	Earliest Start = iota
	// Latest starts at the queue's end: only messages stored after the
	// member took the queue are consumed.
	Latest
)

func (s Start) String() string {
	switch s {
	case Earliest:
		return "earliest"
	case Latest:
		return "latest"
	}
	return fmt.Sprintf("Start(%d)", uint8(s))
}

type config struct {
	// The options every SDK client shares (package sdk's): MetaAddrs,
	// TLS, Token, Logger and Metrics.
	clientcore.Shared
	member           string
	start            Start
	session          time.Duration
	heartbeat        time.Duration
	autoCommit       time.Duration
	manualCommit     bool
	maxPrefetchBytes int64
	maxPollRecords   int
	pollWait         time.Duration
	requestTimeout   time.Duration
	maxRetries       int
	// The redelivery waits: RetryBackoff's doubling (retryBackoff up to
	// maxRetryBackoff) or, when scheduleSet, RetrySchedule's list. New
	// turns either into retryWaits (retryWait).
	retryBackoff    time.Duration
	maxRetryBackoff time.Duration
	retrySchedule   []time.Duration
	scheduleSet     bool
	retryWaits      []time.Duration
	// nonBlocking: a failed message waits for its retry in the group's
	// retry topic, not in its queue (NonBlockingRetries).
	nonBlocking bool
	retryTopic  string // "" unless nonBlocking: "%RETRY%" + group
	filter      string // Filter's expression; "": none asked for
	uncommitted bool   // ReadUncommitted
	deadLetter  string // "" until New: "%DLQ%" + group
	clock       clockwork.Clock
	realClock   bool // clock is the real clock (withClock not given)

	// Tests replace the metaserver and the brokers.
	coord  coordinator
	router router
	puller puller
	dlq    deadLetterer
}

func defaults() config {
	return config{
		start:            Earliest,
		session:          10 * time.Second,
		heartbeat:        time.Second,
		autoCommit:       time.Second,
		maxPrefetchBytes: 64 << 20,
		maxPollRecords:   500,
		pollWait:         time.Second,
		requestTimeout:   5 * time.Second,
		maxRetries:       16,
		retryBackoff:     time.Second,
		maxRetryBackoff:  30 * time.Second,
		clock:            clockwork.NewRealClock(),
		realClock:        true,
	}
}

// Limits on options.
const (
	maxMemberLen = 255
	// minQueueShare is the least prefetch a queue gets, whatever
	// MaxPrefetchBytes and the number of queues: a PULL asks for at least
	// this much (and a PULL returns at least one message anyway).
	minQueueShare = 64 << 10
	// maxPullBytes caps what one PULL asks for (the broker caps it at
	// 8 MiB); the fetcher asks for less still (part.go: 1 MiB behind the
	// queue's end, 64 KiB at it), so that a parked PULL's reserved answer
	// never keeps the broker from reading the member's other PULLs on the
	// same connection (4 MiB of answers owed per connection).
	maxPullBytes = 4 << 20
	// maxPollWait keeps a PULL's wait in its u32 milliseconds and far below
	// any connection timeout.
	maxPollWait = 30 * time.Second
	// The metaserver's bounds of a member's session.
	minSession = time.Second
	maxSession = 5 * time.Minute
)

// validate checks every option and names each bad one: a negative or zero
// duration or size is an error, never a default.
func (c *config) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("consumer: "+format, args...)) }
	c.Shared.Validate(c.coord == nil, bad)
	if c.member == "" || len(c.member) > maxMemberLen {
		bad("MemberID %q must be 1 to %d bytes", c.member, maxMemberLen)
	}
	if c.start != Earliest && c.start != Latest {
		bad("StartFrom %v is neither Earliest nor Latest", c.start)
	}
	if c.filter != "" {
		if f, err := protocol.ParseFilter(c.filter); err != nil {
			bad("Filter: %v", err)
		} else {
			c.filter = f.Canonical() // as the registry keeps it ("*": every message)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"Session", c.session},
		{"Heartbeat", c.heartbeat},
		{"AutoCommit", c.autoCommit},
		{"PollWait", c.pollWait},
		{"RequestTimeout", c.requestTimeout},
	} {
		if d.v <= 0 {
			bad("%s %v must be positive", d.name, d.v)
		}
	}
	if !c.scheduleSet {
		for _, d := range []struct {
			name string
			v    time.Duration
		}{{"RetryBackoff", c.retryBackoff}, {"RetryBackoff's cap", c.maxRetryBackoff}} {
			if d.v <= 0 {
				bad("%s %v must be positive", d.name, d.v)
			}
		}
	}
	if c.session > 0 && (c.session < minSession || c.session > maxSession) {
		bad("Session %v must be from %v to %v (the metaserver's bounds)", c.session, minSession, maxSession)
	}
	if c.pollWait > maxPollWait {
		bad("PollWait %v over the cap %v", c.pollWait, maxPollWait)
	}
	if c.maxPrefetchBytes < minQueueShare {
		bad("MaxPrefetchBytes %d must be at least %d", c.maxPrefetchBytes, minQueueShare)
	}
	if c.maxPollRecords <= 0 {
		bad("MaxPollRecords %d must be positive", c.maxPollRecords)
	}
	if c.maxRetries < 0 {
		bad("MaxRetries %d is negative", c.maxRetries)
	}
	// Relations between options, checked when both sides are valid alone.
	if c.heartbeat > 0 && c.session > 0 && 2*c.heartbeat > c.session {
		bad("Heartbeat %v must be at most half the Session %v (a late heartbeat would lose the queues)", c.heartbeat, c.session)
	}
	if !c.scheduleSet && c.retryBackoff > 0 && c.maxRetryBackoff > 0 && c.retryBackoff > c.maxRetryBackoff {
		bad("RetryBackoff %v must not be longer than its cap %v", c.retryBackoff, c.maxRetryBackoff)
	}
	if c.scheduleSet {
		if len(c.retrySchedule) == 0 {
			bad("RetrySchedule is empty: it needs at least one wait")
		}
		if len(c.retrySchedule) > maxScheduleLen {
			bad("RetrySchedule has %d waits, over the cap %d", len(c.retrySchedule), maxScheduleLen)
		}
		for i, d := range c.retrySchedule {
			if d <= 0 {
				bad("RetrySchedule's wait %d (%v) must be positive", i+1, d)
			}
		}
	}
	return errors.Join(errs...)
}

// maxScheduleLen caps RetrySchedule's waits (a retry past the last waits
// the last).
const maxScheduleLen = 1024

// waits returns the redelivery waits of a valid config: the n-th retry
// (from 0) waits waits[min(n, len-1)]. RetryBackoff(first, max) is first,
// 2*first, 4*first, ... up to max.
func (c *config) waits() []time.Duration {
	if c.scheduleSet {
		return slices.Clone(c.retrySchedule)
	}
	var ws []time.Duration
	for d := c.retryBackoff; ; d *= 2 {
		if d >= c.maxRetryBackoff || d > math.MaxInt64/2 {
			return append(ws, c.maxRetryBackoff)
		}
		ws = append(ws, d)
	}
}

// defaultMember is hostname-pid-random.
func defaultMember() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "consumer"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}

// MemberID names this member in its group (at most 255 bytes). Default:
// hostname-pid-random, new for every New. Two live consumers of one group
// must not share an id; a stable id across restarts is InstanceID.
func MemberID(id string) Opt { return optFunc(func(c *config) { c.member = id }) }

// InstanceID gives this member a stable id (at most 255 bytes): a consumer
// restarted with the same InstanceID within its Session keeps its queues,
// with no rebalance of the others (Kafka's static membership). The new
// instance fences the old one (MEMBER_FENCED ends the old one's Run), and
// takes the queues once the old instance released them (a clean Close does)
// or its session ran out (a crashed or paused one), so the two never
// deliver a queue at once. Two live consumers of one group must not share
// an InstanceID. It sets the member id (MemberID).
func InstanceID(id string) Opt { return optFunc(func(c *config) { c.member = id }) }

// StartFrom says where a queue the group has no committed offset for
// starts: Earliest (its oldest stored message) or Latest (its end, so only
// messages stored after the member took it). The start is committed with
// the first commit, so a restart resumes there. Default Earliest.
func StartFrom(s Start) Opt { return optFunc(func(c *config) { c.start = s }) }

// Session is how long the metaserver keeps a member that stopped
// heartbeating before it gives its queues to the others. A member that
// could not reach the metaserver for a Session (less a Heartbeat, counted
// from its last answered heartbeat's send) stops consuming its queues on
// its own, so two members never keep consuming one queue for long. Close
// leaves at once without waiting for it. From 1 s to 5 min (the
// metaserver's bounds). Default 10 s.
func Session(d time.Duration) Opt { return optFunc(func(c *config) { c.session = d }) }

// Heartbeat is how often the member heartbeats the metaserver, and so how
// soon it learns of a rebalance. At most half the Session. Default 1 s.
func Heartbeat(d time.Duration) Opt { return optFunc(func(c *config) { c.heartbeat = d }) }

// AutoCommit is how often processed offsets are committed: one
// CommitOffsets call with every queue whose offset moved. Offsets are also
// committed when a queue is revoked and on Close. Default 1 s.
func AutoCommit(d time.Duration) Opt { return optFunc(func(c *config) { c.autoCommit = d }) }

// ManualCommit turns the periodic commit off: processed offsets are
// committed only by Commit, when a queue is revoked, and by Close.
func ManualCommit() Opt { return optFunc(func(c *config) { c.manualCommit = true }) }

// MaxPrefetchBytes bounds the bytes of messages fetched and not yet handed
// to the handler (or returned by Poll), over all the member's queues: each
// queue gets an equal share (at least 64 KiB), and its fetcher waits while
// its share is used. Default 64 MiB.
func MaxPrefetchBytes(n int64) Opt { return optFunc(func(c *config) { c.maxPrefetchBytes = n }) }

// MaxPollRecords caps the messages one Poll returns, and one batch of
// RunBatch. Default 500.
func MaxPollRecords(n int) Opt { return optFunc(func(c *config) { c.maxPollRecords = n }) }

// PollWait is how long a broker may hold a PULL that finds nothing new (a
// long poll), answering as soon as a message arrives. An idle consumer
// sends one PULL per queue per PollWait. At most 30 s (the brokers' cap).
// Default 1 s.
func PollWait(d time.Duration) Opt { return optFunc(func(c *config) { c.pollWait = d }) }

// RequestTimeout bounds one call to the metaserver or a broker (a PULL's
// wait comes on top). Default 5 s.
func RequestTimeout(d time.Duration) Opt { return optFunc(func(c *config) { c.requestTimeout = d }) }

// MaxRetries is how many times a message whose handler failed (returned an
// error or panicked) is delivered again, after a backoff, before it is sent
// to the dead-letter topic: n+1 deliveries in all. Its queue waits
// meanwhile, so a queue's order holds (unless NonBlockingRetries). A
// redelivery at a time the handler chose (RetryAt, RetryAfter) counts as
// one too. 0 dead-letters a message at its first failure. Default 16
// (RocketMQ's).
func MaxRetries(n int) Opt { return optFunc(func(c *config) { c.maxRetries = n }) }

// RetryBackoff is the wait before a failed message's first redelivery; it
// doubles per delivery up to max. Defaults 1 s and 30 s: 16 retries wait
// about 6.5 minutes in all. It replaces a RetrySchedule given before it.
// A dead letter (or, with NonBlockingRetries, a retry) that cannot be
// stored is tried again after first, doubling up to max.
func RetryBackoff(first, max time.Duration) Opt {
	return optFunc(func(c *config) {
		c.retryBackoff, c.maxRetryBackoff = first, max
		c.retrySchedule, c.scheduleSet = nil, false
	})
}

// RetrySchedule sets the wait before each redelivery of a failed message:
// the first retry waits ds[0], the second ds[1], and every retry past the
// list waits its last entry. For example RetrySchedule(time.Second,
// 5*time.Second, 30*time.Second, 5*time.Minute). It replaces RetryBackoff's
// doubling (and a RetryBackoff given before it). New refuses an empty
// list, and an entry that is not positive. A handler can choose one
// redelivery's time itself (RetryAt, RetryAfter). A dead letter (or a
// retry) that cannot be stored is tried again after ds[0], doubling up to
// the longest entry.
func RetrySchedule(ds ...time.Duration) Opt {
	ds = slices.Clone(ds)
	return optFunc(func(c *config) { c.retrySchedule, c.scheduleSet = ds, true })
}

// NonBlockingRetries has a failed message wait for its retry outside its
// queue, so the messages after it are not held back: the message is stored
// as a delayed message, due at its retry's time (the schedule's, or the
// handler's RetryAt; rounded up to the millisecond), in the group's retry
// topic ("%RETRY%" followed by the group; created on first use when the
// metaserver auto-creates topics, like the dead-letter topic), and its
// queue moves on at once (its offset is committed past it). The group
// consumes its retry topic besides its topics, its queues like any other:
// when the broker releases a retry (never before it is due), it is handed
// to the handler as the original message (its Topic, Queue, Offset, ID,
// Key, Properties, producer stamp, StoreTime and Timestamp restored, and
// for a delayed original its DueAt, ReleasedAt and DelayedHandle;
// Deliveries counted on from the failed delivery; PropRetry set), and once
// out of retries it is dead-lettered as without the option.
//
// The trade-off: per-queue order, and so per-key order, no longer holds
// for failed messages. A message delivered again comes after the messages
// stored after it in its queue that the group handled while it waited,
// its key's included; messages that never fail keep their order among
// themselves. The default (holding the queue) keeps order, at the price of
// a queue that handles nothing while one of its messages waits: with a 1 s
// first retry and 0.5% of calls failing once, a queue handles about 200
// messages a second however fast its handler is. With this option a
// failure costs its queue one SEND of the retry.
//
// A retry is stored once (its id and producer stamp are kept across its
// own send attempts), as a NORMAL message: it survives what an
// acknowledged NORMAL message survives. A retry that cannot be stored (a
// broker unreachable, the retry topic's delay quota full) is tried again,
// and its queue waits meanwhile; one the broker refuses for good (a
// RetryAt past its maximum delay) is dead-lettered with the refusal. As
// with any handler call, a message whose retry was stored but whose offset
// was not committed before its queue moved (a rebalance, a crash) is
// delivered twice: once from its queue, once from the retry topic.
//
// Every member of a group must give this option or none (they subscribe
// the same topics). It applies to Run and RunBatch; Poll, which has no
// retries, refuses it. The group's name must be at most 241 bytes (its
// retries' pending records are stored under the internal topic
// "%DELAY%%RETRY%" followed by the group, at most 255 bytes).
func NonBlockingRetries() Opt { return optFunc(func(c *config) { c.nonBlocking = true }) }

// Filter asks that the group receive only the messages the expression
// matches (protocol.Filter: tags such as "A || B", and properties such as
// "region = 'eu' AND amount > 100"). The filter is the group's, not the
// member's: the group's first member sets it (unless an operator did, with
// ferryctl group set-filter), and a member asking for another is refused
// (Run and Poll end with an INVALID error naming the group's filter), so no
// member silently skips what another should receive. A member that gives
// no filter receives by the group's. The broker skips the other messages
// without reading them, and the committed offsets pass them. Members
// follow the group's filter as the registry has it: a set-filter takes
// effect from their next heartbeat.
func Filter(expr string) Opt { return optFunc(func(c *config) { c.filter = expr }) }

// ReadUncommitted has the consumer receive the messages of open
// transactions too, as they are stored (a transaction aborted later has
// then delivered some). Default off: a queue is read only up to the first
// message of its oldest open transaction, so messages are received once
// their transaction committed, in queue order. Messages of aborted
// transactions are never received either way.
func ReadUncommitted() Opt { return optFunc(func(c *config) { c.uncommitted = true }) }

// DeadLetterTopic names the topic that messages out of retries go to.
// Default "%DLQ%" followed by the group. The topic is created on first use
// when the metaserver auto-creates topics; otherwise create it first: a
// dead letter that cannot be stored is retried, and its queue waits.
func DeadLetterTopic(name string) Opt { return optFunc(func(c *config) { c.deadLetter = name }) }

// withClock sets the clock of heartbeats, commits, the session's expiry and
// retry backoffs (tests). Default: the real clock.
func withClock(clk clockwork.Clock) Opt {
	return optFunc(func(c *config) {
		if clk != nil {
			c.clock, c.realClock = clk, false
		}
	})
}

// withCoordinator replaces the metaserver's group calls (tests).
func withCoordinator(co coordinator) Opt { return optFunc(func(c *config) { c.coord = co }) }

// withRouter replaces the metaserver's route lookups (tests).
func withRouter(r router) Opt { return optFunc(func(c *config) { c.router = r }) }

// withPuller replaces the brokers' PULL (tests).
func withPuller(p puller) Opt { return optFunc(func(c *config) { c.puller = p }) }

// withDeadLetterer replaces the client core's sender of dead letters (tests).
func withDeadLetterer(d deadLetterer) Opt { return optFunc(func(c *config) { c.dlq = d }) }
