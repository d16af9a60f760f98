package metaserverd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"github.com/ferrymq/ferrymq/cmd/internal/brokerd"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testmetrics"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/sdk"
	"github.com/ferrymq/ferrymq/sdkmetrics/prom"
)

// syncBuffer is a server's stderr, read while it writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// server is a metaserverd or brokerd Run in the test's process.
type server struct {
	name   string
	stderr *syncBuffer
}

// run starts run(args) until the test ends; Cleanup cancels it and fails
// the test if it returns an error or logs an error while stopping.
func run(t *testing.T, name string, fn func(context.Context, []string, io.Writer) error, args ...string) *server {
	t.Helper()
	s := &server{name: name, stderr: &syncBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx, args, s.stderr) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: Run returned %v", name, err)
		}
		// A clean stop logs no error.
		out := s.stderr.String()
		i := strings.Index(out, "shutting down")
		if i < 0 {
			t.Errorf("%s did not log shutting down:\n%s", name, out)
			return
		}
		for _, l := range strings.Split(out[i:], "\n") {
			if strings.Contains(l, "[ERROR]") {
				t.Errorf("%s logged while stopping: %s", name, l)
			}
		}
	})
	return s
}

// logged waits for a log line matching re and returns its first group.
func (s *server) logged(t *testing.T, re string) string {
	t.Helper()
	rx := regexp.MustCompile(re)
	var got string
	testwait.For(t, 20*time.Second, s.name+" to log "+re, func() bool {
		if m := rx.FindStringSubmatch(s.stderr.String()); m != nil {
			got = m[1]
			return true
		}
		return false
	})
	return got
}

// scrape reads a /metrics endpoint in the text format.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s/metrics: %s", addr, resp.Status)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s/metrics: %v", addr, err)
	}
	return fams
}

func value(f *dto.MetricFamily, labels map[string]string) (float64, bool) {
	for _, m := range f.GetMetric() {
		l := testmetrics.Labels(m)
		match := true
		for k, v := range labels {
			match = match && l[k] == v
		}
		if match {
			switch {
			case m.Gauge != nil:
				return m.GetGauge().GetValue(), true
			case m.Counter != nil:
				return m.GetCounter().GetValue(), true
			case m.Untyped != nil:
				return m.GetUntyped().GetValue(), true
			}
		}
	}
	return 0, false
}

// liveCluster is one metaserver and a broker group (master and slave) run
// by the programs' Run, with a topic, messages sent by the producer SDK and
// a consumer group's commit: every metric the servers export has series.
type liveCluster struct {
	meta, master, slave string // metrics addresses
	producer            *producer.Client
	producerMetrics     *prom.Metrics // the producer's metrics (sdkmetrics/prom)
}

const (
	liveGroup    = "g1"
	liveTopic    = "orders"
	liveQueues   = 2
	liveConsumer = "billing"
)

func startLive(t *testing.T) *liveCluster {
	t.Helper()
	rpc, raft := testcluster.FreeAddr(t), testcluster.FreeAddr(t)
	ms := run(t, "metaserver", Run, "-id", "m1", "-dir", t.TempDir(), "-rpc-addr", rpc, "-raft-addr", raft,
		"-peers", fmt.Sprintf("m1=%s/%s", raft, rpc), "-metrics-addr", "127.0.0.1:0")
	lc := &liveCluster{meta: ms.logged(t, `serving metrics: addr=(\S+)`)}
	ms.logged(t, `(metaserver running)`)

	broker := func(role string) *server {
		return run(t, liveGroup+"-"+role, brokerd.Run, "-id", liveGroup+"-"+role, "-group", liveGroup, "-role", role,
			"-dir", t.TempDir(), "-addr", "127.0.0.1:0", "-ha-addr", "127.0.0.1:0", "-meta", rpc,
			"-heartbeat", "200ms", "-metrics-addr", "127.0.0.1:0")
	}
	master := broker("master")
	lc.master = master.logged(t, `serving metrics: addr=(\S+)`)
	// The first broker of a group to register is its master: the slave
	// starts once the master took over.
	master.logged(t, `(took over as master)`)
	slave := broker("slave")
	lc.slave = slave.logged(t, `serving metrics: addr=(\S+)`)
	testwait.For(t, 30*time.Second, "the master to see its slave and the group writable", func() bool {
		mf, gf := scrape(t, lc.master), scrape(t, lc.meta)
		c, _ := value(mf["ferrymq_broker_slave_connected"], nil)
		w, _ := value(gf["ferrymq_metaserver_group_writable"], map[string]string{"group": liveGroup})
		return c == 1 && w == 1
	})

	cl, err := client.New(client.Config{Addrs: []string{rpc}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	ctx := context.Background()
	if _, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: liveTopic, Queues: liveQueues, Groups: []string{liveGroup, liveGroup}}); err != nil {
		t.Fatal(err)
	}
	lc.producerMetrics = prom.NewMetrics()
	if lc.producer, err = producer.New(sdk.MetaAddrs(rpc), sdk.Metrics(lc.producerMetrics)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.producer.Close() })
	for i := range 10 {
		if _, err := lc.producer.Send(ctx, &producer.Message{Topic: liveTopic, Body: fmt.Appendf(nil, "m%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	reply, err := cl.ConsumerHeartbeat(ctx, api.ConsumerHeartbeat{Group: liveConsumer, Member: "c1", Topics: []string{liveTopic}})
	if err != nil {
		t.Fatal(err)
	}
	commit := api.CommitRequest{Group: liveConsumer, Member: "c1", Generation: reply.Generation}
	for _, a := range reply.Assignment {
		commit.Offsets = append(commit.Offsets, api.QueueOffset{Topic: a.Topic, Queue: a.Queue, Offset: 1})
	}
	if _, err := cl.CommitOffsets(ctx, commit); err != nil {
		t.Fatal(err)
	}
	return lc
}

// allowedLabels lists, per metric with labels, its label names; every other
// ferrymq metric has none.
var allowedLabels = map[string][]string{
	"ferrymq_broker_role":                          {"role"},
	"ferrymq_broker_queue_end_offset":              {"queue", "topic"},
	"ferrymq_metaserver_raft_state":                {"state"},
	"ferrymq_metaserver_group_writable":            {"group"},
	"ferrymq_metaserver_group_readonly_reason":     {"group", "reason"},
	"ferrymq_metaserver_group_epoch":               {"group"},
	"ferrymq_metaserver_group_sync_set_size":       {"group"},
	"ferrymq_metaserver_group_min_insync":          {"group"},
	"ferrymq_metaserver_group_high_allowed":        {"group"},
	"ferrymq_metaserver_failover_refusals_total":   {"reason"},
	"ferrymq_metaserver_consumer_group_members":    {"group"},
	"ferrymq_metaserver_consumer_group_generation": {"group"},
	"ferrymq_metaserver_consumer_queues_waiting":   {"group"},
	"ferrymq_metaserver_consumer_committed_offset": {"group", "queue", "topic"},
	"ferrymq_broker_replica_lag_bytes":             {"replica"},
	"ferrymq_broker_replica_lag_seconds":           {"replica"},
	"ferrymq_broker_replica_in_sync":               {"replica"},
	"ferrymq_broker_delayed_pending":               {"due"},
}

// labelValues are the values a label may take: a fixed set, or the names of
// the entities the test configured.
func labelValues(metric, label string) []string {
	switch label {
	case "role":
		return []string{"master", "slave", "broken"}
	case "due":
		return []string{"1m", "1h", "1d", "later"}
	case "state":
		return []string{"Follower", "Candidate", "Leader", "Shutdown"}
	case "replica":
		return []string{liveGroup + "-slave"}
	case "topic":
		return []string{liveTopic}
	case "queue":
		var qs []string
		for q := range liveQueues {
			qs = append(qs, fmt.Sprint(q))
		}
		return qs
	case "group":
		if strings.HasPrefix(metric, "ferrymq_metaserver_consumer_") {
			return []string{liveConsumer}
		}
		return []string{liveGroup}
	case "reason":
		if metric == "ferrymq_metaserver_group_readonly_reason" {
			return []string{"heartbeat-lost", "slave-lag", "admin"}
		}
		return []string{"failover-off", "no-slave", "slave-not-alive", "admin", "slave-broken", "slave-not-in-epoch",
			"slave-missing-acknowledged", "slave-too-far-behind", "slave-not-in-sync-set", "sync-set-not-heard",
			"no-eligible-slave", "waiting-for-margin", "apply-failed"}
	}
	return nil
}

var metricName = regexp.MustCompile(`^ferrymq_(broker|metaserver|producer)_[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// lintFamilies checks the ferrymq families of one endpoint: HELP, a TYPE
// that fits the name, promlint, and labels from the fixed lists. It
// returns the names it saw.
func lintFamilies(t *testing.T, endpoint, prefix string, fams map[string]*dto.MetricFamily) []string {
	t.Helper()
	var names []string
	var ours []*dto.MetricFamily
	for name, f := range fams {
		if !strings.HasPrefix(name, "ferrymq_") {
			continue
		}
		names = append(names, name)
		ours = append(ours, f)
		if !strings.HasPrefix(name, prefix) || !metricName.MatchString(name) {
			t.Errorf("%s: %s: want a name %s<snake_case>", endpoint, name, prefix)
		}
		if strings.TrimSpace(f.GetHelp()) == "" {
			t.Errorf("%s: %s has no HELP", endpoint, name)
		}
		total, seconds := strings.HasSuffix(name, "_total"), strings.HasSuffix(name, "_seconds")
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			if !total {
				t.Errorf("%s: the counter %s does not end in _total", endpoint, name)
			}
		case dto.MetricType_GAUGE:
			if total {
				t.Errorf("%s: the gauge %s ends in _total", endpoint, name)
			}
		case dto.MetricType_HISTOGRAM:
			if !seconds {
				t.Errorf("%s: the histogram %s does not end in _seconds", endpoint, name)
			}
			for _, m := range f.GetMetric() {
				b := m.GetHistogram().GetBucket()
				if len(b) < 10 || b[0].GetUpperBound() > 100e-6 || b[len(b)-1].GetUpperBound() < 10 {
					t.Errorf("%s: %s has buckets %v; want from about 50 µs to about 10 s", endpoint, name, b)
				}
			}
		default:
			t.Errorf("%s: %s has TYPE %v; want counter, gauge or histogram", endpoint, name, f.GetType())
		}
		want := allowedLabels[name]
		for _, m := range f.GetMetric() {
			var got []string
			for _, l := range m.GetLabel() {
				got = append(got, l.GetName())
				if vs := labelValues(name, l.GetName()); !slices.Contains(vs, l.GetValue()) {
					t.Errorf("%s: %s{%s=%q}: the value is not one of %v", endpoint, name, l.GetName(), l.GetValue(), vs)
				}
			}
			sort.Strings(got)
			if !slices.Equal(got, want) {
				t.Errorf("%s: %s has labels %v, want %v", endpoint, name, got, want)
			}
		}
	}
	problems, err := promlint.NewWithMetricFamilies(ours).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: promlint: %s: %s", endpoint, p.Metric, p.Text)
	}
	return names
}

// TestMetricsEndpoints runs a metaserver and a broker group with their
// programs' Run, scrapes their /metrics like Prometheus, and checks every
// ferrymq metric: HELP, a TYPE that fits its name (counters end in _total,
// histograms are _seconds with buckets from about 50 µs to 10 s), names in
// snake case under the server's prefix, label names from a fixed list and
// label values from a finite set or the names of the topic, queues and
// groups the test made: no label takes a reason list, an error or any other
// value that changes with the state. Then it checks that every metric the
// Grafana dashboard and the Prometheus alerts in deploy/ use is one a
// server or the producer SDK exports. At the end every server stops as on
// SIGTERM and must log no error while stopping.
func TestMetricsEndpoints(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a metaserver and two brokers")
	}
	lc := startLive(t)
	exported := map[string]bool{}
	for _, e := range []struct{ name, addr, prefix string }{
		{"metaserver", lc.meta, "ferrymq_metaserver_"},
		{"master", lc.master, "ferrymq_broker_"},
		{"slave", lc.slave, "ferrymq_broker_"},
	} {
		fams := scrape(t, e.addr)
		names := lintFamilies(t, e.name, e.prefix, fams)
		if len(names) < 10 {
			t.Fatalf("%s exports only %v", e.name, names)
		}
		for _, n := range names {
			exported[n] = true
		}
		if e.name == "slave" {
			for _, n := range []string{"ferrymq_broker_slave_lag_bytes", "ferrymq_broker_slave_lag_seconds", "ferrymq_broker_slave_connected",
				"ferrymq_broker_replica_lag_bytes", "ferrymq_broker_replica_lag_seconds", "ferrymq_broker_replica_in_sync", "ferrymq_broker_takes_high"} {
				if fams[n] != nil {
					t.Errorf("the slave exports the master-only %s", n)
				}
			}
		}
	}
	// The producer SDK's metrics, as an application registers them.
	reg := prometheus.NewRegistry()
	reg.MustRegister(lc.producerMetrics)
	for _, n := range lintFamilies(t, "producer", "ferrymq_producer_", testmetrics.Gather(t, reg)) {
		exported[n] = true
	}
	// What the live cluster shows: a sample of the values, not only names.
	mf := scrape(t, lc.meta)
	if v, ok := value(mf["ferrymq_metaserver_consumer_committed_offset"], map[string]string{"group": liveConsumer, "topic": liveTopic}); !ok || v != 1 {
		t.Errorf("consumer committed offset %v (%v), want 1", v, ok)
	}
	if v, ok := value(mf["ferrymq_metaserver_raft_state"], map[string]string{"state": "Leader"}); !ok || v != 1 {
		t.Errorf("the lone metaserver's raft_state{state=Leader} is %v (%v)", v, ok)
	}

	t.Run("deploy", func(t *testing.T) { checkDeploy(t, exported) })
}

// usedMetric is a ferrymq metric name in a PromQL expression.
var usedMetric = regexp.MustCompile(`ferrymq_[a-z_]+`)

// metricsOf returns the metric names expr uses, a histogram's series
// (_bucket, _sum, _count) by the histogram's name.
func metricsOf(expr string) []string {
	var out []string
	for _, n := range usedMetric.FindAllString(expr, -1) {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if strings.HasSuffix(n, "_seconds"+suffix) {
				n = strings.TrimSuffix(n, suffix)
			}
		}
		out = append(out, n)
	}
	return out
}

func checkDeploy(t *testing.T, exported map[string]bool) {
	root := filepath.Join("..", "..", "..", "deploy")
	used := map[string][]string{} // metric -> where

	// The Grafana dashboard: every panel's targets.
	b, err := os.ReadFile(filepath.Join(root, "grafana", "ferrymq-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	exprs := 0
	for _, p := range dash.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs++
			checkExpr(t, "dashboard panel "+p.Title, tg.Expr)
			for _, n := range metricsOf(tg.Expr) {
				used[n] = append(used[n], "dashboard panel "+p.Title)
			}
		}
	}
	if exprs < 15 {
		t.Errorf("the dashboard has %d queries", exprs)
	}

	// The Prometheus alert rules.
	b, err = os.ReadFile(filepath.Join(root, "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			where := "alert " + r.Alert
			if r.Alert == "" || alerts[r.Alert] || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("%s: want a unique name, a severity and a summary: %+v", where, r)
			}
			if _, err := model.ParseDuration(r.For); err != nil {
				t.Errorf("%s: for %q: %v", where, r.For, err)
			}
			alerts[r.Alert] = true
			checkExpr(t, where, r.Expr)
			for _, n := range metricsOf(r.Expr) {
				used[n] = append(used[n], where)
			}
		}
	}
	for _, want := range []string{"FerrymqGroupReadOnly", "FerrymqSlaveLagging", "FerrymqNoRaftLeader", "FerrymqDiskAlmostFull"} {
		if !alerts[want] {
			t.Errorf("alerts.yml has no %s", want)
		}
	}

	for n, where := range used {
		if !exported[n] {
			t.Errorf("%s use %s, which no server or the producer SDK exports", strings.Join(slices.Compact(where), ", "), n)
		}
	}
	if len(used) < 15 {
		t.Errorf("the deploy files use only %d metrics: %v", len(used), used)
	}
}

// checkExpr catches what a metric name check would not: an empty query,
// unbalanced brackets or quotes.
func checkExpr(t *testing.T, where, expr string) {
	t.Helper()
	if strings.TrimSpace(expr) == "" || !strings.Contains(expr, "ferrymq_") {
		t.Errorf("%s: query %q uses no ferrymq metric", where, expr)
		return
	}
	depth := map[rune]int{}
	pairs := map[rune]rune{')': '(', ']': '[', '}': '{'}
	for _, r := range expr {
		switch r {
		case '(', '[', '{':
			depth[r]++
		case ')', ']', '}':
			if depth[pairs[r]]--; depth[pairs[r]] < 0 {
				t.Errorf("%s: unbalanced %q in %s", where, r, expr)
				return
			}
		}
	}
	for r, d := range depth {
		if d != 0 {
			t.Errorf("%s: unclosed %q in %s", where, r, expr)
		}
	}
	if strings.Count(expr, `"`)%2 != 0 {
		t.Errorf("%s: unbalanced quotes in %s", where, expr)
	}
}
