// Package prom exports the SDKs' metric events (package sdkmetrics) to
// Prometheus, as franz-go's plugin/kprom does for its client: the SDKs
// import no metrics library, and an application that uses Prometheus
// registers a Metrics and hands it to its clients.
//
//	m := prom.NewMetrics()
//	registry.MustRegister(m)
//	p, err := producer.New(sdk.MetaAddrs(addr), sdk.Metrics(m))
//
// The metrics (none has labels):
//
//	ferrymq_producer_send_duration_seconds  histogram: time from sending a SEND request
//	                                        (a batch of messages to one broker) to its
//	                                        answer, or to its failure, per request; the
//	                                        brokers' buckets (50 µs doubling to about 13 s)
//	ferrymq_producer_duplicates_total, _possible_duplicates_total, _out_of_order_total,
//	_retries_total, _renewals_total, _given_up_total
//	                                        the counters of producer.Stats
//
// A Metrics given to several clients adds them up. To tell producers apart
// in one registry, give each its own Metrics, registered with
// prometheus.WrapRegistererWith (prometheus.Labels{"producer": "orders"}).
package prom

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrymq/ferrymq/sdkmetrics"
)

// latencyBuckets are the send duration histogram's bucket bounds in
// seconds, exactly as the brokers export theirs (prometheus.
// ExponentialBuckets, as broker.LatencyBuckets): a query joining a
// producer's and a broker's le labels finds the same strings.
var latencyBuckets = prometheus.ExponentialBuckets(50e-6, 2, 19)

// Metrics is sdkmetrics.Hooks that keeps Prometheus metrics, and the
// prometheus.Collector that exports them.
type Metrics struct {
	sendDuration prometheus.Histogram
	counters     [sdkmetrics.NumCounters]prometheus.Counter
}

var _ sdkmetrics.Hooks = (*Metrics)(nil)

// counterInfo names each counter and says what it counts.
var counterInfo = [sdkmetrics.NumCounters]struct{ name, help string }{
	sdkmetrics.ProducerDuplicates: {"ferrymq_producer_duplicates_total",
		"Messages a broker answered DUPLICATE: a retry of a message already stored, not stored again."},
	sdkmetrics.ProducerPossibleDuplicates: {"ferrymq_producer_possible_duplicates_total",
		"Messages sent again without their stamp after an attempt of unknown outcome: they may be stored twice."},
	sdkmetrics.ProducerOutOfOrder: {"ferrymq_producer_out_of_order_total",
		"OUT_OF_ORDER_SEQUENCE answers (each took a new producer identity)."},
	sdkmetrics.ProducerRetries: {"ferrymq_producer_retries_total",
		"Messages sent again after a failed attempt."},
	sdkmetrics.ProducerRenewals: {"ferrymq_producer_renewals_total",
		"Producer identities taken after the first."},
	sdkmetrics.ProducerGivenUp: {"ferrymq_producer_given_up_total",
		"SEND requests abandoned without an answer because the group's master was replaced or the group stayed read-only."},
	sdkmetrics.ProducerTxnCommits: {"ferrymq_producer_txn_commits_total", "Transactions the producer committed."},
	sdkmetrics.ProducerTxnAborts:  {"ferrymq_producer_txn_aborts_total", "Transactions the producer aborted, or found aborted at its commit."},
	sdkmetrics.ProducerTxnChecks: {"ferrymq_producer_txn_checks_total",
		"Open transactions of earlier instances of the producer's identity that it asked its checker about."},
}

// NewMetrics returns metrics at zero, to register with a registry and give
// to clients (sdk.Metrics).
func NewMetrics() *Metrics {
	m := &Metrics{sendDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ferrymq_producer_send_duration_seconds",
		Help:    "Time from sending a SEND request (a batch of messages to one broker) to its answer or its failure, per request.",
		Buckets: latencyBuckets,
	})}
	for i, c := range counterInfo {
		m.counters[i] = prometheus.NewCounter(prometheus.CounterOpts{Name: c.name, Help: c.help})
	}
	return m
}

// Add adds n to counter c.
func (m *Metrics) Add(c sdkmetrics.Counter, n int64) {
	if c < sdkmetrics.NumCounters && n > 0 {
		m.counters[c].Add(float64(n))
	}
}

// Observe records one duration of histogram h.
func (m *Metrics) Observe(h sdkmetrics.Histogram, d time.Duration) {
	if h == sdkmetrics.ProducerSendDuration {
		m.sendDuration.Observe(max(d, 0).Seconds())
	}
}

// Describe sends every metric's description.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.sendDuration.Describe(ch)
	for _, c := range m.counters {
		c.Describe(ch)
	}
}

// Collect sends every metric.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.sendDuration.Collect(ch)
	for _, c := range m.counters {
		c.Collect(ch)
	}
}
