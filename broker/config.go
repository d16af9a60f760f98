package broker

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
	"github.com/ferrymq/ferrymq/storage/vfs"
)

// MaxTxnTimeout bounds Config.TxnTimeout.
const MaxTxnTimeout = 15 * time.Minute

// Config configures a broker. Zero fields take their defaults; negative
// ones are refused by Validate.
type Config struct {
	// ID names the broker. Required.
	ID string
	// Group is the broker group. Required.
	Group string
	// Role is routing.RoleMaster or routing.RoleSlave. Required.
	Role routing.Role
	// Dir holds the commit log. Required.
	Dir string
	// Addr is where producers and consumers connect (host:port; port 0 picks).
	Addr string
	// AdvertiseAddr is the address registered with the metaserver. Default:
	// the bound address.
	AdvertiseAddr string
	// HAAddr is where a master serves its slave (host:port; port 0 picks).
	// Masters only; default "127.0.0.1:0".
	HAAddr string
	// MasterHAAddr is the master's HA address for a slave. Default: learned
	// from the metaserver (the group's master).
	MasterHAAddr string
	// MetaAddrs are the metaserver nodes' RPC addresses. Required.
	MetaAddrs []string

	// Flush is the commit log's flush mode. Default storage.FlushAsync.
	Flush storage.FlushMode
	// FlushInterval for async flush. Default 500 ms.
	FlushInterval time.Duration
	// SegmentSize of the commit log. Default 1 GiB.
	SegmentSize int64
	// FS is the file system (tests inject faults). Default the OS's.
	FS vfs.FS `json:"-"`
	// RetentionBytes bounds the commit log: every RetentionCheck, whole
	// segments before the last RetentionBytes are deleted. 0 keeps everything.
	RetentionBytes int64
	// RetentionCheck is how often retention runs. Default 30 s.
	RetentionCheck time.Duration
	// ProducerIdle is how long the broker remembers an idempotent
	// producer's sequences in a queue after its last message there (by the
	// messages' store times): a retry later than that can be stored twice.
	// Default 7 days.
	ProducerIdle time.Duration
	// Pretouch is how far ahead of the writer the commit log's active
	// segment is pre-touched (storage.Config.Pretouch): 0 the storage
	// default (8 MiB with flush=async, off with sync), negative off.
	Pretouch int64

	// HeartbeatInterval and SessionTimeout: a heartbeat every interval; no
	// heartbeat accepted for a session makes the broker read-only by itself.
	// Defaults 2 s and 10 s.
	HeartbeatInterval time.Duration
	SessionTimeout    time.Duration
	// HighWait bounds how long a HIGH message waits for the slave before
	// SLAVE_SYNC_TIMEOUT. Default 3 s.
	HighWait time.Duration
	// SlaveLagBytes and SlaveLagTime: a slave further behind, or not caught
	// up for longer, makes HIGH messages fail at once with SLAVE_LAGGING.
	// Defaults 64 MiB and 5 s.
	SlaveLagBytes int64
	SlaveLagTime  time.Duration
	// HAFetchWait is how long a master holds a slave's fetch when it has no
	// new data; it is also the slave's acknowledgement tick. Default 100 ms.
	HAFetchWait time.Duration
	// HAFetchBytes caps one fetch. Default 4 MiB.
	HAFetchBytes int

	// DiscardFailoverTail keeps a former master's cut tail (the NORMAL
	// messages it acknowledged that its slave never copied) in its side
	// file only. By default (false) the broker, rejoining as the slave,
	// hands those records to the new master, which appends each again
	// once, flagged as recovered (recover.go). -failover-tail=discard.
	DiscardFailoverTail bool
	// RecoverWindow bounds how far a master looks for copies of recovered
	// messages in its log: records stored later than this after the newest
	// recovered one are not read (a producer's retries end within its
	// delivery timeout). Default 1 h.
	RecoverWindow time.Duration

	// MaxDelay bounds how far ahead a delayed message may be due (by the
	// broker's clock when it arrives): a later one is refused INVALID,
	// never clamped. Default 90 days.
	MaxDelay time.Duration
	// DelayQuota bounds the pending delayed messages of one topic in this
	// group: past it a delayed message gets DELAY_QUOTA. Default 10 million.
	DelayQuota int64
	// DelayTick is how often the master fires due delayed messages (and
	// the slave follows its index). Default 10 ms.
	DelayTick time.Duration

	// TxnTimeout is how long a transaction may stay open: the master
	// aborts one that began longer ago (so no reader of committed messages
	// waits longer). Default 60 s, at most MaxTxnTimeout.
	TxnTimeout time.Duration
	// TxnMaxMessages and TxnMaxBytes bound one transaction's messages and
	// their bytes on this group; TxnMaxOpenPerProducer a producer id's open
	// transactions (its instances' together), TxnMaxOpen the group's. Past
	// them a message gets TXN_LIMIT. Defaults 100k, 256 MiB, 8, 10k.
	TxnMaxMessages        int64
	TxnMaxBytes           int64
	TxnMaxOpenPerProducer int
	TxnMaxOpen            int

	// MaxInflightRequests and MaxInflightBytes bound the SEND requests (and
	// their bytes) being processed across the broker; past them a request
	// gets BUSY. Defaults 8192 and 256 MiB.
	MaxInflightRequests int64
	MaxInflightBytes    int64
	// MaxInflightPerConn bounds requests read from one connection and not yet
	// answered; past it the broker stops reading that connection until one is
	// answered (backpressure). Default 1024.
	MaxInflightPerConn int
	// Workers is the number of request workers. Default 4 x GOMAXPROCS.
	Workers int
	// WriteTimeout closes a connection (producer, consumer or slave) that
	// read nothing of its answers for this long; its unanswered requests'
	// answers are dropped. Default 10 s.
	WriteTimeout time.Duration

	// TLSServer and TLSClient, both or neither, put the broker's links on
	// TLS (tlsconf makes them from -tls-cert, -tls-key and -tls-ca).
	// TLSServer serves the data port (producers, consumers) and the HA port
	// (the slave); with ClientCAs, their clients must present a certificate
	// signed by them. TLSClient is for what the broker dials: the
	// metaservers, and as a slave its master's HA port. Neither: plaintext.
	TLSServer *tls.Config `json:"-"`
	TLSClient *tls.Config `json:"-"`

	// ClusterToken is the servers' shared secret. Setting it turns
	// authorization on (authz.go): the data and HA ports serve a
	// connection only once it authenticated (AUTH with a token, or a TLS
	// client certificate naming a principal), and check every request
	// against the registry's permission table; the broker presents it to
	// the metaservers and, as a slave, to its master. "": off.
	ClusterToken string `json:"-"`

	// Logger is the root logger. Default: stderr at info.
	Logger hclog.Logger `json:"-"`
	// Clock is read for every timing decision: heartbeats and the write
	// lease, HIGH deadlines, parked fetches, route freshness, backoffs.
	// Tests move a fake one. Default: the real clock.
	Clock clockwork.Clock `json:"-"`
}

func (c Config) withDefaults() Config {
	if c.HAAddr == "" {
		c.HAAddr = "127.0.0.1:0"
	}
	if c.FlushInterval <= 0 {
		c.FlushInterval = 500 * time.Millisecond
	}
	if c.RetentionCheck <= 0 {
		c.RetentionCheck = 30 * time.Second
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 2 * time.Second
	}
	if c.SessionTimeout <= 0 {
		c.SessionTimeout = 10 * time.Second
	}
	if c.HighWait <= 0 {
		c.HighWait = 3 * time.Second
	}
	if c.SlaveLagBytes <= 0 {
		c.SlaveLagBytes = 64 << 20
	}
	if c.SlaveLagTime <= 0 {
		c.SlaveLagTime = 5 * time.Second
	}
	if c.HAFetchWait <= 0 {
		c.HAFetchWait = 100 * time.Millisecond
	}
	if c.HAFetchBytes <= 0 {
		c.HAFetchBytes = 4 << 20
	}
	if c.RecoverWindow <= 0 {
		c.RecoverWindow = time.Hour
	}
	if c.MaxDelay <= 0 {
		c.MaxDelay = 90 * 24 * time.Hour
	}
	if c.DelayQuota <= 0 {
		c.DelayQuota = 10_000_000
	}
	if c.DelayTick <= 0 {
		c.DelayTick = 10 * time.Millisecond
	}
	if c.TxnTimeout <= 0 {
		c.TxnTimeout = time.Minute
	}
	if c.TxnMaxMessages <= 0 {
		c.TxnMaxMessages = 100_000
	}
	if c.TxnMaxBytes <= 0 {
		c.TxnMaxBytes = 256 << 20
	}
	if c.TxnMaxOpenPerProducer <= 0 {
		c.TxnMaxOpenPerProducer = 8
	}
	if c.TxnMaxOpen <= 0 {
		c.TxnMaxOpen = 10_000
	}
	if c.MaxInflightRequests <= 0 {
		c.MaxInflightRequests = 8192
	}
	if c.MaxInflightBytes <= 0 {
		c.MaxInflightBytes = 256 << 20
	}
	if c.MaxInflightPerConn <= 0 {
		c.MaxInflightPerConn = 1024
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = hclog.New(&hclog.LoggerOptions{Name: "broker", Level: hclog.Info})
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	return c
}

// Validate reports every problem at once: required fields, negative
// values (zero means the default, a negative value is a mistake) and
// settings that contradict each other. New validates the config with its
// defaults filled in.
func (c Config) Validate() error {
	var errs []error
	negative := func(name string, v int64) {
		if v < 0 {
			errs = append(errs, fmt.Errorf("broker: %s must not be negative, got %d", name, v))
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"FlushInterval", c.FlushInterval}, {"RetentionCheck", c.RetentionCheck}, {"HeartbeatInterval", c.HeartbeatInterval},
		{"SessionTimeout", c.SessionTimeout}, {"HighWait", c.HighWait}, {"SlaveLagTime", c.SlaveLagTime}, {"HAFetchWait", c.HAFetchWait},
		{"WriteTimeout", c.WriteTimeout}, {"ProducerIdle", c.ProducerIdle}, {"RecoverWindow", c.RecoverWindow},
		{"MaxDelay", c.MaxDelay}, {"DelayTick", c.DelayTick}, {"TxnTimeout", c.TxnTimeout},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("broker: %s must not be negative, got %v", d.name, d.v))
		}
	}
	negative("SegmentSize", c.SegmentSize)
	negative("RetentionBytes", c.RetentionBytes)
	negative("SlaveLagBytes", c.SlaveLagBytes)
	negative("HAFetchBytes", int64(c.HAFetchBytes))
	negative("MaxInflightRequests", c.MaxInflightRequests)
	negative("MaxInflightBytes", c.MaxInflightBytes)
	negative("MaxInflightPerConn", int64(c.MaxInflightPerConn))
	negative("Workers", int64(c.Workers))
	negative("DelayQuota", c.DelayQuota)
	negative("TxnMaxMessages", c.TxnMaxMessages)
	negative("TxnMaxBytes", c.TxnMaxBytes)
	negative("TxnMaxOpenPerProducer", int64(c.TxnMaxOpenPerProducer))
	negative("TxnMaxOpen", int64(c.TxnMaxOpen))
	d := c.withDefaults()
	if d.TxnTimeout > MaxTxnTimeout {
		errs = append(errs, fmt.Errorf("broker: TxnTimeout (%v) must be at most %v: an open transaction holds back every reader of its queues", d.TxnTimeout, MaxTxnTimeout))
	}
	if d.HeartbeatInterval >= d.SessionTimeout {
		errs = append(errs, fmt.Errorf("broker: HeartbeatInterval (%v) must be shorter than SessionTimeout (%v), or one lost heartbeat fences the broker",
			d.HeartbeatInterval, d.SessionTimeout))
	}
	if d.HAFetchWait >= d.HighWait {
		errs = append(errs, fmt.Errorf("broker: HAFetchWait (%v) must be shorter than HighWait (%v): the slave acknowledges once per fetch",
			d.HAFetchWait, d.HighWait))
	}
	if d.HAFetchBytes > protocol.MaxFrameSize-64 {
		errs = append(errs, fmt.Errorf("broker: HAFetchBytes (%d) must fit in one frame (%d bytes)", d.HAFetchBytes, protocol.MaxFrameSize))
	}

	if c.ID == "" {
		errs = append(errs, errors.New("broker: ID is required"))
	} else if err := protocol.ValidateServerName("broker id", c.ID); err != nil {
		errs = append(errs, fmt.Errorf("broker: ID: %w", err))
	}
	if c.Group == "" {
		errs = append(errs, errors.New("broker: Group is required"))
	} else if err := protocol.ValidateServerName("broker group name", c.Group); err != nil {
		errs = append(errs, fmt.Errorf("broker: Group: %w", err))
	}
	if !c.Role.Valid() {
		errs = append(errs, fmt.Errorf("broker: Role must be %q or %q, got %q", routing.RoleMaster, routing.RoleSlave, c.Role))
	}
	if c.Dir == "" {
		errs = append(errs, errors.New("broker: Dir is required"))
	}
	if c.Addr == "" {
		errs = append(errs, errors.New("broker: Addr is required"))
	}
	if len(c.MetaAddrs) == 0 {
		errs = append(errs, errors.New("broker: MetaAddrs is required"))
	}
	if c.ClusterToken != "" {
		if err := auth.ValidateToken(c.ClusterToken); err != nil {
			errs = append(errs, fmt.Errorf("broker: ClusterToken: %w", err))
		}
	}
	if (c.TLSServer == nil) != (c.TLSClient == nil) {
		errs = append(errs, errors.New("broker: TLSServer and TLSClient go together: a slave dials its master's HA port with TLSClient when masters serve it with TLSServer"))
	} else if c.TLSServer != nil && len(c.TLSServer.Certificates) == 0 && c.TLSServer.GetCertificate == nil {
		errs = append(errs, errors.New("broker: TLSServer has no certificate (-tls-cert and -tls-key)"))
	}
	return errors.Join(errs...)
}
