// Package metaserverd is the ferry-metaserver program: flags to a
// metaserver.Config, the node, its metrics, and a clean shutdown.
package metaserverd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrymq/ferrymq/cmd/internal/cli"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/routing"
)

// ParsePeers parses "id=raftAddr/rpcAddr,..." into peers.
func ParsePeers(s string) ([]metaserver.Peer, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var peers []metaserver.Peer
	for _, item := range strings.Split(s, ",") {
		id, addrs, ok := strings.Cut(strings.TrimSpace(item), "=")
		raft, rpc, ok2 := strings.Cut(addrs, "/")
		if !ok || !ok2 || id == "" || raft == "" || rpc == "" {
			return nil, fmt.Errorf("peer %q: want id=raftAddr/rpcAddr", item)
		}
		peers = append(peers, metaserver.Peer{ID: id, RaftAddr: raft, RPCAddr: rpc})
	}
	return peers, nil
}

// Run runs a metaserver node until ctx ends.
func Run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("ferry-metaserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := metaserver.DefaultConfig()
	var cfg metaserver.Config
	var peers, failover, admit, raftSecretFile string
	var maxLoss int64
	var sf cli.ServerFlags
	fs.StringVar(&cfg.ID, "id", "", "this node's raft ID (required)")
	fs.StringVar(&cfg.Dir, "dir", "", "data directory for the raft log and snapshots (required)")
	fs.StringVar(&cfg.RaftAddr, "raft-addr", "127.0.0.1:7201", "raft transport address")
	fs.StringVar(&cfg.RPCAddr, "rpc-addr", "127.0.0.1:7101", "RPC address for brokers, producers and ferryctl")
	fs.StringVar(&cfg.AdvertiseRPC, "advertise-rpc", "", "RPC address others use (default: the bound one)")
	fs.StringVar(&peers, "peers", "", "bootstrap peers, identical on every node: id=raftAddr/rpcAddr,...")
	fs.BoolVar(&cfg.AutoCreateTopics, "auto-create", false, "create a topic on its first route lookup")
	fs.IntVar(&cfg.DefaultQueues, "default-queues", def.DefaultQueues, "queues of an auto-created topic")
	fs.StringVar(&admit, "admit-groups", string(metaserver.AdmitAuto), "auto: a broker group that registers takes queues at once; manual: it waits for 'ferryctl broker add-group'")
	fs.DurationVar(&cfg.SessionTimeout, "session", def.SessionTimeout, "a master unheard of this long makes its group read-only")
	fs.Int64Var(&cfg.LagBytes, "lag-bytes", def.LagBytes, "the default of -failover-max-loss (a slave's lag makes no group read-only: its master drops it from the sync set)")
	fs.DurationVar(&cfg.LagTime, "lag-time", def.LagTime, "a member of a sync set not caught up this long leaves it (the masters take it from the heartbeat replies); a slave's lag makes no group read-only")
	fs.IntVar(&cfg.RecoverHeartbeats, "recover-heartbeats", def.RecoverHeartbeats, "healthy heartbeats in a row that make a group writable again")
	fs.StringVar(&failover, "failover", "on", "on: promote a lost master's slave; off: keep the group read-only until a person acts")
	fs.Int64Var(&maxLoss, "failover-max-loss", -1, "most bytes of NORMAL messages a promotion may lose, by the last reports; 0: only a slave that had everything (default: -lag-bytes)")
	fs.DurationVar(&cfg.FailoverMargin, "failover-margin", def.FailoverMargin, "how long past -session the leader waits before it promotes")
	fs.DurationVar(&cfg.ConsumerSession, "consumer-session", def.ConsumerSession, "a consumer group member unheard of this long leaves its group (when it asks for no session of its own; 1s to 5m)")
	fs.DurationVar(&cfg.ConsumerJoinWindow, "consumer-join-window", def.ConsumerJoinWindow, "a consumer group with no member waits this long from its first member's join for others before its first assignment (negative: not at all)")
	fs.StringVar(&raftSecretFile, "raft-secret-file", "", "file holding the metaservers' own secret, the same on every metaserver and on no broker or client: it alone opens the raft port (required with -auth-cluster-token-file or -tls-*)")
	fs.BoolVar(&cfg.RaftAcceptClusterKey, "raft-accept-cluster-key", false, "only while moving a running cluster to -raft-secret-file: also accept raft peers keyed by the cluster token, as metaservers were before it (a broker's token opens the raft port meanwhile; see docs/security.md)")
	cfg.AuditRetention = def.AuditRetention
	fs.Var((*daysFlag)(&cfg.AuditRetention), "audit-retention", "how long the registry keeps its audit records (who changed what): a duration or days, 720h or 30d; 1h to 3650d")
	var con consoleFlags
	con.register(fs)
	sf.Register(fs, true)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	var err error
	if cfg.TLSServer, cfg.TLSClient, err = sf.TLS.Configs(); err != nil {
		return err
	}
	if cfg.ClusterToken, cfg.Auth, err = sf.Auth.Builtins(); err != nil {
		return err
	}
	if cfg.RaftSecret, err = sf.Auth.SecretFile("raft-secret-file", raftSecretFile); err != nil {
		return err
	}
	if cfg.RaftSecret == "" && cfg.SecurityOn() {
		return &cli.ConfigError{Err: errors.New("-raft-secret-file is required with -auth-cluster-token-file or -tls-*: the raft port opens only to the metaservers' own secret, since brokers hold the cluster token and certificates of the same CA. " +
			"Make one file for all the metaservers, and give it to no broker or client: (umask 077; head -c 32 /dev/urandom | base64 > raft.secret)")}
	}
	if cfg.AuditRetention < metaserver.MinAuditRetention || cfg.AuditRetention > metaserver.MaxAuditRetention {
		return &cli.ConfigError{Err: fmt.Errorf("-audit-retention must be from 1h to 3650d, got %v", cfg.AuditRetention)}
	}
	switch failover {
	case "on":
	case "off":
		cfg.DisableFailover = true
	default:
		return &cli.ConfigError{Err: fmt.Errorf("-failover must be on or off, got %q", failover)}
	}
	switch metaserver.AdmitMode(admit) {
	case metaserver.AdmitAuto, metaserver.AdmitManual:
		cfg.AdmitGroups = metaserver.AdmitMode(admit)
	default:
		return &cli.ConfigError{Err: fmt.Errorf("-admit-groups must be auto or manual, got %q", admit)}
	}
	switch {
	case maxLoss == 0:
		cfg.FailoverMaxLoss = metaserver.NoLoss
	case maxLoss > 0:
		cfg.FailoverMaxLoss = maxLoss
	case maxLoss != -1:
		return &cli.ConfigError{Err: fmt.Errorf("-failover-max-loss must be 0 or more bytes, got %d", maxLoss)}
	}
	if cfg.Peers, err = ParsePeers(peers); err != nil {
		return &cli.ConfigError{Err: err}
	}
	if cfg.Logger, err = sf.Logger("metaserver", stderr); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return &cli.ConfigError{Err: err}
	}
	cli.WarnOpenDataDir(cfg.Logger, "-dir", cfg.Dir)
	s, err := metaserver.Open(cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	m := cli.NewMetrics()
	register(m, s)
	m.Ready = func() error { return ready(s.RaftStatus()) }
	m.TLS = cfg.TLSServer
	if cfg.AuthEnabled() {
		m.Principals = cli.TablePrincipals(s.ACL)
	}
	web, err := con.console(cfg, s, sf.MetricsAddr)
	if err != nil {
		return err
	}
	if web != nil {
		defer web.Close()
		m.Console = web
	}
	stop, err := sf.Serve(m, cfg.Logger)
	if err != nil {
		return err
	}
	defer stop()
	cfg.Logger.Info("metaserver running", "id", cfg.ID, "rpc-addr", s.RPCAddr(), "raft-addr", s.RaftAddr())
	<-ctx.Done()
	cfg.Logger.Info("shutting down")
	return nil
}

var raftStates = []string{"Follower", "Candidate", "Leader", "Shutdown"}

func register(m *cli.Metrics, s *metaserver.Server) {
	registerRaft(m.Registry, s.RaftStatus)
	m.CounterFunc("ferrymq_metaserver_heartbeats_total", "Broker heartbeats taken as leader.", func() float64 { return float64(s.Heartbeats()) })
	m.CounterFunc("ferrymq_metaserver_auth_failures_total", "AUTH requests that failed: a token not recognised, or one sent during the backoff of failures before it (answered late; see docs/security.md).",
		func() float64 { return float64(s.AuthFailures()) })
	m.Registry.MustRegister(groupCollector{s}, s.RouteLookupDuration(), s.ConsumerHandover())
	m.CounterFunc("ferrymq_metaserver_failover_promotions_total", "Slaves promoted to master by this node as leader.",
		func() float64 { return float64(s.Failovers().Promotions) })
	m.CounterFunc("ferrymq_metaserver_failover_lost_bytes_total",
		"NORMAL message bytes the promotions lost, by the last reports of the old master's and the slave's log ends (a lower bound).",
		func() float64 { return float64(s.Failovers().LostBytes) })
	m.CounterFunc("ferrymq_metaserver_failover_cut_bytes_total",
		"Bytes the old masters cut from their logs when they rejoined as slaves: what the promotions did lose.",
		func() float64 { return float64(s.Failovers().CutBytes) })
	m.Registry.MustRegister(refusalCollector{s})
	m.CounterFunc("ferrymq_metaserver_consumer_commits_total", "Consumer group offset commits applied by this node as leader.",
		func() float64 { return float64(s.ConsumerStats().Commits) })
	m.CounterFunc("ferrymq_metaserver_consumer_rebalances_total",
		"New consumer group generations applied by this node as leader (joins, leaves, expiries, added queues).",
		func() float64 { return float64(s.ConsumerStats().Rebalances) })
	m.CounterFunc("ferrymq_metaserver_consumer_members_expired_total",
		"Consumer group members this node as leader removed because their session ran out.",
		func() float64 { return float64(s.ConsumerStats().Expired) })
	m.Registry.MustRegister(consumerCollector{s})
	m.Registry.MustRegister(s.TxnCollectors()...)
}

// registerRaft registers the raft metrics, read from status at scrape time.
func registerRaft(reg prometheus.Registerer, status func() api.RaftStatus) {
	reg.MustRegister(raftCollector{status})
}

// raftCollector exports the node's raft state, term and last index from
// one RaftStatus per scrape: each RaftStatus is a trip through raft's main
// loop, which a scrape should make once, not once per series.
type raftCollector struct{ status func() api.RaftStatus }

var (
	raftStateDesc = prometheus.NewDesc("ferrymq_metaserver_raft_state",
		"1 for the node's current raft state.", []string{"state"}, nil)
	raftTermDesc = prometheus.NewDesc("ferrymq_metaserver_raft_term",
		"The node's raft term.", nil, nil)
	raftLastIndexDesc = prometheus.NewDesc("ferrymq_metaserver_raft_last_index",
		"The node's last raft log index.", nil, nil)
)

func (c raftCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- raftStateDesc
	ch <- raftTermDesc
	ch <- raftLastIndexDesc
}

func (c raftCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.status()
	for _, state := range raftStates {
		ch <- prometheus.MustNewConstMetric(raftStateDesc, prometheus.GaugeValue, b2f(st.State == state), state)
	}
	ch <- prometheus.MustNewConstMetric(raftTermDesc, prometheus.GaugeValue, float64(st.Term))
	ch <- prometheus.MustNewConstMetric(raftLastIndexDesc, prometheus.GaugeValue, float64(st.LastIndex))
}

// consumerCollector exports every consumer group's members, generation and
// committed offsets, from the node's registry.
type consumerCollector struct{ s *metaserver.Server }

var (
	consumerMembersDesc = prometheus.NewDesc("ferrymq_metaserver_consumer_group_members",
		"Members of the consumer group.", []string{"group"}, nil)
	consumerGenerationDesc = prometheus.NewDesc("ferrymq_metaserver_consumer_group_generation",
		"The consumer group's generation: it grows by one at every rebalance.", []string{"group"}, nil)
	consumerOffsetDesc = prometheus.NewDesc("ferrymq_metaserver_consumer_committed_offset",
		"The consumer group's committed offset of a queue: the next offset it will consume.", []string{"group", "topic", "queue"}, nil)
	consumerWaitingDesc = prometheus.NewDesc("ferrymq_metaserver_consumer_queues_waiting",
		"Queues of the consumer group whose owner waits for their earlier holder to release them (one owner at a time): nobody delivers them meanwhile.",
		[]string{"group"}, nil)
)

func (c consumerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- consumerMembersDesc
	ch <- consumerGenerationDesc
	ch <- consumerOffsetDesc
	ch <- consumerWaitingDesc
}

func (c consumerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, g := range c.s.FSM().ConsumerGroups() {
		ch <- prometheus.MustNewConstMetric(consumerMembersDesc, prometheus.GaugeValue, float64(len(g.Members)), g.Name)
		ch <- prometheus.MustNewConstMetric(consumerGenerationDesc, prometheus.GaugeValue, float64(g.Generation), g.Name)
		waiting := 0
		for _, qs := range g.Releasing {
			waiting += len(qs)
		}
		ch <- prometheus.MustNewConstMetric(consumerWaitingDesc, prometheus.GaugeValue, float64(waiting), g.Name)
		for _, o := range g.Committed() {
			ch <- prometheus.MustNewConstMetric(consumerOffsetDesc, prometheus.GaugeValue, float64(o.Offset), g.Name, o.Topic, strconv.FormatUint(uint64(o.Queue), 10))
		}
	}
}

// refusalCollector exports the failover refusals by reason.
type refusalCollector struct{ s *metaserver.Server }

var refusalDesc = prometheus.NewDesc("ferrymq_metaserver_failover_refusals_total",
	"Times a lost master's slave was not promoted, by reason (one episode counts once).", []string{"reason"}, nil)

func (c refusalCollector) Describe(ch chan<- *prometheus.Desc) { ch <- refusalDesc }

func (c refusalCollector) Collect(ch chan<- prometheus.Metric) {
	for reason, n := range c.s.Failovers().Refused {
		ch <- prometheus.MustNewConstMetric(refusalDesc, prometheus.CounterValue, float64(n), reason)
	}
}

// groupCollector exports every broker group's state: whether it takes
// writes, and one series per known read-only reason (all of them, 0 or 1),
// so that no label value changes with the group's state.
type groupCollector struct{ s *metaserver.Server }

var (
	groupDesc = prometheus.NewDesc("ferrymq_metaserver_group_writable",
		"1 if the broker group takes writes, 0 if read-only (ferrymq_metaserver_group_readonly_reason says why).", []string{"group"}, nil)
	reasonDesc = prometheus.NewDesc("ferrymq_metaserver_group_readonly_reason",
		"1 if the reason holds for the broker group, for each reason a group can be read-only for: heartbeat-lost, slave-lag, admin.",
		[]string{"group", "reason"}, nil)
	epochDesc = prometheus.NewDesc("ferrymq_metaserver_group_epoch",
		"The broker group's epoch: it grows by one at every promotion.", []string{"group"}, nil)
	syncSetDesc = prometheus.NewDesc("ferrymq_metaserver_group_sync_set_size",
		"Slaves in the broker group's sync set: those its master waits for before it answers a HIGH message.", []string{"group"}, nil)
	minInSyncDesc = prometheus.NewDesc("ferrymq_metaserver_group_min_insync",
		"Copies of a HIGH message, the master's counted, the broker group's policy requires (its min in-sync, and at least its ack quorum).",
		[]string{"group"}, nil)
	highAllowedDesc = prometheus.NewDesc("ferrymq_metaserver_group_high_allowed",
		"1 if the broker group's sync set, with its master, holds the copies a HIGH message needs; 0 if HIGH is refused (NORMAL is still written).",
		[]string{"group"}, nil)
)

// readOnlyReasons are the reasons routing knows, one bit each.
var readOnlyReasons = func() []routing.Reasons {
	var rs []routing.Reasons
	for r := routing.Reasons(1); r != 0; r <<= 1 {
		if r.String() != "" {
			rs = append(rs, r)
		}
	}
	return rs
}()

func (c groupCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- groupDesc
	ch <- reasonDesc
	ch <- epochDesc
	ch <- syncSetDesc
	ch <- minInSyncDesc
	ch <- highAllowedDesc
}

func (c groupCollector) Collect(ch chan<- prometheus.Metric) {
	for _, g := range c.s.FSM().Groups() {
		if g.Admission == routing.Retired {
			continue // no brokers, no queues: nothing to watch
		}
		ch <- prometheus.MustNewConstMetric(groupDesc, prometheus.GaugeValue, b2f(g.Writable()), g.Name)
		for _, r := range readOnlyReasons {
			ch <- prometheus.MustNewConstMetric(reasonDesc, prometheus.GaugeValue, b2f(g.Reasons&r != 0), g.Name, r.String())
		}
		ch <- prometheus.MustNewConstMetric(epochDesc, prometheus.GaugeValue, float64(g.Epoch), g.Name)
		ch <- prometheus.MustNewConstMetric(syncSetDesc, prometheus.GaugeValue, float64(len(g.InSync)), g.Name)
		ch <- prometheus.MustNewConstMetric(minInSyncDesc, prometheus.GaugeValue, float64(g.MinCopies()), g.Name)
		ch <- prometheus.MustNewConstMetric(highAllowedDesc, prometheus.GaugeValue, b2f(g.HighAllowed()), g.Name)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// ready is /readyz: the node serves once it follows a known leader or
// leads (a node that knows no leader cannot answer for the registry).
func ready(st api.RaftStatus) error {
	switch {
	case st.State == "Leader":
		return nil
	case st.State == "Follower" && st.LeaderID != "":
		return nil
	case st.State == "Starting":
		return errors.New("not ready: the node is starting")
	}
	return fmt.Errorf("not ready: no raft leader known (this node is %s)", st.State)
}

// daysFlag is a duration flag that also takes whole days ("30d").
type daysFlag time.Duration

func (d *daysFlag) String() string {
	if d == nil {
		return ""
	}
	if v := time.Duration(*d); v > 0 && v%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(v/(24*time.Hour)), 10) + "d"
	}
	return time.Duration(*d).String()
}

func (d *daysFlag) Set(s string) error {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.ParseInt(n, 10, 64)
		if err != nil || days < 0 || days > math.MaxInt64/int64(24*time.Hour) {
			return fmt.Errorf("not a number of days: %q", s)
		}
		*d = daysFlag(time.Duration(days) * 24 * time.Hour)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = daysFlag(v)
	return nil
}
