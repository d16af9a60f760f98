package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/consumer"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// The tests of issue 23 through real processes: consumer groups without
// zombies. Members run in processes of their own (memberproc_test.go) so
// they can be paused with SIGSTOP and killed with SIGKILL; every handler
// call is recorded with its member process, queue, offset, and when it
// began and ended. From those records the tests check what a user of a
// consumer group relies on:
//
//   - one owner at a time: per queue, no two member processes are in a
//     handler call at the same moment;
//   - a member paused past its session (SIGSTOP, then SIGCONT) hands out
//     nothing once it is resumed until the registry gives it queues again;
//   - committed offsets never move back (polled from the registry during
//     the run), and are the queues' ends once every member Closed;
//   - every acknowledged message is handled at least once;
//   - members started together share the first assignment: none of them
//     takes a queue another then takes from it;
//   - a member the cluster does not authorize for its group is told so at
//     once (Run ends with NOT_AUTHORIZED; ferryctl consume exits 1).
//
// Duplicates (a message handled again) are allowed (at least once) but
// counted per kind of rebalance and logged, with the longest time a queue
// with messages waiting had nobody handling it, as FIGURES lines.

// The members' session and heartbeat (Session's lease margin is one
// heartbeat: a member stops handing out messages 2.5 s after its last
// answered heartbeat was sent).
const (
	ownSession   = 3 * time.Second
	ownHeartbeat = 500 * time.Millisecond
	ownQueues    = 8
)

// forTest is the cluster as seen by a subtest: its failures are t's.
func (c *localCluster) forTest(t *testing.T) *localCluster {
	cc := *c
	cc.t = t
	return &cc
}

func (c *localCluster) memberSpec(group, topic, id string, work time.Duration) memberSpec {
	return memberSpec{Meta: strings.Split(c.meta, ","), Group: group, Topic: topic, Member: id,
		Session: ownSession, Heartbeat: ownHeartbeat, Work: work}
}

// consumerGroup is the registry's view of a group (false if the metaserver
// does not answer or has no such group).
func (c *localCluster) consumerGroup(group string) (api.ConsumerGroupInfo, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	infos, err := c.mc.ConsumerGroups(ctx, group)
	if err != nil {
		return api.ConsumerGroupInfo{}, false
	}
	for _, info := range infos {
		if info.Name == group {
			return info, true
		}
	}
	return api.ConsumerGroupInfo{}, false
}

// owners maps each queue of topic to its owner in the registry's current
// generation.
func owners(info api.ConsumerGroupInfo, topic string) map[uint32]string {
	out := map[uint32]string{}
	for _, m := range info.Members {
		for _, q := range m.Queues {
			if q.Topic == topic {
				out[q.Queue] = m.ID
			}
		}
	}
	return out
}

func memberIDs(info api.ConsumerGroupInfo) []string {
	var ids []string
	for _, m := range info.Members {
		ids = append(ids, m.ID)
	}
	slices.Sort(ids)
	return ids
}

// waitSettled waits until the registry's members are exactly want's and
// every queue's owner, as the process want names, has handled a message of
// it since since: each member delivers what the registry gave it.
func waitSettled(t *testing.T, c *localCluster, recs *groupRecords, group, topic string, since time.Time, want map[string]*memberProc, why string) {
	t.Helper()
	ids := slices.Sorted(maps.Keys(want))
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("%s: last seen: %s", why, last)
		}
	}()
	testwait.ForEvery(t, 30*time.Second, 20*time.Millisecond, fmt.Sprintf("%s: the group to settle on members %v, each handling its queues", why, ids), func() bool {
		info, ok := c.consumerGroup(group)
		if !ok {
			last = "the registry did not answer"
			return false
		}
		if got := memberIDs(info); !slices.Equal(got, ids) {
			last = fmt.Sprintf("members %v", got)
			return false
		}
		own := owners(info, topic)
		handled := map[uint32]map[string]bool{}
		for _, r := range recs.snapshot() {
			if r.Start >= since.UnixNano() {
				if handled[r.Queue] == nil {
					handled[r.Queue] = map[string]bool{}
				}
				handled[r.Queue][r.deliverer()] = true
			}
		}
		for q := range uint32(ownQueues) {
			o, ok := own[q]
			if !ok {
				last = fmt.Sprintf("queue %d has no owner (generation %d)", q, info.Generation)
				return false
			}
			if p := want[o]; p == nil || !handled[q][fmt.Sprintf("%s/%d", o, p.pid)] {
				last = fmt.Sprintf("queue %d's owner %s has handled nothing of it yet (generation %d)", q, o, info.Generation)
				return false
			}
		}
		return true
	})
}

// registryWatch polls a group's committed offsets from the registry while
// a test runs and records every one that moved back.
type registryWatch struct {
	stopCh chan struct{}
	done   chan struct{}

	mu      sync.Mutex
	polls   int
	high    map[uint32]int64
	lowered []string
}

func watchRegistry(t *testing.T, c *localCluster, group, topic string) *registryWatch {
	w := &registryWatch{stopCh: make(chan struct{}), done: make(chan struct{}), high: map[uint32]int64{}}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stopCh:
				return
			case <-tick.C:
			}
			info, ok := c.consumerGroup(group)
			if !ok {
				continue
			}
			w.mu.Lock()
			w.polls++
			for _, o := range info.Offsets {
				if o.Topic != topic {
					continue
				}
				if h, ok := w.high[o.Queue]; ok && o.Offset < h {
					w.lowered = append(w.lowered, fmt.Sprintf("queue %d: committed %d after %d (generation %d, %s)",
						o.Queue, o.Offset, h, info.Generation, time.Now().Format("15:04:05.000")))
					continue
				}
				w.high[o.Queue] = o.Offset
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(w.stop)
	return w
}

func (w *registryWatch) stop() {
	select {
	case <-w.stopCh:
	default:
		close(w.stopCh)
	}
	<-w.done
}

// check stops the watch and fails t if a committed offset moved back.
func (w *registryWatch) check(t *testing.T) {
	t.Helper()
	w.stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.polls < 10 {
		t.Errorf("the registry answered %d polls of the committed offsets; want at least 10", w.polls)
	}
	if len(w.lowered) > 0 {
		t.Errorf("committed offsets moved back %d times, e.g.\n\t%s", len(w.lowered), strings.Join(w.lowered[:min(5, len(w.lowered))], "\n\t"))
	}
	t.Logf("COMMITTED: %d polls of the registry during the run, no committed offset moved back: %v", w.polls, len(w.lowered) == 0)
}

// phase is a kind of rebalance and when it began: duplicates and handovers
// are counted in the phase their call began in.
type phase struct {
	kind string
	at   time.Time
}

// pause is a member process stopped with SIGSTOP, from its stop to its
// SIGCONT.
type pause struct {
	pid      int
	from, to time.Time
}

// ownerFigures is what the handler records show, by phase kind.
type ownerFigures struct {
	calls, distinct int
	dups            map[string]int
	dupEx           map[string][]string
	handovers       map[string]int
	noOwner         map[string]time.Duration // the longest time a queue with messages waiting had nobody handling it
	overlaps        []string
	acrossPause     int // calls under way across their process's pause (not checked for overlap)
}

// analyze reads the calls of a run: duplicates, handovers (a queue's next
// call is by another member process) and the time each left the queue
// unhandled while messages waited, and overlaps (two member processes in a
// call of one queue at once). Handovers and duplicates count in the phase
// the queue's member process took the queue in. A call under way across
// its process's pause is, for overlaps, neither checked nor checked
// against (a handler stopped mid-call cannot be taken back), and counts as
// ending when its process stopped; the calls exempt says are not checked
// either.
func analyze(calls []memberRecord, phases []phase, pauses []pause, exempt func(r *memberRecord) bool) ownerFigures {
	f := ownerFigures{calls: len(calls), dups: map[string]int{}, dupEx: map[string][]string{}, handovers: map[string]int{}, noOwner: map[string]time.Duration{}}
	base := phases[0].at
	rel := func(ns int64) string { return time.Unix(0, ns).Sub(base).Round(time.Millisecond).String() }
	kindAt := func(ns int64) string {
		k := phases[0].kind
		for _, p := range phases {
			if p.at.UnixNano() <= ns {
				k = p.kind
			}
		}
		return k
	}
	spansPause := func(r *memberRecord) (time.Time, bool) {
		for _, p := range pauses {
			if r.PID == p.pid && r.Start <= p.from.UnixNano() && r.End >= p.to.UnixNano() {
				return p.from, true
			}
		}
		return time.Time{}, false
	}
	sorted := slices.Clone(calls)
	slices.SortStableFunc(sorted, func(a, b memberRecord) int { return cmp.Compare(a.Start, b.Start) })
	byQueue := map[uint32][]*memberRecord{}
	for i := range sorted {
		byQueue[sorted[i].Queue] = append(byQueue[sorted[i].Queue], &sorted[i])
	}
	first := map[qoff]*memberRecord{}
	for _, q := range slices.Sorted(maps.Keys(byQueue)) {
		lastEnd := map[string]*memberRecord{} // per member process, its call ending last so far
		var prev *memberRecord
		var prevEnd int64
		tenure := "" // the kind of the phase the queue's current member process took it in
		for _, r := range byQueue[q] {
			end := r.End
			stop, across := spansPause(r)
			if across {
				f.acrossPause++
				end = stop.UnixNano()
			}
			if prev == nil || prev.deliverer() != r.deliverer() {
				tenure = kindAt(r.Start)
			}
			if prev != nil && prev.deliverer() != r.deliverer() {
				f.handovers[tenure]++
				if gap := time.Duration(r.Start - max(prevEnd, r.Stored)); gap > f.noOwner[tenure] {
					f.noOwner[tenure] = gap
				}
			}
			// A message handled again counts in the phase its handler's
			// member process took the queue in: the redeliveries a handover
			// brings come in a burst after it, which the next phase may
			// overtake.
			k := qoff{r.Queue, r.Offset, r.ID}
			if p := first[k]; p != nil {
				f.dups[tenure]++
				if len(f.dupEx[tenure]) < 4 {
					f.dupEx[tenure] = append(f.dupEx[tenure], fmt.Sprintf("q%d@%d by %s at +%s, first by %s at +%s", r.Queue, r.Offset, r.deliverer(), rel(r.Start), p.deliverer(), rel(p.Start)))
				}
			} else {
				first[k] = r
			}
			if !across && (exempt == nil || !exempt(r)) {
				for d, o := range lastEnd {
					if d != r.deliverer() && o.End > r.Start {
						f.overlaps = append(f.overlaps, fmt.Sprintf("queue %d: %s handled offset %d from +%s to +%s while %s handled offset %d from +%s to +%s",
							q, r.deliverer(), r.Offset, rel(r.Start), rel(r.End), d, o.Offset, rel(o.Start), rel(o.End)))
					}
				}
				if o := lastEnd[r.deliverer()]; o == nil || r.End > o.End {
					lastEnd[r.deliverer()] = r
				}
			}
			if prev == nil || r.deliverer() != prev.deliverer() || end > prevEnd {
				prevEnd = end
			}
			prev = r
		}
	}
	f.distinct = len(first)
	return f
}

// report logs the figures, one FIGURES line per phase kind, and fails t on
// overlaps.
func (f *ownerFigures) report(t *testing.T, name string, phases []phase) {
	t.Helper()
	var kinds []string
	for _, p := range phases {
		if !slices.Contains(kinds, p.kind) {
			kinds = append(kinds, p.kind)
		}
	}
	dups := 0
	for _, k := range kinds {
		dups += f.dups[k]
		t.Logf("FIGURES %s: kind=%q duplicates=%d handovers=%d longest-no-owner=%v", name, k, f.dups[k], f.handovers[k], f.noOwner[k].Round(time.Millisecond))
		if len(f.dupEx[k]) > 0 {
			t.Logf("duplicates of %q, e.g.\n\t%s", k, strings.Join(f.dupEx[k], "\n\t"))
		}
	}
	t.Logf("CALLS %s: %d handler calls of %d distinct messages, %d duplicates; %d calls under way across a pause of their process", name, f.calls, f.distinct, dups, f.acrossPause)
	if len(f.overlaps) > 0 {
		t.Errorf("one owner at a time: %d handler calls overlapped a call of another member process on the same queue, e.g.\n\t%s",
			len(f.overlaps), strings.Join(f.overlaps[:min(8, len(f.overlaps))], "\n\t"))
	}
}

// checkHandled checks that every acknowledged message and every stored one
// was handled.
func checkHandled(t *testing.T, l *load, recs *groupRecords, queues [][]storedMsg) {
	t.Helper()
	ids := map[string]bool{}
	for _, r := range recs.snapshot() {
		ids[r.ID] = true
	}
	var missing []string
	acked := 0
	for _, o := range l.snapshot() {
		if o.err != nil {
			continue
		}
		acked++
		if !ids[o.res.ID] {
			missing = append(missing, fmt.Sprintf("%s (id %s, q%d@%d)", o.tid, o.res.ID, o.res.Queue, o.res.QueueOffset))
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d of %d acknowledged messages were never handled, e.g. %s", len(missing), acked, strings.Join(missing[:min(8, len(missing))], ", "))
	}
	if miss := missingCalls(recs, queues); len(miss) > 0 {
		t.Errorf("%d stored messages were never handled, e.g. %v", len(miss), miss[:min(8, len(miss))])
	}
}

// missingCalls lists the stored messages no call handled.
func missingCalls(recs *groupRecords, queues [][]storedMsg) []string {
	seen := recs.delivered()
	var out []string
	for _, q := range queues {
		for _, m := range q {
			if seen[qoff{m.queue, m.offset, m.id}] == 0 {
				out = append(out, fmt.Sprintf("q%d@%d %s", m.queue, m.offset, m.tid))
			}
		}
	}
	return out
}

// catchUp stops the load, reads the topic back and waits until the group
// handled every stored message; it returns what is stored.
func catchUp(t *testing.T, c *localCluster, l *load, recs *groupRecords, topic string) [][]storedMsg {
	t.Helper()
	l.finish()
	queues := readAll(t, c, topic)
	var miss []string
	defer func() {
		if t.Failed() && len(miss) > 0 {
			t.Logf("%d stored messages not handled, e.g. %v", len(miss), miss[:min(8, len(miss))])
		}
	}()
	testwait.ForEvery(t, 30*time.Second, 20*time.Millisecond, "every stored message to be handled after the load's end", func() bool {
		miss = missingCalls(recs, queues)
		return len(miss) == 0
	})
	return queues
}

func ownLoad(t *testing.T, c *localCluster, topic string) *load {
	return startLoad(t, c, loadConfig{topic: topic, workers: 4, keysPerWorker: 8, unkeyedEvery: 4, rate: 100,
		maxMessages: 40_000, maxDuration: 2 * time.Minute, reliability: protocol.Normal})
}

// TestConsumerGroupOneOwner runs, on one cluster, the scenarios of issue
// 23 whose members are processes: a member paused past its session; members
// added, Closed and killed, and all restarted, under a producer load; two
// members started together on a backlog.
func TestConsumerGroupOneOwner(t *testing.T) {
	skipShort(t)
	c := startLocalCluster(t)
	t.Run("paused", func(t *testing.T) { testPausedMember(t, c.forTest(t)) })
	t.Run("rebalances", func(t *testing.T) { testRebalancesUnderLoad(t, c.forTest(t)) })
	t.Run("started-together", func(t *testing.T) { testStartedTogether(t, c.forTest(t)) })
}

// testPausedMember: two members share a topic under a producer load (about
// 400 messages/s, 2 ms of work per message); one is stopped with SIGSTOP
// until its session ran out on the registry and the other handles its
// queues, then resumed with SIGCONT. Once resumed, it must hand out
// nothing until the registry gives it queues again (a later generation
// than the one that dropped it): its prefetched messages and its stale
// position are another member's by then. The one exception is a call its
// worker had decided on before the stop (the lease is checked just before
// each call): the queue's next message, once, at the resume.
func testPausedMember(t *testing.T, c *localCluster) {
	began := time.Now()
	const topic, group = "own-paused", "own-paused-readers"
	c.ctl("topic", "create", topic, "--queues", fmt.Sprint(ownQueues))
	recs := &groupRecords{}
	w := watchRegistry(t, c, group, topic)
	l := ownLoad(t, c, topic)
	phases := []phase{{"started together (under load)", time.Now()}}
	const work = 2 * time.Millisecond
	m := startMemberProc(t, recs, c.memberSpec(group, topic, "paused", work))
	o := startMemberProc(t, recs, c.memberSpec(group, topic, "other", work))
	waitSettled(t, c, recs, group, topic, phases[0].at, map[string]*memberProc{"paused": m, "other": o}, "at the start")
	info, ok := c.consumerGroup(group)
	if !ok {
		t.Fatalf("the registry does not answer for %s", group)
	}
	var held []uint32
	for q, id := range owners(info, topic) {
		if id == "paused" {
			held = append(held, q)
		}
	}
	slices.Sort(held)
	// In its stride: it has committed what it handled of each of its queues.
	testwait.ForEvery(t, 30*time.Second, 20*time.Millisecond, "the member to be paused to commit each of its queues", func() bool {
		info, ok := c.consumerGroup(group)
		if !ok {
			return false
		}
		n := 0
		for _, o := range info.Offsets {
			if o.Topic == topic && o.Offset > 0 && slices.Contains(held, o.Queue) {
				n++
			}
		}
		return n == len(held)
	})
	t.Logf("settled %v after the start: paused holds queues %v, generation %d, and committed each", time.Since(began).Round(time.Millisecond), held, info.Generation)

	stoppedAt := m.stop()
	phases = append(phases, phase{"paused past its session", stoppedAt})
	// Its session runs out on the registry and the other member takes its
	// queues: it handles each of them.
	var expiredGen uint64
	testwait.ForEvery(t, 30*time.Second, 20*time.Millisecond, "the registry to drop the paused member and the other to handle its queues", func() bool {
		info, ok := c.consumerGroup(group)
		if !ok || !slices.Equal(memberIDs(info), []string{"other"}) {
			return false
		}
		for _, q := range held {
			if !recs.any(func(r *memberRecord) bool { return r.PID == o.pid && r.Queue == q && r.Start > stoppedAt.UnixNano() }) {
				return false
			}
		}
		expiredGen = info.Generation
		return true
	})
	tookOver := time.Now()
	contAt := m.cont()
	t.Logf("paused the member for %v; the other handled its queues %v after the stop (generation %d)", contAt.Sub(stoppedAt).Round(time.Millisecond),
		tookOver.Sub(stoppedAt).Round(time.Millisecond), expiredGen)
	// Resumed, it joins again and is given queues in a later generation.
	testwait.ForEvery(t, 30*time.Second, 20*time.Millisecond, "the resumed member to handle messages of queues it was given again", func() bool {
		return recs.any(func(r *memberRecord) bool { return r.PID == m.pid && r.Start > contAt.UnixNano() && r.Gen > expiredGen })
	})
	regiven := time.Now()
	waitSettled(t, c, recs, group, topic, contAt, map[string]*memberProc{"paused": m, "other": o}, "after the resume")
	t.Logf("the resumed member handled messages of queues given again %v after SIGCONT", regiven.Sub(contAt).Round(time.Millisecond))

	queues := catchUp(t, c, l, recs, topic)
	m.terminate()
	o.terminate()
	m.waitClosed(recs)
	o.waitClosed(recs)
	w.check(t)

	// What the paused member handed out after its stop.
	calls := recs.snapshot()
	lastBefore := map[uint32]int64{} // its last offset of each queue begun before the stop
	for _, r := range calls {
		if r.PID == m.pid && r.Start <= stoppedAt.UnixNano() {
			lastBefore[r.Queue] = max(lastBefore[r.Queue], r.Offset)
		}
	}
	// One call may have been decided before the stop: a worker that checked
	// the lease just before SIGSTOP landed calls its handler at the resume,
	// with the queue's next message. Only the first such call is excused:
	// SIGSTOP stops every worker at one moment.
	decided := map[qoff]bool{}
	var zombies []string
	stale := 0
	for _, r := range slices.SortedFunc(slices.Values(calls), func(a, b memberRecord) int { return cmp.Compare(a.Start, b.Start) }) {
		if r.PID != m.pid || r.Start <= stoppedAt.UnixNano() || r.Gen > expiredGen {
			continue
		}
		if stale++; stale == 1 && r.Offset == lastBefore[r.Queue]+1 && r.Start < contAt.Add(100*time.Millisecond).UnixNano() {
			decided[qoff{r.Queue, r.Offset, r.ID}] = true
			continue
		}
		zombies = append(zombies, fmt.Sprintf("q%d@%d at +%v after SIGCONT in generation %d (the registry had dropped it at generation %d)",
			r.Queue, r.Offset, r.start().Sub(contAt).Round(time.Microsecond), r.Gen, expiredGen))
	}
	if len(zombies) > 0 {
		t.Errorf("the paused member handed out %d messages after its session ended before it was given queues again, e.g.\n\t%s",
			len(zombies), strings.Join(zombies[:min(8, len(zombies))], "\n\t"))
	}
	t.Logf("PAUSED: after SIGCONT the member handed out %d messages before it was given queues again (%d decided before the stop, at the resume)",
		len(zombies), len(decided))
	f := analyze(calls, phases, []pause{{m.pid, stoppedAt, contAt}}, func(r *memberRecord) bool {
		return r.PID == m.pid && decided[qoff{r.Queue, r.Offset, r.ID}]
	})
	f.report(t, "paused", phases)
	checkHandled(t, l, recs, queues)
	assertCommittedAtEnds(t, c, group, topic, logEnds(queues))
	t.Logf("paused: done in %v", time.Since(began).Round(time.Millisecond))
}

// testRebalancesUnderLoad: under a producer load, two members start
// together, a third is added, the first Closed (SIGTERM), the second
// killed with SIGKILL, a fourth added, and then every member restarted
// (Closed and started again with the same ids). After each change the test
// waits until every queue is handled by its owner. Per queue no two member
// processes are ever in a handler call at once, committed offsets never
// move back, and every acknowledged message is handled.
func testRebalancesUnderLoad(t *testing.T, c *localCluster) {
	began := time.Now()
	const topic, group = "own-rebalance", "own-rebalance-readers"
	c.ctl("topic", "create", topic, "--queues", fmt.Sprint(ownQueues))
	recs := &groupRecords{}
	w := watchRegistry(t, c, group, topic)
	l := ownLoad(t, c, topic)
	const work = 2 * time.Millisecond
	start := func(id string) *memberProc { return startMemberProc(t, recs, c.memberSpec(group, topic, id, work)) }
	var phases []phase
	step := func(kind string) time.Time {
		at := time.Now()
		phases = append(phases, phase{kind, at})
		return at
	}
	settled := func(since time.Time, want map[string]*memberProc) {
		t.Helper()
		waitSettled(t, c, recs, group, topic, since, want, phases[len(phases)-1].kind)
		t.Logf("%s: settled on %v in %v", phases[len(phases)-1].kind, slices.Sorted(maps.Keys(want)), time.Since(since).Round(time.Millisecond))
	}

	at := step("started together (under load)")
	m1, m2 := start("m1"), start("m2")
	settled(at, map[string]*memberProc{"m1": m1, "m2": m2})

	at = step("added")
	m3 := start("m3")
	settled(at, map[string]*memberProc{"m1": m1, "m2": m2, "m3": m3})

	at = step("removed (Close)")
	m1.terminate()
	m1.waitClosed(recs)
	settled(at, map[string]*memberProc{"m2": m2, "m3": m3})

	at = step("killed (SIGKILL)")
	m2.kill9()
	settled(at, map[string]*memberProc{"m3": m3})

	at = step("added")
	m4 := start("m4")
	settled(at, map[string]*memberProc{"m3": m3, "m4": m4})

	at = step("all restarted (Close, start)")
	m3.terminate()
	m4.terminate()
	m3.waitClosed(recs)
	m4.waitClosed(recs)
	m3, m4 = start("m3"), start("m4")
	settled(at, map[string]*memberProc{"m3": m3, "m4": m4})

	// The leader's figures of the handovers: none waits now.
	waiting := fmt.Sprintf("ferrymq_metaserver_consumer_queues_waiting{group=%q}", group)
	testwait.ForEvery(t, 10*time.Second, 50*time.Millisecond, "every metaserver to show no queue of the group waiting for its holder", func() bool {
		ms := c.metaMetrics()
		for _, m := range ms {
			if v, ok := m[waiting]; !ok || v != 0 {
				return false
			}
		}
		return len(ms) == 3
	})
	handovers := c.metaCounter("ferrymq_metaserver_consumer_handover_seconds_count")
	if handovers == 0 {
		t.Errorf("the leader observed no handover in ferrymq_metaserver_consumer_handover_seconds after %d rebalances", len(phases))
	}
	t.Logf("the leader observed %v handovers, %.3f s in all", handovers, c.metaCounter("ferrymq_metaserver_consumer_handover_seconds_sum"))

	queues := catchUp(t, c, l, recs, topic)
	m3.terminate()
	m4.terminate()
	m3.waitClosed(recs)
	m4.waitClosed(recs)
	w.check(t)
	f := analyze(recs.snapshot(), phases, nil, nil)
	f.report(t, "rebalances", phases)
	checkHandled(t, l, recs, queues)
	assertCommittedAtEnds(t, c, group, topic, logEnds(queues))
	t.Logf("rebalances: done in %v", time.Since(began).Round(time.Millisecond))
}

// sendBacklog sends n keyed messages and waits for every acknowledgement.
func sendBacklog(t *testing.T, c *localCluster, topic string, n int) {
	t.Helper()
	p, err := producer.New(sdk.MetaAddrs(strings.Split(c.meta, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	for i := range n {
		wg.Add(1)
		p.SendAsync(context.Background(), &producer.Message{Topic: topic, Key: fmt.Sprintf("k%d", i%256), Body: []byte(fmt.Sprintf("backlog-%d", i))},
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

// testStartedTogether: two members start together on a backlog of 10,000
// messages. Both get queues from the group's first assignment (the join
// window), so no queue is handled by both, no message twice, and all in
// one generation.
func testStartedTogether(t *testing.T, c *localCluster) {
	began := time.Now()
	const topic, group = "own-backlog", "own-backlog-readers"
	const backlog = 10_000
	c.ctl("topic", "create", topic, "--queues", fmt.Sprint(ownQueues))
	sendBacklog(t, c, topic, backlog)
	queues := readAll(t, c, topic)
	stored := 0
	for _, q := range queues {
		if len(q) == 0 {
			t.Fatalf("the backlog left a queue empty: %v", logEnds(queues))
		}
		stored += len(q)
	}
	t.Logf("backlog of %d messages stored in %v: %v", stored, time.Since(began).Round(time.Millisecond), logEnds(queues))
	recs := &groupRecords{}
	w := watchRegistry(t, c, group, topic)
	phases := []phase{{"two started together (backlog)", time.Now()}}
	const work = 200 * time.Microsecond
	a := launchMemberProc(t, recs, c.memberSpec(group, topic, "a", work))
	b := launchMemberProc(t, recs, c.memberSpec(group, topic, "b", work))
	a.waitReady(recs)
	b.waitReady(recs)
	testwait.ForEvery(t, 60*time.Second, 20*time.Millisecond, fmt.Sprintf("the %d stored messages to be handled", stored), func() bool {
		return len(missingCalls(recs, queues)) == 0
	})
	handled := time.Since(phases[0].at)
	a.terminate()
	b.terminate()
	a.waitClosed(recs)
	b.waitClosed(recs)
	w.check(t)

	calls := recs.snapshot()
	byQueue := map[uint32]map[string]int{}
	gens := map[uint64]int{}
	perMember := map[string]int{}
	for _, r := range calls {
		if byQueue[r.Queue] == nil {
			byQueue[r.Queue] = map[string]int{}
		}
		byQueue[r.Queue][r.Member]++
		gens[r.Gen]++
		perMember[r.Member]++
	}
	for q, ms := range byQueue {
		if len(ms) > 1 {
			t.Errorf("queue %d was handled by both members: %v calls each", q, ms)
		}
	}
	if perMember["a"] == 0 || perMember["b"] == 0 {
		t.Errorf("one member handled nothing: %v calls each", perMember)
	}
	if len(gens) != 1 {
		t.Errorf("the calls came in %d generations (%v calls each); want all in the first assignment", len(gens), gens)
	}
	f := analyze(calls, phases, nil, nil)
	f.report(t, "started-together", phases)
	if dups := f.calls - f.distinct; dups != 0 {
		t.Errorf("%d messages handled twice; want none", dups)
	}
	assertCommittedAtEnds(t, c, group, topic, logEnds(queues))
	t.Logf("STARTED TOGETHER: %d calls by member %v, generations %v; every stored message handled %v after the start; done in %v",
		len(calls), perMember, gens, handled.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}

// TestConsumerGroupNotAuthorized: with authorization on, a principal
// allowed to consume a topic in one group joins another. Run ends at once
// with NOT_AUTHORIZED (not at its context's deadline: retrying would never
// help), and ferryctl consume exits 1 naming it; in its own group the same
// principal consumes.
func TestConsumerGroupNotAuthorized(t *testing.T) {
	skipShort(t)
	c := startLocalCluster(t, "FERRY_AUTH=1")
	adminFile := filepath.Join(c.home, "auth", "admin.token")
	const topic = "own-auth"
	if code, _, errOut := c.ctlExit("topic", "create", topic, "--queues", "2", "--token-file", adminFile); code != 0 {
		t.Fatalf("topic create: exit %d: %s", code, errOut)
	}
	code, out, errOut := c.ctlExit("--json", "acl", "add", "reader", "--perm", "consume:"+topic+":allowed", "--token-file", adminFile)
	if code != 0 {
		t.Fatalf("acl add: exit %d: %s", code, errOut)
	}
	var made struct{ Token string }
	if err := json.Unmarshal([]byte(out), &made); err != nil || made.Token == "" {
		t.Fatalf("acl add printed %q: %v", out, err)
	}
	token := made.Token
	tokenFile := filepath.Join(t.TempDir(), "reader.token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := c.ctlExit("send", topic, "--body", "hello", "--key", "k", "--token-file", adminFile); code != 0 {
		t.Fatalf("send: exit %d: %s", code, errOut)
	}
	newConsumer := func(group, id string) *consumer.Consumer {
		cons, err := consumer.New(group, []string{topic}, sdk.MetaAddrs(strings.Split(c.meta, ",")...), consumer.MemberID(id),
			sdk.Token(token), consumer.Session(ownSession), consumer.Heartbeat(ownHeartbeat))
		if err != nil {
			t.Fatal(err)
		}
		return cons
	}

	// In its group, the principal consumes what is there.
	ok := newConsumer("allowed", "ok")
	got := make(chan string, 1)
	okDone := make(chan error, 1)
	go func() {
		okDone <- ok.Run(context.Background(), func(_ context.Context, m *consumer.Message) error {
			select {
			case got <- string(m.Body):
			default:
			}
			return nil
		})
	}()
	select {
	case body := <-got:
		if body != "hello" {
			t.Errorf("the allowed member handled %q, want hello", body)
		}
	case err := <-okDone:
		t.Fatalf("Run of a member of the group the principal may consume in ended: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the member of the allowed group handled nothing in 30 s")
	}
	if err := ok.Close(); err != nil {
		t.Errorf("Close of the allowed member: %v", err)
	}
	if err := <-okDone; err != nil {
		t.Errorf("Run of the allowed member after Close: %v", err)
	}

	// In another group it is refused, at once.
	const deadline = 30 * time.Second
	refused := newConsumer("other", "refused")
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	began := time.Now()
	handled := atomic.Int64{}
	err := refused.Run(ctx, func(context.Context, *consumer.Message) error { handled.Add(1); return nil })
	took := time.Since(began)
	if err == nil || !errors.Is(err, protocol.ErrNotAuthorized) || !strings.Contains(err.Error(), "NOT_AUTHORIZED") {
		t.Errorf("Run in a group the principal may not consume in returned %v after %v; want NOT_AUTHORIZED", err, took)
	}
	if took > 10*time.Second {
		t.Errorf("Run took %v to return NOT_AUTHORIZED (its context allowed %v); want it at once", took, deadline)
	}
	if n := handled.Load(); n > 0 {
		t.Errorf("the refused member handled %d messages", n)
	}
	if err := refused.Close(); err != nil {
		t.Logf("Close of the refused member: %v", err)
	}

	began2 := time.Now()
	code, _, errOut = c.ctlExit("consume", topic, "--group", "other", "--timeout", deadline.String(), "--token-file", tokenFile)
	took2 := time.Since(began2)
	if code != 1 || !strings.Contains(errOut, "NOT_AUTHORIZED") {
		t.Errorf("ferryctl consume in a group the principal may not consume in: exit %d after %v: %s; want exit 1 naming NOT_AUTHORIZED", code, took2, errOut)
	}
	if took2 > 10*time.Second {
		t.Errorf("ferryctl consume took %v to exit (--timeout %v); want it at once", took2, deadline)
	}
	t.Logf("NOT AUTHORIZED: Run returned %q after %v; ferryctl consume exited %d after %v: %s", err, took.Round(time.Millisecond), code,
		took2.Round(time.Millisecond), strings.TrimSpace(errOut))
}
