package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/consumer"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// Consume-transform-produce exactly once, through real crashes: a process
// consumes topic "in" (group "xform", ManualCommit, Poll) and, for each
// batch, sends one output per input to "out" in a transaction of producer
// Identity "xform-1" that carries the batch's offsets (TxnOffsets). One
// process is killed -9 just after a transaction committed (before the
// consumer heard of it: where an application committing its offsets after
// the transaction, at least once, loses them), the next with a transaction
// open (its outputs stored, its offsets not committed), and a third
// finishes (each new one fences the dead: the same Identity, whose checker
// aborts what the dead left open). What a user relies on: reading "out" as
// a committed reader, every input's output appears exactly once, and the
// group's offsets end at the inputs' end.

// xformEnv carries a transform process's spec (JSON); without it
// TestHelperXform skips.
const xformEnv = "FERRY_TEST_XFORM"

// xformSpec is what a transform process runs.
type xformSpec struct {
	Meta []string `json:"meta"`
	// Hold, once the process committed HoldAfter outputs, stops it for
	// good (it prints "holding", for the parent to kill it) at a point of
	// its loop: "committed" once a transaction's Commit returned nil,
	// before the consumer is told; "sent" once a transaction's outputs are
	// stored, before its Commit. "": never.
	Hold      string `json:"hold,omitempty"`
	HoldAfter int    `json:"hold_after,omitempty"`
}

// xformLine is a line a transform process prints: "committed" after each
// committed transaction (Total: the outputs it committed so far), "aborted"
// after each aborted one, "holding" at its Hold, "error" when it gives up.
type xformLine struct {
	Event string `json:"event"`
	Total int    `json:"total,omitempty"`
	Err   string `json:"err,omitempty"`
}

// xformSession is the transform processes' consumer session: a killed
// one's queues go to the next within it.
const xformSession = 2 * time.Second

// TestHelperXform is a transform process of TestTxnThroughProcesses (ConsumeTransform), not a
// test: it runs only with xformEnv set.
func TestHelperXform(t *testing.T) {
	raw := os.Getenv(xformEnv)
	if raw == "" {
		t.Skip("a transform process, started by TestTxnThroughProcesses")
	}
	os.Exit(runXform(raw))
}

func runXform(raw string) int {
	var s xformSpec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		fmt.Fprintf(os.Stderr, "transform spec %q: %v\n", raw, err)
		return 2
	}
	out := json.NewEncoder(os.Stdout)
	var outMu sync.Mutex
	say := func(l xformLine) {
		outMu.Lock()
		defer outMu.Unlock()
		_ = out.Encode(l)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	// The checker aborts what a dead instance left open: should the
	// registry hold a commit of it (the instance died after the decision),
	// that decision wins.
	p, err := producer.New(sdk.MetaAddrs(s.Meta...), producer.Identity("xform-1"), producer.TxnCheckInterval(200*time.Millisecond),
		producer.CheckTxns(func(context.Context, producer.TxnCheck) producer.TxnDecision { return producer.TxnAbort }, "out"),
		sdk.Logger(log.With("sdk", "producer")))
	if err != nil {
		say(xformLine{Event: "error", Err: err.Error()})
		return 1
	}
	c, err := consumer.New("xform", []string{"in"}, sdk.MetaAddrs(s.Meta...), consumer.ManualCommit(), consumer.MaxPollRecords(25),
		consumer.Session(xformSession), consumer.Heartbeat(200*time.Millisecond), consumer.PollWait(200*time.Millisecond),
		sdk.Logger(log.With("sdk", "consumer")))
	if err != nil {
		say(xformLine{Event: "error", Err: err.Error()})
		return 1
	}
	// Stop once the parent closes its end of stdin.
	ctx, stop := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	total := 0
	for ctx.Err() == nil {
		batch, err := c.Poll(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			say(xformLine{Event: "error", Err: err.Error()})
			return 1
		}
		hold := func(at string) {
			if s.Hold == at && total >= s.HoldAfter {
				say(xformLine{Event: "holding", Total: total})
				<-ctx.Done() // killed here (or the parent ended)
				os.Exit(3)
			}
		}
		committed, err := transformBatch(p, c, batch, hold)
		switch {
		case err != nil:
			say(xformLine{Event: "error", Err: err.Error()})
			return 1
		case committed:
			total += len(batch)
			say(xformLine{Event: "committed", Total: total})
		default:
			say(xformLine{Event: "aborted"})
		}
	}
	err = errors.Join(c.Close(), p.Close())
	if err != nil {
		say(xformLine{Event: "error", Err: err.Error()})
		return 1
	}
	return 0
}

// transformBatch sends one output per input of batch to "out" in a
// transaction carrying the batch's offsets. It reports whether the
// transaction committed; an abort has the consumer deliver the batch
// again. hold is called at the points a test may kill the process.
func transformBatch(p *producer.Client, c *consumer.Consumer, batch []*consumer.Message, hold func(at string)) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	offsets, err := c.TxnOffsets(batch...)
	if errors.Is(err, consumer.ErrQueueLost) {
		return false, nil // a rebalance took a queue: the batch is void, delivered again
	}
	if err != nil {
		return false, err
	}
	txn, err := p.BeginTxn(ctx)
	if err != nil {
		return false, err
	}
	var sent sync.WaitGroup
	for _, m := range batch {
		sent.Add(1)
		txn.SendAsync(ctx, &producer.Message{Topic: "out", Body: m.Body, Properties: map[string]string{"input": m.ID}},
			func(producer.Result, error) { sent.Done() }) // Commit aborts if one failed
	}
	txn.CommitOffsets(offsets)
	sent.Wait()
	hold("sent")
	err = txn.Commit(ctx)
	if errors.Is(err, producer.ErrTxnAborted) {
		c.TxnAborted(offsets)
		return false, nil
	}
	if err != nil {
		return false, err
	}
	hold("committed")
	c.TxnCommitted(offsets)
	return true, nil
}

// xformProc is a transform process the test started.
type xformProc struct {
	*childProc
	total   atomic.Int64 // outputs committed, by its lines
	failed  atomic.Pointer[string]
	holding chan struct{} // closed at its "holding" line
}

// startXform starts a transform process. The test's cleanup kills it by
// PID if it still runs.
func startXform(t *testing.T, name string, spec xformSpec) *xformProc {
	t.Helper()
	p := &xformProc{holding: make(chan struct{})}
	p.childProc = startChild(t, "transform process "+name, "TestHelperXform", xformEnv, spec, func(b []byte) {
		var l xformLine
		if json.Unmarshal(b, &l) != nil {
			return
		}
		switch l.Event {
		case "committed":
			p.total.Store(int64(l.Total))
		case "error":
			p.failed.Store(&l.Err)
		case "holding":
			close(p.holding)
		}
	})
	return p
}

// err is what the process gave up on ("" none).
func (p *xformProc) err() string {
	if e := p.failed.Load(); e != nil {
		return *e
	}
	return ""
}

// kill9When kills the process with SIGKILL once it holds (see xformSpec),
// and waits until it is reaped.
func (p *xformProc) kill9When(timeout time.Duration, what string) {
	p.t.Helper()
	select {
	case <-p.holding:
	case <-p.exited:
		p.t.Fatalf("transform process %d exited (%d: %s) before it held %s", p.pid, p.code, p.err(), what)
	case <-time.After(timeout):
		p.t.Fatalf("transform process %d: not held %s in %v (committed %d; %s)", p.pid, what, timeout, p.total.Load(), p.err())
	}
	p.kill9()
}

// txnConsumeTransform: see the top of the file (TestTxnThroughProcesses
// runs it).
func txnConsumeTransform(t *testing.T, c *localCluster) {
	began := time.Now()
	const queues, n = 4, 600
	c.ctl("topic", "create", "in", "--queues", fmt.Sprint(queues), "--groups", "g1")
	c.ctl("topic", "create", "out", "--queues", fmt.Sprint(queues), "--groups", "g1")
	meta := strings.Split(c.meta, ",")

	// The inputs, and each queue's end.
	ids, ends := sendInputs(t, meta, n, queues)

	// Killed just after a transaction committed, before the consumer
	// heard of it; then the next with a transaction open.
	killedAt := map[string]int64{}
	for _, k := range []struct{ name, hold, what string }{
		{"first", "committed", "just after a transaction committed"},
		{"second", "sent", "with a transaction's outputs stored, before its commit"},
	} {
		proc := startXform(t, k.name, xformSpec{Meta: meta, Hold: k.hold, HoldAfter: n / 3})
		proc.kill9When(30*time.Second, k.what)
		killedAt[k.name] = proc.total.Load()
		t.Logf("KILLED the %s transform process %s, after it committed %d outputs (%v in)", k.name, k.what, killedAt[k.name], time.Since(began).Round(100*time.Millisecond))
	}

	last := startXform(t, "third", xformSpec{Meta: meta})
	testwait.ForEvery(t, 30*time.Second, 50*time.Millisecond, "the group's offsets to reach the inputs' end", func() bool {
		if e := last.err(); e != "" {
			t.Fatalf("the third transform process: %s", e)
		}
		got := c.committed("xform", "in")
		for q, end := range ends {
			if got[uint32(q)] != end {
				return false
			}
		}
		return true
	})
	last.stdin.Close()
	select {
	case <-last.exited:
	case <-time.After(15 * time.Second):
		t.Fatal("the third transform process did not exit 15 s after its stdin closed")
	}
	if last.code != 0 || last.err() != "" {
		t.Fatalf("the third transform process exited %d: %s", last.code, last.err())
	}
	t.Logf("the third transform process committed %d outputs; done %v in", last.total.Load(), time.Since(began).Round(100*time.Millisecond))
	assertCommittedAtEnds(t, c, "xform", "in", ends)

	// Every input's output once. A transaction the first process left open
	// holds committed readers until it is aborted (its checker, else the
	// timeout): read until every input shows, then check.
	addr := c.addr(c.masterOf("g1"))
	var got map[string]int
	testwait.ForEvery(t, txnTimeout+15*time.Second, 100*time.Millisecond, "every input's output to be readable in out", func() bool {
		got = readOutputs(t, addr, "out", queues)
		return len(got) >= len(ids)
	})
	var missing, twice []string
	for _, id := range ids {
		switch got[id] {
		case 0:
			missing = append(missing, id)
		case 1:
		default:
			twice = append(twice, fmt.Sprintf("%s x%d", id, got[id]))
		}
	}
	if len(missing) > 0 || len(twice) > 0 || len(got) != len(ids) {
		t.Fatalf("out holds %d inputs' outputs (want %d): %d missing %v, %d more than once %v",
			len(got), len(ids), len(missing), firstTen(missing), len(twice), firstTen(twice))
	}
	open, decided := c.txnDecisions()
	if len(open) > 0 {
		t.Errorf("ferryctl txn ls: transactions %v still open", open)
	}
	t.Logf("decided by others than their producers: %v", decided)
	t.Logf("TIME %v in all: %d inputs, each output once in out", time.Since(began).Round(100*time.Millisecond), n)
}

func firstTen(s []string) []string { return s[:min(len(s), 10)] }

// sendInputs sends n inputs to "in" and returns their ids and each queue's
// end.
func sendInputs(t *testing.T, meta []string, n, queues int) ([]string, []int64) {
	t.Helper()
	p, err := producer.New(sdk.MetaAddrs(meta...))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ids := make([]string, n)
	ends := make([]int64, queues)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var failed error
	for i := range n {
		wg.Add(1)
		p.SendAsync(context.Background(), &producer.Message{Topic: "in", Key: fmt.Sprint("k", i), Body: fmt.Appendf(nil, "in-%d", i)},
			func(r producer.Result, err error) {
				defer wg.Done()
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					failed = err
					return
				}
				ids[i] = r.ID
				ends[r.Queue] = max(ends[r.Queue], r.QueueOffset+1)
			})
	}
	wg.Wait()
	if failed != nil {
		t.Fatal(failed)
	}
	return ids, ends
}

// readOutputs reads every queue of topic whole from the broker at addr, as
// a reader of committed messages, and counts the outputs of each input (by
// their "input" property).
func readOutputs(t *testing.T, addr, topic string, queues int) map[string]int {
	t.Helper()
	cl := transport.NewClient(addr, transport.ClientConfig{})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := map[string]int{}
	for q := range queues {
		req := protocol.PullRequest{Topic: topic, Queue: uint32(q), MaxBytes: 1 << 20}
		for range 10_000 {
			resp, err := cl.Call(ctx, protocol.CodePull, protocol.AppendPullRequest(nil, &req))
			if err != nil {
				t.Fatalf("pull %s/%d at %d from %s: %v", topic, q, req.Offset, addr, err)
			}
			pr, err := protocol.DecodePullResponse(resp.Body)
			if err != nil {
				t.Fatalf("pull %s/%d at %d from %s: %v", topic, q, req.Offset, addr, err)
			}
			for _, m := range pr.Messages {
				for _, p := range m.Message.Properties {
					if p.Key == "input" {
						out[p.Value]++
					}
				}
			}
			if pr.NextOffset == req.Offset {
				break
			}
			req.Offset = pr.NextOffset
		}
	}
	return out
}
