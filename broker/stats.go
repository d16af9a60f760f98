package broker

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// LatencyBuckets are the bounds, in seconds, of the broker's latency
// histograms: 50 µs doubling to about 13 s.
var LatencyBuckets = prometheus.ExponentialBuckets(50e-6, 2, 19)

// Stats are the broker's counters, read by the metrics endpoint. The parts
// add to them; nothing reads them on the hot path. The histograms are made
// by New (nil in a Stats made otherwise).
type Stats struct {
	MessagesIn   atomic.Int64 // messages stored
	BytesIn      atomic.Int64 // message bytes stored
	Refused      atomic.Int64 // messages answered with a non-OK status
	NoRoute      atomic.Int64 // of them, NO_ROUTE: the route cache did not route the queue here
	HighAcked    atomic.Int64 // HIGH messages confirmed by the slave
	HighTimeouts atomic.Int64 // HIGH messages answered SLAVE_SYNC_TIMEOUT (or LEASE_LOST when stepping down)

	// SendDuration observes, once per SEND request (not per message), the
	// time from reading it to answering it; its count is the requests
	// answered.
	SendDuration prometheus.Histogram
	// FlushDuration observes every commit log sync.
	FlushDuration prometheus.Histogram

	// Failover.
	LeaseLost      atomic.Int64 // stored messages answered LEASE_LOST: the lease ran out before the answer
	AcksAfterLease atomic.Int64 // OK or DUPLICATE answers handed to the socket whole only after the lease ended (sendBatch.Sent)
	Fenced         atomic.Int64 // SEND batches refused because a newer epoch was seen
	Takeovers      atomic.Int64 // times this broker took over as master
	Truncations    atomic.Int64 // times this broker cut its log on rejoining as slave
	TruncatedBytes atomic.Int64 // bytes cut
	HAFetchRefused atomic.Int64 // HA fetches refused: not this group's slave in this epoch
	HADiverged     atomic.Int64 // HA fetches refused LOG_DIVERGED: the slave's log is not a prefix of this master's
	HAAnswers      atomic.Int64 // HA fetches answered with log bytes (parked ones once data came)
	HABytes        atomic.Int64 // log bytes sent in them
	HAAcks         atomic.Int64 // HA_ACKs taken from the slave
	Resyncs        atomic.Int64 // times this broker set its log aside and copied it again (an operator's order)
	// A failover's cut tail, appended again through the new master
	// (recover.go).
	Recovered             atomic.Int64 // as master: recovered records appended
	RecoverDuplicates     atomic.Int64 // as master: recovered records it held already (by stamp or message id)
	TailsHandedOver       atomic.Int64 // as former master: cut tails handed to the new master whole
	TailRecordsHandedOver atomic.Int64 // as former master: records of those tails

	// Transactions (txns.go).
	TxnCommits  atomic.Int64 // transactions committed (decision marks written by this broker)
	TxnAborts   atomic.Int64 // transactions aborted, timeouts included
	TxnTimeouts atomic.Int64 // of them, open past the timeout
	TxnRefused  atomic.Int64 // messages refused TXN_LIMIT
	TxnOpen     atomic.Int64 // open transactions at the last sweep
	TxnOldest   atomic.Int64 // when the oldest of them began, unix milliseconds (0: none)

	// Delayed messages (delayed.go).
	DelayedIn          atomic.Int64 // delayed messages stored pending
	DelayedFired       atomic.Int64 // released into their target queues
	DelayedCancelled   atomic.Int64 // cancelled by a client
	DelayedMoved       atomic.Int64 // appended again before retention deleted their segment
	DelayedUnreadable  atomic.Int64 // pending records that could not be read when due (cancelled, counted here)
	DelayedRefused     atomic.Int64 // delayed messages refused: beyond the maximum delay or over a quota
	DelayedLateness    prometheus.Histogram
	DelayedFireBatches atomic.Int64 // appends of released messages

	// Long-polling PULL (longpoll.go).
	PullsParked   atomic.Int64 // PULLs parked now (a gauge)
	PullWakeups   atomic.Int64 // parked PULLs answered because their queue grew
	PullsExpired  atomic.Int64 // parked PULLs answered when their wait passed
	PullsReleased atomic.Int64 // parked PULLs answered at a step-down or a truncation
	PullsOverflow atomic.Int64 // PULLs answered at once, empty, because too many were parked
}

// initHistograms makes the histograms; New calls it before anything
// observes.
func (s *Stats) initHistograms() {
	s.SendDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ferrymq_broker_send_duration_seconds",
		Help:    "Time from reading a SEND request to answering it, per request (a batch of messages).",
		Buckets: LatencyBuckets,
	})
	s.DelayedLateness = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ferrymq_broker_delayed_lateness_seconds",
		Help:    "Time from a delayed message's due time to its release into its target queue (never negative: none is released early).",
		Buckets: LatencyBuckets,
	})
	s.FlushDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ferrymq_broker_flush_duration_seconds",
		Help:    "Time of a commit log sync (fdatasync of the segments written since the last one).",
		Buckets: LatencyBuckets,
	})
}

// observeFlush is the commit log's OnSync.
func (s *Stats) observeFlush(d time.Duration) { s.FlushDuration.Observe(d.Seconds()) }
