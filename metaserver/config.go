package metaserver

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/auth"
)

// Peer is one node of the static bootstrap list.
type Peer struct {
	ID       string // raft server ID
	RaftAddr string // raft TCP transport address
	RPCAddr  string // client, broker and admin RPC address
}

// Config configures a metaserver node. Zero fields take their defaults;
// negative ones are errors (see Validate).
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
	// AdmitGroups is how a broker group that registers for the first time
	// is admitted: AdmitAuto (the default) lets it take queues at once;
	// AdmitManual keeps it pending, working but never given a queue, until
	// an admin admits it (ADMIN_ADMIT_GROUP, ferryctl broker add-group), so
	// a broker started with a mistyped -group takes no queue.
	AdmitGroups AdmitMode

	// SessionTimeout: a master unheard of for this long makes its group
	// read-only (heartbeat-lost). Default 10 s.
	SessionTimeout time.Duration
	// LagBytes is FailoverMaxLoss's default. LagTime is how long a member
	// of a sync set may be not caught up before its master takes it out of
	// the set (heartbeat replies carry it to the masters). A slave's lag
	// makes no group read-only. Defaults 64 MiB and 5 s.
	LagBytes int64
	LagTime  time.Duration
	// RecoverHeartbeats is how many healthy master heartbeats in a row make
	// a group writable again. Default 3.
	RecoverHeartbeats int
	// JudgeInterval is how often the leader checks every group. Default
	// 500 ms; it must be shorter than SessionTimeout.
	JudgeInterval time.Duration
	// ConsumerSession is the session of a consumer group member that asks
	// for none: unheard of for this long, it leaves its group. A member may
	// ask for 1 s to 5 min. Default 10 s.
	ConsumerSession time.Duration
	// ConsumerJoinWindow is how long a consumer group that has no member
	// waits, from its first member's join, for more members before its
	// first assignment (Kafka's initial rebalance delay): members that
	// start together share it. Negative: none. Default 3 s.
	ConsumerJoinWindow time.Duration
	// RoutePushWait is the longest a topic creation or queue addition waits
	// for the masters of the topic's groups to learn it (ROUTE_WATCH) before
	// it is answered anyway. Default 2 s.
	RoutePushWait time.Duration

	// DisableFailover keeps a group whose master is lost read-only until a
	// person acts (the seeds' behaviour). By default the leader promotes
	// the group's slave (see DESIGN.md, "Failover").
	DisableFailover bool
	// FailoverMargin is how long past SessionTimeout the leader waits,
	// after the master's last accepted heartbeat, before it promotes: the
	// old master's lease has run out by its own clock by then, whatever the
	// two clocks read, as long as they tick at about the same rate. Default
	// 1 s.
	FailoverMargin time.Duration
	// FailoverMaxLoss is the most bytes of NORMAL messages a promotion may
	// lose, by the last reports of the master's and the slave's log ends: a
	// slave further behind is not promoted. 0 takes the default, LagBytes
	// (a group that was writable when its master vanished fails over);
	// NoLoss promotes only a slave that had everything.
	FailoverMaxLoss int64
	// Clock is what the leader's failure detection reads: the times the
	// heartbeat handler records, the sessions, the judge's ticker and the
	// times stamped into the commands it applies. Raft's own timings stay
	// on the real clock. Default: the real clock; tests pass a
	// clockwork.FakeClock and move it.
	Clock clockwork.Clock

	// Raft timings. Defaults: the hashicorp/raft library's (1 s, 1 s,
	// 500 ms). Raft's rules apply to the values in effect: each at least
	// 5 ms, the lease not longer than the heartbeat timeout, the election
	// timeout not shorter than it.
	RaftHeartbeatTimeout   time.Duration
	RaftElectionTimeout    time.Duration
	RaftLeaderLeaseTimeout time.Duration
	// SnapshotInterval and SnapshotThreshold. Defaults 30 s and 16384.
	SnapshotInterval  time.Duration
	SnapshotThreshold uint64

	// AuditRetention is how long the registry keeps its audit records
	// (audit.go): the leader expires older ones. Default 30 days; at least
	// MinAuditRetention, at most MaxAuditRetention.
	AuditRetention time.Duration

	// Logger is the root logger. Default: stderr at info.
	Logger hclog.Logger

	// TLSServer and TLSClient, both or neither, put the node's links on
	// TLS (tlsconf makes them from -tls-cert, -tls-key and -tls-ca). The
	// RPC port serves TLS with TLSServer (client certificates required
	// when it has ClientCAs); raft speaks mutual TLS: its port accepts only
	// peers whose certificate TLSServer.ClientCAs verifies, and the node
	// dials its peers with TLSClient, presenting TLSClient's certificate.
	// The node's own clients (to the other nodes' RPC) use TLSClient.
	// Neither: plaintext everywhere.
	TLSServer *tls.Config `json:"-"`
	TLSClient *tls.Config `json:"-"`

	// Auth holds the built-in principals' token hashes (acl.go): the
	// bootstrap admin's, which is always admin and with an empty ACL the
	// only one let in, and the cluster's, the servers' shared secret. They
	// are never in the registry. Zero hashes: no such principal. The
	// cluster's is ClusterToken's when that is set. Without ClusterToken
	// they are in the table (ACL) but nothing checks it.
	Auth auth.Builtins
	// ClusterToken is the servers' shared secret. Setting it turns
	// authorization on: every RPC connection must authenticate (AUTH with
	// a token, or a TLS client certificate naming a principal) and every
	// request is checked against the permission table (ACL); the node
	// presents it to the other nodes (forwards, route questions). Every
	// broker holds it too, so it opens nothing on raft's port (RaftSecret
	// does). "": authorization off, every peer may do anything.
	ClusterToken string `json:"-"`

	// RaftSecret is the metaservers' own secret, which no broker or client
	// holds (-raft-secret-file): raft's port serves only nodes that prove
	// they hold it, each connection opening with a challenge and response
	// keyed with a key derived from it (raftsecret.go), inside TLS when
	// TLS is on. Required when ClusterToken or TLS is set; a token's
	// rules (auth.ValidateToken), and not the cluster's or the admin's
	// token. "" with neither: raft is plaintext to anyone who reaches its
	// port.
	RaftSecret string `json:"-"`
	// RaftAcceptClusterKey is the move of a running cluster from the key
	// the cluster token once gave raft to RaftSecret's (docs/security.md):
	// the node also accepts peers that prove the cluster token's key, and
	// dials a peer that refuses RaftSecret's key again with it. It needs
	// RaftSecret and ClusterToken. While it is on, a broker's token still
	// opens raft's port on this node: turn it off once every metaserver
	// holds RaftSecret.
	RaftAcceptClusterKey bool

	// The raft port's limits before trust (raftlayer.go); zero: 5 s and 64.
	// Tests shorten them.
	raftHandshakeTimeout time.Duration
	raftMaxHandshakes    int
	// raftClusterKeyOnly keys raft's handshake with the cluster token's
	// key alone, as metaservers did before the raft secret: tests of the
	// move to it play such nodes.
	raftClusterKeyOnly bool
}

// AuthEnabled reports whether the node checks credentials and permissions
// (ClusterToken is set).
func (c Config) AuthEnabled() bool { return c.ClusterToken != "" }

// SecurityOn reports whether authorization or TLS is on: raft's port then
// needs RaftSecret.
func (c Config) SecurityOn() bool {
	return c.ClusterToken != "" || c.TLSServer != nil || c.TLSClient != nil
}

// AdmitMode is Config.AdmitGroups.
type AdmitMode string

// The admission modes.
const (
	AdmitAuto   AdmitMode = "auto"
	AdmitManual AdmitMode = "manual"
)

// NoLoss as Config.FailoverMaxLoss promotes only a slave that had every
// byte the master reported.
const NoLoss = -1

// Limits that Validate enforces.
const (
	// maxQueues is the most queues a topic has: created, or grown by
	// add-queues.
	maxQueues = 4096
	// minRaftTimeout is hashicorp/raft's floor for its timeouts and for
	// the snapshot interval (raft.ValidateConfig).
	minRaftTimeout = 5 * time.Millisecond
)

// DefaultConfig returns a config with every default filled in.
func DefaultConfig() Config {
	return Config{}.withDefaults()
}

// withDefaults fills in zero fields. Negative ones are left for Validate to
// report.
func (c Config) withDefaults() Config {
	if c.ClusterToken != "" && c.Auth.Cluster.IsZero() {
		c.Auth.Cluster = auth.HashToken(c.ClusterToken)
	}
	if c.DefaultQueues == 0 {
		c.DefaultQueues = 8
	}
	if c.AdmitGroups == "" {
		c.AdmitGroups = AdmitAuto
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = 10 * time.Second
	}
	if c.LagBytes == 0 {
		c.LagBytes = 64 << 20
	}
	if c.LagTime == 0 {
		c.LagTime = 5 * time.Second
	}
	if c.RecoverHeartbeats == 0 {
		c.RecoverHeartbeats = 3
	}
	if c.JudgeInterval == 0 {
		c.JudgeInterval = 500 * time.Millisecond
	}
	if c.FailoverMargin == 0 {
		c.FailoverMargin = time.Second
	}
	if c.ConsumerSession == 0 {
		c.ConsumerSession = 10 * time.Second
	}
	if c.ConsumerJoinWindow == 0 {
		c.ConsumerJoinWindow = 3 * time.Second
	}
	if c.RoutePushWait == 0 {
		c.RoutePushWait = 2 * time.Second
	}
	if c.FailoverMaxLoss == 0 {
		c.FailoverMaxLoss = c.LagBytes
	}
	if c.SnapshotInterval == 0 {
		c.SnapshotInterval = 30 * time.Second
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = 16384
	}
	if c.AuditRetention == 0 {
		c.AuditRetention = DefaultAuditRetention
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Logger == nil {
		c.Logger = hclog.New(&hclog.LoggerOptions{Name: "metaserver", Level: hclog.Info})
	}
	return c
}

// raftConfig is the hashicorp/raft config of the node: the library's
// defaults with this config's timings over them.
func (c Config) raftConfig() *raft.Config {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(c.ID)
	if c.RaftHeartbeatTimeout != 0 {
		rc.HeartbeatTimeout = c.RaftHeartbeatTimeout
	}
	if c.RaftElectionTimeout != 0 {
		rc.ElectionTimeout = c.RaftElectionTimeout
	}
	if c.RaftLeaderLeaseTimeout != 0 {
		rc.LeaderLeaseTimeout = c.RaftLeaderLeaseTimeout
	}
	if c.SnapshotInterval != 0 {
		rc.SnapshotInterval = c.SnapshotInterval
	}
	if c.SnapshotThreshold != 0 {
		rc.SnapshotThreshold = c.SnapshotThreshold
	}
	return rc
}

// Validate reports every problem at once (errors.Join), each naming the
// field. It checks the config as given, with zero fields standing for their
// defaults: no field may be negative, and the values in effect must fit
// together (the judge must look more often than a session lasts; raft's
// own rules on its timings hold).
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("metaserver: "+format, args...)) }
	if c.ID == "" {
		bad("ID is required")
	}
	if err := c.Auth.Validate(); err != nil {
		bad("Auth: %v", err)
	}
	if c.ClusterToken != "" {
		if err := auth.ValidateToken(c.ClusterToken); err != nil {
			bad("ClusterToken: %v", err)
		} else if h := auth.HashToken(c.ClusterToken); !c.Auth.Cluster.IsZero() && c.Auth.Cluster != h {
			bad("Auth.Cluster is not ClusterToken's hash")
		}
	}
	switch {
	case c.RaftSecret != "":
		if err := auth.ValidateToken(c.RaftSecret); err != nil {
			bad("RaftSecret (-raft-secret-file): %v", err)
		} else if h := auth.HashToken(c.RaftSecret); c.RaftSecret == c.ClusterToken || h == c.Auth.Cluster {
			bad("RaftSecret (-raft-secret-file) is the cluster token, which every broker holds: give the metaservers a secret of their own")
		} else if h == c.Auth.Admin {
			bad("RaftSecret (-raft-secret-file) is the bootstrap admin's token: give the metaservers a secret of their own")
		}
		if len(c.ID) > raftMaxIDLen {
			bad("ID is %d bytes; with a raft secret raft's handshake carries it, which allows at most %d", len(c.ID), raftMaxIDLen)
		}
	case c.SecurityOn():
		bad("RaftSecret (-raft-secret-file) is required with authorization or TLS on: raft's port opens only to the metaservers' own secret, since brokers hold the cluster token and certificates of the same CA")
	}
	if c.RaftAcceptClusterKey && (c.RaftSecret == "" || c.ClusterToken == "") {
		bad("RaftAcceptClusterKey (-raft-accept-cluster-key) is the move from the cluster token's raft key to RaftSecret's: it needs both RaftSecret and ClusterToken")
	}
	if c.Dir == "" {
		bad("Dir is required")
	}
	if c.AdmitGroups != "" && c.AdmitGroups != AdmitAuto && c.AdmitGroups != AdmitManual {
		bad("AdmitGroups is %q; want %q or %q", c.AdmitGroups, AdmitAuto, AdmitManual)
	}
	if c.RaftAddr == "" {
		bad("RaftAddr is required")
	}
	if c.AuditRetention != 0 && (c.AuditRetention < MinAuditRetention || c.AuditRetention > MaxAuditRetention) {
		bad("AuditRetention (-audit-retention) is %v; it must be from %v to %v", c.AuditRetention, MinAuditRetention, MaxAuditRetention)
	}
	if c.RPCAddr == "" {
		bad("RPCAddr is required")
	}
	switch {
	case (c.TLSServer == nil) != (c.TLSClient == nil):
		bad("TLSServer and TLSClient go together: the node serves and dials its peers over TLS, or neither")
	case c.TLSServer != nil && c.TLSServer.ClientCAs == nil:
		bad("raft over TLS authenticates peers by their certificates: TLSServer needs ClientCAs (-tls-ca)")
	case c.TLSServer != nil && len(c.TLSServer.Certificates) == 0 && c.TLSServer.GetCertificate == nil:
		bad("TLSServer has no certificate (-tls-cert and -tls-key)")
	case c.TLSClient != nil && len(c.TLSClient.Certificates) == 0 && c.TLSClient.GetClientCertificate == nil:
		bad("raft over TLS authenticates peers by their certificates: TLSClient needs the node's certificate (-tls-cert and -tls-key)")
	}
	ids, raftAddrs, rpcAddrs := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, p := range c.Peers {
		if p.ID == "" || p.RaftAddr == "" || p.RPCAddr == "" {
			bad("peer %+v needs an ID, a raft address and an RPC address", p)
		}
		if p.ID != "" && ids[p.ID] {
			bad("peer %q listed twice", p.ID)
		}
		if p.RaftAddr != "" && raftAddrs[p.RaftAddr] {
			bad("peer %q: raft address %s is another peer's too", p.ID, p.RaftAddr)
		}
		if p.RPCAddr != "" && rpcAddrs[p.RPCAddr] {
			bad("peer %q: RPC address %s is another peer's too", p.ID, p.RPCAddr)
		}
		ids[p.ID], raftAddrs[p.RaftAddr], rpcAddrs[p.RPCAddr] = true, true, true
	}

	// Nothing negative: zero means "the default", a negative value is a
	// mistake, never silently a default.
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"DefaultQueues", int64(c.DefaultQueues)},
		{"LagBytes", c.LagBytes},
		{"RecoverHeartbeats", int64(c.RecoverHeartbeats)},
	} {
		if f.v < 0 {
			bad("%s is %d; it must be positive (0 means the default)", f.name, f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{
		{"SessionTimeout", c.SessionTimeout},
		{"LagTime", c.LagTime},
		{"JudgeInterval", c.JudgeInterval},
		{"FailoverMargin", c.FailoverMargin},
		{"ConsumerSession", c.ConsumerSession},
		{"RoutePushWait", c.RoutePushWait},
		{"RaftHeartbeatTimeout", c.RaftHeartbeatTimeout},
		{"RaftElectionTimeout", c.RaftElectionTimeout},
		{"RaftLeaderLeaseTimeout", c.RaftLeaderLeaseTimeout},
		{"SnapshotInterval", c.SnapshotInterval},
	} {
		if f.v < 0 {
			bad("%s is %v; it must be positive (0 means the default)", f.name, f.v)
		}
	}

	if c.FailoverMaxLoss < NoLoss {
		bad("FailoverMaxLoss is %d; it must be positive, 0 (the default, LagBytes) or NoLoss (-1)", c.FailoverMaxLoss)
	}

	// Relations between the values in effect, checked only where the fields
	// involved are not already reported as negative.
	d := c.withDefaults()
	if d.DefaultQueues > maxQueues {
		bad("DefaultQueues is %d, over the limit of %d queues per topic", d.DefaultQueues, maxQueues)
	}
	if c.LagTime > 0 && c.LagTime < time.Millisecond {
		bad("LagTime is %v; brokers report lag in whole milliseconds, so it must be at least 1ms", c.LagTime)
	}
	if c.SessionTimeout >= 0 && c.JudgeInterval >= 0 && d.JudgeInterval >= d.SessionTimeout {
		bad("JudgeInterval (%v%s) must be shorter than SessionTimeout (%v%s), so a lost master is noticed soon after its session ends",
			d.JudgeInterval, dflt(c.JudgeInterval), d.SessionTimeout, dflt(c.SessionTimeout))
	}

	if c.ConsumerSession > 0 && (c.ConsumerSession < minConsumerSession || c.ConsumerSession > maxConsumerSession) {
		bad("ConsumerSession is %v; it must be %v to %v", c.ConsumerSession, minConsumerSession, maxConsumerSession)
	}
	if c.ConsumerSession >= 0 && c.JudgeInterval >= 0 && d.JudgeInterval >= d.ConsumerSession && d.JudgeInterval < d.SessionTimeout {
		bad("JudgeInterval (%v%s) must be shorter than ConsumerSession (%v%s), so a dead consumer is noticed soon after its session ends",
			d.JudgeInterval, dflt(c.JudgeInterval), d.ConsumerSession, dflt(c.ConsumerSession))
	}

	// hashicorp/raft's rules (raft.ValidateConfig), on the values in effect,
	// reported here with this config's field names and before any port is
	// bound.
	rc := d.raftConfig()
	for _, f := range []struct {
		name string
		v    time.Duration
	}{
		{"RaftHeartbeatTimeout", c.RaftHeartbeatTimeout},
		{"RaftElectionTimeout", c.RaftElectionTimeout},
		{"RaftLeaderLeaseTimeout", c.RaftLeaderLeaseTimeout},
		{"SnapshotInterval", c.SnapshotInterval},
	} {
		if f.v > 0 && f.v < minRaftTimeout {
			bad("%s is %v; raft needs at least %v", f.name, f.v, minRaftTimeout)
		}
	}
	if c.RaftLeaderLeaseTimeout >= 0 && c.RaftHeartbeatTimeout >= 0 && rc.LeaderLeaseTimeout > rc.HeartbeatTimeout {
		bad("RaftLeaderLeaseTimeout (%v%s) must not be longer than RaftHeartbeatTimeout (%v%s)",
			rc.LeaderLeaseTimeout, dflt(c.RaftLeaderLeaseTimeout), rc.HeartbeatTimeout, dflt(c.RaftHeartbeatTimeout))
	}
	if c.RaftElectionTimeout >= 0 && c.RaftHeartbeatTimeout >= 0 && rc.ElectionTimeout < rc.HeartbeatTimeout {
		bad("RaftElectionTimeout (%v%s) must not be shorter than RaftHeartbeatTimeout (%v%s)",
			rc.ElectionTimeout, dflt(c.RaftElectionTimeout), rc.HeartbeatTimeout, dflt(c.RaftHeartbeatTimeout))
	}
	return errors.Join(errs...)
}

// dflt marks a value in an error as the default when its field was zero.
func dflt(set time.Duration) string {
	if set == 0 {
		return ", the default"
	}
	return ""
}
