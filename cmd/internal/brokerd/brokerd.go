// Package brokerd is the ferry-broker program: flags to a broker.Config,
// the broker, its metrics, and a clean shutdown.
package brokerd

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/cmd/internal/cli"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

// Run runs a broker until ctx ends.
func Run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("ferry-broker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg broker.Config
	var meta, flush, role, metricsAddr, pprofAddr string
	var logf cli.LogFlags
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
	fs.StringVar(&metricsAddr, "metrics-addr", "", "serve Prometheus metrics on this address (empty: off)")
	fs.StringVar(&pprofAddr, "pprof", "", cli.PprofHelp)
	logf.Register(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	cfg.Role = routing.Role(role)
	var err error
	if cfg.Flush, err = storage.ParseFlushMode(flush); err != nil {
		return &cli.ConfigError{Err: err}
	}
	for _, a := range strings.Split(meta, ",") {
		if a = strings.TrimSpace(a); a != "" {
			cfg.MetaAddrs = append(cfg.MetaAddrs, a)
		}
	}
	if cfg.Logger, err = logf.Logger("broker", stderr); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return &cli.ConfigError{Err: err}
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return &cli.ConfigError{Err: fmt.Errorf("data directory: %w", err)}
	}
	b, err := broker.New(cfg)
	if err != nil {
		return err
	}
	defer b.Close()
	m := cli.NewMetrics()
	register(m, b)
	if err := m.Serve(metricsAddr, cfg.Logger); err != nil {
		return &cli.ConfigError{Err: err}
	}
	defer m.Close()
	stopPprof, err := cli.ServePprof(pprofAddr, cfg.Logger)
	if err != nil {
		return &cli.ConfigError{Err: err}
	}
	defer stopPprof()
	<-ctx.Done()
	cfg.Logger.Info("shutting down")
	return nil
}

func register(m *cli.Metrics, b *broker.Broker) {
	st := b.Stats()
	f := func(v interface{ Load() int64 }) func() float64 { return func() float64 { return float64(v.Load()) } }
	m.CounterFunc("ferrymq_broker_messages_in_total", "Messages stored.", f(&st.MessagesIn))
	m.CounterFunc("ferrymq_broker_bytes_in_total", "Message body bytes stored.", f(&st.BytesIn))
	m.CounterFunc("ferrymq_broker_messages_refused_total", "Messages answered with a non-OK status.", f(&st.Refused))
	m.CounterFunc("ferrymq_broker_send_requests_total", "SEND requests answered.", f(&st.Batches))
	m.CounterFunc("ferrymq_broker_send_seconds_total", "Total time from reading a SEND to answering it; divide by send_requests_total for the mean.",
		func() float64 { return time.Duration(st.BatchNanos.Load()).Seconds() })
	m.CounterFunc("ferrymq_broker_high_acked_total", "HIGH messages confirmed by the slave.", f(&st.HighAcked))
	m.CounterFunc("ferrymq_broker_high_timeouts_total", "HIGH messages answered SLAVE_SYNC_TIMEOUT.", f(&st.HighTimeouts))
	m.GaugeFunc("ferrymq_broker_producers_tracked", "Idempotent (producer, queue) pairs whose sequences the broker remembers.",
		func() float64 { return float64(b.Store().ProducerStats().Tracked) })
	m.CounterFunc("ferrymq_broker_duplicates_total", "Sends of messages already stored, answered DUPLICATE with the original offsets and not stored again.",
		func() float64 { return float64(b.Store().ProducerStats().Duplicates) })
	m.CounterFunc("ferrymq_broker_sequence_refusals_total", "Messages refused OUT_OF_ORDER_SEQUENCE or PRODUCER_FENCED.",
		func() float64 { return float64(b.Store().ProducerStats().Refused) })
	m.CounterFunc("ferrymq_broker_flushes_total", "Commit log syncs.", f(&b.Store().Flushes))
	m.CounterFunc("ferrymq_broker_flush_seconds_total", "Total time in commit log syncs; divide by flushes_total for the mean.",
		func() float64 { return time.Duration(b.Store().FlushNanos.Load()).Seconds() })
	m.GaugeFunc("ferrymq_broker_log_end_offset", "Commit log end offset.", func() float64 { return float64(b.Store().EndOffset()) })
	m.GaugeFunc("ferrymq_broker_log_start_offset", "Commit log start offset (after retention).", func() float64 { return float64(b.Store().StartOffset()) })
	m.GaugeFunc("ferrymq_broker_writable", "1 if the broker takes writes.", func() float64 {
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
	m.CounterFunc("ferrymq_broker_fenced_total", "SEND requests refused because a newer group epoch was seen.", f(&st.Fenced))
	m.CounterFunc("ferrymq_broker_takeovers_total", "Times this broker took over as its group's master.", f(&st.Takeovers))
	m.CounterFunc("ferrymq_broker_truncations_total", "Times this broker cut its log back on rejoining as the slave.", f(&st.Truncations))
	m.CounterFunc("ferrymq_broker_truncated_bytes_total", "Bytes cut from the log on rejoining as the slave (kept in side files).", f(&st.TruncatedBytes))
	m.CounterFunc("ferrymq_broker_ha_fetch_refused_total", "HA fetches refused: not from the group's slave in the current epoch.", f(&st.HAFetchRefused))
	m.GaugeFunc("ferrymq_broker_pulls_parked", "PULLs held by the broker now, waiting for a message (long polls).", f(&st.PullsParked))
	m.CounterFunc("ferrymq_broker_pull_wakeups_total", "Parked PULLs answered because a message arrived in their queue.", f(&st.PullWakeups))
	m.CounterFunc("ferrymq_broker_pulls_expired_total", "Parked PULLs answered when their wait passed.", f(&st.PullsExpired))
	m.CounterFunc("ferrymq_broker_pulls_released_total", "Parked PULLs answered at once because the broker stepped down or cut its log.", f(&st.PullsReleased))
	m.CounterFunc("ferrymq_broker_pulls_overflow_total", "PULLs answered at once, empty, because too many were parked.", f(&st.PullsOverflow))
	m.GaugeFunc("ferrymq_broker_slave_lag_bytes", "Master: bytes the slave is behind.", func() float64 { return float64(b.Slave().LagBytes) })
	m.GaugeFunc("ferrymq_broker_slave_lag_seconds", "Master: time the slave has not been caught up.", func() float64 { return b.Slave().LagTime.Seconds() })
	m.GaugeFunc("ferrymq_broker_slave_connected", "Master: 1 if the slave is fetching.", func() float64 {
		if b.Slave().Connected {
			return 1
		}
		return 0
	})
}
