package console

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/testwait"
)

// sampled advances the console's fake clock by a sample's interval and
// waits for the sampler to take it.
func sampled(t *testing.T, e *env) {
	t.Helper()
	n := e.con.sampler.samples.Load()
	e.clock.Advance(sampleEvery)
	testwait.For(t, 10*time.Second, "a sample", func() bool { return e.con.sampler.samples.Load() > n })
}

// sampledEnd is g1's master's log end as the sampler last read it.
func sampledEnd(e *env) int64 {
	e.con.sampler.mu.Lock()
	defer e.con.sampler.mu.Unlock()
	return e.con.sampler.ends["g1"].end
}

// logEndOf is g1's master's log end as the registry last heard it.
func logEndOf(t *testing.T, e *env) int64 {
	return groupInfo(t, e, "g1").Last.LogEnd
}

var chartRe = regexp.MustCompile(`<figure class="chart" id="([^"]+)"><figcaption>[^<]*: <b>([^<]*)</b></figcaption>\s*(<svg[^>]*><polyline[^>]*points="([^"]*)"/></svg>)?`)

// charts returns the page's charts: id -> "last value" ("" without a line).
func charts(body string) map[string]string {
	out := map[string]string{}
	for _, m := range chartRe.FindAllStringSubmatch(body, -1) {
		if m[3] != "" {
			out[m[1]] = m[2]
		} else {
			out[m[1]] = ""
		}
	}
	return out
}

// The sampler takes a sample every 5 s of the console's clock: the broker
// groups' bytes stored a second (from their masters' log ends) and the
// consumer groups' lag, which the overview, broker groups and consumer
// groups pages draw as inline SVG lines.
func TestChartsSampleRatesAndLag(t *testing.T) {
	e := startEnv(t, envOpts{fakeClock: true, edit: unlimited})
	billingSetup(t, e, false) // lag 4 + 3
	b := e.browser(t)
	if c := charts(b.must(Prefix)); c["rate-g1"] != "" {
		t.Fatalf("a chart before any sample: %v", c)
	}
	sampled(t, e)
	first := sampledEnd(e)
	sendTo(t, e, "orders", 0, 5)
	testwait.For(t, 10*time.Second, "the master's heartbeat with the new log end", func() bool { return logEndOf(t, e) > first })
	sampled(t, e)
	grown := sampledEnd(e) - first
	if grown <= 0 {
		t.Fatalf("the sampled log end did not grow with the messages sent: %d", grown)
	}

	body := b.must(Prefix)
	c := charts(body)
	if want := fmt.Sprintf("%.0f B/s", float64(grown)/sampleEvery.Seconds()); c["rate-g1"] != want {
		t.Errorf("the overview's g1 chart shows %q, want %s (%d bytes in 5 s):\n%s", c["rate-g1"], want, grown, body)
	}
	if c["lag-billing"] != "12" {
		t.Errorf("the overview's billing lag chart shows %q, want 12 (4+5+3):\n%s", c["lag-billing"], body)
	}
	if strings.Contains(body, " style=") || strings.Contains(body, "<script>") {
		t.Error("the charts hold a style attribute or an inline script")
	}
	if c := charts(b.must(Prefix + "groups")); c["rate-g1"] == "" {
		t.Errorf("the broker groups page lacks g1's chart: %v", c)
	}
	if c := charts(b.must(Prefix + "consumers")); c["lag-billing"] != "12" {
		t.Errorf("the consumer groups page's billing chart: %v", c)
	}
	if c := charts(b.must(Prefix + "consumer?group=billing")); c["lag-billing"] != "12" {
		t.Errorf("billing's page's chart: %v", c)
	}

	// A series keeps the last 10 minutes: 121 samples at most.
	for range 130 {
		sampled(t, e)
	}
	e.con.sampler.mu.Lock()
	n := len(e.con.sampler.lags[lagKey("billing", "orders")].pts)
	e.con.sampler.mu.Unlock()
	if n != int(sampleWindow/sampleEvery)+1 {
		t.Errorf("after 132 samples the lag series holds %d, want %d", n, int(sampleWindow/sampleEvery)+1)
	}
}

// With authorization on and no cluster token the console samples nothing,
// and its charts say so.
func TestChartsWithoutClusterToken(t *testing.T) {
	e := startEnv(t, envOpts{auth: true, edit: func(c *Config) { c.ClusterToken = "" }})
	if e.con.sampler != nil {
		t.Fatal("a sampler without a cluster token")
	}
	b := e.browser(t)
	b.login(e.principal(t, "viewer", "describe"))
	if body := b.must(Prefix); !strings.Contains(body, "no cluster token") {
		t.Fatalf("the overview does not say why there are no charts:\n%s", body)
	}
}

// A consumer group's lag chart is drawn only for a principal that may
// describe or consume that group.
func TestLagChartsFollowPermissions(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	for _, c := range []struct {
		perms []string
		want  string
	}{
		{[]string{"describe"}, "lag-billing lag-other"},
		{[]string{"consume:orders:billing"}, "lag-billing"},
		{[]string{"consume:*:bill*"}, "lag-billing"},
		{[]string{"produce:orders"}, ""},
	} {
		perms, err := auth.ParsePermissions(c.perms)
		if err != nil {
			t.Fatal(err)
		}
		q := &query{c: e.con, s: &session{principal: auth.Principal{Name: "p", Permissions: perms}}, ctx: context.Background()}
		var ids []string
		for _, ch := range q.lagCharts([]string{"billing", "other"}) {
			ids = append(ids, ch.ID)
		}
		if got := strings.Join(ids, " "); got != c.want {
			t.Errorf("lag charts for %v: %q, want %q", c.perms, got, c.want)
		}
	}
}

// With authorization on the sampler calls with the cluster token. The
// registry's rules give the cluster principal no describe today, so the
// sample is refused: the charts say so, with the registry's word, rather
// than draw nothing silently.
func TestChartsWithClusterToken(t *testing.T) {
	e := startEnv(t, envOpts{auth: true, fakeClock: true, edit: unlimited})
	billingSetup(t, e, false) // lag 4 + 3
	sampled(t, e)
	sampled(t, e)
	if note := e.con.chartNote(); note != "" {
		t.Fatalf("with authorization on the sampler's reads with the cluster token failed: %s", note)
	}
	b := e.browser(t)
	b.login(e.principal(t, "viewer", "describe"))
	c := charts(b.must(Prefix))
	if v, ok := c["rate-g1"]; !ok || v == "" {
		t.Fatalf("the overview's chart of g1 has no line with authorization on: %v", c)
	}
}
