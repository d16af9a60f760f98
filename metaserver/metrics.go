package metaserver

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
