package loadgen

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// MaxDuration is the longest Config.Duration, and the longest a paced send
// waits for its turn.
const MaxDuration = 7 * 24 * time.Hour

// Mode is how each producer sends.
type Mode string

const (
	// Async keeps up to Config.Window messages in flight per producer.
	Async Mode = "async"
	// Sync sends one message at a time per producer, waiting for each.
	Sync Mode = "sync"
)

// Config is one run. Zero values are not defaults: a caller (ferryctl
// bench) fills every field it uses from its flags.
type Config struct {
	// MetaAddrs are the metaservers the clients bootstrap from.
	MetaAddrs []string
	// TLS, when set, is used on every connection; Token is presented to the
	// servers ("": none).
	TLS   *tls.Config
	Token string
	// CallTimeout bounds each metaserver call of the run (creating the
	// topic, starting a backlog group).
	CallTimeout time.Duration

	// Topic is sent to, created with Queues queues if missing.
	Topic  string
	Queues int
	// Producers is how many producer clients send, each in its own
	// goroutine; Size the body size in bytes.
	Producers int
	Size      int
	// Count is the most messages sent in all (0: no limit, then Duration
	// must be set); Duration the longest the sends run (0: no limit).
	Count    int64
	Duration time.Duration
	// Rate is the most messages/s in all (0: as fast as the cluster takes
	// them).
	Rate float64
	Mode Mode
	// Window is how many messages each producer keeps in flight (Async).
	Window int

	// The producers' options: DeliveryTimeout and Linger as the SDK's;
	// BatchBytes and MaxInflight 0 for the SDK's defaults.
	Reliability protocol.Reliability
	// DeliverAfter, when above 0, sends delayed messages due this long
	// after each send; DeliverAt, when set, sends delayed messages all due
	// at that instant. At most one of them. DelaySpread, with
	// DeliverAfter, adds to each message's delay a uniformly random
	// duration in [0, DelaySpread), so that a run's messages fall due over
	// a span rather than at one offset from their sends.
	DeliverAfter    time.Duration
	DeliverAt       time.Time
	DelaySpread     time.Duration
	Tags            []string // the messages' tags, taken in turn (none: untagged)
	DeliveryTimeout time.Duration
	Linger          time.Duration
	BatchBytes      int
	MaxInflight     int
	Idempotence     bool

	// Consumers, when above 0, consume what is sent with a consumer group
	// of that many members, named Group ("": a new group per run, deleted
	// after it). With Backlog the group starts after every send is done, at
	// where the queues ended before the run (read by QueueEnds), and
	// measures how fast it drains them; else it consumes while the
	// producers send. ConsumeWait is how long the run waits for a message
	// before it stops consuming.
	Consumers int
	Group     string
	Backlog   bool
	// Filter is the consumer group's filter ("": every message); the run
	// waits for the messages sent that it takes.
	Filter      string
	ConsumeWait time.Duration
	// QueueEnds reads each queue's log end (where a Backlog group starts);
	// needed only with Backlog.
	QueueEnds func(ctx context.Context, route routing.Route) ([]api.QueueOffset, error)

	// CPUProfile, when set, is a file the CPU profile of this process
	// while it sends is written to; MemProfile one the allocation profile
	// taken after the sends is written to.
	CPUProfile string
	MemProfile string
	// Progress, when set, gets a progress line redrawn while the run sends
	// (for a terminal).
	Progress io.Writer
}

// ConfigError is a run refused before it sent anything for what it was
// asked: a Config that Validate refuses, a client that refused its
// options, a profile file that cannot be created. Its text is the cause's.
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }

func (e *ConfigError) Unwrap() error { return e.Err }

// Validate reports every problem of c at once.
func (c *Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf("loadgen: "+format, args...)) }
	if len(c.MetaAddrs) == 0 {
		add("no metaserver address")
	}
	if c.CallTimeout <= 0 {
		add("call timeout %v is not positive", c.CallTimeout)
	}
	if c.Topic == "" {
		add("no topic")
	}
	if c.Queues < 1 {
		add("%d queues: want at least 1", c.Queues)
	}
	if c.Producers < 1 {
		add("%d producers: want at least 1", c.Producers)
	}
	if c.Size < 0 {
		add("size %d is negative", c.Size)
	}
	if c.DeliverAfter < 0 || c.DeliverAfter > 0 && !c.DeliverAt.IsZero() {
		add("deliver-after %v: want 0 or more, and not with a deliver-at time", c.DeliverAfter)
	}
	if c.DelaySpread < 0 || c.DelaySpread > 0 && c.DeliverAfter == 0 {
		add("delay spread %v: want 0 or more, and only with a deliver-after delay", c.DelaySpread)
	}
	for _, t := range c.Tags {
		if err := protocol.ValidateTag(t); err != nil {
			add("tag: %v", err)
		}
	}
	if c.Filter != "" {
		if _, err := protocol.ParseFilter(c.Filter); err != nil {
			add("filter: %v", err)
		} else if c.Consumers == 0 {
			add("a filter is the consumers': it needs consumers")
		}
	}
	if c.Count < 0 {
		add("count %d is negative", c.Count)
	}
	if c.Duration < 0 || c.Duration > MaxDuration {
		add("duration %v: want 0 to %v", c.Duration, MaxDuration)
	}
	if c.Count == 0 && c.Duration == 0 {
		add("neither a count nor a duration: the run would not end")
	}
	if math.IsNaN(c.Rate) || c.Rate < 0 {
		add("rate %v: want 0 or more", c.Rate)
	}
	switch c.Mode {
	case Sync:
	case Async:
		if c.Window < 1 {
			add("window %d: want at least 1", c.Window)
		}
	default:
		add("mode %q: want %q or %q", c.Mode, Sync, Async)
	}
	if c.Linger >= c.DeliveryTimeout {
		add("linger %v must be shorter than the delivery timeout %v", c.Linger, c.DeliveryTimeout)
	}
	if c.Consumers < 0 {
		add("%d consumers is negative", c.Consumers)
	}
	if c.Consumers > 0 && c.ConsumeWait <= 0 {
		add("consume wait %v is not positive", c.ConsumeWait)
	}
	if c.Backlog && c.Consumers == 0 {
		add("a backlog run needs consumers")
	}
	if c.Backlog && c.QueueEnds == nil {
		add("a backlog run needs QueueEnds")
	}
	return errors.Join(errs...)
}
