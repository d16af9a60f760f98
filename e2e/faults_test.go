package e2e

import (
	"slices"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
)

// The fault tests of issue 11 (ordered, exactly-once sends), through real
// processes: each starts the local cluster, creates a topic of 8 queues,
// runs a bounded load with the producer SDK in the test process, injects
// one fault into g1 once the load is under way, lets the load go on until
// the group is back and more messages are acknowledged, then reads every
// queue back through PULL and checks (load.check):
//
//   - every acknowledged message is stored, at the offsets its result gives;
//   - no message is stored twice unless its result said PossibleDuplicate;
//   - per key, acknowledged messages are in one queue, in send order;
//   - per queue and producer, stored sequence numbers strictly increase,
//     and every message carries a producer stamp.
//
// Nothing is asserted about timing: every wait is for an observable event
// (acknowledgements counted, a process gone, a metric, the metaserver's
// view), with generous bounds.

const (
	ackedBeforeFault = 2000 // acknowledgements before the fault is injected
	ackedAfterFault  = 2000 // more acknowledgements once the group is back
)

func faultLoadConfig(topic string, reliability protocol.Reliability) loadConfig {
	return loadConfig{
		topic:         topic,
		workers:       4,
		keysPerWorker: 8,
		unkeyedEvery:  4,
		rate:          400,
		maxMessages:   40_000,
		maxDuration:   25 * time.Second,
		reliability:   reliability,
		opts: []producer.Opt{
			producer.RouteRefresh(500 * time.Millisecond),
			producer.RetryBackoff(20 * time.Millisecond),
			// Shorter than the faults, so that sends time out with their
			// outcome unknown (the case that used to store twice).
			producer.RequestTimeout(2 * time.Second),
		},
	}
}

// startFaultLoad creates the topic and starts the load, and waits until it
// is under way.
func startFaultLoad(t *testing.T, c *localCluster, topic string, reliability protocol.Reliability) *load {
	t.Helper()
	c.ctl("topic", "create", topic, "--queues", "8")
	l := startLoad(t, c, faultLoadConfig(topic, reliability))
	l.waitAcked(ackedBeforeFault, 30*time.Second, "before the fault")
	return l
}

// recovered lets the load go on until ackedAfterFault more messages are
// acknowledged, stops it, and checks what is stored.
func (l *load) recovered(c *localCluster) {
	l.t.Helper()
	n := l.acked.Load()
	l.waitAcked(n+ackedAfterFault, 30*time.Second, "after the recovery")
	l.finish()
	l.check(c, l.t.Name())
}

func skipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
}

// TestFaultKillMasterSyncFlush kills g1's master (flushing synchronously)
// with SIGKILL mid-load, waits until the metaserver marks g1 read-only
// (the 4 s session passed unheard: keyed messages for g1's queues wait,
// others move to g2), and restarts it with its own command line: it rebuilds
// its state from its log and answers the retries of batches whose outcome
// the producer never learned. Failover is off (FERRY_FAILOVER=off), so the
// restarted master's log is the group's and every acknowledged message
// must be recovered from it; failover_test.go covers the master that is
// replaced (and a SIGSTOPped master, which used to be TestFaultStopMaster).
func TestFaultKillMasterSyncFlush(t *testing.T) {
	skipShort(t)
	c := startLocalCluster(t, "FERRY_FLUSH=sync", "FERRY_FAILOVER=off")
	args := c.cmdline("g1-master")
	if i := slices.Index(args, "-flush"); i < 0 || i+1 >= len(args) || args[i+1] != "sync" {
		t.Fatalf("g1-master does not run with -flush sync: %q", args)
	}
	l := startFaultLoad(t, c, "kill-master", protocol.Normal)

	c.kill9("g1-master")
	killed := time.Now()
	t.Logf("killed g1-master (-flush sync) at %d acknowledgements", l.acked.Load())
	testwait.ForEvery(t, 20*time.Second, 20*time.Millisecond, "g1 to turn read-only after its master was killed", func() bool {
		g, ok := c.group("g1")
		return ok && g.State == "RO"
	})
	t.Logf("g1 read-only %v after the kill, at %d acknowledgements", time.Since(killed).Round(100*time.Millisecond), l.acked.Load())
	// With failover off nobody is promoted, even past the session and the
	// failover margin (4 s + 500 ms): the leader says why not.
	var g api.GroupInfo
	testwait.ForEvery(t, 20*time.Second, 20*time.Millisecond, "g1's master silent past the session and the failover margin", func() bool {
		var ok bool
		g, ok = c.group("g1")
		return ok && g.MasterHeartbeatAgeMillis > 5500
	})
	refusedOff := c.metaCounter(`ferrymq_metaserver_failover_refusals_total{reason="failover-off"}`)
	if g.Master.ID != "g1-master" || g.Epoch != 1 || g.State != "RO" || g.Failover == "" || refusedOff < 1 {
		t.Errorf("with failover off, %v after the kill g1 is %s with master %q at epoch %d, failover %q, failover-off refusals %v; want RO, g1-master, epoch 1, the leader's word why not, a refusal",
			time.Since(killed).Round(100*time.Millisecond), g.State, g.Master.ID, g.Epoch, g.Failover, refusedOff)
	} else {
		t.Logf("the leader's word on g1 %v after the kill: %s", time.Since(killed).Round(100*time.Millisecond), g.Failover)
	}
	c.restart("g1-master", args)
	c.waitMaster("g1", 30*time.Second, "after the restart of g1-master")
	t.Logf("g1-master back %v after the kill, at %d acknowledgements", time.Since(killed).Round(100*time.Millisecond), l.acked.Load())
	l.recovered(c)
}

// TestFaultKillSlaveHigh kills g1's slave with SIGKILL while HIGH messages
// are sent, and restarts it with its own command line.
func TestFaultKillSlaveHigh(t *testing.T) {
	skipShort(t)
	c := startLocalCluster(t)
	args := c.cmdline("g1-slave")
	l := startFaultLoad(t, c, "kill-slave", protocol.High)

	timeouts := func() float64 {
		m, _ := c.metrics("g1-master")
		return m["ferrymq_broker_high_timeouts_total"]
	}
	before := timeouts()
	c.kill9("g1-slave")
	killed := time.Now()
	t.Logf("killed g1-slave at %d acknowledgements", l.acked.Load())
	testwait.ForEvery(t, 20*time.Second, 20*time.Millisecond, "g1's master to see its slave gone", func() bool {
		m, ok := c.metrics("g1-master")
		return ok && m["ferrymq_broker_slave_connected"] == 0
	})
	// HIGH messages appended before the master saw the slave gone wait for
	// it until -high-wait (3 s) and are answered SLAVE_SYNC_TIMEOUT.
	if testwait.Until(10*time.Second, func() bool { return timeouts() > before }) {
		t.Logf("g1's master answered %v SLAVE_SYNC_TIMEOUT by %v after the kill", timeouts()-before, time.Since(killed).Round(100*time.Millisecond))
	} else {
		t.Logf("g1's master answered no SLAVE_SYNC_TIMEOUT within 10 s of the kill")
	}
	c.restart("g1-slave", args)
	c.waitMaster("g1", 30*time.Second, "after the restart of g1-slave")
	t.Logf("g1-slave back after %v, at %d acknowledgements", time.Since(killed).Round(100*time.Millisecond), l.acked.Load())
	l.recovered(c)
}
