package metaserver

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrymq/ferrymq/metaserver/fsm"
)

// LatencyBuckets are the bounds, in seconds, of the metaserver's latency
// histograms: 50 µs doubling to about 13 s.
var LatencyBuckets = prometheus.ExponentialBuckets(50e-6, 2, 19)

func newRouteLookupHistogram() prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ferrymq_metaserver_route_lookup_duration_seconds",
		Help: "Time to answer a route lookup (from the cache, the registry, the leader, or by creating the topic), " +
			"including lookups answered with an error.",
		Buckets: LatencyBuckets,
	})
}

func (s *Server) observeRouteLookup(start time.Time) {
	s.routeLookups.Observe(time.Since(start).Seconds())
}

// RouteLookupDuration is the histogram of the route lookups this node
// answered, for a metrics registry.
func (s *Server) RouteLookupDuration() prometheus.Histogram { return s.routeLookups }

// txnMetrics count the decisions this node recorded and refused as leader.
type txnMetrics struct {
	decisions *prometheus.CounterVec // by outcome: commit, abort
	refused   *prometheus.CounterVec // by status
	expired   prometheus.Counter
	records   prometheus.GaugeFunc
}

func newTxnMetrics(f *fsm.FSM) txnMetrics {
	return txnMetrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferrymq_metaserver_txn_decisions_total",
			Help: "Transaction decisions this node recorded as leader (TXN_DECIDE), by outcome (commit or abort).",
		}, []string{"outcome"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferrymq_metaserver_txn_decisions_refused_total",
			Help: "TXN_DECIDE requests this node refused as leader, by status (e.g. STALE_GENERATION: the offsets committed with it were refused; BUSY: too many decisions held).",
		}, []string{"status"}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferrymq_metaserver_txn_decisions_expired_total",
			Help: "Transaction decisions this node expired as leader: some of their broker groups never reported done within 7 days.",
		}),
		records: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ferrymq_metaserver_txn_decisions",
			Help: "Transaction decisions the registry holds (decided, some broker group not yet reported done), as this node has applied them.",
		}, func() float64 { return float64(f.TxnCount()) }),
	}
}

// TxnCollectors are the transaction decisions' metrics, for a registry.
func (s *Server) TxnCollectors() []prometheus.Collector {
	return []prometheus.Collector{s.txnm.decisions, s.txnm.refused, s.txnm.expired, s.txnm.records}
}
