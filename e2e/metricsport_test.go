package e2e

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMetricsPortThroughProcesses: the local cluster with TLS and
// authorization (FERRY_TLS=1 FERRY_AUTH=1, real processes). Every server's
// metrics port serves HTTPS; /healthz answers without credentials; /metrics
// answers 401 without them and the metrics with the bootstrap admin's
// token (the harness's scrape); the broker and metaserver metrics the
// other tests read are there.
func TestMetricsPortThroughProcesses(t *testing.T) {
	c := startLocalCluster(t, "FERRY_TLS=1", "FERRY_AUTH=1")
	ports := map[string]int{"m1": c.base + 21, "m2": c.base + 22, "m3": c.base + 23}
	for _, b := range []string{"g1-master", "g1-slave", "g2-master", "g2-slave"} {
		ports[b] = c.brokerPort(b, portMetrics)
	}
	// A client with the CA only: no certificate, no token.
	cfg := c.tls.Clone()
	cfg.Certificates = nil
	anon := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	defer anon.CloseIdleConnections()
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := anon.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for name, port := range ports {
		base := "https://127.0.0.1:" + strconv.Itoa(port)
		if code, body := get(base + "/healthz"); code != http.StatusOK {
			t.Errorf("%s /healthz over HTTPS without credentials: %d %q, want 200", name, code, body)
		}
		if code, body := get(base + "/metrics"); code != http.StatusUnauthorized {
			t.Errorf("%s /metrics without credentials: %d %q, want 401", name, code, body)
		}
		m, ok := c.readMetrics(port)
		if !ok || m["go_goroutines"] == 0 {
			t.Errorf("%s /metrics with the admin's token over HTTPS: %v", name, ok)
		}
	}
	if m, ok := c.metrics("g1-master"); !ok || m["ferrymq_broker_is_master"] != 1 {
		t.Errorf("g1-master's metrics through the harness: ok %v, is_master %v", ok, m["ferrymq_broker_is_master"])
	}
	// Plain HTTP gets no metrics.
	if resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(ports["m1"]) + "/metrics"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "go_goroutines") {
			t.Error("m1 served its metrics over plain HTTP")
		}
	}
}
