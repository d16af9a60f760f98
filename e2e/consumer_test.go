package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/consumer"
	"github.com/ferrymq/ferrymq/internal/testlog"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// The consumer tests of issue 13, through real processes (cluster.sh):
// consumer groups of the consumer SDK in the test process, reading topics
// the producer SDK fills, while the cluster's processes are killed and
// restarted. They assert what a consumer user relies on:
//
//   - at least once: every acknowledged message is handed to a handler,
//     through a master failover, a metaserver leader change and a
//     rebalance (a member Closed, another started); the only exception is
//     a NORMAL message the failed master acknowledged in the tail its
//     slave did not have, when the failover reported a loss, and the
//     message is then absent from the group's queues (read with PULL);
//   - order: per queue, the first deliveries come in increasing offset
//     order (no offset skipped and delivered later);
//   - one member per queue per generation;
//   - committed offsets: after Close they are the queues' log ends (lag
//     0), and they survive the brokers' kill -9 and restart: a new member
//     resumes exactly at them and delivers nothing before them.
//
// Every wait is for an observable event (deliveries counted, a process
// gone, the registry's view), with bounds that only guard against a hang.

// qoff names a stored message: its queue, its offset and its id (a failover
// can reuse an offset for another message).
type qoff struct {
	queue  uint32
	offset int64
	id     string
}

// delivery is one handler call that returned nil.
type delivery struct {
	seq    int64 // order of recording, over every member
	member string
	gen    uint64 // the member's generation when the handler began (see recorder.handler)
	queue  uint32
	offset int64
	id     string
	body   string
	at     time.Time
	// storeTime (unix ms) is the delivered record's (storedMsg.storeTime).
	storeTime int64
}

// recorder records every delivery of every member of a group.
type recorder struct {
	mu      sync.Mutex
	list    []delivery
	seen    map[qoff]int    // deliveries of each stored message
	ids     map[string]bool // ids delivered
	aborted atomic.Int64    // handler calls whose queue was revoked before they began (not processed)
}

func newRecorder() *recorder { return &recorder{seen: map[qoff]int{}, ids: map[string]bool{}} }

// handler records each message c hands out. The generation is read before
// the handler's context is checked: a member stops a revoked queue's
// handler context before it moves to the new generation, so a handler
// that sees generation g and then a live context holds its queue in g. A
// call whose context has ended returns its error: the message is not
// processed and will be delivered again.
func (r *recorder) handler(c *consumer.Consumer) consumer.Handler {
	member := c.MemberID()
	return func(ctx context.Context, m *consumer.Message) error {
		gen := c.Stats().Generation
		if err := ctx.Err(); err != nil {
			r.aborted.Add(1)
			return err
		}
		r.mu.Lock()
		r.list = append(r.list, delivery{seq: int64(len(r.list)), member: member, gen: gen, queue: m.Queue, offset: m.Offset,
			id: m.ID, body: string(m.Body), at: time.Now(), storeTime: m.StoreTime.UnixMilli()})
		r.seen[qoff{m.Queue, m.Offset, m.ID}]++
		r.ids[m.ID] = true
		r.mu.Unlock()
		return nil
	}
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.list)
}

func (r *recorder) snapshot() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.list)
}

// countWhere counts the deliveries that match.
func (r *recorder) countWhere(f func(d *delivery) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for i := range r.list {
		if f(&r.list[i]) {
			n++
		}
	}
	return n
}

// missing returns the stored messages not delivered yet.
func (r *recorder) missing(queues [][]storedMsg) []storedMsg {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []storedMsg
	for _, q := range queues {
		for _, m := range q {
			if r.seen[qoff{m.queue, m.offset, m.id}] == 0 {
				out = append(out, m)
			}
		}
	}
	return out
}

// member is a consumer running Run in the background.
type member struct {
	c      *consumer.Consumer
	log    *testlog.Capture
	runErr chan error
}

func startMember(t *testing.T, cl *localCluster, rec *recorder, group, topic, id string, opts ...consumer.Opt) *member {
	t.Helper()
	log := testlog.NewCapture(id, hclog.Warn)
	opts = append([]consumer.Opt{sdk.MetaAddrs(strings.Split(cl.meta, ",")...), consumer.MemberID(id),
		consumer.Session(3 * time.Second), consumer.Heartbeat(500 * time.Millisecond), consumer.StartFrom(consumer.Earliest),
		sdk.Logger(log.Slog())}, opts...)
	c, err := consumer.New(group, []string{topic}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	m := &member{c: c, log: log, runErr: make(chan error, 1)}
	t.Cleanup(func() {
		_ = c.Close()
		if t.Failed() {
			if lines := log.Lines(""); len(lines) > 0 {
				t.Logf("member %s logged (warnings and errors, last 20):\n%s", id, strings.Join(lines[max(0, len(lines)-20):], "\n"))
			}
		}
	})
	if rec != nil {
		go func() { m.runErr <- c.Run(context.Background(), rec.handler(c)) }()
	}
	return m
}

// close Closes the member and checks Run ended with nil.
func (m *member) close(t *testing.T) {
	t.Helper()
	began := time.Now()
	if err := m.c.Close(); err != nil {
		t.Errorf("Close of %s: %v", m.c.MemberID(), err)
	}
	select {
	case err := <-m.runErr:
		if err != nil {
			t.Errorf("Run of %s ended with %v after Close, want nil", m.c.MemberID(), err)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("Run of %s did not return within 10 s of Close", m.c.MemberID())
	}
	t.Logf("closed member %s in %v", m.c.MemberID(), time.Since(began).Round(time.Millisecond))
}

func (m *member) queues() int { return len(m.c.Stats().Queues) }

// metaLeader is the process name of the metaserver leader ("" if none
// answers with one).
func (c *localCluster) metaLeader() string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := c.mc.RaftStatus(ctx)
	if err != nil || st.LeaderID == "" {
		return ""
	}
	return "meta-" + st.LeaderID
}

// describeGroup runs `ferryctl group describe GROUP --json`.
func (c *localCluster) describeGroup(group string) groupDescribe {
	c.t.Helper()
	var d groupDescribe
	if err := json.Unmarshal([]byte(c.ctl("group", "describe", group, "--json")), &d); err != nil {
		c.t.Fatalf("ferryctl group describe %s --json: %v", group, err)
	}
	return d
}

// groupDescribe is what `ferryctl group describe --json` prints.
type groupDescribe struct {
	Name       string `json:"name"`
	Generation uint64 `json:"generation"`
	Members    []struct {
		ID string `json:"id"`
	} `json:"members"`
	Queues []struct {
		Topic     string `json:"topic"`
		Queue     uint32 `json:"queue"`
		Owner     string `json:"owner"`
		Committed int64  `json:"committed"`
		LogStart  *int64 `json:"log_start"`
		LogEnd    *int64 `json:"log_end"`
		Lag       *int64 `json:"lag"`
		Error     string `json:"error"`
	} `json:"queues"`
	TotalLag *int64 `json:"total_lag"`
}

// committed returns the group's committed offsets of topic by queue, from
// the metaserver client.
func (c *localCluster) committed(group, topic string) map[uint32]int64 {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	infos, err := c.mc.ConsumerGroups(ctx, group)
	if err != nil {
		c.t.Fatalf("ConsumerGroups(%s): %v", group, err)
	}
	out := map[uint32]int64{}
	for _, info := range infos {
		if info.Name != group {
			continue
		}
		for _, o := range info.Offsets {
			if o.Topic == topic {
				out[o.Queue] = o.Offset
			}
		}
	}
	return out
}

// assertCommittedAtEnds checks, once the group has no member, that its
// committed offsets are the queues' log ends (ends[q]), through ferryctl
// and the metaserver client.
func assertCommittedAtEnds(t *testing.T, c *localCluster, group, topic string, ends []int64) {
	t.Helper()
	d := c.describeGroup(group)
	if len(d.Members) != 0 {
		t.Errorf("ferryctl group describe %s: %d members after every member Closed: %+v", group, len(d.Members), d.Members)
	}
	seen := 0
	for _, q := range d.Queues {
		if q.Topic != topic {
			continue
		}
		seen++
		end := ends[q.Queue]
		if q.Committed != end || q.LogEnd == nil || *q.LogEnd != end || q.Lag == nil || *q.Lag != 0 {
			t.Errorf("ferryctl group describe %s: queue %d committed %d, log end %s, lag %s, error %q; want committed = log end = %d, lag 0",
				group, q.Queue, q.Committed, optStr(q.LogEnd), optStr(q.Lag), q.Error, end)
		}
	}
	if seen != len(ends) {
		t.Errorf("ferryctl group describe %s shows %d queues of %s, want %d", group, seen, topic, len(ends))
	}
	if d.TotalLag == nil || *d.TotalLag != 0 {
		t.Errorf("ferryctl group describe %s: total lag %s, want 0", group, optStr(d.TotalLag))
	}
	got := c.committed(group, topic)
	for q, end := range ends {
		if o, ok := got[uint32(q)]; !ok || o != end {
			t.Errorf("ConsumerGroups(%s): queue %d committed %d (known %v), want its log end %d", group, q, o, ok, end)
		}
	}
	t.Logf("COMMITTED: generation %d, no member, every queue of %s committed at its log end %v (ferryctl describe: total lag %s)",
		d.Generation, topic, ends, optStr(d.TotalLag))
}

func optStr(v *int64) string {
	if v == nil {
		return "null"
	}
	return fmt.Sprint(*v)
}

// logEnds is each queue's end by a PULL read of the whole topic.
func logEnds(queues [][]storedMsg) []int64 {
	ends := make([]int64, len(queues))
	for q := range queues {
		ends[q] = int64(len(queues[q]))
	}
	return ends
}

// TestConsumerGroupAtLeastOnceThroughFaults runs a group of two members
// (Session 3 s, Heartbeat 500 ms, from the earliest offset) on a topic of 8
// queues that a load of keyed and unkeyed messages, NORMAL and one in ten
// HIGH, fills at about 1000 messages/s, and meanwhile: (a) kills g1's
// master with SIGKILL (its slave is promoted; the old master is restarted
// and rejoins as the slave), (b) kills the metaserver leader with SIGKILL
// and restarts it, (c) Closes one member and starts a new one. Once the
// load stopped and the group caught up with every stored message, it
// checks the deliveries (see the file's comment) and, after the members
// Close, that the committed offsets are the log ends.
func TestConsumerGroupAtLeastOnceThroughFaults(t *testing.T) {
	skipShort(t)
	began := time.Now()
	c := startLocalCluster(t)
	masterArgs := c.cmdline("g1-master")
	c.waitMembers("g1", "g1-master", "g1-slave", 1, 10*time.Second, "at the start")
	const topic, group = "cg-faults", "cg-faults-readers"
	c.ctl("topic", "create", topic, "--queues", "8")
	oldAddr := c.addr("g1-master")

	rec := newRecorder()
	members := map[string]*member{}
	for _, id := range []string{"m1", "m2"} {
		members[id] = startMember(t, c, rec, group, topic, id)
	}
	testwait.ForEvery(t, 20*time.Second, 20*time.Millisecond, "m1 and m2 to share the 8 queues", func() bool {
		a, b := members["m1"].queues(), members["m2"].queues()
		return a > 0 && b > 0 && a+b == 8
	})

	l := startLoad(t, c, loadConfig{
		topic: topic, workers: 4, keysPerWorker: 8, unkeyedEvery: 4, rate: 250, highEvery: 10,
		maxMessages: 20_000, maxDuration: 40 * time.Second, reliability: protocol.Normal,
	})
	l.waitAcked(2000, 30*time.Second, "before the faults")
	testwait.ForEvery(t, 30*time.Second, 10*time.Millisecond, "1000 deliveries before the faults", func() bool { return rec.count() >= 1000 })
	t.Logf("before the faults (%v after the start): %d acknowledged, %d delivered", time.Since(began).Round(time.Millisecond), l.acked.Load(), rec.count())

	route, err := c.mc.RouteExisting(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	g1Queues := map[uint32]bool{}
	for _, q := range route.Queues {
		if q.Group == "g1" {
			g1Queues[q.Queue] = true
		}
	}

	// (a) g1's master dies; its slave is promoted; the old master comes
	// back. The slave is stopped first (SIGSTOP) until the master has
	// acknowledged NORMAL messages and the group has delivered messages of
	// g1's queues that the slave cannot have, as in TestFailoverKillMaster:
	// the failover loses that tail, and the group must go on from the new
	// master's log, whose offsets are behind what it delivered.
	c.signal("g1-slave", syscall.SIGSTOP)
	slaveStopped := time.Now()
	// (HIGH messages wait for the stopped slave, and the messages behind them
	// in their queues, keyed or not: they keep their queue through a failover.
	// Once the slave lags past -lag-time the group turns read-only. So g1
	// acknowledges a dozen or so.)
	var tail []string // ids g1-master acknowledged since the slave stopped
	tailDelivered := func() bool {
		tail = tail[:0]
		for _, o := range l.snapshot() {
			if o.err == nil && o.res.Group == "g1" && o.res.Broker == oldAddr && !o.at.Before(slaveStopped) {
				tail = append(tail, o.res.ID)
			}
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(tail) >= 8 && !slices.ContainsFunc(tail, func(id string) bool { return !rec.ids[id] })
	}
	if !testwait.Until(failoverBound, tailDelivered) {
		t.Fatalf("with g1-slave stopped for %v, g1-master acknowledged %d messages; want 8, every one delivered", time.Since(slaveStopped), len(tail))
	}
	killed := time.Now()
	c.kill9("g1-master")
	c.signal("g1-slave", syscall.SIGCONT)
	g := c.waitMembers("g1", "g1-slave", "", 2, failoverBound, "after kill -9 of g1-master")
	promoted := time.Now()
	epoch2 := epochStart(t, g, 2, "g1-slave")
	// The leader's counter, read before (b) restarts a metaserver.
	metaLost := c.metaCounter("ferrymq_metaserver_failover_lost_bytes_total")
	c.restart("g1-master", masterArgs)
	c.waitMembers("g1", "g1-slave", "g1-master", 2, failoverBound, "after the restart of g1-master")
	fm := waitFollower(t, c, "g1-master", 2)
	truncated := fm["ferrymq_broker_truncated_bytes_total"]
	testwait.ForEvery(t, failoverBound, 20*time.Millisecond, "deliveries of g1's queues stored by its new master", func() bool {
		return rec.countWhere(func(d *delivery) bool { return g1Queues[d.queue] && d.at.After(promoted) }) >= 100
	})
	t.Logf("FAILOVER: stopped g1-slave for %v (g1-master acknowledged %d messages meanwhile, all delivered), then killed g1-master; g1 writable with master g1-slave (epoch 2 from log offset %d) %v after SIGKILL; the metaserver reported %v lost bytes, the old master cut %v bytes on rejoining (%v after SIGKILL); the group delivered from g1's new master; %d acknowledged, %d delivered",
		killed.Sub(slaveStopped).Round(time.Millisecond), len(tail), epoch2, promoted.Sub(killed).Round(time.Millisecond), metaLost, truncated, time.Since(killed).Round(time.Millisecond), l.acked.Load(), rec.count())

	// (b) the metaserver leader dies, another is elected; it comes back.
	var leader string
	testwait.ForEvery(t, 20*time.Second, 50*time.Millisecond, "a metaserver leader", func() bool { leader = c.metaLeader(); return leader != "" })
	leaderArgs := c.cmdline(leader)
	metaKilled := time.Now()
	c.kill9(leader)
	var newLeader string
	testwait.ForEvery(t, 30*time.Second, 50*time.Millisecond, "a new metaserver leader after "+leader+" was killed", func() bool {
		newLeader = c.metaLeader()
		return newLeader != "" && newLeader != leader
	})
	elected := time.Now()
	c.restart(leader, leaderArgs)
	n := rec.count()
	testwait.ForEvery(t, 30*time.Second, 20*time.Millisecond, "500 more deliveries under the new metaserver leader", func() bool { return rec.count() >= n+500 })
	t.Logf("META LEADER: killed %s; %s elected %v later; the group delivered 500 more %v after the kill; %d acknowledged, %d delivered",
		leader, newLeader, elected.Sub(metaKilled).Round(time.Millisecond), time.Since(metaKilled).Round(time.Millisecond), l.acked.Load(), rec.count())

	// (c) m1 leaves with Close; m3 joins.
	testwait.ForEvery(t, 20*time.Second, 20*time.Millisecond, "m1 and m2 to share the 8 queues again", func() bool {
		a, b := members["m1"].queues(), members["m2"].queues()
		return a > 0 && b > 0 && a+b == 8
	})
	swapped := time.Now()
	members["m1"].close(t)
	members["m3"] = startMember(t, c, rec, group, topic, "m3")
	testwait.ForEvery(t, 20*time.Second, 20*time.Millisecond, "m2 and m3 to share the 8 queues and m3 to deliver", func() bool {
		a, b := members["m2"].queues(), members["m3"].queues()
		return a > 0 && b > 0 && a+b == 8 && rec.countWhere(func(d *delivery) bool { return d.member == "m3" }) > 0
	})
	t.Logf("REBALANCE: m1 Closed and m3 joined; m2 holds %d queues and m3 %d, m3 delivering %v after the Close",
		members["m2"].queues(), members["m3"].queues(), time.Since(swapped).Round(time.Millisecond))

	l.waitAcked(l.acked.Load()+1000, 30*time.Second, "after the faults")
	l.finish()

	// Catch up with everything stored, then leave.
	queues := readAll(t, c, topic)
	stored := 0
	for _, q := range queues {
		stored += len(q)
	}
	caughtUp := testwait.Until(15*time.Second, func() bool { return len(rec.missing(queues)) == 0 })
	if !caughtUp {
		miss := rec.missing(queues)
		var ex []string
		for _, m := range miss[:min(10, len(miss))] {
			ex = append(ex, fmt.Sprintf("q%d@%d %s (g1 queue %v)", m.queue, m.offset, m.tid, g1Queues[m.queue]))
		}
		t.Errorf("%d of the %d stored messages were not delivered within 15 s of the load's end, e.g. %s", len(miss), stored, strings.Join(ex, ", "))
	}
	t.Logf("caught up: %v after the load's end (%d stored)", caughtUp, stored)
	members["m2"].close(t)
	members["m3"].close(t)

	// What the log holds, by place and by id.
	inLog := map[qoff]storedMsg{}
	placesOf := map[string][]qoff{}
	for _, q := range queues {
		for _, m := range q {
			k := qoff{m.queue, m.offset, m.id}
			inLog[k] = m
			placesOf[m.id] = append(placesOf[m.id], k)
		}
	}
	dels := rec.snapshot()
	lossReported := metaLost > 0 || truncated > 0
	rec.mu.Lock()
	seen := maps.Clone(rec.seen)
	deliveredIDs := maps.Clone(rec.ids)
	rec.mu.Unlock()

	// 1. Every acknowledged message was delivered where the log holds it,
	// or was lost by the failover.
	inTail := tailLoss("g1", oldAddr, epoch2, promoted)
	var v violations
	acked, lostByFailover, lostDelivered := 0, 0, 0
	for _, o := range l.snapshot() {
		if o.err != nil {
			continue
		}
		acked++
		places := placesOf[o.res.ID]
		switch {
		case len(places) > 0 && slices.ContainsFunc(places, func(k qoff) bool { return seen[k] > 0 }):
		case len(places) > 0:
			v.add("acknowledged, stored and never delivered", "%s (id %s) at q%d@%d (g1's queue: %v; %s)", o.tid, o.res.ID, places[0].queue, places[0].offset,
				g1Queues[places[0].queue], map[bool]string{true: "its id was delivered from the old master's lost tail", false: "its id was never delivered"}[deliveredIDs[o.res.ID]])
		case inTail(&o) && lossReported:
			// Absent from every queue read with PULL: lost with the old
			// master's tail, which the failover reported.
			lostByFailover++
			if deliveredIDs[o.res.ID] {
				lostDelivered++
			}
		default:
			v.add("acknowledged and absent from the queues, not a loss the failover allows", "%s (id %s, %v, acked by %s of %s at q%d@%d, log offset %d, %v after the kill; epoch 2 starts at %d; loss reported %v)",
				o.tid, o.res.ID, o.rel, o.res.Broker, o.res.Group, o.res.Queue, o.res.QueueOffset, o.res.LogOffset, o.at.Sub(killed), epoch2, lossReported)
		}
	}

	// 2. A delivery is of a message where the log holds it, or one of g1's
	// queues the failover lost (read from the old master before it died;
	// the producer may have stored it again elsewhere, having never had
	// the old master's answer).
	deliveredLost := 0
	for _, d := range dels {
		m, ok := inLog[qoff{d.queue, d.offset, d.id}]
		switch {
		case ok && m.tid != d.body:
			v.add("delivered another body than stored", "%s at q%d@%d: delivered %q, stored %q", d.id, d.queue, d.offset, d.body, m.tid)
		case !ok && (!g1Queues[d.queue] || !lossReported):
			v.add("delivered and not in the log, without a failover loss", "%s %q at q%d@%d by %s", d.id, d.body, d.queue, d.offset, d.member)
		case !ok:
			deliveredLost++
		}
	}

	// 3. Per queue, the first deliveries of stored messages in increasing
	// offset order.
	last := map[uint32]int64{}
	firstSeen := map[qoff]bool{}
	for _, d := range dels {
		k := qoff{d.queue, d.offset, d.id}
		// A delivery of another record than the log's at that place (the
		// old master's, cut by the failover, and stored there again by the
		// new master) was read before the member's rewind to where the new
		// epoch took the queue up: the order starts again from there.
		if m, ok := inLog[k]; !ok || firstSeen[k] || m.storeTime != d.storeTime {
			continue
		}
		firstSeen[k] = true
		if prev, ok := last[d.queue]; ok && d.offset <= prev {
			v.add("first deliveries out of offset order", "queue %d: offset %d first delivered (by %s) after offset %d", d.queue, d.offset, d.member, prev)
		}
		last[d.queue] = d.offset
	}
	redelivered := len(dels) - len(firstSeen) - deliveredLost

	// 4. One member per queue and generation; across generations, how long
	// two members delivered one queue at the same time.
	type qgen struct {
		queue uint32
		gen   uint64
	}
	type span struct{ from, to time.Time }
	owners := map[qgen]map[string]*span{}
	gen0 := 0
	for _, d := range dels {
		if d.gen == 0 {
			gen0++ // the member had just dropped its queues (a lost session)
			continue
		}
		k := qgen{d.queue, d.gen}
		if owners[k] == nil {
			owners[k] = map[string]*span{}
		}
		if s := owners[k][d.member]; s == nil {
			owners[k][d.member] = &span{d.at, d.at}
		} else {
			s.to = d.at
		}
	}
	gens := map[uint64]bool{}
	var spans []struct {
		queue  uint32
		member string
		gen    uint64
		s      span
	}
	for k, ms := range owners {
		gens[k.gen] = true
		if len(ms) > 1 {
			v.add("two members delivered one queue in one generation", "queue %d generation %d: %v", k.queue, k.gen, slices.Sorted(maps.Keys(ms)))
		}
		for m, s := range ms {
			spans = append(spans, struct {
				queue  uint32
				member string
				gen    uint64
				s      span
			}{k.queue, m, k.gen, *s})
		}
	}
	var maxOverlap time.Duration
	overlaps := 0
	for i := range spans {
		for j := range spans {
			a, b := spans[i], spans[j]
			if i >= j || a.queue != b.queue || a.member == b.member {
				continue
			}
			from, to := a.s.from, a.s.to
			if b.s.from.After(from) {
				from = b.s.from
			}
			if b.s.to.Before(to) {
				to = b.s.to
			}
			if o := to.Sub(from); o > 0 {
				overlaps++
				maxOverlap = max(maxOverlap, o)
				// A member learns it lost a queue at its next heartbeat (or
				// stops it on its own a Session less a Heartbeat after its
				// last answered one).
				if o > 3*time.Second {
					v.add("two members delivered one queue at once for longer than a session", "queue %d: %s in generation %d and %s in generation %d for %v",
						a.queue, a.member, a.gen, b.member, b.gen, o)
				}
			}
		}
	}

	pastEnd := 0
	for _, m := range members {
		pastEnd += len(m.log.Lines("offset past the queue's end"))
	}
	assertCommittedAtEnds(t, c, group, topic, logEnds(queues))
	t.Logf("members logged %d times that a queue's committed or fetched offset was past its end on its master (going on from the end)", pastEnd)
	t.Logf("DELIVERIES: acknowledged=%d stored=%d delivered=%d (distinct stored messages %d) redelivered=%d aborted-by-revocation=%d "+
		"lost-by-failover=%d (acknowledged by g1-master past epoch 2's start %d and absent from every queue by PULL; %d of them delivered before the kill) "+
		"delivered-then-lost=%d generations=%d deliveries-in-generation-0=%d cross-generation-overlaps=%d (longest %v) in %v",
		acked, stored, len(dels), len(firstSeen), redelivered, rec.aborted.Load(), lostByFailover, epoch2, lostDelivered,
		deliveredLost, len(gens), gen0, overlaps, maxOverlap.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
	for _, k := range slices.Sorted(maps.Keys(v.count)) {
		t.Errorf("%s: %d, e.g.\n\t%s", k, v.count[k], strings.Join(v.examples[k], "\n\t"))
	}
}

// TestConsumerOffsetsSurviveBrokerRestart consumes the first half of every
// queue of a topic with a member in poll style (MarkProcessed up to there,
// Commit, Close), kills every broker with SIGKILL and restarts them, and
// starts a new member of the group: its first delivery of each queue is at
// the committed offset, it delivers nothing before it, and everything
// after it exactly once, messages sent after the restart too.
func TestConsumerOffsetsSurviveBrokerRestart(t *testing.T) {
	skipShort(t)
	began := time.Now()
	c := startLocalCluster(t)
	const topic, group = "cg-resume", "cg-resume-readers"
	c.ctl("topic", "create", topic, "--queues", "8")
	p, err := producer.New(sdk.MetaAddrs(strings.Split(c.meta, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sendTo := func(topic, prefix string, n int, tags ...string) {
		t.Helper()
		var wg sync.WaitGroup
		var failed atomic.Int64
		var firstErr atomic.Value
		for i := range n {
			wg.Add(1)
			tag := ""
			if len(tags) > 0 {
				tag = tags[i%len(tags)]
			}
			p.SendAsync(context.Background(), &producer.Message{Topic: topic, Key: fmt.Sprintf("k%d", i%64), Tag: tag, Body: []byte(fmt.Sprintf("%s-%d-%s", prefix, i, tag))},
				func(_ producer.Result, err error) {
					if err != nil && failed.Add(1) == 1 {
						firstErr.Store(err)
					}
					wg.Done()
				})
		}
		wg.Wait()
		if failed.Load() > 0 {
			t.Fatalf("%d of %d sends failed, e.g. %v", failed.Load(), n, firstErr.Load())
		}
	}
	send := func(prefix string, n int) { sendTo(topic, prefix, n) }
	send("before", 1600)
	// Tagged messages, for a group with a filter after the restarts.
	const tagged, tagGroup = "cg-tagged", "cg-tagged-a"
	c.ctl("topic", "create", tagged, "--queues", "4")
	sendTo(tagged, "tagged", 400, "A", "B", "C", "")
	queues := readAll(t, c, topic)
	ends := logEnds(queues)
	half := make([]int64, len(ends))
	for q, e := range ends {
		if e < 2 {
			t.Fatalf("queue %d holds %d messages: sends not spread over the queues (%v)", q, e, ends)
		}
		half[q] = e / 2
	}

	// A member processes each queue's first half in poll style, commits
	// and leaves.
	first := startMember(t, c, nil, group, topic, "first", consumer.ManualCommit())
	marked := make([]int64, len(ends))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for !slices.Equal(marked, half) {
		msgs, err := first.c.Poll(ctx)
		if err != nil {
			t.Fatalf("Poll with %v of %v marked: %v", marked, half, err)
		}
		for _, m := range msgs {
			if m.Offset < half[m.Queue] {
				if m.Offset != marked[m.Queue] {
					t.Fatalf("Poll handed out q%d@%d after %d messages of the queue", m.Queue, m.Offset, marked[m.Queue])
				}
				first.c.MarkProcessed(m)
				marked[m.Queue]++
			}
		}
	}
	if err := first.c.Commit(ctx); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if err := first.c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	got := c.committed(group, topic)
	for q, h := range half {
		if got[uint32(q)] != h {
			t.Errorf("after Commit and Close, queue %d committed %d, want %d (its first half processed)", q, got[uint32(q)], h)
		}
	}
	t.Logf("the first member processed %v of %v and committed them (%v after the start)", half, ends, time.Since(began).Round(time.Millisecond))

	// Every broker dies and comes back.
	names := []string{"g1-slave", "g2-slave", "g1-master", "g2-master"}
	args := map[string][]string{}
	for _, n := range names {
		args[n] = c.cmdline(n)
	}
	killed := time.Now()
	for _, n := range names {
		c.kill9(n)
	}
	for _, n := range []string{"g1-master", "g2-master", "g1-slave", "g2-slave"} {
		c.restart(n, args[n])
	}
	c.waitMembers("g1", "g1-master", "g1-slave", 1, failoverBound, "after every broker's restart")
	c.waitMembers("g2", "g2-master", "g2-slave", 1, failoverBound, "after every broker's restart")
	c.waitMaster("g1", failoverBound, "after every broker's restart")
	c.waitMaster("g2", failoverBound, "after every broker's restart")
	t.Logf("killed every broker with SIGKILL and restarted them: both groups writable with their slaves %v later", time.Since(killed).Round(time.Millisecond))
	d := c.describeGroup(group)
	for _, q := range d.Queues {
		if q.Committed != half[q.Queue] || q.LogEnd == nil || *q.LogEnd != ends[q.Queue] {
			t.Errorf("after the restart, ferryctl group describe: queue %d committed %d, log end %s; want %d and %d", q.Queue, q.Committed, optStr(q.LogEnd), half[q.Queue], ends[q.Queue])
		}
	}

	// A group with the filter A receives exactly the messages tagged A
	// (the restarted brokers' index rebuilt their fingerprints), and its
	// committed offsets reach the queues' ends past the others.
	tagRec := newRecorder()
	tagMember := startMember(t, c, tagRec, tagGroup, tagged, "tags", consumer.Filter("A"))
	if !testwait.Until(30*time.Second, func() bool { return tagRec.count() >= 100 }) {
		t.Errorf("the group of A received %d of the 100 tagged A within 30 s", tagRec.count())
	}
	tagMember.close(t)
	for _, d := range tagRec.snapshot() {
		if !strings.HasSuffix(d.body, "-A") {
			t.Errorf("the group of A received %q", d.body)
		}
	}
	if n := tagRec.count(); n != 100 {
		t.Errorf("the group of A received %d messages, want the 100 tagged A", n)
	}
	assertCommittedAtEnds(t, c, tagGroup, tagged, logEnds(readAll(t, c, tagged)))
	t.Logf("FILTERED: the group of A received the 100 tagged A of 400 and committed every queue at its end")

	// The key tables (and the tails' keys) came back with the logs: a key's
	// messages of the tagged topic are found in every group, newest first.
	var found struct {
		Messages []struct {
			Topic     string `json:"topic"`
			Key       string `json:"key"`
			StoreTime int64  `json:"store_time"`
		} `json:"messages"`
		Cursor string `json:"cursor"`
	}
	if err := json.Unmarshal([]byte(c.ctl("message", "find", "--key", "k3", "--limit", "1000", "--json")), &found); err != nil {
		t.Fatal(err)
	}
	n := 0
	for i, m := range found.Messages {
		if m.Key != "k3" || i > 0 && m.StoreTime > found.Messages[i-1].StoreTime {
			t.Errorf("message find --key k3: %+v at %d, not k3 newest first", m, i)
		}
		if m.Topic == tagged {
			n++
		}
	}
	if n != 7 || found.Cursor != "" {
		t.Errorf("message find --key k3 after the restarts: %d of %s (want the 7 sent), cursor %q", n, tagged, found.Cursor)
	}

	// A new member resumes at the committed offsets.
	rec := newRecorder()
	second := startMember(t, c, rec, group, topic, "second")
	send("after", 160)
	queues = readAll(t, c, topic)
	ends2 := logEnds(queues)
	want := 0
	for q := range ends2 {
		want += int(ends2[q] - half[q])
	}
	if !testwait.Until(30*time.Second, func() bool { return len(rec.missing(trimQueues(queues, half))) == 0 }) {
		t.Errorf("%d messages past the committed offsets not delivered within 30 s", len(rec.missing(trimQueues(queues, half))))
	}
	second.close(t)
	dels := rec.snapshot()
	firstAt := map[uint32]int64{}
	next := map[uint32]int64{}
	var v violations
	for _, d := range dels {
		if _, ok := firstAt[d.queue]; !ok {
			firstAt[d.queue] = d.offset
			next[d.queue] = half[d.queue]
		}
		switch {
		case d.offset < half[d.queue]:
			v.add("delivered before the committed offset", "q%d@%d (committed %d)", d.queue, d.offset, half[d.queue])
		case d.offset != next[d.queue]:
			v.add("not delivered in order exactly once", "q%d@%d after q%d@%d", d.queue, d.offset, d.queue, next[d.queue]-1)
		default:
			next[d.queue]++
		}
		if m := queues[d.queue]; d.offset < int64(len(m)) && (m[d.offset].id != d.id || m[d.offset].tid != d.body) {
			v.add("delivered another message than stored", "q%d@%d: %s %q, stored %s %q", d.queue, d.offset, d.id, d.body, m[d.offset].id, m[d.offset].tid)
		}
	}
	for q, h := range half {
		if firstAt[uint32(q)] != h {
			v.add("first delivery not at the committed offset", "queue %d: first delivered q%d@%d, committed %d", q, q, firstAt[uint32(q)], h)
		}
	}
	assertCommittedAtEnds(t, c, group, topic, ends2)
	t.Logf("RESUMED: the new member's first deliveries per queue %v (committed %v); it delivered %d messages (%d past the committed offsets, 160 sent after the restart), none before the committed offsets; in %v",
		firstAt, half, len(dels), want, time.Since(began).Round(time.Millisecond))
	for _, k := range slices.Sorted(maps.Keys(v.count)) {
		t.Errorf("%s: %d, e.g.\n\t%s", k, v.count[k], strings.Join(v.examples[k], "\n\t"))
	}
}

// trimQueues drops each queue's messages before from[q].
func trimQueues(queues [][]storedMsg, from []int64) [][]storedMsg {
	out := make([][]storedMsg, len(queues))
	for q := range queues {
		out[q] = queues[q][min(int64(len(queues[q])), from[q]):]
	}
	return out
}
