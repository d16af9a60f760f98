package metaserver

import (
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"
)

// Peer is one node of the static bootstrap list.
type Peer struct {
	ID       string // raft server ID
	RaftAddr string // raft TCP transport address
	RPCAddr  string // client, broker and admin RPC address
}

// Config configures a metaserver node. Zero fields take their defaults.
type Config struct {
	// ID is this node's raft ID. Required.
	ID string
	// Dir holds the raft log (raft.db) and snapshots. Required.
	Dir string
	// RaftAddr is where the raft transport listens (host:port). Required.
	RaftAddr string
	// RPCAddr is where the RPC server listens (host:port; port 0 picks one).
	RPCAddr string
	// AdvertiseRPC is the RPC address other nodes and clients use. Default:
	// the bound RPC address.
	AdvertiseRPC string
	// Peers is the static bootstrap list, identical on every node. A node
	// whose ID is not in it does not bootstrap: it waits to be added as a
	// voter by the admin API.
	Peers []Peer
	// AutoCreateTopics creates a topic on its first route lookup. Default off.
	AutoCreateTopics bool
	// DefaultQueues is the queue count of an auto-created topic. Default 8.
	DefaultQueues int

	// SessionTimeout: a master unheard of for this long makes its group
	// read-only (heartbeat-lost). Default 10 s.
	SessionTimeout time.Duration
	// LagBytes and LagTime: a slave behind by more than LagBytes, or not
	// caught up for LagTime, makes its group read-only (slave-lag).
	// Defaults 64 MiB and 5 s.
	LagBytes int64
	LagTime  time.Duration
	// RecoverHeartbeats is how many healthy master heartbeats in a row make
	// a group writable again. Default 3.
	RecoverHeartbeats int
	// JudgeInterval is how often the leader checks every group. Default 500 ms.
	JudgeInterval time.Duration
	// Clock is what the leader's failure detection reads: the times the
	// heartbeat handler records, the sessions, the judge's ticker and the
	// times stamped into the commands it applies. Raft's own timings stay
	// on the real clock. Default: the real clock; tests pass a
	// clockwork.FakeClock and move it.
	Clock clockwork.Clock

	// Raft timings. Defaults: the hashicorp/raft library's.
	RaftHeartbeatTimeout   time.Duration
	RaftElectionTimeout    time.Duration
	RaftLeaderLeaseTimeout time.Duration
	// SnapshotInterval and SnapshotThreshold. Defaults 30 s and 16384.
	SnapshotInterval  time.Duration
	SnapshotThreshold uint64

	// Logger is the root logger. Default: stderr at info.
	Logger hclog.Logger
}

// DefaultConfig returns a config with every default filled in.
func DefaultConfig() Config {
	return Config{}.withDefaults()
}

func (c Config) withDefaults() Config {
	if c.DefaultQueues <= 0 {
		c.DefaultQueues = 8
	}
	if c.SessionTimeout <= 0 {
		c.SessionTimeout = 10 * time.Second
	}
	if c.LagBytes <= 0 {
		c.LagBytes = 64 << 20
	}
	if c.LagTime <= 0 {
		c.LagTime = 5 * time.Second
	}
	if c.RecoverHeartbeats <= 0 {
		c.RecoverHeartbeats = 3
	}
	if c.JudgeInterval <= 0 {
		c.JudgeInterval = 500 * time.Millisecond
	}
	if c.SnapshotInterval <= 0 {
		c.SnapshotInterval = 30 * time.Second
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = 16384
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Logger == nil {
		c.Logger = hclog.New(&hclog.LoggerOptions{Name: "metaserver", Level: hclog.Info})
	}
	return c
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.ID == "" {
		errs = append(errs, errors.New("metaserver: ID is required"))
	}
	if c.Dir == "" {
		errs = append(errs, errors.New("metaserver: Dir is required"))
	}
	if c.RaftAddr == "" {
		errs = append(errs, errors.New("metaserver: RaftAddr is required"))
	}
	if c.RPCAddr == "" {
		errs = append(errs, errors.New("metaserver: RPCAddr is required"))
	}
	seen := map[string]bool{}
	for _, p := range c.Peers {
		if p.ID == "" || p.RaftAddr == "" || p.RPCAddr == "" {
			errs = append(errs, fmt.Errorf("metaserver: peer %+v needs an ID, a raft address and an RPC address", p))
		}
		if seen[p.ID] {
			errs = append(errs, fmt.Errorf("metaserver: peer %q listed twice", p.ID))
		}
		seen[p.ID] = true
	}
	return errors.Join(errs...)
}
