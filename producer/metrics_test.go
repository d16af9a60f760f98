package producer

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"github.com/ferrymq/ferrymq/broker"
)

// TestLatencyBoundsAreTheBrokers: the producer's send latency histogram has
// exactly the brokers' bucket bounds, so that its le labels are the same
// strings as a broker's (a query comparing or joining them by le works).
func TestLatencyBoundsAreTheBrokers(t *testing.T) {
	var h latencyHistogram
	cum, _, _ := h.snapshot()
	var got []float64
	for le := range cum {
		got = append(got, le)
	}
	slices.Sort(got)
	if !slices.Equal(got, broker.LatencyBuckets) {
		t.Fatalf("producer bounds %v\nbroker bounds   %v", got, broker.LatencyBuckets)
	}
}

func TestLatencyBucketBounds(t *testing.T) {
	last := latencyBase << (latencyBuckets - 1) // about 13 s
	for _, c := range []struct {
		d    time.Duration
		want int
	}{
		{-time.Second, 0}, {0, 0}, {time.Nanosecond, 0}, {latencyBase, 0},
		{latencyBase + 1, 1}, {2 * latencyBase, 1}, {2*latencyBase + 1, 2},
		{time.Millisecond, 5}, // (800 µs, 1.6 ms]
		{last, latencyBuckets - 1}, {last + 1, latencyBuckets}, {time.Hour, latencyBuckets},
	} {
		if got := bucketOf(c.d); got != c.want {
			t.Errorf("bucketOf(%v) = %d, want %d", c.d, got, c.want)
		}
	}
	var h latencyHistogram
	for _, d := range []time.Duration{30 * time.Microsecond, 70 * time.Microsecond, 70 * time.Microsecond, time.Hour} {
		h.observe(d)
	}
	cum, count, sum := h.snapshot()
	if count != 4 || cum[50e-6] != 1 || cum[100e-6] != 3 || cum[broker.LatencyBuckets[latencyBuckets-1]] != 3 || len(cum) != latencyBuckets {
		t.Errorf("snapshot: count %d, buckets %v; want 4 observations, 1 up to 50 µs, 3 up to 100 µs and up to the last bound", count, cum)
	}
	if want := (time.Hour + 170*time.Microsecond).Seconds(); sum != want {
		t.Errorf("sum %v, want %v", sum, want)
	}
}

// TestCollector: a registry gathering a producer's collector gets the send
// latency histogram, with one observation per SEND request, and the Stats
// counters as counters, all passing promlint.
func TestCollector(t *testing.T) {
	c := start(t, false, "g1")
	c.Meta.CreateTopic(t, "measured", "g1", "g1")
	p := newProducer(t, c)
	const sends = 5
	for i := range sends {
		if _, err := p.Send(context.Background(), &Message{Topic: "measured", Body: fmt.Appendf(nil, "m%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(p.Collector())
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if problems, err := promlint.NewWithMetricFamilies(families).Lint(); err != nil || len(problems) > 0 {
		t.Fatalf("promlint: %v %+v", err, problems)
	}
	got := map[string]*dto.MetricFamily{}
	for _, f := range families {
		got[f.GetName()] = f
	}
	h := got["ferrymq_producer_send_duration_seconds"]
	if h == nil || h.GetType() != dto.MetricType_HISTOGRAM || len(h.Metric) != 1 {
		t.Fatalf("no send duration histogram: %v", h)
	}
	hist := h.Metric[0].GetHistogram()
	// Synchronous sends, one at a time: each is one request (a retry would
	// be another, with Stats().Retries counting it).
	if n := hist.GetSampleCount(); n < sends || n > uint64(sends+p.Stats().Retries) || hist.GetSampleSum() <= 0 {
		t.Errorf("%d sends made %d observations summing %gs; want %d (plus retries) and some time", sends, n, hist.GetSampleSum(), sends)
	}
	if b := hist.GetBucket(); len(b) != latencyBuckets || b[0].GetUpperBound() != 50e-6 || b[len(b)-1].GetCumulativeCount() > hist.GetSampleCount() {
		t.Errorf("buckets %v: want %d, from 50 µs, none above the count", b, latencyBuckets)
	}
	for _, name := range []string{"duplicates", "possible_duplicates", "out_of_order", "retries", "renewals", "given_up"} {
		if f := got["ferrymq_producer_"+name+"_total"]; f == nil || f.GetType() != dto.MetricType_COUNTER {
			t.Errorf("ferrymq_producer_%s_total: %v, want a counter", name, f)
		}
	}
}
