package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// The model-based failover test of issue 22. rapid draws, for every group
// of one real local cluster at once, a short schedule of faults on the
// group's two broker processes: kill -9, SIGTERM, SIGSTOP and SIGCONT (a
// pause as long as the waits drawn between them, up to well past the
// session and the failover margin) and restarts with the process's own
// command line, in any order, on either member, whatever its role by then.
// So the schedules include a master killed or paused until its slave is
// promoted, the new master killed and restarted after that failover, both
// members down at once, and the old master coming back first or last (the
// order in which what is down comes back is drawn too). A NORMAL and a
// HIGH producer load run throughout, so acknowledgements exist on both
// sides of every fault.
//
// After each schedule every process runs again, and the test checks what
// a user relies on:
//
//	(a) every group is writable (a NORMAL SEND to its registry master is
//	    acknowledged and the registry shows it RW) within the session plus
//	    the failover margin plus 2 s of its last process running, and it
//	    becomes whole again (its slave following in the current epoch, a
//	    HIGH SEND acknowledged) within modelHealthBound;
//	(b) every acknowledged message, HIGH and NORMAL, is stored, once all
//	    former masters handed their cut tails over (no `*.recover` marker
//	    left in any truncated/ directory), and no message id is stored
//	    twice but where the design allows it: a message whose result said
//	    PossibleDuplicate, which left a group that had no writable master
//	    and no slave to promote (checkTwice);
//	(c) each group's slave's commit log is byte for byte its master's once
//	    it caught up (the loads stopped);
//	(d) every member's local epochs (broker.LocalEpochs) are the registry's
//	    history, with fixed starts, for the epochs both hold, up to the
//	    current epoch.
//
// The timings are shrunk for this test (modelHeartbeat, modelSession,
// modelMargin) so a schedule takes seconds. The count of schedules is
// FERRY_MODEL_SCHEDULES (default modelSchedules, for CI), run modelGroups at
// a time as one rapid check; -rapid.checks, if given, counts rapid checks
// instead. The seed is logged; -rapid.seed repeats the draws (the timing of
// a real cluster is not repeatable). FERRY_MODEL_KEEP=DIR keeps a failed
// run's logs, epochs files and side files under DIR.

const (
	modelGroups    = 6
	modelSchedules = 100
	modelHeartbeat = 250 * time.Millisecond
	modelSession   = time.Second
	modelMargin    = 250 * time.Millisecond
	modelLagTime   = 2 * time.Second
	// modelWritableBound is the bound on (a): session + failover
	// margin + 2 s after every process of the group runs.
	modelWritableBound = modelSession + modelMargin + 2*time.Second
	// modelHealthBound bounds the wait for a group to be whole again (its
	// slave copying in the current epoch): a hang, not a timing.
	modelHealthBound = 30 * time.Second
	// modelPoll is how often the model's waits ask the cluster.
	modelPoll = 20 * time.Millisecond
)

// procState is what a broker process is doing, as the schedule left it.
type procState uint8

const (
	procUp procState = iota
	procPaused
	procDown
)

// opKind is one fault or repair on a broker process.
type opKind uint8

const (
	opKill  opKind = iota // kill -9
	opTerm                // SIGTERM: a clean stop
	opStop                // SIGSTOP
	opCont                // SIGCONT
	opStart               // restart with its own command line
)

var opNames = [...]string{opKill: "kill -9", opTerm: "SIGTERM", opStop: "SIGSTOP", opCont: "SIGCONT", opStart: "restart"}

func (k opKind) String() string { return opNames[k] }

// applicable is what may be done to a process in state s.
func applicable(s procState) []opKind {
	switch s {
	case procUp:
		return []opKind{opKill, opTerm, opStop}
	case procPaused:
		return []opKind{opCont, opKill}
	}
	return []opKind{opStart}
}

func (k opKind) leaves() procState {
	switch k {
	case opKill, opTerm:
		return procDown
	case opStop:
		return procPaused
	}
	return procUp
}

// modelOp is one step of a group's schedule: an operation on one of its
// two members, then a wait before the next step.
type modelOp struct {
	kind opKind
	who  int // 0: the group's master when the schedule began, 1: its slave
	then time.Duration
}

// schedule is one group's faults and then its bring-up: what the faults
// left down or paused, restarted or continued in a drawn order.
type schedule struct {
	group   string
	members [2]string // [0] the master at the start, [1] the slave
	ops     []modelOp
}

func (s schedule) String() string {
	var b strings.Builder
	for i, op := range s.ops {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s", op.kind, s.members[op.who])
		if op.then > 0 {
			fmt.Fprintf(&b, ", wait %v", op.then)
		}
	}
	return b.String()
}

// drawWait draws the wait after a step: short, within a session, or past
// the session and the margin (with the judge's 500 ms round, long enough
// for a lost master's slave to be promoted).
func drawWait(rt *rapid.T, label string) time.Duration {
	ms := func(lo, hi time.Duration) time.Duration {
		return time.Duration(rapid.IntRange(int(lo.Milliseconds()), int(hi.Milliseconds())).Draw(rt, label)) * time.Millisecond
	}
	switch rapid.IntRange(0, 2).Draw(rt, label+" kind") {
	case 0:
		return ms(0, modelSession/4)
	case 1:
		return ms(modelSession/4, modelSession)
	}
	return ms(modelSession+modelMargin+500*time.Millisecond, 2*modelSession+modelMargin+500*time.Millisecond)
}

// drawSchedule draws 2 to 5 faults on a group's members, then brings back
// what they left down or paused, in a drawn order. The last step has no
// wait: the check starts as soon as every process runs.
func drawSchedule(rt *rapid.T, group string, members [2]string) schedule {
	s := schedule{group: group, members: members}
	var st [2]procState
	for i := range rapid.IntRange(2, 5).Draw(rt, group+" faults") {
		who := rapid.IntRange(0, 1).Draw(rt, fmt.Sprintf("%s fault %d member", group, i))
		kind := rapid.SampledFrom(applicable(st[who])).Draw(rt, fmt.Sprintf("%s fault %d", group, i))
		st[who] = kind.leaves()
		s.ops = append(s.ops, modelOp{kind: kind, who: who, then: drawWait(rt, fmt.Sprintf("%s wait %d", group, i))})
	}
	var back []int
	for who := range 2 {
		if st[who] != procUp {
			back = append(back, who)
		}
	}
	back = rapid.Permutation(back).Draw(rt, group+" bring-up order")
	for i, who := range back {
		kind := opStart
		if st[who] == procPaused {
			kind = opCont
		}
		s.ops = append(s.ops, modelOp{kind: kind, who: who, then: drawWait(rt, fmt.Sprintf("%s bring-up wait %d", group, i))})
	}
	s.ops[len(s.ops)-1].then = 0
	return s
}

// step is one step of a schedule as it was done.
type step struct {
	op     modelOp
	name   string
	at     time.Duration // since the schedule began
	role   string        // the member's role by the registry just before
	master uint32        // the epoch it was the registry's master of then, 0 if not
}

// groupRun is what became of one group's schedule.
type groupRun struct {
	sched    schedule
	began    time.Time
	steps    []step
	errs     []string      // steps that could not be done as drawn
	allUp    time.Time     // when the last step ran: every process runs since
	writable time.Duration // from allUp to a NORMAL SEND acknowledged and RW; -1: never
	whole    time.Duration // from allUp to the group whole again (HIGH acknowledged); -1: never
	notWhole string        // why it was not whole at modelHealthBound
	epochs   [2]uint32     // the group's epoch before and after
}

// modelProbe sends single messages straight to a group's registry master,
// on a topic of its own, to tell when the group takes writes.
type modelProbe struct {
	c      *localCluster
	topic  string
	queues map[string]uint32 // group -> one of its queues in topic
}

func newModelProbe(t *testing.T, c *localCluster, groups int) *modelProbe {
	t.Helper()
	p := &modelProbe{c: c, topic: "model-probe", queues: map[string]uint32{}}
	c.ctl("topic", "create", p.topic, "--queues", strconv.Itoa(2*groups))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	route, err := c.mc.RouteExisting(ctx, p.topic)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range route.Queues {
		p.queues[q.Group] = q.Queue
	}
	if len(p.queues) != groups {
		t.Fatalf("the probe topic's queues are on %d groups, want %d: %+v", len(p.queues), groups, route.Queues)
	}
	return p
}

// send sends one message of rel to group's registry master in its
// epoch; it reports whether it was acknowledged OK, and why not.
func (p *modelProbe) send(group string, rel protocol.Reliability, n int) (bool, string) {
	g, ok := p.c.group(group)
	if !ok || g.Master.Addr == "" {
		return false, "no master in the registry"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tc := transport.NewClient(g.Master.Addr, transport.ClientConfig{})
	defer tc.Close()
	msg := protocol.Message{ID: fmt.Sprintf("probe-%s-%d-%d", group, time.Now().UnixNano(), n), Topic: p.topic, Queue: p.queues[group],
		Reliability: rel, Timestamp: time.Now().UnixMilli(), Body: []byte("probe")}
	resp, err := tc.Call(ctx, protocol.CodeSend, protocol.AppendSendRequest(nil, g.Epoch, []protocol.Message{msg}))
	if err != nil {
		return false, err.Error()
	}
	res, err := protocol.DecodeSendResponse(resp.Body, nil)
	if err != nil || len(res) != 1 {
		return false, fmt.Sprintf("%d results, %v", len(res), err)
	}
	if res[0].Status != protocol.StatusOK {
		return false, res[0].Status.String()
	}
	if g.State != "RW" {
		return false, "acknowledged, but the registry shows the group " + g.State + " (" + g.Reason + ")"
	}
	return true, ""
}

// modelCluster is the cluster the schedules run on.
type modelCluster struct {
	*localCluster
	cmdlines map[string][]string
	probe    *modelProbe
}

func (c *modelCluster) members(group string) [2]string {
	return [2]string{group + "-master", group + "-slave"}
}

// roleOf says what the registry makes of a member now, for the log, and
// the epoch it is the master of (0 if it is not).
func (c *modelCluster) roleOf(group, name string) (string, uint32) {
	g, ok := c.group(group)
	switch {
	case !ok:
		return "registry unreachable", 0
	case g.Master.ID == name:
		return fmt.Sprintf("master of epoch %d", g.Epoch), g.Epoch
	case g.Slave.ID == name:
		return fmt.Sprintf("slave in epoch %d", g.Epoch), 0
	}
	return fmt.Sprintf("out of the group at epoch %d", g.Epoch), 0
}

// do carries out one step on a member; it runs on the group's goroutine.
func (c *modelCluster) do(name string, kind opKind) error {
	if kind == opStart {
		return c.start(name, c.cmdlines[name])
	}
	pid, err := c.pidOf(name)
	if err != nil {
		return err
	}
	switch kind {
	case opKill:
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return err
		}
		if !testwait.Until(10*time.Second, func() bool { return !alive(pid) }) {
			return fmt.Errorf("%s (pid %d) still runs 10 s after SIGKILL", name, pid)
		}
	case opTerm:
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			return err
		}
		if !testwait.Until(15*time.Second, func() bool { return !alive(pid) }) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			return fmt.Errorf("%s (pid %d) did not stop within 15 s of SIGTERM; killed it", name, pid)
		}
	case opStop:
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return err
		}
		if !testwait.Until(10*time.Second, func() bool { return stopped(pid) }) {
			return fmt.Errorf("%s (pid %d) not stopped 10 s after SIGSTOP", name, pid)
		}
	case opCont:
		return syscall.Kill(pid, syscall.SIGCONT)
	}
	return nil
}

// whole reports whether a group is as a fresh cluster has it: writable,
// its slave (the other member) following in the current epoch, neither
// broken nor waiting, the master seeing it connected, the epoch's start
// fixed; and why not.
func (c *modelCluster) whole(group string) (bool, string) {
	g, ok := c.group(group)
	if !ok {
		return false, "registry unreachable"
	}
	ms := c.members(group)
	switch {
	case g.State != "RW":
		return false, "registry: " + g.State + " (" + g.Reason + ")"
	case g.Master.ID == "" || g.Slave.ID == "" || !slices.Contains(ms[:], g.Master.ID) || !slices.Contains(ms[:], g.Slave.ID):
		return false, fmt.Sprintf("registry: master %q, slave %q", g.Master.ID, g.Slave.ID)
	case g.Last.BrokerID != g.Master.ID || g.Last.Epoch != g.Epoch || !g.Last.SlaveConnected:
		return false, fmt.Sprintf("master's last heartbeat: %s at epoch %d, slave connected %v", g.Last.BrokerID, g.Last.Epoch, g.Last.SlaveConnected)
	case g.LastSlave.BrokerID != g.Slave.ID || g.LastSlave.Epoch != g.Epoch || g.LastSlave.Broken != "" || g.LastSlave.Waiting != "":
		return false, fmt.Sprintf("slave's last heartbeat: %s at epoch %d, broken %q, waiting %q", g.LastSlave.BrokerID, g.LastSlave.Epoch, g.LastSlave.Broken, g.LastSlave.Waiting)
	case g.MasterHeartbeatAgeMillis < 0 || g.MasterHeartbeatAgeMillis > modelSession.Milliseconds() ||
		g.SlaveHeartbeatAgeMillis < 0 || g.SlaveHeartbeatAgeMillis > modelSession.Milliseconds():
		return false, fmt.Sprintf("heartbeat ages: master %d ms, slave %d ms", g.MasterHeartbeatAgeMillis, g.SlaveHeartbeatAgeMillis)
	}
	if r, ok := g.Record(g.Epoch); !ok || !r.Fixed {
		return false, fmt.Sprintf("epoch %d's start not fixed: %+v", g.Epoch, g.History)
	}
	mm, ok1 := c.metrics(g.Master.ID)
	sm, ok2 := c.metrics(g.Slave.ID)
	switch {
	case !ok1 || !ok2:
		return false, "a member's metrics do not answer"
	case mm["ferrymq_broker_writable"] != 1 || mm["ferrymq_broker_slave_connected"] != 1:
		return false, fmt.Sprintf("%s: writable %v, slave connected %v", g.Master.ID, mm["ferrymq_broker_writable"], mm["ferrymq_broker_slave_connected"])
	case sm["ferrymq_broker_is_master"] != 0 || sm["ferrymq_broker_epoch"] != float64(g.Epoch) || sm[`ferrymq_broker_role{role="slave"}`] != 1:
		return false, fmt.Sprintf("%s: is master %v, epoch %v, role slave %v", g.Slave.ID, sm["ferrymq_broker_is_master"], sm["ferrymq_broker_epoch"], sm[`ferrymq_broker_role{role="slave"}`])
	}
	return true, ""
}

// run carries out a group's schedule, then measures (a). It runs on its
// own goroutine and reports through the groupRun only.
func (c *modelCluster) run(s schedule) *groupRun {
	r := &groupRun{sched: s, writable: -1, whole: -1}
	if g, ok := c.group(s.group); ok {
		r.epochs[0] = g.Epoch
	}
	began := time.Now()
	r.began = began
	for _, op := range s.ops {
		name := s.members[op.who]
		role, master := c.roleOf(s.group, name)
		at := time.Now()
		if err := c.do(name, op.kind); err != nil {
			r.errs = append(r.errs, fmt.Sprintf("%s %s: %v", op.kind, name, err))
		}
		r.steps = append(r.steps, step{op: op, name: name, at: at.Sub(began), role: role, master: master})
		r.allUp = time.Now()
		// The wait is the schedule's drawn fault timing, not a wait for
		// an outcome: nothing is asserted after it but what follows.
		time.Sleep(op.then)
	}
	n := 0
	if testwait.UntilEvery(modelWritableBound+modelHealthBound, modelPoll, func() bool {
		n++
		ok, _ := c.probe.send(s.group, protocol.Normal, n)
		return ok
	}) {
		r.writable = time.Since(r.allUp)
	}
	var why string
	if testwait.UntilEvery(modelHealthBound, modelPoll, func() bool {
		var ok bool
		if ok, why = c.whole(s.group); !ok {
			return false
		}
		n++
		ok, why = c.probe.send(s.group, protocol.High, n)
		return ok
	}) {
		r.whole = time.Since(r.allUp)
	} else {
		r.notWhole = why
	}
	if g, ok := c.group(s.group); ok {
		r.epochs[1] = g.Epoch
	}
	return r
}

// shape says what a schedule did: both members down or paused at once; a
// fault on a master promoted in the schedule; and the members that came
// back at its end, in order.
func (r *groupRun) shape() (both, hit bool, back []int) {
	var st [2]procState
	for _, s := range r.steps {
		if s.master > r.epochs[0] && s.op.kind != opStart && s.op.kind != opCont {
			hit = true
		}
		st[s.op.who] = s.op.kind.leaves()
		both = both || st[0] != procUp && st[1] != procUp
		if s.op.kind == opStart || s.op.kind == opCont {
			back = append(back, s.op.who)
		} else {
			back = nil
		}
	}
	return both, hit, back
}

// modelTotals are the figures over all schedules.
type modelTotals struct {
	mu                              sync.Mutex
	schedules, checks               int
	failovers                       int
	longestWritable, longestWhole   time.Duration
	ackedNormal, ackedHigh          int64
	failedNormal, failedHigh        int64
	recovered, lostNormal, lostHigh int
	flaggedTwice                    int // stored twice, flagged PossibleDuplicate, as the design allows
	writableFigures                 []time.Duration
	ops                             map[opKind]int
	// What the schedules covered: with a failover; a fault on a master
	// promoted in the same schedule; both members down or paused at once;
	// both brought back at the end, the master at the schedule's start
	// first (with a failover in the schedule, or none), or last (the
	// same).
	withFailover, newMasterHit, bothDown int
	oldFirst, oldLast                    [2]int // [0]: no failover, [1]: failover
}

// cover counts what a schedule covered.
func (tot *modelTotals) cover(r *groupRun) {
	if r.epochs[1] > r.epochs[0] {
		tot.withFailover++
	}
	both, hit, back := r.shape()
	if hit {
		tot.newMasterHit++
	}
	if both {
		tot.bothDown++
	}
	// members[0] was the master at the start.
	if len(back) == 2 {
		fo := 0
		if r.epochs[1] > r.epochs[0] {
			fo = 1
		}
		if back[0] == 0 {
			tot.oldFirst[fo]++
		} else {
			tot.oldLast[fo]++
		}
	}
}

func modelSchedulesWanted(t *testing.T) int {
	t.Helper()
	v := os.Getenv("FERRY_MODEL_SCHEDULES")
	if v == "" {
		return modelSchedules
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("FERRY_MODEL_SCHEDULES=%q: want a positive count", v)
	}
	return n
}

// flagGiven reports whether the flag was on the command line.
func flagGiven(name string) bool {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// setFlag sets a rapid flag for this test unless the command line or the
// environment gave it, and puts it back after.
func setFlag(t *testing.T, name, env, value string) {
	if flagGiven(name) || os.Getenv(env) != "" {
		return
	}
	f := flag.Lookup(name)
	if f == nil {
		t.Fatalf("no flag -%s", name)
	}
	old := f.Value.String()
	if err := flag.Set(name, value); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = flag.Set(name, old) })
}

// TestFailoverModel runs random schedules of faults on the brokers of a
// real cluster and checks (a) to (d) after each (see the top of this file).
func TestFailoverModel(t *testing.T) {
	skipShort(t)
	schedules := modelSchedulesWanted(t)
	checks := (schedules + modelGroups - 1) / modelGroups
	setFlag(t, "rapid.checks", "RAPID_CHECKS", strconv.Itoa(checks))
	setFlag(t, "rapid.seed", "RAPID_SEED", strconv.FormatUint(rand.Uint64()>>1, 10))
	// A failing schedule is reported with its seed and its steps; a fail
	// file of a real cluster's run would not repeat its timing.
	setFlag(t, "rapid.nofailfile", "RAPID_NOFAILFILE", "true")
	checks, _ = strconv.Atoi(flag.Lookup("rapid.checks").Value.String())
	seed := flag.Lookup("rapid.seed").Value.String()
	t.Logf("MODEL: %d schedules: %d rapid checks of %d groups at once; seed %s (repeat the draws with -rapid.seed=%s); "+
		"heartbeat %v, session %v, failover margin %v, lag time %v; writable bound %v",
		checks*modelGroups, checks, modelGroups, seed, seed, modelHeartbeat, modelSession, modelMargin, modelLagTime, modelWritableBound)

	started := time.Now()
	lc := startLocalCluster(t, fmt.Sprintf("FERRY_GROUPS=%d", modelGroups), "FERRY_HEARTBEAT="+modelHeartbeat.String(),
		"FERRY_SESSION="+modelSession.String(), "FERRY_FAILOVER_MARGIN="+modelMargin.String(), "FERRY_LAG_TIME="+modelLagTime.String())
	c := &modelCluster{localCluster: lc, cmdlines: map[string][]string{}}
	var groups []string
	for i := 1; i <= modelGroups; i++ {
		group := fmt.Sprintf("g%d", i)
		groups = append(groups, group)
		for _, name := range c.members(group) {
			c.cmdlines[name] = c.cmdline(name)
		}
	}
	c.probe = newModelProbe(t, lc, modelGroups)
	if keep := os.Getenv("FERRY_MODEL_KEEP"); keep != "" {
		t.Cleanup(func() { c.keep(t, keep) }) // before the processes stop
	}
	tot := &modelTotals{ops: map[opKind]int{}}
	run := 0

	rapid.Check(t, func(rt *rapid.T) {
		run++
		// Every schedule starts from a whole cluster: the previous one's
		// check made it so. If it is not (a failed check, then rapid
		// shrinking), nothing more can be learnt from this cluster.
		for _, group := range groups {
			var why string
			if !testwait.UntilEvery(modelHealthBound, modelPoll, func() bool {
				var ok bool
				ok, why = c.whole(group)
				return ok
			}) {
				modelLogTails(t, c, group)
				t.Fatalf("run %d: %s is not whole at the start of a schedule (%s); the previous schedule left it so", run, group, why)
			}
		}
		ls := c.startModelLoads(t, run)
		defer ls.halt()

		var scheds []schedule
		for _, group := range groups {
			g, _ := c.group(group)
			ms := [2]string{g.Master.ID, g.Slave.ID}
			scheds = append(scheds, drawSchedule(rt, group, ms))
		}
		runs := make([]*groupRun, len(scheds))
		var wg sync.WaitGroup
		for i, s := range scheds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runs[i] = c.run(s)
			}()
		}
		wg.Wait()
		mt := modelT{t, rt}
		c.report(mt, run, runs, tot)

		// (b): the loads stop; every former master hands its cut tail
		// over; every acknowledged message is stored, once.
		for _, l := range ls.all() {
			l.finish()
		}
		var markers []string
		if !testwait.UntilEvery(modelHealthBound, modelPoll, func() bool { markers = c.recoverMarkers(groups); return len(markers) == 0 }) {
			mt.Errorf("run %d: cut tails not handed over %v after the schedules: %v", run, modelHealthBound, markers)
		}
		c.checkLoads(mt, run, ls, runs, tot)
		for _, r := range runs {
			c.checkGroup(mt, run, r)
		}
		// Producers of this check end here, not at the test's end.
		for _, l := range ls.all() {
			_ = l.p.Close()
		}
	})
	tot.mu.Lock()
	defer tot.mu.Unlock()
	slices.Sort(tot.writableFigures)
	median := time.Duration(0)
	if n := len(tot.writableFigures); n > 0 {
		median = tot.writableFigures[n/2]
	}
	t.Logf("MODEL COVERAGE: of %d schedules, %d with a failover, %d with a fault on a master promoted in it, %d with both members down or paused at once; "+
		"both brought back at the end, the starting master first: %d (%d of them with a failover), last: %d (%d with a failover)",
		tot.schedules, tot.withFailover, tot.newMasterHit, tot.bothDown,
		tot.oldFirst[0]+tot.oldFirst[1], tot.oldFirst[1], tot.oldLast[0]+tot.oldLast[1], tot.oldLast[1])
	t.Logf("MODEL FIGURES: %d schedules (%d rapid runs, seed %s) in %v; steps %v; %d failovers; "+
		"time to writable after every process ran: median %v, longest %v (bound %v); to whole again: longest %v; "+
		"acknowledged NORMAL %d (failed %d), HIGH %d (failed %d); recovered %d; lost NORMAL %d, HIGH %d; "+
		"stored twice %d, each flagged PossibleDuplicate and from a group left with no master and no slave to promote",
		tot.schedules, run, seed, time.Since(started).Round(time.Second), tot.ops, tot.failovers,
		median.Round(time.Millisecond), tot.longestWritable.Round(time.Millisecond), modelWritableBound, tot.longestWhole.Round(time.Millisecond),
		tot.ackedNormal, tot.failedNormal, tot.ackedHigh, tot.failedHigh, tot.recovered, tot.lostNormal, tot.lostHigh, tot.flaggedTwice)
}

// report logs each group's schedule and figures, and checks (a).
func (c *modelCluster) report(mt modelT, run int, runs []*groupRun, tot *modelTotals) {
	tot.mu.Lock()
	defer tot.mu.Unlock()
	tot.checks++
	for _, r := range runs {
		tot.schedules++
		tot.failovers += int(r.epochs[1] - r.epochs[0])
		for _, op := range r.sched.ops {
			tot.ops[op.kind]++
		}
		tot.cover(r)
		var events []string
		for _, s := range r.steps {
			events = append(events, fmt.Sprintf("+%v %s %s (%s)", s.at.Round(time.Millisecond), s.op.kind, s.name, s.role))
		}
		line := fmt.Sprintf("run %d %s from %s: %s; writable %v, whole %v after all ran; epoch %d -> %d",
			run, r.sched.group, r.began.Format("15:04:05.000"), strings.Join(events, ", "), r.writable.Round(time.Millisecond), r.whole.Round(time.Millisecond), r.epochs[0], r.epochs[1])
		mt.Logf("%s", line)
		for _, e := range r.errs {
			mt.Errorf("run %d %s: a step could not be done as drawn: %s (schedule: %s)", run, r.sched.group, e, r.sched)
		}
		if r.writable >= 0 {
			tot.writableFigures = append(tot.writableFigures, r.writable)
			tot.longestWritable = max(tot.longestWritable, r.writable)
		}
		if r.whole >= 0 {
			tot.longestWhole = max(tot.longestWhole, r.whole)
		}
		if r.writable < 0 || r.writable > modelWritableBound {
			modelLogTails(mt.t, c, r.sched.group)
			mt.Errorf("run %d %s: (a) writable %v after every process ran, over the bound %v (schedule: %s)",
				run, r.sched.group, r.writable, modelWritableBound, r.sched)
		}
		if r.whole < 0 {
			modelLogTails(mt.t, c, r.sched.group)
			mt.Errorf("run %d %s: not whole again %v after every process ran: %s (schedule: %s)", run, r.sched.group, modelHealthBound, r.notWhole, r.sched)
		}
	}
}

// modelT reports a check's failures to rapid, and logs them with
// everything else in the test's log: rapid shows only its last run's.
type modelT struct {
	t  *testing.T
	rt *rapid.T
}

func (m modelT) Helper()                         { m.t.Helper(); m.rt.Helper() }
func (m modelT) Logf(format string, args ...any) { m.t.Logf(format, args...) }
func (m modelT) Errorf(format string, args ...any) {
	m.t.Logf("FAILED: "+format, args...)
	m.rt.Errorf(format, args...)
}
func (m modelT) Fatalf(format string, args ...any) {
	m.t.Logf("FAILED: "+format, args...)
	m.rt.Fatalf(format, args...)
}
func (m modelT) Fatal(args ...any) { m.Fatalf("%s", fmt.Sprint(args...)) }

// modelLoads are a check's NORMAL and HIGH loads, each on its own topic.
type modelLoads struct{ normal, high *load }

func (ls modelLoads) all() []*load { return []*load{ls.normal, ls.high} }

func (ls modelLoads) halt() {
	for _, l := range ls.all() {
		l.halt()
	}
}

// startModelLoads creates the check's topics (two queues per group) and
// starts a NORMAL and a HIGH load on them, and waits until both have
// acknowledgements.
func (c *modelCluster) startModelLoads(t *testing.T, run int) modelLoads {
	t.Helper()
	var ls modelLoads
	for _, x := range []struct {
		l   **load
		rel protocol.Reliability
	}{{&ls.normal, protocol.Normal}, {&ls.high, protocol.High}} {
		topic := fmt.Sprintf("model-%d-%s", run, strings.ToLower(x.rel.String()))
		c.ctl("topic", "create", topic, "--queues", strconv.Itoa(2*modelGroups))
		*x.l = startLoad(t, c.localCluster, loadConfig{
			topic:         topic,
			workers:       2,
			keysPerWorker: 6,
			unkeyedEvery:  3,
			rate:          25,
			maxMessages:   6000,
			maxDuration:   2 * time.Minute,
			reliability:   x.rel,
		})
		// Lost acknowledged messages are counted by checkLoads, by kind.
		(*x.l).lostOK = func(*outcome) bool { return true }
	}
	for _, l := range ls.all() {
		l.waitAcked(10, 30*time.Second, l.cfg.topic+" before the faults")
	}
	return ls
}

// recoverMarkers lists the cut tails not yet handed over.
func (c *modelCluster) recoverMarkers(groups []string) []string {
	var out []string
	for _, group := range groups {
		for _, name := range c.members(group) {
			m, _ := filepath.Glob(filepath.Join(c.dataDir(name), "truncated", "*.recover"))
			out = append(out, m...)
		}
	}
	return out
}

// checkLoads checks (b) for both loads.
func (c *modelCluster) checkLoads(mt modelT, run int, ls modelLoads, runs []*groupRun, tot *modelTotals) {
	for _, l := range ls.all() {
		lost := l.checkOn(mt, c.localCluster, l.cfg.topic)
		var ex []string
		scheds := map[string]string{}
		for i, o := range lost {
			if i < 5 {
				ex = append(ex, fmt.Sprintf("%s (%v, acked by %s of %s at queue %d offset %d, log offset %d, at %s)", o.tid, o.rel, o.res.Broker,
					o.res.Group, o.res.Queue, o.res.QueueOffset, o.res.LogOffset, o.at.Format("15:04:05.000")))
			}
			for _, r := range runs {
				if r.sched.group == o.res.Group {
					scheds[r.sched.group] = r.sched.String()
				}
			}
		}
		if len(lost) > 0 {
			mt.Errorf("run %d: (b) %d acknowledged %v messages of %s are not stored, though every cut tail was handed over: %v (schedules: %v)",
				run, len(lost), l.cfg.reliability, l.cfg.topic, ex, scheds)
		}
		c.checkTwice(mt, run, l, runs)
		tot.mu.Lock()
		if l.cfg.reliability == protocol.High {
			tot.ackedHigh += l.acked.Load()
			tot.failedHigh += l.failed.Load()
			tot.lostHigh += len(lost)
		} else {
			tot.ackedNormal += l.acked.Load()
			tot.failedNormal += l.failed.Load()
			tot.lostNormal += len(lost)
		}
		tot.recovered += l.recoveredN
		tot.flaggedTwice += len(l.flaggedTwice)
		tot.mu.Unlock()
	}
}

// checkTwice checks that the messages of l stored twice are ones the
// design allows: checkOn reports those whose result did not say
// PossibleDuplicate; a flagged one must have left a group that, by the
// route, had no writable master and no slave to promote (the producer's
// FailoverWait, far longer than a schedule, does not come into it): both
// members down or paused at once, or the master promoted in the schedule
// faulted while its old master was out of the group.
func (c *modelCluster) checkTwice(mt modelT, run int, l *load, runs []*groupRun) {
	if len(l.flaggedTwice) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	route, err := c.mc.RouteExisting(ctx, l.cfg.topic)
	if err != nil {
		mt.Errorf("run %d: route of %s: %v", run, l.cfg.topic, err)
		return
	}
	groupOf := func(q uint32) string {
		for _, qr := range route.Queues {
			if qr.Queue == q {
				return qr.Group
			}
		}
		return ""
	}
	for _, f := range l.flaggedTwice {
		var at []string
		for _, m := range f.copies {
			at = append(at, fmt.Sprintf("q%d@%d on %s", m.queue, m.offset, groupOf(m.queue)))
		}
		if n := len(slices.DeleteFunc(slices.Clone(f.copies), func(m storedMsg) bool { return m.queue != f.o.res.Queue })); n > 1 {
			mt.Errorf("run %d: (b) %s (%v) is stored %d times in its own queue, at %v", run, f.o.tid, f.o.rel, n, at)
		}
		for _, m := range f.copies {
			if m.queue == f.o.res.Queue {
				continue // where it was acknowledged
			}
			from := groupOf(m.queue)
			i := slices.IndexFunc(runs, func(r *groupRun) bool { return r.sched.group == from })
			if i < 0 {
				mt.Errorf("run %d: (b) %s stored at %v: no schedule for %s", run, f.o.tid, at, from)
				continue
			}
			if both, hit, _ := runs[i].shape(); !both && !hit {
				mt.Errorf("run %d: (b) %s (%v) is stored twice, at %v, acknowledged PossibleDuplicate by %s, but %s always had a master or a slave to promote (schedule: %s)",
					run, f.o.tid, f.o.rel, at, f.o.res.Group, from, runs[i].sched)
			}
		}
		mt.Logf("run %d: %s (%v) stored twice, at %v; its result said PossibleDuplicate", run, f.o.tid, f.o.rel, at)
	}
}

// checkGroup checks (c) and (d) for a group.
func (c *modelCluster) checkGroup(mt modelT, run int, r *groupRun) {
	group := r.sched.group
	g, ok := c.group(group)
	if !ok {
		mt.Errorf("run %d %s: the registry does not answer", run, group)
		return
	}
	// (c): the slave catches up with the master, and its log is the
	// master's, byte for byte.
	var mEnd, sEnd float64
	if !testwait.UntilEvery(modelHealthBound, modelPoll, func() bool {
		mm, ok1 := c.metrics(g.Master.ID)
		sm, ok2 := c.metrics(g.Slave.ID)
		mEnd, sEnd = mm["ferrymq_broker_log_end_offset"], sm["ferrymq_broker_log_end_offset"]
		return ok1 && ok2 && mEnd > 0 && mEnd == sEnd
	}) {
		mt.Errorf("run %d %s: (c) the slave %s did not catch up with the master %s: log ends %v and %v (schedule: %s)",
			run, group, g.Slave.ID, g.Master.ID, sEnd, mEnd, r.sched)
	} else if err := sameLog(c.dataDir(g.Master.ID), c.dataDir(g.Slave.ID), int64(mEnd)); err != nil {
		mt.Errorf("run %d %s: (c) master %s, slave %s: %v (schedule: %s)", run, group, g.Master.ID, g.Slave.ID, err, r.sched)
	}
	// (d): every member's epochs are the registry's.
	for _, name := range c.members(group) {
		local, err := broker.LocalEpochs(c.dataDir(name))
		if err != nil {
			mt.Errorf("run %d %s: (d) %v", run, group, err)
			continue
		}
		if why := sameHistory(local, g); why != "" {
			mt.Errorf("run %d %s: (d) %s's local epochs %s; the registry's history %s: %s (schedule: %s)",
				run, group, name, fmtEpochs(local), fmtEpochs(g.History), why, r.sched)
		}
	}
}

// sameHistory says how a member's local epochs differ from the registry's
// history ("" if they do not): the member holds the current epoch, every
// start fixed, and the registry's records from its oldest local epoch on,
// as the registry has them.
func sameHistory(local []routing.EpochRecord, g api.GroupInfo) string {
	if len(local) == 0 {
		return "no local epochs"
	}
	if last := local[len(local)-1].Epoch; last != g.Epoch {
		return fmt.Sprintf("its last epoch is %d, the group's %d", last, g.Epoch)
	}
	key := func(r routing.EpochRecord) string {
		return fmt.Sprintf("%d:%s@%d fixed=%v", r.Epoch, r.Master, r.Start, r.Fixed)
	}
	var mine, theirs []string
	for _, r := range local {
		if !r.Fixed || r.Start < 0 {
			return fmt.Sprintf("epoch %d's start is not fixed", r.Epoch)
		}
		if len(g.History) > 0 && r.Epoch >= g.History[0].Epoch {
			mine = append(mine, key(r))
		}
	}
	for _, r := range g.History {
		if r.Epoch >= local[0].Epoch {
			theirs = append(theirs, key(r))
		}
	}
	if !slices.Equal(mine, theirs) {
		return fmt.Sprintf("%v against %v", mine, theirs)
	}
	return ""
}

func fmtEpochs(h []routing.EpochRecord) string {
	var b []string
	for _, r := range h {
		b = append(b, fmt.Sprintf("%d:%s@%d%s", r.Epoch, r.Master, r.Start, map[bool]string{true: "", false: "?"}[r.Fixed]))
	}
	return "[" + strings.Join(b, " ") + "]"
}

// segmentFile matches a commit-log segment: its base offset in 20 digits.
var segmentFile = regexp.MustCompile(`^(\d{20})\.log$`)

// logRange reads a broker's commit log from its data directory, from its
// first offset to end (not past it: a running broker's last segment holds
// pre-touched zeros after its end); it returns the first offset too.
func logRange(dir string, end int64) (int64, []byte, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, nil, err
	}
	var bases []int64
	for _, e := range entries { // sorted by name: by base offset
		if m := segmentFile.FindStringSubmatch(e.Name()); m != nil && !e.IsDir() {
			b, _ := strconv.ParseInt(m[1], 10, 64)
			bases = append(bases, b)
		}
	}
	if len(bases) == 0 {
		return 0, nil, fmt.Errorf("%s holds no segment", dir)
	}
	data := make([]byte, 0, max(0, end-bases[0]))
	for i, base := range bases {
		hi := end
		if i+1 < len(bases) {
			hi = min(hi, bases[i+1])
		}
		if hi <= base {
			break
		}
		f, err := os.Open(filepath.Join(dir, fmt.Sprintf("%020d.log", base)))
		if err != nil {
			return 0, nil, err
		}
		buf := make([]byte, hi-base)
		n, err := f.ReadAt(buf, 0)
		f.Close()
		if int64(n) != hi-base {
			return 0, nil, fmt.Errorf("segment %020d.log of %s holds %d bytes, want %d up to the log end %d: %v", base, dir, n, hi-base, end, err)
		}
		data = append(data, buf...)
	}
	return bases[0], data, nil
}

// sameLog compares two brokers' commit logs, both ending at end, from the
// later of their first offsets.
func sameLog(masterDir, slaveDir string, end int64) error {
	mb, md, err := logRange(masterDir, end)
	if err != nil {
		return err
	}
	sb, sd, err := logRange(slaveDir, end)
	if err != nil {
		return err
	}
	from := max(mb, sb)
	a, b := md[from-mb:], sd[from-sb:]
	if len(a) != len(b) {
		return fmt.Errorf("the logs from %d hold %d and %d bytes up to %d", from, len(a), len(b), end)
	}
	for i := range a {
		if a[i] != b[i] {
			return fmt.Errorf("the commit logs differ from log offset %d (compared from %d to %d)", from+int64(i), from, end)
		}
	}
	return nil
}

// keep copies, after a failure, the cluster's logs and each broker's
// epochs file and side files to a new directory under dir
// (FERRY_MODEL_KEEP), which the test's temporary directory outlives.
func (c *modelCluster) keep(t *testing.T, dir string) {
	if !t.Failed() {
		return
	}
	to := filepath.Join(dir, time.Now().Format("20060102-150405"))
	var files []string
	logs, _ := filepath.Glob(filepath.Join(c.home, "logs", "*"))
	files = append(files, logs...)
	for name := range c.cmdlines {
		files = append(files, filepath.Join(c.dataDir(name), "epoch"))
		side, _ := filepath.Glob(filepath.Join(c.dataDir(name), "truncated", "*"))
		files = append(files, side...)
	}
	for _, f := range files {
		rel, _ := filepath.Rel(c.home, f)
		b, err := os.ReadFile(f)
		if err == nil {
			err = os.MkdirAll(filepath.Dir(filepath.Join(to, rel)), 0o755)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(to, rel), b, 0o644)
		}
		if err != nil {
			t.Logf("keeping %s: %v", f, err)
		}
	}
	t.Logf("kept the cluster's logs, epochs and side files in %s", to)
}

// modelLogTails logs the last lines of a group's brokers' logs.
func modelLogTails(t *testing.T, c *modelCluster, group string) {
	for _, name := range c.members(group) {
		b, err := os.ReadFile(filepath.Join(c.home, "logs", name+".log"))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		t.Logf("last lines of %s.log:\n%s", name, strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
}
