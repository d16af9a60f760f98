// Package brokerd is the ferry-broker program: flags to a broker.Config,
// the broker, its metrics, and a clean shutdown.
package brokerd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/cmd/internal/cli"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
	"github.com/ferrymq/ferrymq/storage/vfs"
)

// Run runs a broker until ctx ends.
func Run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("ferry-broker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg broker.Config
	var meta, flush, role, failoverTail string
	var sf cli.ServerFlags
	fs.StringVar(&cfg.ID, "id", "", "broker ID (required)")
	fs.StringVar(&cfg.Group, "group", "", "broker group (required)")
	fs.StringVar(&role, "role", string(routing.RoleMaster), "preferred role when first joining the group: master or slave (afterwards the metaserver decides, e.g. at a failover)")
	fs.StringVar(&cfg.Dir, "dir", "", "commit log directory (required)")
	fs.StringVar(&cfg.Addr, "addr", "127.0.0.1:7401", "address for producers and consumers")
	fs.StringVar(&cfg.AdvertiseAddr, "advertise", "", "address registered with the metaserver (default: the bound one)")
	fs.StringVar(&cfg.HAAddr, "ha-addr", "127.0.0.1:7501", "where the slave fetches the log while this broker is the master")
	fs.StringVar(&cfg.MasterHAAddr, "master-ha", "", "pin the master's HA address for a slave (default: learned from the metaserver, which follows failovers)")
	fs.StringVar(&meta, "meta", "127.0.0.1:7101", "metaserver RPC addresses, comma-separated")
	fs.StringVar(&flush, "flush", "async", "commit log flush: async (every -flush-interval) or sync (before every answer)")
	fs.DurationVar(&cfg.FlushInterval, "flush-interval", 500*time.Millisecond, "async flush interval")
	fs.Int64Var(&cfg.SegmentSize, "segment-size", 1<<30, "commit log segment size in bytes")
	fs.Int64Var(&cfg.RetentionBytes, "retention-bytes", 0, "keep about this many bytes of log, deleting whole old segments (0: keep everything)")
	fs.DurationVar(&cfg.RetentionCheck, "retention-check", 30*time.Second, "how often retention runs")
	fs.DurationVar(&cfg.HeartbeatInterval, "heartbeat", 2*time.Second, "heartbeat interval")
	fs.DurationVar(&cfg.SessionTimeout, "session", 10*time.Second, "no heartbeat accepted for this long makes the broker read-only")
	fs.DurationVar(&cfg.HighWait, "high-wait", 3*time.Second, "how long a HIGH message waits for the slave")
	fs.DurationVar(&cfg.ProducerIdle, "producer-idle", 7*24*time.Hour, "forget an idempotent producer's sequences in a queue after this long without its messages")
	fs.Int64Var(&cfg.Pretouch, "pretouch", 0, "write zeros this many bytes ahead of the commit log's writer, so appends land on pages the file has (0: 8 MiB with -flush async, off with sync; -1: off)")
	fs.DurationVar(&cfg.WriteTimeout, "write-timeout", 10*time.Second, "close a connection that read none of its answers for this long")
	fs.DurationVar(&cfg.MaxDelay, "max-delay", 90*24*time.Hour, "refuse (INVALID) a delayed message due further ahead than this")
	fs.Int64Var(&cfg.DelayQuota, "delay-quota", 10_000_000, "refuse (DELAY_QUOTA) a delayed message when its topic has this many pending in the group")
	fs.DurationVar(&cfg.DelayTick, "delay-tick", 10*time.Millisecond, "how often the master releases due delayed messages")
	fs.DurationVar(&cfg.TxnTimeout, "txn-timeout", time.Minute, "abort a transaction open longer than this (at most 15m): no reader of committed messages waits longer")
	fs.Int64Var(&cfg.TxnMaxMessages, "txn-max-messages", 100_000, "refuse (TXN_LIMIT) a transaction's message past this many in the group")
	fs.Int64Var(&cfg.TxnMaxBytes, "txn-max-bytes", 256<<20, "refuse (TXN_LIMIT) a transaction's message past this many bytes in the group")
	fs.IntVar(&cfg.TxnMaxOpenPerProducer, "txn-max-open-per-producer", 8, "refuse (TXN_LIMIT) a producer's new transaction past this many open in the group")
	fs.StringVar(&failoverTail, "failover-tail", "recover", "what a former master does with the records a failover cut from its log (NORMAL messages it acknowledged that its slave never copied): recover (hand them to the new master, which stores each again once, flagged) or discard (keep them in truncated/ for the operator only)")
	sf.Register(fs, false)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	cfg.Role = routing.Role(role)
	var err error
	if cfg.TLSServer, cfg.TLSClient, err = sf.TLS.Configs(); err != nil {
		return err
	}
	if cfg.ClusterToken, err = sf.Auth.ClusterToken(); err != nil {
		return err
	}
	if cfg.Flush, err = storage.ParseFlushMode(flush); err != nil {
		return &cli.ConfigError{Err: err}
	}
	switch failoverTail {
	case "recover":
	case "discard":
		cfg.DiscardFailoverTail = true
	default:
		return &cli.ConfigError{Err: fmt.Errorf("-failover-tail %q: want recover or discard", failoverTail)}
	}
	for _, a := range strings.Split(meta, ",") {
		if a = strings.TrimSpace(a); a != "" {
			cfg.MetaAddrs = append(cfg.MetaAddrs, a)
		}
	}
	if cfg.Logger, err = sf.Logger("broker", stderr); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return &cli.ConfigError{Err: err}
	}
	cli.WarnOpenDataDir(cfg.Logger, "-dir", cfg.Dir)
	// Durably: a power loss must not take the directory the log then
	// acknowledges records in.
	if err := vfs.MkdirAllDurable(vfs.Default, cfg.Dir); err != nil {
		return &cli.ConfigError{Err: fmt.Errorf("data directory: %w", err)}
	}
	b, err := broker.New(cfg)
	if err != nil {
		return err
	}
	defer b.Close()
	m := cli.NewMetrics()
	register(m, b, cfg.Dir)
	m.Health = b.Store().Broken
	m.Ready = func() error { return ready(b) }
	m.TLS = cfg.TLSServer
	if cfg.ClusterToken != "" {
		m.Principals = b
	}
	stop, err := sf.Serve(m, cfg.Logger)
	if err != nil {
		return err
	}
	defer stop()
	<-ctx.Done()
	cfg.Logger.Info("shutting down")
	return nil
}

func register(m *cli.Metrics, b *broker.Broker, dir string) {
	st := b.Stats()
	f := func(v interface{ Load() int64 }) func() float64 { return func() float64 { return float64(v.Load()) } }
	m.CounterFunc("ferrymq_broker_messages_in_total", "Messages stored.", f(&st.MessagesIn))
	m.CounterFunc("ferrymq_broker_auth_failures_total", "AUTH requests that failed: a token not recognised, or one sent during the backoff of failures before it (answered late; see docs/security.md).",
		func() float64 { return float64(b.AuthFailures()) })
	m.CounterFunc("ferrymq_broker_bytes_in_total", "Message body bytes stored.", f(&st.BytesIn))
	m.CounterFunc("ferrymq_broker_messages_refused_total", "Messages answered with a non-OK status.", f(&st.Refused))
	m.CounterFunc("ferrymq_broker_no_route_total", "Messages answered NO_ROUTE: the broker's route cache did not route their queue here (yet).", f(&st.NoRoute))
	m.Registry.MustRegister(st.SendDuration, st.FlushDuration, st.DelayedLateness)
	m.GaugeFunc("ferrymq_broker_clock_skew_seconds", "The metaserver leader's clock minus this broker's, at the last heartbeat (within half a round trip): delayed messages are due by the broker's clock, so a master whose clock is behind releases them late, ahead early.",
		func() float64 { return b.ClockSkew().Seconds() })
	m.CounterFunc("ferrymq_broker_delayed_in_total", "Delayed messages stored pending.", f(&st.DelayedIn))
	m.CounterFunc("ferrymq_broker_delayed_fired_total", "Delayed messages released into their target queues.", f(&st.DelayedFired))
	m.CounterFunc("ferrymq_broker_delayed_cancelled_total", "Delayed messages cancelled by a client before their time.", f(&st.DelayedCancelled))
	m.CounterFunc("ferrymq_broker_delayed_moved_total", "Pending delayed messages appended again before retention deleted their segment.", f(&st.DelayedMoved))
	m.CounterFunc("ferrymq_broker_delayed_unreadable_total", "Due delayed messages whose pending record could not be read (cancelled, and logged): should stay 0.", f(&st.DelayedUnreadable))
	m.CounterFunc("ferrymq_broker_delayed_refused_total", "Delayed messages refused: due beyond -max-delay, or over their topic's -delay-quota.", f(&st.DelayedRefused))
	m.CounterFunc("ferrymq_broker_txn_commits_total", "Transactions committed (decision marks written by this broker as master).", f(&st.TxnCommits))
	m.CounterFunc("ferrymq_broker_txn_aborts_total", "Transactions aborted, those past -txn-timeout included.", f(&st.TxnAborts))
	m.CounterFunc("ferrymq_broker_txn_timeouts_total", "Transactions aborted because they were open longer than -txn-timeout.", f(&st.TxnTimeouts))
	m.CounterFunc("ferrymq_broker_txn_refused_total", "Messages of transactions refused TXN_LIMIT.", f(&st.TxnRefused))
	m.GaugeFunc("ferrymq_broker_txn_open", "Open transactions in the group's log, at the last sweep (every second).", func() float64 { return float64(st.TxnOpen.Load()) })
	m.GaugeFunc("ferrymq_broker_txn_oldest_age_seconds", "Age of the oldest open transaction at the last sweep (0: none): readers of committed messages of its queues wait for it.",
		func() float64 {
			if began := st.TxnOldest.Load(); began > 0 {
				return time.Since(time.UnixMilli(began)).Seconds()
			}
			return 0
		})
	m.CounterFunc("ferrymq_broker_high_acked_total", "HIGH messages confirmed by the slave.", f(&st.HighAcked))
	m.CounterFunc("ferrymq_broker_high_timeouts_total", "HIGH messages answered SLAVE_SYNC_TIMEOUT.", f(&st.HighTimeouts))
	m.GaugeFunc("ferrymq_broker_producers_tracked", "Idempotent (producer, queue) pairs whose sequences the broker remembers.",
		func() float64 { return float64(b.Store().ProducerStats().Tracked) })
	m.CounterFunc("ferrymq_broker_duplicates_total", "Sends of messages already stored, answered DUPLICATE with the original offsets and not stored again.",
		func() float64 { return float64(b.Store().ProducerStats().Duplicates) })
	m.CounterFunc("ferrymq_broker_sequence_refusals_total", "Messages refused OUT_OF_ORDER_SEQUENCE or PRODUCER_FENCED.",
		func() float64 { return float64(b.Store().ProducerStats().Refused) })
	m.GaugeFunc("ferrymq_broker_log_end_offset", "Commit log end offset.", func() float64 { return float64(b.Store().EndOffset()) })
	m.GaugeFunc("ferrymq_broker_log_start_offset", "Commit log start offset (after retention).", func() float64 { return float64(b.Store().StartOffset()) })
	m.GaugeFunc("ferrymq_broker_writable", "1 if the broker takes writes (it is the master and its write lease holds).", func() float64 {
		if b.IsMaster() && b.Writable() {
			return 1
		}
		return 0
	})
	m.GaugeFunc("ferrymq_broker_is_master", "1 while the registry names this broker its group's master.", func() float64 {
		if b.IsMaster() {
			return 1
		}
		return 0
	})
	m.GaugeFunc("ferrymq_broker_epoch", "The last group epoch whose records this broker's log holds.", func() float64 { return float64(b.Epoch()) })
	m.CounterFunc("ferrymq_broker_lease_lost_total", "Stored messages answered LEASE_LOST: the write lease ran out (or a newer epoch was seen) before the answer.", f(&st.LeaseLost))
	m.CounterFunc("ferrymq_broker_acks_after_lease_total", "OK or DUPLICATE answers that the write lease allowed when their write began but that were handed to the socket whole only after it ended (a pause, or a peer slow to read): their NORMAL messages may be lost to a failover.", f(&st.AcksAfterLease))
	m.CounterFunc("ferrymq_broker_fenced_total", "SEND requests refused because a newer group epoch was seen.", f(&st.Fenced))
	m.CounterFunc("ferrymq_broker_takeovers_total", "Times this broker took over as its group's master.", f(&st.Takeovers))
	m.CounterFunc("ferrymq_broker_truncations_total", "Times this broker cut its log back on rejoining as the slave.", f(&st.Truncations))
	m.CounterFunc("ferrymq_broker_truncated_bytes_total", "Bytes cut from the log on rejoining as the slave (kept in side files).", f(&st.TruncatedBytes))
	m.CounterFunc("ferrymq_broker_ha_fetch_refused_total", "HA fetches refused: not from the group's slave in the current epoch.", f(&st.HAFetchRefused))
	m.CounterFunc("ferrymq_broker_ha_diverged_total", "HA fetches refused LOG_DIVERGED: the slave's log is not a prefix of this master's.", f(&st.HADiverged))
	m.CounterFunc("ferrymq_broker_ha_answers_total", "As master: HA fetches answered with log bytes.", f(&st.HAAnswers))
	m.CounterFunc("ferrymq_broker_ha_answer_bytes_total", "As master: log bytes sent to the slave in HA fetch answers.", f(&st.HABytes))
	m.CounterFunc("ferrymq_broker_ha_acks_total", "As master: HA_ACKs taken from the slave (one per append of a fetch answer).", f(&st.HAAcks))
	m.CounterFunc("ferrymq_broker_resyncs_total", "Times this broker set its log aside and copied it again from its master, on an operator's order.", f(&st.Resyncs))
	m.CounterFunc("ferrymq_broker_recovered_messages_total", "As master: messages a failover had cut from a former master's log, appended again (flagged recovered).", f(&st.Recovered))
	m.CounterFunc("ferrymq_broker_recover_duplicates_total", "As master: messages of a former master's cut tail that this log held already (by stamp or message id), not appended again.", f(&st.RecoverDuplicates))
	m.CounterFunc("ferrymq_broker_tails_handed_over_total", "As former master: cut tails handed to the group's master whole.", f(&st.TailsHandedOver))
	m.GaugeFunc("ferrymq_broker_pulls_parked", "PULLs held by the broker now, waiting for a message (long polls).", f(&st.PullsParked))
	m.CounterFunc("ferrymq_broker_pull_wakeups_total", "Parked PULLs answered because a message arrived in their queue.", f(&st.PullWakeups))
	m.CounterFunc("ferrymq_broker_pulls_expired_total", "Parked PULLs answered when their wait passed.", f(&st.PullsExpired))
	m.CounterFunc("ferrymq_broker_pulls_released_total", "Parked PULLs answered at once because the broker stepped down or cut its log.", f(&st.PullsReleased))
	m.CounterFunc("ferrymq_broker_pulls_overflow_total", "PULLs answered at once, empty, because too many were parked.", f(&st.PullsOverflow))
	m.Registry.MustRegister(roleCollector{b}, queueCollector{b}, diskCollector{dir}, delayedCollector{b})
}

// roleCollector exports the broker's role and the gauges that only mean
// something on a master: a slave (or a broker the registry has not named
// yet) exports none of them, so an alert on slave lag never fires on a
// slave. ferrymq_broker_role has one series, valued 1, once the broker has
// a role: join on it (`* on(instance) group_left(role)`) to split any
// other metric by role.
type roleCollector struct{ b *broker.Broker }

var (
	roleDesc = prometheus.NewDesc("ferrymq_broker_role",
		"1, labelled with the broker's role now: master, slave (also while it waits for its master to confirm its epoch), or broken (a slave that cannot follow its master without an operator's resync); absent before the registry names one.",
		[]string{"role"}, nil)
	slaveLagBytesDesc = prometheus.NewDesc("ferrymq_broker_slave_lag_bytes",
		"Master only: bytes the slowest member of the sync set (or the slowest slave, with an empty set) is behind.", nil, nil)
	slaveLagSecondsDesc = prometheus.NewDesc("ferrymq_broker_slave_lag_seconds",
		"Master only: how long the slowest member of the sync set (or the slowest slave) has not been caught up.", nil, nil)
	slaveConnectedDesc = prometheus.NewDesc("ferrymq_broker_slave_connected",
		"Master only: 1 if the slowest member of the sync set (or the slowest slave) is fetching.", nil, nil)
	replicaLagBytesDesc = prometheus.NewDesc("ferrymq_broker_replica_lag_bytes",
		"Master only: bytes each slave is behind.", []string{"replica"}, nil)
	replicaLagSecondsDesc = prometheus.NewDesc("ferrymq_broker_replica_lag_seconds",
		"Master only: how long each slave has not been caught up.", []string{"replica"}, nil)
	replicaInSyncDesc = prometheus.NewDesc("ferrymq_broker_replica_in_sync",
		"Master only: 1 if the master waits for the slave's copy of each HIGH message (it is in the sync set, or joining it).", []string{"replica"}, nil)
	takesHighDesc = prometheus.NewDesc("ferrymq_broker_takes_high",
		"Master only: 1 if the sync set holds the copies a HIGH message needs (else HIGH is refused NOT_ENOUGH_REPLICAS).", nil, nil)
)

func (c roleCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- roleDesc
	ch <- slaveLagBytesDesc
	ch <- slaveLagSecondsDesc
	ch <- slaveConnectedDesc
	ch <- replicaLagBytesDesc
	ch <- replicaLagSecondsDesc
	ch <- replicaInSyncDesc
	ch <- takesHighDesc
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (c roleCollector) Collect(ch chan<- prometheus.Metric) {
	if !c.b.IsMaster() {
		switch c.b.Role().Kind {
		case broker.RoleSlave, broker.RoleWaiting:
			ch <- prometheus.MustNewConstMetric(roleDesc, prometheus.GaugeValue, 1, string(routing.RoleSlave))
		case broker.RoleBroken:
			ch <- prometheus.MustNewConstMetric(roleDesc, prometheus.GaugeValue, 1, "broken")
		}
		return
	}
	s := c.b.Slave()
	ch <- prometheus.MustNewConstMetric(roleDesc, prometheus.GaugeValue, 1, string(routing.RoleMaster))
	ch <- prometheus.MustNewConstMetric(slaveLagBytesDesc, prometheus.GaugeValue, float64(s.LagBytes))
	ch <- prometheus.MustNewConstMetric(slaveLagSecondsDesc, prometheus.GaugeValue, s.LagTime.Seconds())
	ch <- prometheus.MustNewConstMetric(slaveConnectedDesc, prometheus.GaugeValue, b2f(s.Connected))
	ch <- prometheus.MustNewConstMetric(takesHighDesc, prometheus.GaugeValue, b2f(c.b.TakesHigh()))
	for _, r := range c.b.Replicas() {
		ch <- prometheus.MustNewConstMetric(replicaLagBytesDesc, prometheus.GaugeValue, float64(r.LagBytes), r.ID)
		ch <- prometheus.MustNewConstMetric(replicaLagSecondsDesc, prometheus.GaugeValue, r.LagTime.Seconds(), r.ID)
		ch <- prometheus.MustNewConstMetric(replicaInSyncDesc, prometheus.GaugeValue, b2f(r.InSync), r.ID)
	}
}

// queueCollector exports every queue's end offset in the broker's log,
// for consumer lag (end minus a consumer group's committed offset). The
// labels name configured topics and their queues.
type queueCollector struct{ b *broker.Broker }

var queueEndDesc = prometheus.NewDesc("ferrymq_broker_queue_end_offset",
	"A queue's next offset in this broker's log (the offset its next message gets).", []string{"topic", "queue"}, nil)

func (c queueCollector) Describe(ch chan<- *prometheus.Desc) { ch <- queueEndDesc }

func (c queueCollector) Collect(ch chan<- prometheus.Metric) {
	type q struct {
		topic string
		queue uint32
		next  int64
	}
	var qs []q
	// Queues holds the log's index lock: copy, then send.
	c.b.Store().Queues(func(topic string, queue uint32, _, next int64) { qs = append(qs, q{topic, queue, next}) })
	for _, x := range qs {
		ch <- prometheus.MustNewConstMetric(queueEndDesc, prometheus.GaugeValue, float64(x.next), x.topic, strconv.FormatUint(uint64(x.queue), 10))
	}
}

// diskCollector exports the size and the free space of the file system
// holding the data directory.
type diskCollector struct{ dir string }

var (
	diskAvailDesc = prometheus.NewDesc("ferrymq_broker_disk_avail_bytes",
		"Bytes free for the broker on the file system of its data directory.", nil, nil)
	diskSizeDesc = prometheus.NewDesc("ferrymq_broker_disk_size_bytes",
		"Size in bytes of the file system of the broker's data directory.", nil, nil)
)

func (c diskCollector) Describe(ch chan<- *prometheus.Desc) { ch <- diskAvailDesc; ch <- diskSizeDesc }

func (c diskCollector) Collect(ch chan<- prometheus.Metric) {
	avail, size, err := diskSpace(c.dir)
	if err != nil {
		return // not on this system: the series are absent
	}
	ch <- prometheus.MustNewConstMetric(diskAvailDesc, prometheus.GaugeValue, float64(avail))
	ch <- prometheus.MustNewConstMetric(diskSizeDesc, prometheus.GaugeValue, float64(size))
}

// ready is /readyz: the broker serves once the metaserver named it its
// group's master or slave (before that it takes no writes and follows no
// master), and while its log is not broken.
func ready(b *broker.Broker) error {
	if err := b.Store().Broken(); err != nil {
		return err
	}
	switch st := b.Role(); st.Kind {
	case broker.RoleMaster, broker.RoleSlave:
		return nil
	case broker.RoleWaiting, broker.RoleBroken:
		return fmt.Errorf("not ready: %s", st)
	}
	return errors.New("not ready: the metaserver has not named this broker master or slave yet")
}

// delayedCollector exports the pending delayed messages by how soon they
// are due, and when the next one is.
type delayedCollector struct{ b *broker.Broker }

var (
	delayedPendingDesc = prometheus.NewDesc("ferrymq_broker_delayed_pending",
		"Delayed messages pending in this broker's log, by how soon they are due (within 1m, 1h, 1d, or later; each series counts only its own span).",
		[]string{"due"}, nil)
	delayedNextDueDesc = prometheus.NewDesc("ferrymq_broker_delayed_next_due_seconds",
		"Seconds until the earliest pending delayed message is due (negative: overdue by that much); absent when none is pending.", nil, nil)
)

func (c delayedCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- delayedPendingDesc
	ch <- delayedNextDueDesc
}

func (c delayedCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.b.Delayed()
	for _, h := range d.ByHorizon {
		ch <- prometheus.MustNewConstMetric(delayedPendingDesc, prometheus.GaugeValue, float64(h.Pending), h.Label)
	}
	if d.NextDue != nil {
		ch <- prometheus.MustNewConstMetric(delayedNextDueDesc, prometheus.GaugeValue, d.NextDue.Sub(d.Now).Seconds())
	}
}
