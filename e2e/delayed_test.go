package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

// The delayed-message tests of issue 28, through real processes (cluster.sh
// with one group, g1, a master and a slave), speaking the wire protocol to
// the brokers directly: a delayed SEND is a message with
// Schedule{Kind: ScheduleDelayed, At: due (unix ms), Ref: -1}; its result's
// log offset is its handle (the pending record); the broker releases a copy
// into the target queue, Schedule{Kind: ScheduleReleased, At: due, Ref:
// handle}, whose StoreTime is when it was released.
//
// What a user relies on, and these tests assert:
//   - every acknowledged delayed message is released, never before its time,
//     and once: across kill -9 and restart of the master, and across a
//     failover in the new master's log (what a failover may repeat is said
//     at TestDelayedExactlyOnceFailover);
//   - a lookup (DELAYED_STATE) names where a released message went, after
//     kill -9 too;
//   - a cancel racing the release: exactly one of the two happens and the
//     cancel's answer says which.
//
// Lateness (StoreTime - due) is logged, with the broker's histogram, never
// asserted: the machine is shared.

// delayedTopic is the target topic of the delayed loads; its queues are
// all on g1.
const (
	delayedTopic  = "later"
	delayedQueues = 8
)

// delayedPlan is a delayed load: n messages due within window from t0, a
// share of them in the busiest second, which starts at busy.
type delayedPlan struct {
	n        int
	window   time.Duration
	t0, busy time.Time
	busyN    int // messages due in the busiest second
	highN    int // HIGH messages (the rest are NORMAL)
}

// newDelayedPlan is the load of FERRY_DELAY_N messages (default 4,000) due
// over FERRY_DELAY_WINDOW (default 6 s), starting far enough ahead that
// they are all sent before the busiest second (in the middle of the
// window, holding 40% of them).
func newDelayedPlan(t *testing.T) delayedPlan {
	t.Helper()
	p := delayedPlan{n: 4_000, window: 6 * time.Second}
	if v := os.Getenv("FERRY_DELAY_N"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 100 {
			t.Fatalf("FERRY_DELAY_N=%q: want a number of messages >= 100", v)
		}
		p.n = n
	}
	if v := os.Getenv("FERRY_DELAY_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 4*time.Second {
			t.Fatalf("FERRY_DELAY_WINDOW=%q: want a Go duration >= 4s", v)
		}
		p.window = d
	}
	// About 3,000 delayed messages a second are sent under -race on two
	// shared cores; the busiest second must come after the last of them.
	lead := 3*time.Second + time.Duration(p.n/3000)*time.Second
	p.t0 = time.Now().Add(lead).Truncate(time.Second)
	p.busy = p.t0.Add(p.window / 2).Truncate(time.Second)
	return p
}

// delayedSent is an acknowledged delayed message.
type delayedSent struct {
	id     string
	queue  uint32
	rel    protocol.Reliability
	due    int64 // unix ms
	handle int64 // the pending record's log offset
}

// messages makes the plan's messages: every fifth one HIGH, two in five
// due in the busiest second, the rest spread over the window.
func (p *delayedPlan) messages(prefix string) []protocol.Message {
	r := rand.New(rand.NewPCG(uint64(p.n), 28))
	out := make([]protocol.Message, p.n)
	body := []byte(strings.Repeat("d", 100))
	for i := range out {
		var due time.Time
		if i%5 < 2 {
			due = p.busy.Add(time.Duration(r.Int64N(int64(time.Second))))
			p.busyN++
		} else {
			due = p.t0.Add(time.Duration(r.Int64N(int64(p.window))))
			if !due.Before(p.busy) && due.Before(p.busy.Add(time.Second)) {
				p.busyN++
			}
		}
		rel := protocol.Normal
		if i%5 == 4 {
			rel = protocol.High
			p.highN++
		}
		out[i] = protocol.Message{ID: fmt.Sprintf("%s-%07d", prefix, i), Topic: delayedTopic, Queue: uint32(i % delayedQueues),
			Reliability: rel, Timestamp: time.Now().UnixMilli(), Body: body,
			Schedule: protocol.Schedule{Kind: protocol.ScheduleDelayed, At: due.UnixMilli(), Ref: -1}}
	}
	return out
}

// notStored are the SEND statuses that say the message was not stored (so
// sending it again cannot store it twice).
var notStored = []protocol.Status{protocol.StatusNoRoute, protocol.StatusBusy, protocol.StatusSlaveLagging,
	protocol.StatusNotEnoughReplicas, protocol.StatusReadOnly}

// sendDelayed sends msgs to the broker at addr in batches of 256 from four
// goroutines, sends again those refused as not stored (a fresh topic is
// NO_ROUTE until the broker looked it up), and returns the acknowledged
// ones. Any other refusal, or an unknown outcome, fails the test: the
// tests count releases against what was acknowledged.
func sendDelayed(t *testing.T, addr string, msgs []protocol.Message) []delayedSent {
	t.Helper()
	cl := transport.NewClient(addr, transport.ClientConfig{})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const batch = 256
	out := make([]delayedSent, len(msgs))
	batches := make(chan int, len(msgs)/batch+1)
	for i := 0; i < len(msgs); i += batch {
		batches <- i
	}
	close(batches)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failure error
	retries := atomic.Int64{}
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for from := range batches {
				todo := make([]int, 0, batch)
				for i := from; i < min(from+batch, len(msgs)); i++ {
					todo = append(todo, i)
				}
				for try := 0; len(todo) > 0; try++ {
					if try == 200 || ctx.Err() != nil {
						mu.Lock()
						failure = errors.Join(failure, fmt.Errorf("%d messages from %d still refused after %d tries", len(todo), from, try))
						mu.Unlock()
						return
					}
					if try > 0 {
						retries.Add(int64(len(todo)))
						time.Sleep(50 * time.Millisecond) // a pause before sending again, not an assertion
					}
					b := make([]protocol.Message, len(todo))
					for j, i := range todo {
						b[j] = msgs[i]
					}
					resp, err := cl.Call(ctx, protocol.CodeSend, protocol.AppendSendRequest(nil, 0, b))
					var res []protocol.SendResult
					if err == nil {
						res, err = protocol.DecodeSendResponse(resp.Body, nil)
					}
					if err != nil || len(res) != len(b) {
						mu.Lock()
						failure = errors.Join(failure, fmt.Errorf("SEND of %d delayed messages from %d: %d results, %v (outcome unknown)", len(b), from, len(res), err))
						mu.Unlock()
						return
					}
					var again []int
					for j, r := range res {
						i := todo[j]
						switch {
						case r.Status == protocol.StatusOK:
							m := msgs[i]
							out[i] = delayedSent{id: m.ID, queue: m.Queue, rel: m.Reliability, due: m.Schedule.At, handle: r.LogOffset}
						case slices.Contains(notStored, r.Status):
							again = append(again, i)
						default:
							mu.Lock()
							failure = errors.Join(failure, fmt.Errorf("delayed message %s: %v", msgs[i].ID, r.Status))
							mu.Unlock()
							return
						}
					}
					todo = again
				}
			}
		}()
	}
	wg.Wait()
	if failure != nil {
		t.Fatal(failure)
	}
	t.Logf("SENT %d delayed messages (%d sent again after NO_ROUTE and the like)", len(out), retries.Load())
	return out
}

// startDelayedCluster starts one group's cluster, with extra environment,
// creates the target topic with its queues on g1, and returns g1's master.
func startDelayedCluster(t *testing.T, env ...string) (*localCluster, string) {
	t.Helper()
	skipShort(t)
	c := startLocalCluster(t, append([]string{"FERRY_GROUPS=1"}, env...)...)
	c.waitMaster("g1", 30*time.Second, "at the start")
	c.ctl("topic", "create", delayedTopic, "--queues", strconv.Itoa(delayedQueues), "--groups", "g1")
	return c, c.masterOf("g1")
}

// releasedCopy is a released copy read back from a target queue.
type releasedCopy struct {
	queue       uint32
	queueOffset int64
	logOffset   int64
	storeTime   int64
	ref         int64 // the pending record it came from
	due         int64
	rel         protocol.Reliability
	broker      string // the process it was read from
}

// readReleased reads every target queue whole from the broker at addr
// (named broker) and returns the copies by message id. A record in a
// target queue that is not a released copy fails the test.
func readReleased(t *testing.T, addr, broker string) map[string][]releasedCopy {
	t.Helper()
	cl := transport.NewClient(addr, transport.ClientConfig{})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := map[string][]releasedCopy{}
	for q := range uint32(delayedQueues) {
		req := protocol.PullRequest{Topic: delayedTopic, Queue: q, MaxBytes: 1 << 20}
		for range 1_000_000 {
			resp, err := cl.Call(ctx, protocol.CodePull, protocol.AppendPullRequest(nil, &req))
			if err != nil {
				t.Fatalf("pull %s/%d at %d from %s: %v", delayedTopic, q, req.Offset, broker, err)
			}
			pr, err := protocol.DecodePullResponse(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range pr.Messages {
				if m.Message.Schedule.Kind != protocol.ScheduleReleased {
					t.Fatalf("%s/%d offset %d on %s holds a %v record %s, not a released copy", delayedTopic, q, m.QueueOffset, broker, m.Message.Schedule.Kind, m.Message.ID)
				}
				out[m.Message.ID] = append(out[m.Message.ID], releasedCopy{queue: q, queueOffset: m.QueueOffset, logOffset: m.LogOffset, storeTime: m.StoreTime,
					ref: m.Message.Schedule.Ref, due: m.Message.Schedule.At, rel: m.Message.Reliability, broker: broker})
			}
			if len(pr.Messages) == 0 {
				break
			}
			req.Offset = pr.NextOffset
		}
	}
	return out
}

// delayedMetrics are a broker's delayed-message figures.
type delayedMetrics struct {
	fired, pending, in float64
	queueEnds          float64 // the target queues' ends summed: copies released
	lateCount, lateSum float64
	lateBuckets        [][2]float64 // (le, cumulative count), by le
}

func readDelayedMetrics(m map[string]float64) delayedMetrics {
	d := delayedMetrics{fired: m["ferrymq_broker_delayed_fired_total"], in: m["ferrymq_broker_delayed_in_total"],
		lateCount: m["ferrymq_broker_delayed_lateness_seconds_count"], lateSum: m["ferrymq_broker_delayed_lateness_seconds_sum"]}
	for k, v := range m {
		switch {
		case strings.HasPrefix(k, "ferrymq_broker_delayed_pending{"):
			d.pending += v
		case strings.HasPrefix(k, "ferrymq_broker_queue_end_offset{") && strings.Contains(k, `topic="`+delayedTopic+`"`):
			d.queueEnds += v
		case strings.HasPrefix(k, "ferrymq_broker_delayed_lateness_seconds_bucket{le=\""):
			le := strings.TrimSuffix(strings.TrimPrefix(k, "ferrymq_broker_delayed_lateness_seconds_bucket{le=\""), "\"}")
			if f, err := strconv.ParseFloat(le, 64); err == nil {
				d.lateBuckets = append(d.lateBuckets, [2]float64{f, v})
			}
		}
	}
	sort.Slice(d.lateBuckets, func(i, j int) bool { return d.lateBuckets[i][0] < d.lateBuckets[j][0] })
	return d
}

// quantile is the upper bound of the histogram bucket holding the q-th
// quantile.
func (d delayedMetrics) quantile(q float64) string {
	for _, b := range d.lateBuckets {
		if b[1] >= q*d.lateCount && d.lateCount > 0 {
			return fmt.Sprintf("<=%gs", b[0])
		}
	}
	return "n/a"
}

func (d delayedMetrics) lateness() string {
	mean := 0.0
	if d.lateCount > 0 {
		mean = d.lateSum / d.lateCount
	}
	return fmt.Sprintf("%v observed, mean %.1f ms, p50 %s, p99 %s, p99.9 %s", d.lateCount, mean*1000, d.quantile(0.5), d.quantile(0.99), d.quantile(0.999))
}

// delayedOf reads a broker's delayed figures; false if it does not answer.
func (c *localCluster) delayedOf(broker string) (delayedMetrics, bool) {
	m, ok := c.metrics(broker)
	if !ok {
		return delayedMetrics{}, false
	}
	return readDelayedMetrics(m), true
}

// waitAllReleased waits until broker holds want released copies in the
// target queues and nothing pending. It does not fail the test on a
// timeout: the checks that follow say which messages are missing.
func waitAllReleased(t *testing.T, c *localCluster, broker string, want int, timeout time.Duration) {
	t.Helper()
	var d delayedMetrics
	ok := testwait.UntilEvery(timeout, 100*time.Millisecond, func() bool {
		var ok bool
		d, ok = c.delayedOf(broker)
		return ok && d.queueEnds >= float64(want) && d.pending == 0
	})
	if !ok {
		t.Errorf("after %v %s holds %v released copies (want %d) and %v pending", timeout, broker, d.queueEnds, want, d.pending)
	}
}

// latenessFigures is p50, p99, p99.9 and max of StoreTime - due over
// copies.
func latenessFigures(copies []releasedCopy) string {
	if len(copies) == 0 {
		return "none"
	}
	late := make([]int64, len(copies))
	for i, cp := range copies {
		late[i] = cp.storeTime - cp.due
	}
	slices.Sort(late)
	q := func(f float64) int64 { return late[min(len(late)-1, int(f*float64(len(late))))] }
	return fmt.Sprintf("%d copies: p50 %d ms, p99 %d ms, p99.9 %d ms, max %d ms", len(late), q(0.5), q(0.99), q(0.999), late[len(late)-1])
}

// checkOnce asserts that every acknowledged message has exactly one copy
// in got (one broker's log): naming its pending record, due when it was
// sent, its reliability kept, released no earlier than due; and that got
// holds nothing else. It returns the copies in the order of sent.
func checkOnce(t *testing.T, sent []delayedSent, got map[string][]releasedCopy, what string) []releasedCopy {
	t.Helper()
	var missing, twice, wrong, early []string
	out := make([]releasedCopy, 0, len(sent))
	known := make(map[string]bool, len(sent))
	for _, s := range sent {
		known[s.id] = true
		cps := got[s.id]
		switch {
		case len(cps) == 0:
			missing = append(missing, s.id)
			continue
		case len(cps) > 1:
			twice = append(twice, fmt.Sprintf("%s x%d %+v", s.id, len(cps), cps))
		}
		cp := cps[0]
		if cp.ref != s.handle || cp.due != s.due || cp.rel != s.rel || cp.queue != s.queue {
			wrong = append(wrong, fmt.Sprintf("%s (sent to queue %d, %v, due %d, handle %d): copy %+v", s.id, s.queue, s.rel, s.due, s.handle, cp))
		}
		if cp.storeTime < s.due {
			early = append(early, fmt.Sprintf("%s due %d released %d", s.id, s.due, cp.storeTime))
		}
		out = append(out, cp)
	}
	var unknown []string
	for id := range got {
		if !known[id] {
			unknown = append(unknown, id)
		}
	}
	report := func(kind string, l []string) {
		if len(l) > 0 {
			t.Errorf("%s: %d acknowledged delayed messages %s, e.g. %v", what, len(l), kind, l[:min(5, len(l))])
		}
	}
	report("never released", missing)
	report("released more than once", twice)
	report("released with the wrong queue, reliability, due time or pending record", wrong)
	report("released early", early)
	report("(unknown ids) released though never sent", unknown)
	return out
}

// checkLookups asks DELAYED_STATE of sent messages at addr (every one, or
// an even sample of 4,000) and asserts it says released, at the copy's queue offset, log offset and
// store time.
func checkLookups(t *testing.T, addr string, sent []delayedSent, copies map[string][]releasedCopy, what string) {
	t.Helper()
	cl := transport.NewClient(addr, transport.ClientConfig{})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// At most 4,000 lookups, spread over the messages in the order sent.
	stride := (len(sent) + 3999) / 4000
	var asked []delayedSent
	for i := 0; i < len(sent); i += stride {
		asked = append(asked, sent[i])
	}
	sent = asked
	var mu sync.Mutex
	var bad []string
	next := atomic.Int64{}
	var wg sync.WaitGroup
	started := time.Now()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(sent) {
					return
				}
				s := sent[i]
				st, err := delayedCall(ctx, cl, protocol.CodeDelayedState, s.handle)
				var why string
				switch cps := copies[s.id]; {
				case err != nil:
					why = err.Error()
				case len(cps) == 0:
					why = "no copy to compare with"
				case st.State != protocol.DelayReleased || st.Released == nil || st.ID != s.id || st.DueAt != s.due ||
					st.Released.QueueOffset != cps[0].queueOffset || st.Released.LogOffset != cps[0].logOffset || st.Released.At != cps[0].storeTime || st.Queue != s.queue:
					why = fmt.Sprintf("%+v (released %+v), the copy is %+v", st, st.Released, cps[0])
				}
				if why != "" {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("%s@%d: %s", s.id, s.handle, why))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("LOOKUPS %s: %d DELAYED_STATE answers in %v, %d wrong", what, len(sent), time.Since(started).Round(time.Millisecond), len(bad))
	if len(bad) > 0 {
		t.Errorf("%s: %d lookups do not name where the message went, e.g. %v", what, len(bad), bad[:min(5, len(bad))])
	}
}

// delayedCall makes a DELAYED_STATE or DELAYED_CANCEL request for the
// pending record at handle.
func delayedCall(ctx context.Context, cl *transport.Client, code protocol.Code, handle int64) (protocol.DelayedState, error) {
	var st protocol.DelayedState
	body, err := json.Marshal(protocol.DelayedRef{Offset: handle})
	if err != nil {
		return st, err
	}
	resp, err := cl.Call(ctx, code, body)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(resp.Body, &st); err != nil {
		return st, fmt.Errorf("%v answer %q: %w", code, resp.Body, err)
	}
	return st, nil
}

// cancelAll cancels each of sent at addr and fails the test unless each
// answer says this cancel did it.
func cancelAll(t *testing.T, addr string, sent []delayedSent, when string) {
	t.Helper()
	cl := transport.NewClient(addr, transport.ClientConfig{})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, s := range sent {
		st, err := delayedCall(ctx, cl, protocol.CodeDelayedCancel, s.handle)
		if err != nil || st.State != protocol.DelayCancelled || st.By != "cancel" || st.ID != s.id {
			t.Fatalf("cancel of %s@%d %s: %+v, %v; want cancelled by this cancel", s.id, s.handle, when, st, err)
		}
	}
}

// expectStates asks DELAYED_STATE of each of sent at addr and fails the
// test unless each is in state.
func expectStates(t *testing.T, addr string, sent []delayedSent, state, what string) {
	t.Helper()
	cl := transport.NewClient(addr, transport.ClientConfig{})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, s := range sent {
		st, err := delayedCall(ctx, cl, protocol.CodeDelayedState, s.handle)
		if err != nil || st.State != state || st.ID != s.id || st.DueAt != s.due || st.By != "" {
			t.Errorf("lookup of %s@%d (%s): %+v, %v; want %s", s.id, s.handle, what, st, err, state)
		}
	}
}

// waitFired waits until broker has fired at least n, and returns its
// figures as last read.
func waitFired(t *testing.T, c *localCluster, broker string, n int, why string) delayedMetrics {
	t.Helper()
	var d delayedMetrics
	testwait.ForEvery(t, 2*time.Minute, 5*time.Millisecond, fmt.Sprintf("%s to release %d delayed messages (%s)", broker, n, why), func() bool {
		var ok bool
		d, ok = c.delayedOf(broker)
		return ok && d.fired >= float64(n)
	})
	return d
}

// dueBefore counts the messages due before at.
func dueBefore(sent []delayedSent, at time.Time) int {
	n := 0
	for _, s := range sent {
		if s.due < at.UnixMilli() {
			n++
		}
	}
	return n
}

// TestDelayedExactlyOnceKill9 sends delayed messages to g1 (NORMAL and
// HIGH), kills g1's master with SIGKILL in the busiest second of their
// releases, and restarts it with its own command line (failover off, so the
// same broker takes over its own log): every acknowledged message is
// released exactly once, none early; the first incarnation's releases and
// the second's add up to the messages; nothing stays pending; a lookup of
// each message names where it went, those released before the kill too;
// and a message cancelled before the kill stays cancelled.
func TestDelayedExactlyOnceKill9(t *testing.T) {
	c, master := startDelayedCluster(t, "FERRY_FAILOVER=off")
	args := c.cmdline(master)
	p := newDelayedPlan(t)
	msgs := p.messages("k9")
	sent := sendDelayed(t, c.addr(master), msgs)
	if time.Now().After(p.busy) {
		t.Fatalf("sending %d delayed messages ended after the busiest second began: raise the lead in newDelayedPlan", p.n)
	}
	t.Logf("PLAN: %d delayed messages (%d HIGH) due from %s over %v; the busiest second %s holds %d",
		p.n, p.highN, p.t0.Format("15:04:05"), p.window, p.busy.Format("15:04:05"), p.busyN)
	// And a few due in an hour, half of them cancelled before the kill.
	far := make([]protocol.Message, 20)
	for i := range far {
		far[i] = protocol.Message{ID: fmt.Sprintf("k9-far-%02d", i), Topic: delayedTopic, Queue: uint32(i % delayedQueues),
			Reliability: []protocol.Reliability{protocol.Normal, protocol.High}[i%2], Timestamp: time.Now().UnixMilli(), Body: []byte("far"),
			Schedule: protocol.Schedule{Kind: protocol.ScheduleDelayed, At: time.Now().Add(time.Hour).UnixMilli(), Ref: -1}}
	}
	farSent := sendDelayed(t, c.addr(master), far)
	cancelAll(t, c.addr(master), farSent[:10], "before the kill")

	// Kill in the busiest second, once a quarter of it was released.
	before := dueBefore(sent, p.busy)
	d1 := waitFired(t, c, master, before+p.busyN/4, "a quarter into the busiest second")
	c.kill9(master)
	killed := time.Now()
	t.Logf("KILLED %s at %s, %v into the busiest second, when its metrics last showed %v released and %v pending; its lateness histogram: %s",
		master, killed.Format("15:04:05.000"), killed.Sub(p.busy).Round(time.Millisecond), d1.fired, d1.pending, d1.lateness())
	c.restart(master, args)
	c.waitWritable("g1", 60*time.Second, "after the restart of "+master)
	back := time.Now()
	t.Logf("RESTARTED: %s writable again %v after the kill", master, back.Sub(killed).Round(time.Millisecond))

	// The cancels held, the others are pending still, and cancel now.
	expectStates(t, c.addr(master), farSent[:10], protocol.DelayCancelled, "cancelled before the kill, after the restart")
	expectStates(t, c.addr(master), farSent[10:], protocol.DelayPending, "due in an hour, after the restart")
	cancelAll(t, c.addr(master), farSent[10:], "after the restart")
	expectStates(t, c.addr(master), farSent, protocol.DelayCancelled, "cancelled")

	waitAllReleased(t, c, master, len(sent), p.window+2*time.Minute)
	got := readReleased(t, c.addr(master), master)
	copies := checkOnce(t, sent, got, "after kill -9 and restart")

	// The first incarnation's releases are those stored before the kill;
	// the second incarnation counts the rest.
	d2, ok := c.delayedOf(master)
	if !ok {
		t.Fatalf("%s does not answer its metrics", master)
	}
	var first, outage []releasedCopy
	for _, cp := range copies {
		if cp.storeTime <= killed.UnixMilli() {
			first = append(first, cp)
		} else if cp.due <= back.UnixMilli() {
			outage = append(outage, cp)
		}
	}
	t.Logf("FIRED: the first incarnation released %d (its metrics last showed %v), the second %v (ferrymq_broker_delayed_fired_total after the restart); %d acknowledged",
		len(first), d1.fired, d2.fired, len(sent))
	if float64(len(first))+d2.fired != float64(len(sent)) || float64(len(first)) < d1.fired {
		t.Errorf("the first incarnation released %d (its last metrics said %v) and the second %v: want them to add up to %d",
			len(first), d1.fired, d2.fired, len(sent))
	}
	if d2.fired == 0 {
		t.Errorf("the restarted master released nothing: the kill came after every release")
	}
	if d2.pending != 0 {
		t.Errorf("ferrymq_broker_delayed_pending sums to %v after every message was released", d2.pending)
	}
	t.Logf("LATENESS (StoreTime - due) all: %s", latenessFigures(copies))
	t.Logf("LATENESS due during the outage (released by the restarted master): %s", latenessFigures(outage))
	t.Logf("LATENESS histogram of the restarted master: %s", d2.lateness())

	// 4: after kill -9, a lookup of each message names where it went.
	checkLookups(t, c.addr(master), sent, got, "after kill -9 and restart")
}

// TestDelayedExactlyOnceFailover sends delayed messages to g1 (NORMAL and
// HIGH), stops g1's slave in the busiest second of their releases so the
// master releases some that the slave does not copy, then kills the master
// with SIGKILL and lets the slave run again: the metaservers promote it.
//
// What the product promises (DESIGN.md, "Delayed messages"): releases are a
// fact of the log. A release the slave copied (below the new epoch's start)
// is in the new master's log and is not released again. A release in the
// old master's tail that no slave copied is released again by the new
// master, with the same message id and the same pending record
// (Schedule.Ref): a consumer that read it from the old master before the
// failover sees it twice, NORMAL or HIGH alike, since a release is appended
// without waiting for the slave. So:
//   - in the new master's log every acknowledged message, NORMAL or HIGH, is
//     released exactly once, none early (a HIGH pending record is on the
//     slave before its SEND is answered; a NORMAL one too here, since every
//     SEND was answered long before the fault);
//   - counting what a consumer read from the old master too, a message is
//     released at most twice, both copies naming the same pending record,
//     and only if the first copy lay at or past the new epoch's start.
func TestDelayedExactlyOnceFailover(t *testing.T) {
	c, master := startDelayedCluster(t)
	if master != "g1-master" {
		t.Fatalf("g1's master is %q", master)
	}
	args := c.cmdline("g1-master")
	p := newDelayedPlan(t)
	msgs := p.messages("fo")
	sent := sendDelayed(t, c.addr("g1-master"), msgs)
	if time.Now().After(p.busy) {
		t.Fatalf("sending %d delayed messages ended after the busiest second began: raise the lead in newDelayedPlan", p.n)
	}
	t.Logf("PLAN: %d delayed messages (%d HIGH) due from %s over %v; the busiest second %s holds %d",
		p.n, p.highN, p.t0.Format("15:04:05"), p.window, p.busy.Format("15:04:05"), p.busyN)

	// A consumer reads the old master's releases as they come.
	tail := startReleaseTail(c.addr("g1-master"), "g1-master")
	defer tail.stop()

	before := dueBefore(sent, p.busy)
	waitFired(t, c, "g1-master", before+p.busyN/8, "an eighth into the busiest second")
	c.signal("g1-slave", syscall.SIGSTOP)
	d1 := waitFired(t, c, "g1-master", before+p.busyN/4, "while its slave is stopped")
	c.kill9("g1-master")
	killed := time.Now()
	c.signal("g1-slave", syscall.SIGCONT)
	seenOld := tail.stop()
	t.Logf("KILLED g1-master at %s, %v into the busiest second, when its metrics last showed %v released; its lateness histogram: %s; a consumer had read %d released copies from it",
		killed.Format("15:04:05.000"), killed.Sub(p.busy).Round(time.Millisecond), d1.fired, d1.lateness(), len(seenOld))

	g := c.waitMembers("g1", "g1-slave", "", 2, failoverBound, "after kill -9 of g1-master")
	promoted := time.Now()
	start := epochStart(t, g, 2, "g1-slave")
	t.Logf("PROMOTED g1-slave %v after the kill; epoch 2 starts at log offset %d", promoted.Sub(killed).Round(time.Millisecond), start)

	waitAllReleased(t, c, "g1-slave", len(sent), p.window+2*time.Minute)
	got := readReleased(t, c.addr("g1-slave"), "g1-slave")
	copies := checkOnce(t, sent, got, "in the new master's log after the failover")
	d2, _ := c.delayedOf("g1-slave")

	// The old master comes back as the slave and hands its cut tail over:
	// it holds releases and marks (which name offsets of the old log) and
	// nothing pending, so nothing is released again.
	c.restart("g1-master", args)
	c.waitMembers("g1", "g1-slave", "g1-master", 2, failoverBound, "after the restart of g1-master")
	if testwait.UntilEvery(failoverBound, 50*time.Millisecond, func() bool {
		m, ok := c.metrics("g1-master")
		return ok && m["ferrymq_broker_tails_handed_over_total"] >= 1
	}) {
		m, _ := c.metrics("g1-slave")
		t.Logf("HANDED OVER: the new master appended %v records of the old master's cut tail again (%v held already)",
			m["ferrymq_broker_recovered_messages_total"], m["ferrymq_broker_recover_duplicates_total"])
	} else {
		t.Logf("g1-master handed no cut tail over in %v (it cut nothing?)", failoverBound)
	}
	after := readReleased(t, c.addr("g1-slave"), "g1-slave")
	checkOnce(t, sent, after, "in the new master's log after the old master rejoined")

	// Releases the slave copied are in the new log at the same place; the
	// new master released the rest, those of the cut tail again.
	copied := 0
	for _, cp := range copies {
		if cp.logOffset < start {
			copied++
		}
	}
	t.Logf("FIRED: %d releases copied from the old master (below the epoch start), %v by the new master (ferrymq_broker_delayed_fired_total); %d acknowledged",
		copied, d2.fired, len(sent))
	if float64(copied)+d2.fired != float64(len(sent)) {
		t.Errorf("%d releases below the epoch start and %v by the new master: want them to add up to %d", copied, d2.fired, len(sent))
	}
	if d2.pending != 0 {
		t.Errorf("the new master's ferrymq_broker_delayed_pending sums to %v after every message was released", d2.pending)
	}

	// What a consumer saw: the old master's copies and the new master's.
	bySent := map[string]delayedSent{}
	for _, s := range sent {
		bySent[s.id] = s
	}
	var repeated [2]int // NORMAL, HIGH
	var bad []string
	for id, olds := range seenOld {
		s, ok := bySent[id]
		if !ok {
			bad = append(bad, id+": read from the old master, never sent")
			continue
		}
		news := got[id]
		if len(olds) != 1 || len(news) != 1 {
			bad = append(bad, fmt.Sprintf("%s: %d copies on the old master, %d on the new", id, len(olds), len(news)))
			continue
		}
		o, n := olds[0], news[0]
		switch {
		case o.ref != s.handle || n.ref != s.handle:
			bad = append(bad, fmt.Sprintf("%s: the old master's copy names pending record %d, the new one %d; sent as %d", id, o.ref, n.ref, s.handle))
		case o.logOffset < start && (n.logOffset != o.logOffset || n.queueOffset != o.queueOffset):
			bad = append(bad, fmt.Sprintf("%s: released at log offset %d (copied, below the epoch start %d) and again at %d", id, o.logOffset, start, n.logOffset))
		case o.logOffset >= start:
			if s.rel == protocol.High {
				repeated[1]++
			} else {
				repeated[0]++
			}
		}
	}
	if len(bad) > 0 {
		t.Errorf("what a consumer read across the failover: %d messages break the promise, e.g. %v", len(bad), bad[:min(5, len(bad))])
	}
	t.Logf("REPEATED: a consumer reading the old master and then the new one read %d NORMAL and %d HIGH messages twice (released in the old master's uncopied tail, again by the new master, same pending record)",
		repeated[0], repeated[1])
	var outage []releasedCopy
	for _, cp := range copies {
		if cp.logOffset >= start {
			outage = append(outage, cp)
		}
	}
	t.Logf("LATENESS (StoreTime - due) in the new master's log, all: %s", latenessFigures(copies))
	t.Logf("LATENESS released by the new master: %s", latenessFigures(outage))
	t.Logf("LATENESS histogram of the new master: %s", d2.lateness())

	checkLookups(t, c.addr("g1-slave"), sent, got, "on the new master after the failover")
}

// releaseTail reads the released copies of the target queues from one
// broker as they come (long polls), until stopped or the broker fails.
type releaseTail struct {
	done   chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	seen   map[string][]releasedCopy
	once   sync.Once
	cl     *transport.Client
	cancel context.CancelFunc
}

func startReleaseTail(addr, broker string) *releaseTail {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	r := &releaseTail{done: make(chan struct{}), seen: map[string][]releasedCopy{}, cl: transport.NewClient(addr, transport.ClientConfig{}), cancel: cancel}
	for q := range uint32(delayedQueues) {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			req := protocol.PullRequest{Topic: delayedTopic, Queue: q, MaxBytes: 1 << 20, WaitMillis: 200}
			for ctx.Err() == nil {
				select {
				case <-r.done:
					return
				default:
				}
				resp, err := r.cl.Call(ctx, protocol.CodePull, protocol.AppendPullRequest(nil, &req))
				if err != nil {
					return // the broker died
				}
				pr, err := protocol.DecodePullResponse(resp.Body)
				if err != nil {
					return
				}
				r.mu.Lock()
				for _, m := range pr.Messages {
					r.seen[m.Message.ID] = append(r.seen[m.Message.ID], releasedCopy{queue: q, queueOffset: m.QueueOffset, logOffset: m.LogOffset,
						storeTime: m.StoreTime, ref: m.Message.Schedule.Ref, due: m.Message.Schedule.At, rel: m.Message.Reliability, broker: broker})
				}
				r.mu.Unlock()
				req.Offset = pr.NextOffset
			}
		}()
	}
	return r
}

// stop ends the tail and returns what it read, by message id.
func (r *releaseTail) stop() map[string][]releasedCopy {
	r.once.Do(func() {
		close(r.done)
		r.cancel()
		r.wg.Wait()
		_ = r.cl.Close()
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen
}

// TestDelayedCancelRacesFire sends delayed messages all due at the same
// instant a little ahead, and cancels each of them from other goroutines
// at times spread around that instant: for each message exactly one of the
// cancel and the release happened, and the cancel's answer says which (a
// cancel answered "cancelled" by this call never has a copy in the target
// queue; one answered "released" names the queue offset of the copy, which
// holds that message). A lookup afterwards agrees.
func TestDelayedCancelRacesFire(t *testing.T) {
	c, master := startDelayedCluster(t)
	const n = 1500
	due := time.Now().Add(4 * time.Second).Truncate(100 * time.Millisecond)
	msgs := make([]protocol.Message, n)
	for i := range msgs {
		msgs[i] = protocol.Message{ID: fmt.Sprintf("race-%05d", i), Topic: delayedTopic, Queue: uint32(i % delayedQueues),
			Reliability: []protocol.Reliability{protocol.Normal, protocol.High}[i%2], Timestamp: time.Now().UnixMilli(), Body: []byte("cancel me"),
			Schedule: protocol.Schedule{Kind: protocol.ScheduleDelayed, At: due.UnixMilli(), Ref: -1}}
	}
	sent := sendDelayed(t, c.addr(master), msgs)
	if time.Now().After(due.Add(-300 * time.Millisecond)) {
		t.Fatalf("sending %d delayed messages ended after %s, too close to their due time", n, due.Format("15:04:05.000"))
	}

	// Cancels start 150 ms before the due time and are spread over 400 ms,
	// in a shuffled order, from 8 goroutines.
	order := rand.New(rand.NewPCG(28, 3)).Perm(n)
	from := due.Add(-150 * time.Millisecond)
	const spread = 400 * time.Millisecond
	answers := make([]protocol.DelayedState, n)
	errs := make([]error, n)
	cl := transport.NewClient(c.addr(master), transport.ClientConfig{})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := int(next.Add(1) - 1)
				if k >= n {
					return
				}
				// This cancel's moment: an action's time, not a wait for a result.
				time.Sleep(time.Until(from.Add(spread * time.Duration(k) / n)))
				i := order[k]
				answers[i], errs[i] = delayedCall(ctx, cl, protocol.CodeDelayedCancel, sent[i].handle)
			}
		}()
	}
	wg.Wait()

	var cancelled, released, pending []int
	var bad []string
	for i, st := range answers {
		switch {
		case errs[i] == nil && st.State == protocol.DelayPending && st.ID == sent[i].id:
			pending = append(pending, i) // neither: see below
		case errs[i] != nil:
			bad = append(bad, fmt.Sprintf("%s: %v", sent[i].id, errs[i]))
		case st.ID != sent[i].id || st.Offset != sent[i].handle:
			bad = append(bad, fmt.Sprintf("%s@%d: the answer names %s@%d", sent[i].id, sent[i].handle, st.ID, st.Offset))
		case st.State == protocol.DelayCancelled && st.By == "cancel":
			cancelled = append(cancelled, i)
		case st.State == protocol.DelayReleased && st.Released != nil && st.By == "":
			released = append(released, i)
		default:
			bad = append(bad, fmt.Sprintf("%s: answered %+v (released %+v), want cancelled by this cancel or released", sent[i].id, st, st.Released))
		}
	}
	if len(bad) > 0 {
		t.Fatalf("%d cancels answered neither: e.g. %v", len(bad), bad[:min(5, len(bad))])
	}
	t.Logf("RACE: of %d messages due at %s, %d cancels won and %d answered released", n, due.Format("15:04:05.000"), len(cancelled), len(released))
	if len(cancelled) == 0 || len(released) == 0 {
		t.Errorf("the cancels did not race the release: %d won, %d lost (cancels spread over %v from %v before the due time)", len(cancelled), len(released), spread, due.Sub(from))
	}

	waitAllReleased(t, c, master, len(released)+len(pending), time.Minute)
	got := readReleased(t, c.addr(master), master)
	// A cancel answered "pending" said neither: what became of the message?
	if len(pending) > 0 {
		var what []string
		for _, i := range pending {
			st, err := delayedCall(ctx, cl, protocol.CodeDelayedState, sent[i].handle)
			what = append(what, fmt.Sprintf("%s@%d: cancel answered pending; %d copies in its queue %v; a lookup now says %s (released %+v, err %v)",
				sent[i].id, sent[i].handle, len(got[sent[i].id]), got[sent[i].id], st.State, st.Released, err))
		}
		t.Errorf("%d cancels were answered %q, neither cancelled nor released: %s", len(pending), protocol.DelayPending, strings.Join(what, "; "))
		released = append(released, pending...) // checked below as released, which the lookup says they were
		for _, i := range pending {
			if st, err := delayedCall(ctx, cl, protocol.CodeDelayedState, sent[i].handle); err == nil {
				answers[i] = st
			}
		}
	}
	var wrong []string
	for _, i := range cancelled {
		if cps := got[sent[i].id]; len(cps) > 0 {
			wrong = append(wrong, fmt.Sprintf("%s cancelled, yet released at %s/%d offset %d", sent[i].id, delayedTopic, cps[0].queue, cps[0].queueOffset))
		}
	}
	for _, i := range released {
		s, rel := sent[i], answers[i].Released
		cps := got[s.id]
		switch {
		case rel == nil:
			wrong = append(wrong, fmt.Sprintf("%s: answered %+v, which names no release", s.id, answers[i]))
		case len(cps) != 1:
			wrong = append(wrong, fmt.Sprintf("%s answered released, %d copies in its queue", s.id, len(cps)))
		case cps[0].queue != s.queue || cps[0].queueOffset != rel.QueueOffset || cps[0].logOffset != rel.LogOffset || cps[0].ref != s.handle:
			wrong = append(wrong, fmt.Sprintf("%s answered released at queue offset %d (log %d), its copy is %+v", s.id, rel.QueueOffset, rel.LogOffset, cps[0]))
		case cps[0].storeTime < s.due:
			wrong = append(wrong, fmt.Sprintf("%s due %d released %d: early", s.id, s.due, cps[0].storeTime))
		}
	}
	if total := len(got); total != len(released) {
		wrong = append(wrong, fmt.Sprintf("the queues hold %d released messages, %d cancels answered released", total, len(released)))
	}
	if len(wrong) > 0 {
		t.Errorf("%d answers disagree with the queues: e.g. %v", len(wrong), wrong[:min(5, len(wrong))])
	}
	if d, ok := c.delayedOf(master); ok {
		m, _ := c.metrics(master)
		t.Logf("metrics: released %v, cancelled %v, pending %v; lateness histogram: %s", d.fired, m["ferrymq_broker_delayed_cancelled_total"], d.pending, d.lateness())
		if d.fired != float64(len(released)) || m["ferrymq_broker_delayed_cancelled_total"] != float64(len(cancelled)) || d.pending != 0 {
			t.Errorf("the metrics say %v released, %v cancelled, %v pending; the answers %d released, %d cancelled",
				d.fired, m["ferrymq_broker_delayed_cancelled_total"], d.pending, len(released), len(cancelled))
		}
	}
	// A second look agrees with the first answer.
	var look []int
	if len(cancelled) > 0 {
		look = append(look, cancelled[0])
	}
	if len(released) > 0 {
		look = append(look, released[0])
	}
	for _, i := range look {
		st, err := delayedCall(ctx, cl, protocol.CodeDelayedState, sent[i].handle)
		if err != nil || st.State != answers[i].State || st.By != "" {
			t.Errorf("lookup of %s after the race: %+v, %v; the cancel answered %s", sent[i].id, st, err, answers[i].State)
		}
	}
}
