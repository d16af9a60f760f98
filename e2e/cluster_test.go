package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/sdk"
)

type groupJSON struct {
	Name   string `json:"name"`
	State  string `json:"state"`
	Reason string `json:"reason"`
}

// TestLocalCluster starts the cluster with scripts/cluster.sh, sends and
// reads back messages through the real processes, kills one group's master
// with SIGKILL, sees that group turn read-only and sends move to the other
// group, and stops every process. It runs with failover off.
func TestLocalCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	// Failover off: the group stays read-only (failover_test.go covers the
	// promotion of its slave).
	c := startLocalCluster(t, "FERRY_FAILOVER=off")
	base := c.base
	c.ctl("topic", "create", "e2e", "--queues", "4")

	p, err := producer.New(sdk.MetaAddrs(strings.Split(c.meta, ",")...), producer.RouteRefresh(500*time.Millisecond),
		producer.RetryBackoff(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	byGroup := map[string]int{}
	for i := range 100 {
		r, err := p.Send(ctx, &producer.Message{Topic: "e2e", Body: []byte(fmt.Sprintf("m%d", i))})
		if err != nil {
			t.Fatal(err)
		}
		byGroup[r.Group]++
	}
	if byGroup["g1"] == 0 || byGroup["g2"] == 0 {
		t.Fatalf("sends not spread: %v", byGroup)
	}
	// Read everything back through ferryctl and the brokers.
	stored := 0
	for q := range 4 {
		var msgs []map[string]any
		if err := json.Unmarshal([]byte(c.ctl("read", "e2e", "--queue", fmt.Sprint(q), "--limit", "1000", "--json")), &msgs); err != nil {
			t.Fatal(err)
		}
		stored += len(msgs)
	}
	if stored != 100 {
		t.Fatalf("read back %d of 100 messages", stored)
	}

	// The local cluster does not auto-create topics: a typo is refused
	// UNKNOWN_TOPIC (exit 1) and makes no topic.
	if code, _, stderr := c.ctlExit("send", "e2e-typo", "--body", "x"); code != 1 || !strings.Contains(stderr, "UNKNOWN_TOPIC") {
		t.Fatalf("send to a topic that does not exist: exit %d, stderr %q; want exit 1 and UNKNOWN_TOPIC", code, stderr)
	}
	if out := c.ctl("topics"); strings.Contains(out, "e2e-typo") {
		t.Fatalf("a send to an unknown topic created it:\n%s", out)
	}

	// Both kinds of server export Prometheus metrics.
	brokerMetrics := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", base+51)) // g1's master
	if !strings.Contains(brokerMetrics, "ferrymq_broker_writable 1") || !strings.Contains(brokerMetrics, "ferrymq_broker_slave_connected 1") ||
		strings.Contains(brokerMetrics, "ferrymq_broker_messages_in_total 0\n") {
		t.Fatalf("g1 master's metrics:\n%s", grepLines(brokerMetrics, "ferrymq_"))
	}
	metaMetrics := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", base+21))
	if !strings.Contains(metaMetrics, `ferrymq_metaserver_group_writable{group="g1"} 1`) || !strings.Contains(metaMetrics, "ferrymq_metaserver_raft_term") {
		t.Fatalf("metaserver metrics:\n%s", grepLines(metaMetrics, "ferrymq_"))
	}

	// Kill g1's master: its group turns read-only, sends move to g2.
	if err := syscall.Kill(c.pid("g1-master"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// The metaserver marks g1 read-only once the master's session (4 s in
	// cluster.sh) passes unheard.
	var last []groupJSON
	testwait.ForEvery(t, 20*time.Second, 50*time.Millisecond, "g1 to turn read-only (heartbeat-lost) after its master was killed", func() bool {
		var groups []groupJSON
		if err := json.Unmarshal([]byte(c.ctl("brokers", "--json")), &groups); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(groups) != fmt.Sprint(last) {
			t.Logf("brokers after %v: %+v", time.Since(killed).Round(10*time.Millisecond), groups)
			last = groups
		}
		return len(groups) == 2 && groups[0].Name == "g1" && groups[0].State == "RO" && strings.Contains(groups[0].Reason, "heartbeat-lost")
	})
	t.Logf("g1 read-only %v after its master was killed", time.Since(killed).Round(100*time.Millisecond))
	// Every send now lands on g2, with no wait for the producer's next route
	// refresh: a send it still routes to g1 fails to reach the dead master
	// (a lost connection, which is retried) and its retry excludes g1.
	for i := range 50 {
		r, err := p.Send(ctx, &producer.Message{Topic: "e2e", Body: []byte(fmt.Sprintf("after-%d", i))})
		if err != nil {
			t.Fatal(err)
		}
		if r.Group != "g2" {
			t.Fatalf("send %d after the kill went to %s", i, r.Group)
		}
	}
	if out := c.ctl("brokers"); !strings.Contains(out, "heartbeat-lost") {
		t.Fatalf("brokers table does not show the reason:\n%s", out)
	}

	names := []string{"meta-m1", "meta-m2", "meta-m3", "g1-slave", "g2-master", "g2-slave"}
	pids := map[string]int{}
	for _, name := range names {
		pids[name] = c.pid(name)
	}
	out := c.script("stop")
	for _, name := range names {
		if !strings.Contains(out, "stopped "+name) {
			t.Fatalf("stop did not stop %s:\n%s", name, out)
		}
		if err := syscall.Kill(pids[name], 0); err == nil {
			t.Fatalf("%s (pid %d) still runs after stop", name, pids[name])
		}
	}
}
