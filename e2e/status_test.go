package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver/api"
)

// metaStatusJSON runs `ferryctl meta status --json`.
func (c *localCluster) metaStatusJSON() api.MetaStatus {
	c.t.Helper()
	var st api.MetaStatus
	if err := json.Unmarshal([]byte(c.ctl("meta", "status", "--json", "--member-timeout", "500ms")), &st); err != nil {
		c.t.Fatalf("ferryctl meta status --json: %v", err)
	}
	return st
}

// lineOf is the first line of s that starts with prefix, or "".
func lineOf(s, prefix string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// TestDeadMembersShown kills a metaserver follower and g1's master with
// SIGKILL on the local cluster (failover on) and reads what an operator
// sees through ferryctl: meta status shows the dead metaserver unreachable,
// never as a follower, and the live ones with their applied indexes;
// brokers shows the dead master, which the failover took out of g1, as
// g1's former master, DEAD, with the age of its last heartbeat growing as
// time passes.
func TestDeadMembersShown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	c := startLocalCluster(t)
	var deadMeta string
	for _, m := range c.metaStatusJSON().Members {
		if m.Reachable && m.State == "Follower" {
			deadMeta = m.ID
			break
		}
	}
	if deadMeta == "" {
		t.Fatalf("no reachable follower in meta status: %+v", c.metaStatusJSON())
	}
	c.kill9("meta-" + deadMeta)
	c.kill9("g1-master")

	st := c.metaStatusJSON() // the process is gone: its port refuses at once
	for _, m := range st.Members {
		switch {
		case m.ID == deadMeta && (m.Reachable || m.Error == "" || m.State != ""):
			t.Fatalf("meta status shows the killed %s as %+v; want unreachable with the error", deadMeta, m)
		case m.ID != deadMeta && (!m.Reachable || m.AppliedIndex == 0 || (m.State != "Leader" && m.State != "Follower")):
			t.Fatalf("meta status shows the live %s as %+v", m.ID, m)
		}
	}
	out := c.ctl("meta", "status")
	if row := lineOf(out, deadMeta+" "); strings.Contains(row, "follower") || !strings.Contains(row, "no: ") ||
		!strings.Contains(out, "2 of 3 members reachable") {
		t.Fatalf("meta status after kill -9 of %s:\n%s", deadMeta, out)
	}
	t.Logf("meta status after kill -9 of %s:\n%s", deadMeta, out)

	// After the session and the failover margin the slave is promoted and
	// the killed master leaves g1; the leader still shows it.
	var former api.BrokerStatus
	formerOf := func(g api.GroupInfo) (api.BrokerStatus, bool) {
		for _, m := range g.Members {
			if m.ID == "g1-master" && m.Role == api.RoleFormerMaster {
				return m, true
			}
		}
		return api.BrokerStatus{}, false
	}
	testwait.ForEvery(t, 20*time.Second, 100*time.Millisecond, "g1-slave promoted, g1-master shown as g1's former master, lost", func() bool {
		g := c.brokersJSON()["g1"]
		var ok bool
		former, ok = formerOf(g)
		return g.Master.ID == "g1-slave" && ok && former.Lost
	})
	if !former.Heard || former.Alive || former.ReplacedBy != "g1-slave" || former.ReplacedAtEpoch != 2 || former.LastHeartbeatAgeMillis < 0 {
		t.Fatalf("g1's former master: %+v", former)
	}
	// The age is the leader's clock since the last heartbeat: between two
	// readings (with a run of the table between them) it grows by at
	// least the time between the end of the first and the start of the
	// second, and by at most the time from the start of the first to the
	// end of the second.
	s1 := time.Now()
	first, ok1 := formerOf(c.brokersJSON()["g1"])
	e1 := time.Now()
	table := c.ctl("brokers")
	if note := lineOf(table, "g1 former master:"); !strings.Contains(note, "g1-master") || !strings.Contains(note, "DEAD") {
		t.Fatalf("brokers after the failover:\n%s", table)
	}
	t.Logf("brokers after the failover:\n%s", table)
	s2 := time.Now()
	second, ok2 := formerOf(c.brokersJSON()["g1"])
	e2 := time.Now()
	if !ok1 || !ok2 {
		t.Fatalf("g1's former master missing from a reading: %v, %v", ok1, ok2)
	}
	grew := time.Duration(second.LastHeartbeatAgeMillis-first.LastHeartbeatAgeMillis) * time.Millisecond
	if grew < s2.Sub(e1)-time.Millisecond || grew > e2.Sub(s1)+time.Millisecond {
		t.Fatalf("the former master's age went from %d ms to %d ms between readings %v apart (%v from first start to last end)",
			first.LastHeartbeatAgeMillis, second.LastHeartbeatAgeMillis, s2.Sub(e1), e2.Sub(s1))
	}
}
