package producer

import (
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The send latency histogram's buckets: 50 µs doubling to about 13 s, the
// brokers' and metaservers' buckets.
const (
	latencyBuckets = 19
	latencyBase    = 50 * time.Microsecond
)

// latencyBounds are the buckets' upper bounds in seconds, exactly as the
// brokers export them (prometheus.ExponentialBuckets, as broker.LatencyBuckets):
// a query joining the producer's and a broker's le labels finds the same
// strings (1.6384, not 1.6383999999999999 from converting latencyBase<<15).
var latencyBounds = prometheus.ExponentialBuckets(latencyBase.Seconds(), 2, latencyBuckets)

// latencyHistogram is a histogram of durations in fixed buckets, made of
// atomic counters: observe takes no lock and allocates nothing, and the
// zero value is ready.
type latencyHistogram struct {
	buckets [latencyBuckets]atomic.Uint64 // per bucket, not cumulative; a duration past the last is only in count
	count   atomic.Uint64
	sum     atomic.Int64 // nanoseconds
}

// bucketOf is the index of the bucket d falls in (latencyBuckets: past the
// last): bucket i holds durations in (base·2^(i-1), base·2^i], bucket 0
// those up to base.
func bucketOf(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return min(bits.Len64(uint64((d-1)/latencyBase)), latencyBuckets)
}

func (h *latencyHistogram) observe(d time.Duration) {
	if i := bucketOf(d); i < latencyBuckets {
		h.buckets[i].Add(1)
	}
	h.sum.Add(int64(max(d, 0)))
	h.count.Add(1)
}

// snapshot returns the cumulative bucket counts by upper bound in seconds,
// the count and the sum in seconds. Observations running meanwhile may be
// in a bucket and not yet in count: count is never below the buckets.
func (h *latencyHistogram) snapshot() (map[float64]uint64, uint64, float64) {
	cum := make(map[float64]uint64, latencyBuckets)
	var n uint64
	for i := range h.buckets {
		n += h.buckets[i].Load()
		cum[latencyBounds[i]] = n
	}
	count := max(h.count.Load(), n)
	return cum, count, time.Duration(h.sum.Load()).Seconds()
}

// Collector returns a prometheus.Collector of the producer's metrics; see
// NewCollector.
func (c *Client) Collector() prometheus.Collector { return NewCollector(c) }

// NewCollector returns a prometheus.Collector of c's metrics, for an
// application to register with its own registry:
//
//	ferrymq_producer_send_duration_seconds  histogram: time from sending a SEND request
//	                                        (a batch of messages to one broker) to its
//	                                        answer, or to its failure, per request
//	ferrymq_producer_duplicates_total, _possible_duplicates_total, _out_of_order_total,
//	_retries_total, _renewals_total, _given_up_total
//	                                        the counters of Stats
//
// The metrics have no labels: to register several producers in one
// registry, give each its own with prometheus.WrapRegistererWith, e.g.
// prometheus.Labels{"producer": "orders"}.
func NewCollector(c *Client) prometheus.Collector { return collector{c} }

type collector struct{ c *Client }

var (
	sendDurationDesc = prometheus.NewDesc("ferrymq_producer_send_duration_seconds",
		"Time from sending a SEND request (a batch of messages to one broker) to its answer or its failure, per request.", nil, nil)
	counterDescs = []struct {
		desc *prometheus.Desc
		get  func(Stats) int64
	}{
		{prometheus.NewDesc("ferrymq_producer_duplicates_total",
			"Messages a broker answered DUPLICATE: a retry of a message already stored, not stored again.", nil, nil),
			func(s Stats) int64 { return s.Duplicates }},
		{prometheus.NewDesc("ferrymq_producer_possible_duplicates_total",
			"Messages sent again without their stamp after an attempt of unknown outcome: they may be stored twice.", nil, nil),
			func(s Stats) int64 { return s.PossibleDuplicates }},
		{prometheus.NewDesc("ferrymq_producer_out_of_order_total",
			"OUT_OF_ORDER_SEQUENCE answers (each took a new producer identity).", nil, nil),
			func(s Stats) int64 { return s.OutOfOrder }},
		{prometheus.NewDesc("ferrymq_producer_retries_total",
			"Messages sent again after a failed attempt.", nil, nil),
			func(s Stats) int64 { return s.Retries }},
		{prometheus.NewDesc("ferrymq_producer_renewals_total",
			"Producer identities taken after the first.", nil, nil),
			func(s Stats) int64 { return s.Renewals }},
		{prometheus.NewDesc("ferrymq_producer_given_up_total",
			"SEND requests abandoned without an answer because the group's master was replaced or the group stayed read-only.", nil, nil),
			func(s Stats) int64 { return s.GivenUp }},
	}
)

func (col collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sendDurationDesc
	for _, d := range counterDescs {
		ch <- d.desc
	}
}

func (col collector) Collect(ch chan<- prometheus.Metric) {
	buckets, count, sum := col.c.stats.sendLatency.snapshot()
	ch <- prometheus.MustNewConstHistogram(sendDurationDesc, count, sum, buckets)
	st := col.c.Stats()
	for _, d := range counterDescs {
		ch <- prometheus.MustNewConstMetric(d.desc, prometheus.CounterValue, float64(d.get(st)))
	}
}
