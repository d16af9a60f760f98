package console

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
)

// BenchmarkListPages renders every list page of a registry with 1,000
// topics and 5,000 consumer groups (issue 31's aim: each within 300 ms at
// the 95th percentile), the first page and the last, as one session, and
// reports each page's p50 and p95 in milliseconds. The cluster is built
// once (about 20 s); -benchtime sets the renders per page.
//
//	go test -run '^$' -bench BenchmarkListPages -benchtime 40x ./console
func BenchmarkListPages(b *testing.B) {
	e := startEnv(b, envOpts{edit: func(c *Config) { c.RequestsPerSecond = 1e6 }})
	ctx := context.Background()
	const topics, groups = 1000, 5000
	start := time.Now()
	for i := range topics {
		if _, err := e.admin.CreateTopic(ctx, api.CreateTopicRequest{Name: fmt.Sprintf("topic-%04d", i), Queues: 4}); err != nil {
			b.Fatal(err)
		}
	}
	for i := range groups {
		req := api.ResetOffsetsRequest{Group: fmt.Sprintf("group-%04d", i), Create: true,
			Offsets: []api.QueueOffset{{Topic: fmt.Sprintf("topic-%04d", i%topics), Queue: 0, Offset: 0}}}
		if _, err := e.admin.ResetOffsets(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("%d topics and %d consumer groups made in %v", topics, groups, time.Since(start).Round(time.Millisecond))
	hc := &http.Client{Timeout: 30 * time.Second}
	pages := []string{Prefix, Prefix + "groups", Prefix + "topics", Prefix + "topics?page=20", Prefix + "consumers",
		Prefix + "consumers?page=100", Prefix + "topics?q=topic-09"}
	// One session for all: the first answer's cookie.
	var cookie *http.Cookie
	times := map[string][]time.Duration{}
	for b.Loop() { // the cluster is built once: b.Loop calls this function once
		for _, p := range pages {
			req, _ := http.NewRequest(http.MethodGet, e.srv.URL+p, nil)
			if cookie != nil {
				req.AddCookie(cookie)
			}
			t0 := time.Now()
			resp, err := hc.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			times[p] = append(times[p], time.Since(t0))
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("%s: status %d", p, resp.StatusCode)
			}
			for _, c := range resp.Cookies() {
				if c.Name == cookieName {
					cookie = c
				}
			}
		}
	}
	worst := 0.0
	for _, p := range pages {
		d := times[p]
		slices.Sort(d)
		q := func(f float64) float64 { return float64(d[int(f*float64(len(d)-1))]) / float64(time.Millisecond) }
		worst = max(worst, q(0.95))
		fmt.Printf("%-32s p50 %6.1f ms  p95 %6.1f ms  max %6.1f ms  (%d renders)\n", p, q(0.5), q(0.95), q(1), len(d))
	}
	b.ReportMetric(worst, "worst-p95-ms")
}
