package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// The failover tests of issue 12, through real processes (cluster.sh with
// failover on: a 4 s session and a 500 ms failover margin). Each runs two
// loads with the producer SDK at its defaults, one of NORMAL and one of
// HIGH messages (each keyed and unkeyed, on its own topic and producer),
// injects one fault into g1's master, and asserts what a user relies on:
//
//   - the group takes writes again with its former slave as master at
//     epoch 2, without anyone restarting the master;
//   - every acknowledged HIGH message is readable, and every acknowledged
//     NORMAL one too, except those the old master acknowledged in the tail
//     its slave did not have (at or past the new epoch's start);
//   - no message is stored twice in its topic's queues (each message id
//     once), flagged PossibleDuplicate or not: a message whose outcome was
//     unknown when its master failed keeps its stamp and its queue, and
//     the promoted slave answers it DUPLICATE if it holds it (storedOnce);
//   - the old master rejoins as the slave, keeps what it cut in a side
//     file (where every lost message is), and converges byte for byte;
//   - a stopped master that comes back acknowledges nothing;
//   - only the group's slave can release HIGH messages;
//   - the recovered group gets traffic again, keyed and unkeyed.
//
// Figures (kill-to-writable, the longest wait for an acknowledgement,
// lost bytes, time to traffic) are logged, never asserted tightly:
// failoverBound only guards against a hang.

const failoverBound = 30 * time.Second

func failoverLoadConfig(topic string, reliability protocol.Reliability) loadConfig {
	return loadConfig{
		topic:         topic,
		workers:       4,
		keysPerWorker: 8,
		unkeyedEvery:  4,
		rate:          200,
		maxMessages:   40_000,
		maxDuration:   50 * time.Second,
		reliability:   reliability,
		// The SDK's defaults, so the figures are what a user gets.
	}
}

// failoverLoads is a NORMAL and a HIGH load, each on its own topic.
type failoverLoads struct {
	normal, high *load
}

func startFailoverLoads(t *testing.T, c *localCluster, name string) failoverLoads {
	t.Helper()
	var ls failoverLoads
	for _, x := range []struct {
		l   **load
		rel protocol.Reliability
	}{{&ls.normal, protocol.Normal}, {&ls.high, protocol.High}} {
		topic := name + "-" + strings.ToLower(x.rel.String())
		c.ctl("topic", "create", topic, "--queues", "8")
		*x.l = startLoad(t, c, failoverLoadConfig(topic, x.rel))
	}
	for _, l := range ls.all() {
		l.waitAcked(ackedBeforeFault/2, 30*time.Second, l.cfg.topic+" before the fault")
	}
	return ls
}

func (ls failoverLoads) all() []*load { return []*load{ls.normal, ls.high} }

func (ls failoverLoads) acked() string {
	return fmt.Sprintf("%d NORMAL and %d HIGH acknowledgements", ls.normal.acked.Load(), ls.high.acked.Load())
}

// more lets both loads go on until each has ackedAfterFault/2 more
// acknowledgements, and stops them.
func (ls failoverLoads) more(why string) {
	for _, l := range ls.all() {
		l.waitAcked(l.acked.Load()+ackedAfterFault/2, 30*time.Second, l.cfg.topic+" "+why)
	}
	for _, l := range ls.all() {
		l.finish()
	}
}

// storedOnce fails the test if a message of either load is stored more
// than once in its topic's queues (as load.check counted message ids),
// even flagged PossibleDuplicate: across a failover, a message whose
// outcome was unknown waits for its queue's new master, which answers it
// from the dedupe state the slave replicated, instead of moving to another
// queue. (A copy in the old master's cut tail, the side file, is not in
// the queues.)
func (ls failoverLoads) storedOnce(t *testing.T) {
	t.Helper()
	for _, l := range ls.all() {
		t.Logf("STORED TWICE %s: %d message ids", l.cfg.topic, l.storedTwice)
		if l.storedTwice > 0 {
			t.Errorf("%s: %d messages stored twice across the failover", l.cfg.topic, l.storedTwice)
		}
	}
}

// epochStart returns where epoch e began by the group's history.
func epochStart(t *testing.T, g api.GroupInfo, e uint32, master string) int64 {
	t.Helper()
	for _, h := range g.History {
		if h.Epoch == e {
			if h.Master != master {
				t.Fatalf("epoch %d of %s was led by %s, want %s (history %+v)", e, g.Name, h.Master, master, g.History)
			}
			return h.Start
		}
	}
	t.Fatalf("%s's history has no epoch %d: %+v", g.Name, e, g.History)
	return 0
}

// tailLoss is the lostOK of a failover of group away from the broker at
// oldAddr whose new epoch starts at start: only NORMAL messages the old
// master acknowledged before until, at log offsets at or past start (the
// tail the promoted slave did not have).
func tailLoss(group, oldAddr string, start int64, until time.Time) func(o *outcome) bool {
	return func(o *outcome) bool {
		return o.rel == protocol.Normal && o.res.Group == group && o.res.Broker == oldAddr && o.res.LogOffset >= start && o.at.Before(until)
	}
}

// waitTraffic waits until broker (by process name), master of group,
// acknowledged keyed and unkeyed messages that arrived at or after since,
// and logs when the first of each came.
func waitTraffic(t *testing.T, c *localCluster, l *load, group, broker string, since time.Time, what string) {
	t.Helper()
	addr := c.addr(broker)
	testwait.ForEvery(t, failoverBound, 20*time.Millisecond, fmt.Sprintf("keyed and unkeyed messages stored on %s's master %s after %s", group, broker, what), func() bool {
		a := l.acksFrom(group, addr, since)
		return a.unkeyed > 0 && a.n > a.unkeyed
	})
	a := l.acksFrom(group, addr, since)
	t.Logf("TRAFFIC after %s: %d messages stored on %s's queues by %s so far (%d unkeyed); the first %v after, the first unkeyed %v after",
		what, a.n, group, broker, a.unkeyed, a.first.Sub(since).Round(time.Millisecond), a.firstUnkeyed.Sub(since).Round(time.Millisecond))
}

// waitFollower waits until broker reports itself a slave holding epoch's
// records.
func waitFollower(t *testing.T, c *localCluster, broker string, epoch uint32) map[string]float64 {
	t.Helper()
	var m map[string]float64
	testwait.ForEvery(t, failoverBound, 20*time.Millisecond, fmt.Sprintf("%s to follow at epoch %d", broker, epoch), func() bool {
		var ok bool
		m, ok = c.metrics(broker)
		return ok && m["ferrymq_broker_is_master"] == 0 && m["ferrymq_broker_epoch"] == float64(epoch)
	})
	return m
}

// logFailoverFigures logs the metaserver's word and counters on the
// promotion and returns the lost bytes it reported.
func logFailoverFigures(t *testing.T, c *localCluster, group string) float64 {
	t.Helper()
	g := c.brokersJSON()[group]
	promotions := c.metaCounter("ferrymq_metaserver_failover_promotions_total")
	lost := c.metaCounter("ferrymq_metaserver_failover_lost_bytes_total")
	if promotions != 1 {
		t.Errorf("the metaservers count %v promotions, want 1", promotions)
	}
	epochs := map[float64]int{}
	for _, m := range c.metaMetrics() {
		epochs[m[fmt.Sprintf("ferrymq_metaserver_group_epoch{group=%q}", group)]]++
	}
	t.Logf("ferryctl brokers --json: %s epoch %d, master %s, slave %q, history %+v, failover %q; metaserver metrics: promotions %v, lost bytes %v, %s epoch gauge by node %v",
		group, g.Epoch, g.Master.ID, g.Slave.ID, g.History, g.Failover, promotions, lost, group, epochs)
	return lost
}

// TestFailoverKillMaster kills g1's master with SIGKILL under load, just
// after its slave fell behind (the slave was stopped until the master had
// acknowledged NORMAL messages it does not have, and continued as the
// master died), and does not restart it: the metaserver promotes g1-slave
// (epoch 2) and g1 takes writes again. Then it restarts the old master
// with its own command line: it rejoins as the slave, cuts the records its
// new master does not have into a side file, copies, and ends
// byte-identical.
func TestFailoverKillMaster(t *testing.T) { failoverKillMaster(t) }

// TestFailoverKillMasterSyncFlush is TestFailoverKillMaster with every
// broker flushing before it answers (-flush sync): what an acknowledgement
// promises on the old master's disk, a failover keeps too.
func TestFailoverKillMasterSyncFlush(t *testing.T) { failoverKillMaster(t, "FERRY_FLUSH=sync") }

func failoverKillMaster(t *testing.T, env ...string) {
	skipShort(t)
	c := startLocalCluster(t, env...)
	args := c.cmdline("g1-master")
	c.waitMembers("g1", "g1-master", "g1-slave", 1, 10*time.Second, "at the start")
	oldAddr, newAddr := c.addr("g1-master"), c.addr("g1-slave")
	ls := startFailoverLoads(t, c, "fo-kill")

	// The slave falls behind: it stops copying (SIGSTOP) until the master
	// has acknowledged some NORMAL messages since, which the slave cannot
	// have; then the master dies and the slave runs again.
	c.signal("g1-slave", syscall.SIGSTOP)
	slaveStopped := time.Now()
	testwait.ForEvery(t, failoverBound, 5*time.Millisecond, "g1-master to acknowledge NORMAL messages while its slave is stopped", func() bool {
		return ls.normal.acksFrom("g1", oldAddr, slaveStopped).n >= 100
	})
	killed := time.Now()
	c.kill9("g1-master")
	c.signal("g1-slave", syscall.SIGCONT)
	t.Logf("stopped g1-slave for %v, then killed g1-master, at %s", killed.Sub(slaveStopped).Round(time.Millisecond), ls.acked())

	// a: g1 is writable again with its former slave as master, at epoch 2.
	g := c.waitMembers("g1", "g1-slave", "", 2, failoverBound, "after kill -9 of g1-master")
	promoted := time.Now()
	start := epochStart(t, g, 2, "g1-slave")
	epochStart(t, g, 1, "g1-master")
	testwait.ForEvery(t, failoverBound, 5*time.Millisecond, "a send to g1 acknowledged by its new master g1-slave", func() bool {
		return ls.normal.acksFrom("g1", newAddr, killed).n > 0
	})
	first := ls.normal.acksFrom("g1", newAddr, killed).first
	t.Logf("KILL-TO-WRITABLE: the registry showed g1 writable with master g1-slave at epoch 2 (starting at log offset %d) %v after SIGKILL; "+
		"the first send to one of g1's queues was acknowledged by g1-slave %v after SIGKILL",
		start, promoted.Sub(killed).Round(time.Millisecond), first.Sub(killed).Round(time.Millisecond))
	if bj := c.brokersJSON()["g1"]; bj.Epoch != 2 || bj.Master.ID != "g1-slave" || !strings.HasPrefix(bj.Failover, "promoted g1-slave over g1-master") {
		t.Errorf("ferryctl brokers --json shows g1 at epoch %d with master %q and failover %q; want epoch 2, g1-slave, promoted", bj.Epoch, bj.Master.ID, bj.Failover)
	}
	metaLost := logFailoverFigures(t, c, "g1")
	if m, ok := c.metrics("g1-slave"); !ok || m["ferrymq_broker_is_master"] != 1 || m["ferrymq_broker_epoch"] != 2 {
		t.Errorf("g1-slave's metrics after the promotion: is_master %v, epoch %v; want 1, 2", m["ferrymq_broker_is_master"], m["ferrymq_broker_epoch"])
	}

	// The old master took records past the new epoch's start (those it
	// acknowledged while its slave was stopped): it must cut them when it
	// comes back.
	pastStart := 0
	for _, o := range ls.normal.snapshot() {
		if o.err == nil && o.res.Group == "g1" && o.res.Broker == oldAddr && o.res.LogOffset >= start {
			pastStart++
		}
	}
	if pastStart == 0 {
		t.Fatalf("no NORMAL message acknowledged by g1-master lies past the new epoch's start %d, although its slave was stopped", start)
	}

	// b: the old master comes back with its own command line.
	c.restart("g1-master", args)
	restarted := time.Now()
	c.waitMembers("g1", "g1-slave", "g1-master", 2, failoverBound, "after the restart of g1-master")
	m := waitFollower(t, c, "g1-master", 2)
	c.waitMaster("g1", failoverBound, "after g1-master rejoined")
	rejoined := time.Now()
	t.Logf("g1-master rejoined as g1's slave %v after its restart (epoch 2, truncations %v, truncated bytes %v); %d NORMAL messages it acknowledged lay past the new epoch's start",
		rejoined.Sub(restarted).Round(time.Millisecond), m["ferrymq_broker_truncations_total"], m["ferrymq_broker_truncated_bytes_total"], pastStart)
	if m["ferrymq_broker_truncations_total"] != 1 || m["ferrymq_broker_truncated_bytes_total"] <= 0 {
		t.Errorf("g1-master held acknowledged records past offset %d but its metrics show %v truncations of %v bytes",
			start, m["ferrymq_broker_truncations_total"], m["ferrymq_broker_truncated_bytes_total"])
	}
	side := filepath.Join(c.dataDir("g1-master"), "truncated", fmt.Sprintf("%020d-epoch-%d.log", start, 1))
	cut := readSideFile(t, c, side, start)
	if got := cut[len(cut)-1].end - start; float64(got) != m["ferrymq_broker_truncated_bytes_total"] {
		t.Errorf("the side file's records span %d bytes; the truncated-bytes metric says %v", got, m["ferrymq_broker_truncated_bytes_total"])
	}

	// e: g1 gets traffic again, keyed and unkeyed.
	waitTraffic(t, c, ls.normal, "g1", "g1-slave", promoted, "the promotion")
	waitTraffic(t, c, ls.high, "g1", "g1-slave", rejoined, "the old master rejoined (HIGH)")
	recovered := waitHandedOver(t, c, "g1-master", "g1-slave")
	ls.more("after the rejoin")
	// The tail the old master cut came back through the new master: no
	// acknowledged message is lost, NORMAL ones included, none twice.
	lost := ls.normal.check(c, t.Name()+"/normal")
	ls.high.check(c, t.Name()+"/high")
	ls.storedOnce(t)
	if len(lost) != 0 {
		t.Errorf("%d acknowledged NORMAL messages lost though the old master's disk came back", len(lost))
	}
	alsoStored := 0
	for _, l := range ls.all() {
		stored := storedTids(t, c, l.cfg.topic)
		for _, r := range cut {
			if r.Topic == l.cfg.topic && stored[r.Body] {
				alsoStored++
			}
		}
	}
	if alsoStored != len(cut) {
		t.Errorf("%d of the %d records the old master cut are stored on the new master", alsoStored, len(cut))
	}
	// The metaserver's figure comes from the last reports, so it may
	// understate the loss (the master took more after its last heartbeat),
	// never overstate it.
	if metaLost > m["ferrymq_broker_truncated_bytes_total"] {
		t.Errorf("the metaserver reported %v lost bytes, more than the %v bytes the old master had past the epoch start", metaLost, m["ferrymq_broker_truncated_bytes_total"])
	}
	t.Logf("RECOVERED: the old master cut %v bytes, %d records past the epoch start %d (the metaserver reported %v lost bytes at the promotion); "+
		"the new master appended %v of them again and held %v already (retried sends); lost: %d",
		m["ferrymq_broker_truncated_bytes_total"], len(cut), start, metaLost, recovered["ferrymq_broker_recovered_messages_total"],
		recovered["ferrymq_broker_recover_duplicates_total"], len(lost))

	// b: converged byte for byte once the load stopped.
	assertSameLogs(t, c, "g1-slave", "g1-master")
}

// waitHandedOver waits until the former master oldName handed its cut
// tail over to newName, and returns newName's metrics.
func waitHandedOver(t *testing.T, c *localCluster, oldName, newName string) map[string]float64 {
	t.Helper()
	testwait.ForEvery(t, failoverBound, 20*time.Millisecond, oldName+" to hand its cut tail to "+newName, func() bool {
		m, ok := c.metrics(oldName)
		return ok && m["ferrymq_broker_tails_handed_over_total"] >= 1
	})
	m, _ := c.metrics(newName)
	return m
}

// sideRecord is one record of a side file, as `ferryctl truncated --json`
// prints it, with where it ends.
type sideRecord struct {
	LogOffset   int64  `json:"log_offset"`
	Topic       string `json:"topic"`
	Queue       uint32 `json:"queue"`
	QueueOffset int64  `json:"queue_offset"`
	ID          string `json:"id"`
	Reliability string `json:"reliability"`
	Body        string `json:"body"`
	end         int64  // the next record's offset (the last: from the file's size)
}

// readSideFile reads a truncation's side file with `ferryctl truncated`:
// its records start at start and follow each other.
func readSideFile(t *testing.T, c *localCluster, path string, start int64) []sideRecord {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		entries, _ := os.ReadDir(filepath.Dir(path))
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("no side file %s (the directory holds %v): %v", path, names, err)
	}
	var recs []sideRecord
	if err := json.Unmarshal([]byte(c.ctl("truncated", path, "--json")), &recs); err != nil {
		t.Fatalf("ferryctl truncated %s --json: %v", path, err)
	}
	if len(recs) == 0 {
		t.Fatalf("ferryctl truncated %s: no records", path)
	}
	if recs[0].LogOffset != start {
		t.Errorf("side file %s: the first record is at log offset %d, want the epoch start %d", path, recs[0].LogOffset, start)
	}
	for i := range recs {
		if i+1 < len(recs) {
			recs[i].end = recs[i+1].LogOffset
			if recs[i].end <= recs[i].LogOffset {
				t.Fatalf("side file %s: record %d at %d follows one at %d", path, i+1, recs[i].end, recs[i].LogOffset)
			}
		}
	}
	// The file holds the records as the log did, so the last one ends
	// where the file does, relative to the first.
	recs[len(recs)-1].end = start + st.Size()
	t.Logf("side file %s: %d records, log offsets %d..%d; `ferryctl truncated` reads it", filepath.Base(path), len(recs), start, start+st.Size())
	return recs
}

// storedTids reads a topic back and returns the bodies stored.
func storedTids(t *testing.T, c *localCluster, topic string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, q := range readAll(t, c, topic) {
		for _, m := range q {
			out[m.tid] = true
		}
	}
	return out
}

// segmentName is a commit-log segment file: its base log offset in 20
// digits (storage/segment.go).
var segmentName = regexp.MustCompile(`^(\d{20})\.log$`)

// commitLog reads a broker's commit log from its data directory: the
// segment files in order, which must follow each other.
func commitLog(t tb, dir string) (base int64, data []byte) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	base = -1
	for _, e := range entries { // ReadDir sorts by name: by base offset
		mm := segmentName.FindStringSubmatch(e.Name())
		if mm == nil || e.IsDir() {
			continue
		}
		b, err := strconv.ParseInt(mm[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seg, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if base < 0 {
			base = b
		} else if b != base+int64(len(data)) {
			t.Fatalf("%s: segment %s does not follow the one before (which ends at %d)", dir, e.Name(), base+int64(len(data)))
		}
		data = append(data, seg...)
	}
	if base < 0 {
		t.Fatalf("%s holds no segment", dir)
	}
	return base, data
}

// cutZeros returns a log's bytes up to end, checking that what follows
// end in its files is only zeros.
func cutZeros(t tb, who string, base int64, data []byte, end int64) []byte {
	t.Helper()
	n := end - base
	if n < 0 || n > int64(len(data)) {
		return data // the caller reports the mismatch
	}
	if rest := data[n:]; !bytes.Equal(rest, make([]byte, len(rest))) {
		t.Fatalf("%s: the segment files hold %d bytes past the log end %d that are not zeros", who, len(rest), end)
	}
	return data[:n]
}

// assertSameLogs waits until the master and the slave report the same log
// end (the load has stopped) and compares their commit logs' segment
// files byte for byte.
func assertSameLogs(t *testing.T, c *localCluster, master, slave string) {
	t.Helper()
	var end float64
	testwait.ForEvery(t, failoverBound, 20*time.Millisecond, fmt.Sprintf("%s and %s to report the same log end", master, slave), func() bool {
		mm, ok1 := c.metrics(master)
		sm, ok2 := c.metrics(slave)
		end = mm["ferrymq_broker_log_end_offset"]
		return ok1 && ok2 && end > 0 && sm["ferrymq_broker_log_end_offset"] == end
	})
	mb, md := commitLog(t, c.dataDir(master))
	sb, sd := commitLog(t, c.dataDir(slave))
	// A running broker's last segment may hold pre-touched zeros past the
	// log's end (storage/pretouch.go): they are not part of the log.
	md, sd = cutZeros(t, master, mb, md, int64(end)), cutZeros(t, slave, sb, sd, int64(end))
	from := max(mb, sb)
	if mb+int64(len(md)) != int64(end) || sb+int64(len(sd)) != int64(end) {
		t.Fatalf("the segment files end at %d (%s) and %d (%s); both brokers report %v", mb+int64(len(md)), master, sb+int64(len(sd)), slave, end)
	}
	a, b := md[from-mb:], sd[from-sb:]
	if !bytes.Equal(a, b) {
		i := 0
		for i < len(a) && i < len(b) && a[i] == b[i] {
			i++
		}
		t.Fatalf("the commit logs of %s and %s differ from log offset %d (compared from %d to %v)", master, slave, from+int64(i), from, end)
	}
	t.Logf("CONVERGED: the commit logs of %s and %s are byte-identical from log offset %d to %v", master, slave, from, end)
}

// TestFailoverStopMaster freezes g1's master with SIGSTOP under load until
// the metaserver has promoted g1-slave, then lets it go on with SIGCONT:
// the old master acknowledges nothing more, and every message acknowledged
// after SIGCONT is readable from the new master; the old master rejoins as
// the slave and g1 gets traffic again. Then, on the same cluster, a
// stranger on the master's HA port is refused and cannot release HIGH
// messages while the real slave is stopped.
func TestFailoverStopMaster(t *testing.T) {
	skipShort(t)
	c := startLocalCluster(t)
	c.waitMembers("g1", "g1-master", "g1-slave", 1, 10*time.Second, "at the start")
	oldAddr := c.addr("g1-master")
	ls := startFailoverLoads(t, c, "fo-stop")

	c.signal("g1-master", syscall.SIGSTOP)
	stopped := time.Now()
	t.Logf("stopped g1-master at %s", ls.acked())
	g := c.waitMembers("g1", "g1-slave", "", 2, failoverBound, "while g1-master is stopped")
	promoted := time.Now()
	start := epochStart(t, g, 2, "g1-slave")
	t.Logf("the registry promoted g1-slave %v after SIGSTOP (epoch 2 from log offset %d)", promoted.Sub(stopped).Round(time.Millisecond), start)
	// The fault lasts until the promotion; now the old master runs again.
	c.signal("g1-master", syscall.SIGCONT)
	cont := time.Now()
	t.Logf("continued g1-master %v after SIGSTOP, at %s", cont.Sub(stopped).Round(time.Millisecond), ls.acked())

	c.waitMembers("g1", "g1-slave", "g1-master", 2, failoverBound, "after SIGCONT")
	m := waitFollower(t, c, "g1-master", 2)
	c.waitMaster("g1", failoverBound, "after g1-master rejoined")
	rejoined := time.Now()
	t.Logf("g1-master rejoined as g1's slave %v after SIGCONT (its metrics: lease lost %v, fenced %v, refused %v, truncations %v, truncated bytes %v)",
		rejoined.Sub(cont).Round(time.Millisecond), m["ferrymq_broker_lease_lost_total"], m["ferrymq_broker_fenced_total"],
		m["ferrymq_broker_messages_refused_total"], m["ferrymq_broker_truncations_total"], m["ferrymq_broker_truncated_bytes_total"])
	// What it had past the new epoch's start (stored before SIGSTOP, never
	// copied) it cut into a side file that ferryctl reads.
	side := filepath.Join(c.dataDir("g1-master"), "truncated", fmt.Sprintf("%020d-epoch-%d.log", start, 1))
	var cut []sideRecord
	if m["ferrymq_broker_truncations_total"] > 0 {
		cut = readSideFile(t, c, side, start)
	}
	logFailoverFigures(t, c, "g1")

	waitTraffic(t, c, ls.normal, "g1", "g1-slave", promoted, "the promotion")
	waitTraffic(t, c, ls.high, "g1", "g1-slave", rejoined, "the old master rejoined (HIGH)")
	var recovered map[string]float64
	if len(cut) > 0 {
		recovered = waitHandedOver(t, c, "g1-master", "g1-slave")
	}
	ls.more("after the rejoin")
	for _, l := range ls.all() {
		ackedWait, anyWait := l.longestWait(stopped, cont)
		t.Logf("LONGEST WAIT during the SIGSTOP (%v), %s: %v for an acknowledgement, %v for any outcome", cont.Sub(stopped).Round(time.Millisecond),
			l.cfg.topic, ackedWait.Round(time.Millisecond), anyWait.Round(time.Millisecond))
	}

	// After SIGCONT the old master made no acknowledgement: it checks its
	// lease as each answer is written. An answer it checked before SIGSTOP
	// and had not yet handed to the socket leaves after SIGCONT; it counts
	// those (acks after the lease), and only those may arrive late. (That
	// the check sits at the write, not earlier, is held by
	// TestGuardChecksWhenWritten and TestSendAnswerCheckedAtTheWrite: this
	// count would also cover an earlier check.)
	m, _ = c.metrics("g1-master")
	afterLease := int(m["ferrymq_broker_acks_after_lease_total"])
	var late []outcome
	var lateText []string
	for _, l := range ls.all() {
		for _, o := range l.snapshot() {
			if o.err == nil && o.res.Broker == oldAddr && !o.at.Before(cont) {
				late = append(late, o)
				lateText = append(lateText, fmt.Sprintf("%s (%v, log offset %d, %v after SIGCONT)", o.tid, o.rel, o.res.LogOffset, o.at.Sub(cont)))
			}
		}
	}
	if len(late) > afterLease {
		t.Errorf("the old master acknowledged %d messages after SIGCONT, and counted %d acknowledgements that left after its lease; e.g. %v",
			len(late), afterLease, lateText[:min(5, len(lateText))])
	} else {
		t.Logf("the old master's acknowledgements that left after its lease: %d counted, %d arrived after SIGCONT %v", afterLease, len(late), lateText)
	}
	// Every acknowledged message is readable from the new master: the old
	// master's tail (late acknowledgements included) came back through it.
	lost := ls.normal.check(c, t.Name()+"/normal")
	ls.high.check(c, t.Name()+"/high")
	ls.storedOnce(t)
	if len(lost) != 0 {
		t.Errorf("%d acknowledged NORMAL messages lost though the old master came back", len(lost))
	}
	t.Logf("RECOVERED: the old master cut %d records past offset %d (the metaserver reported %v lost bytes); the new master appended %v again and held %v already",
		len(cut), start, c.metaCounter("ferrymq_metaserver_failover_lost_bytes_total"), recovered["ferrymq_broker_recovered_messages_total"],
		recovered["ferrymq_broker_recover_duplicates_total"])

	strangerOnHAPort(t, c, ls.high.cfg.topic)
}

// strangerOnHAPort checks that a client on g1's master's HA port that is
// not g1's slave in the current epoch is refused NOT_AUTHORIZED, and that
// while the real slave is stopped its fetches (at the master's log end)
// release no HIGH message.
func strangerOnHAPort(t *testing.T, c *localCluster, topic string) {
	t.Helper()
	g, ok := c.group("g1")
	if !ok {
		t.Fatal("no group g1")
	}
	master, slave := g.Master.ID, g.Slave.ID
	c.waitMaster("g1", failoverBound, "before the stranger")
	ctx, cancel := context.WithTimeout(context.Background(), 2*failoverBound)
	defer cancel()

	logEnd := func() int64 {
		m, _ := c.metrics(master)
		return int64(m["ferrymq_broker_log_end_offset"])
	}
	refused := func() float64 {
		m, _ := c.metrics(master)
		return m["ferrymq_broker_ha_fetch_refused_total"]
	}
	stranger := transport.NewClient(c.haAddr(master), transport.ClientConfig{})
	defer stranger.Close()
	fetch := func() error {
		req := protocol.HAFetchRequest{Offset: logEnd(), MaxBytes: 1 << 20, Epoch: g.Epoch, BrokerID: "stranger"}
		_, err := stranger.Call(ctx, protocol.CodeHAFetch, protocol.AppendHAFetchRequest(nil, &req))
		return err
	}
	before := refused()
	if err := fetch(); !errors.Is(err, protocol.ErrNotAuthorized) {
		t.Fatalf("a stranger's HA fetch from %s's HA port: %v, want NOT_AUTHORIZED", master, err)
	}

	// A SEND of one message to one of g1's queues, straight to its master.
	route, err := c.mc.RouteExisting(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	qi := slices.IndexFunc(route.Queues, func(q routing.QueueRoute) bool { return q.Group == "g1" })
	if qi < 0 {
		t.Fatalf("no queue of %s on g1: %+v", topic, route.Queues)
	}
	q := route.Queues[qi]
	sender := transport.NewClient(c.addr(master), transport.ClientConfig{})
	defer sender.Close()
	var n atomic.Int64
	send := func(rel protocol.Reliability) (protocol.Status, time.Duration) {
		msg := protocol.Message{ID: fmt.Sprintf("stranger-test-%d", n.Add(1)), Topic: topic, Queue: q.Queue, Reliability: rel,
			Timestamp: time.Now().UnixMilli(), Body: []byte("sent while the slave is stopped")}
		began := time.Now()
		resp, err := sender.Call(ctx, protocol.CodeSend, protocol.AppendSendRequest(nil, q.Epoch, []protocol.Message{msg}))
		if err != nil {
			t.Fatalf("SEND %v to %s: %v", rel, master, err)
		}
		res, err := protocol.DecodeSendResponse(resp.Body, nil)
		if err != nil || len(res) != 1 {
			t.Fatalf("SEND %v to %s: %d results, %v", rel, master, len(res), err)
		}
		return res[0].Status, time.Since(began)
	}
	if st, _ := send(protocol.High); st != protocol.StatusOK {
		t.Fatalf("a HIGH send to %s with its slave running: %v", master, st)
	}

	// Stop the real slave; the stranger keeps fetching at the master's end.
	c.signal(slave, syscall.SIGSTOP)
	t.Cleanup(func() { _ = syscall.Kill(c.pid(slave), syscall.SIGCONT) })
	var wg sync.WaitGroup
	done := make(chan struct{})
	var fetches, others atomic.Int64
	var otherErr atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			err := fetch()
			fetches.Add(1)
			if !errors.Is(err, protocol.ErrNotAuthorized) {
				others.Add(1)
				otherErr.Store(fmt.Sprint(err))
			}
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	st, took := send(protocol.High)
	normal, _ := send(protocol.Normal)
	close(done)
	wg.Wait()
	c.signal(slave, syscall.SIGCONT)
	t.Logf("with %s stopped and a stranger fetching at the master's log end (%d fetches, %v refused by the master's metric): a HIGH send was answered %v after %v; a NORMAL one %v",
		slave, fetches.Load(), refused()-before, st, took.Round(time.Millisecond), normal)
	if st == protocol.StatusOK {
		t.Errorf("a HIGH send was acknowledged OK while the slave was stopped: the stranger's fetches released it")
	}
	if others.Load() > 0 {
		t.Errorf("%d of the stranger's %d fetches were not refused NOT_AUTHORIZED, e.g. %v", others.Load(), fetches.Load(), otherErr.Load())
	}
	if got := refused() - before; got < float64(fetches.Load()+1) {
		t.Errorf("ferrymq_broker_ha_fetch_refused_total rose by %v for %d refused fetches", got, fetches.Load()+1)
	}
	// Once the slave runs again, HIGH sends are acknowledged again.
	testwait.ForEvery(t, failoverBound, 50*time.Millisecond, "a HIGH send acknowledged once the slave runs again", func() bool {
		st, _ := send(protocol.High)
		return st == protocol.StatusOK
	})
}
