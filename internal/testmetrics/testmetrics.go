// Package testmetrics reads Prometheus metrics in tests: what a gatherer
// holds, by family name, and a metric's labels.
//
// It is imported only from tests (an import rule in internal/lint says so).
package testmetrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Gather is what g holds, by family name; an error gathering fails tb.
func Gather(tb testing.TB, g prometheus.Gatherer) map[string]*dto.MetricFamily {
	tb.Helper()
	families, err := g.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range families {
		out[f.GetName()] = f
	}
	return out
}

// Labels is a metric's labels as a map.
func Labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}
