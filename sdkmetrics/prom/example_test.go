package prom_test

import (
	"log"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/sdk"
	"github.com/ferrymq/ferrymq/sdkmetrics/prom"
)

// ExampleNewMetrics gives a producer Prometheus metrics and a logger, and
// serves the metrics beside the application's own.
func ExampleNewMetrics() {
	m := prom.NewMetrics()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	p, err := producer.New(sdk.MetaAddrs("127.0.0.1:7101"), sdk.Metrics(m), sdk.Logger(slog.Default()))
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
}
