package prom_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/sdk"
	"github.com/ferrymq/ferrymq/sdkmetrics/prom"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestLatencyBoundsAreTheBrokers: the producer's send latency histogram has
// exactly the brokers' bucket bounds, so that its le labels are the same
// strings as a broker's (a query comparing or joining them by le works).
func TestLatencyBoundsAreTheBrokers(t *testing.T) {
	if !slices.Equal(prom.LatencyBuckets, broker.LatencyBuckets) {
		t.Fatalf("producer bounds %v\nbroker bounds   %v", prom.LatencyBuckets, broker.LatencyBuckets)
	}
}

// TestProducerMetrics: a registry gathering a producer's Metrics gets the
// send latency histogram, with one observation per SEND request, and the
// Stats counters as counters moving with Stats, all passing promlint, under
// the names they had when the producer exported them itself.
func TestProducerMetrics(t *testing.T) {
	c := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1"}, MetaEdit: testcluster.SteadyMeta, BrokerEdit: testcluster.SteadyBroker})
	c.Meta.CreateTopic(t, "measured", "g1", "g1")
	m := prom.NewMetrics()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	p, err := producer.New(sdk.MetaAddrs(c.MetaAddr()), sdk.Metrics(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	const sends = 5
	for i := range sends {
		if _, err := p.Send(context.Background(), &producer.Message{Topic: "measured", Body: fmt.Appendf(nil, "m%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
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
	if h == nil || h.GetType() != dto.MetricType_HISTOGRAM || len(h.Metric) != 1 || len(h.Metric[0].GetLabel()) != 0 {
		t.Fatalf("no send duration histogram without labels: %v", h)
	}
	hist := h.Metric[0].GetHistogram()
	// Synchronous sends, one at a time: each is one request (a retry would
	// be another, with Stats().Retries counting it).
	st := p.Stats()
	if n := hist.GetSampleCount(); n < sends || n > uint64(sends+st.Retries) || hist.GetSampleSum() <= 0 {
		t.Errorf("%d sends made %d observations summing %gs; want %d (plus retries) and some time", sends, n, hist.GetSampleSum(), sends)
	}
	if b := hist.GetBucket(); len(b) != 19 || b[0].GetUpperBound() != 50e-6 || b[len(b)-1].GetCumulativeCount() > hist.GetSampleCount() {
		t.Errorf("buckets %v: want 19, from 50 µs, none above the count", b)
	}
	for name, want := range map[string]int64{
		"duplicates": st.Duplicates, "possible_duplicates": st.PossibleDuplicates, "out_of_order": st.OutOfOrder,
		"retries": st.Retries, "renewals": st.Renewals, "given_up": st.GivenUp,
	} {
		f := got["ferrymq_producer_"+name+"_total"]
		if f == nil || f.GetType() != dto.MetricType_COUNTER || len(f.Metric) != 1 {
			t.Errorf("ferrymq_producer_%s_total: %v, want a counter", name, f)
			continue
		}
		if v := f.Metric[0].GetCounter().GetValue(); v != float64(want) {
			t.Errorf("ferrymq_producer_%s_total is %v, Stats says %d", name, v, want)
		}
	}
}
