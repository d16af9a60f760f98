package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
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
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// The transaction tests, through real processes (cluster.sh with one
// group, g1): producers that die between their messages and their commit
// (kill -9 of a child process, the test binary run again), and a master
// killed while a producer commits. What a user relies on, and these tests
// assert, with consumers of the SDK reading committed messages (the
// default):
//   - a transaction left open by a dead process is resolved by the next
//     instance of its Identity with its checker (committed: every message
//     received once), or, without a checker, aborted by the broker at its
//     -txn-timeout (never received; `ferryctl txn ls` says "timeout");
//   - across a failover, every transaction whose Commit returned nil is
//     received whole, once; one aborted never; one whose outcome the
//     producer never learned, all or nothing; and the old master rejoining
//     brings none of its cut tail's transaction records back.

// txnProducerEnv carries a transaction producer process's spec (JSON);
// without it TestHelperTxnProducer skips.
const txnProducerEnv = "FERRY_TEST_TXN_PRODUCER"

// txnProducerSpec is what a transaction producer process runs: it begins a
// transaction as Identity, sends Count messages to Topic (bodies Prefix-i),
// prints a txnSentLine and blocks until killed (or its stdin closes).
type txnProducerSpec struct {
	Meta     []string `json:"meta"`
	Identity string   `json:"identity"`
	Topic    string   `json:"topic"`
	Count    int      `json:"count"`
	Prefix   string   `json:"prefix"`
}

// txnSentLine is the line a transaction producer process prints once
// every message of its transaction is stored (Err: what failed instead).
type txnSentLine struct {
	Event  string   `json:"event"` // "sent"
	Txn    string   `json:"txn"`   // PRODUCER.EPOCH.NUMBER
	Bodies []string `json:"bodies"`
	Err    string   `json:"err,omitempty"`
}

// TestHelperTxnProducer is a transaction producer process of
// TestTxnThroughProcesses (ProducerKilled), not a test: it runs only with txnProducerEnv set.
func TestHelperTxnProducer(t *testing.T) {
	raw := os.Getenv(txnProducerEnv)
	if raw == "" {
		t.Skip("a transaction producer process, started by TestTxnThroughProcesses")
	}
	os.Exit(runTxnProducer(raw))
}

func runTxnProducer(raw string) int {
	var s txnProducerSpec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		fmt.Fprintf(os.Stderr, "txn producer spec %q: %v\n", raw, err)
		return 2
	}
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) int {
		_ = out.Encode(txnSentLine{Event: "sent", Err: err.Error()})
		return 1
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	p, err := producer.New(sdk.MetaAddrs(s.Meta...), producer.Identity(s.Identity), producer.Linger(0), sdk.Logger(log))
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	txn, err := p.BeginTxn(ctx)
	if err != nil {
		return fail(err)
	}
	line := txnSentLine{Event: "sent", Txn: txn.ID().String()}
	for i := range s.Count {
		body := fmt.Sprintf("%s-%d", s.Prefix, i)
		if _, err := txn.Send(ctx, &producer.Message{Topic: s.Topic, Body: []byte(body)}); err != nil {
			return fail(err)
		}
		line.Bodies = append(line.Bodies, body)
	}
	_ = out.Encode(line)
	// Neither Commit nor Abort: the parent kills this process now. Should
	// it not, the parent's end closes stdin, and the process leaves the
	// transaction open all the same.
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// txnProducerProc is a transaction producer process the test started.
type txnProducerProc struct {
	*childProc
	lines chan txnSentLine
}

// startTxnProducerProc starts a transaction producer process. The test's
// cleanup kills it by PID if it still runs.
// TestTxnThroughProcesses runs, on one cluster (one group, a slave,
// FERRY_TXN_TIMEOUT short), the transaction tests that need no failover:
// producers killed before their commits (txnProducerKilled), then a
// consume-transform-produce loop killed twice (txnConsumeTransform, in
// txn_ctp_test.go). Their topics and identities are their own.
func TestTxnThroughProcesses(t *testing.T) {
	skipShort(t)
	c := startLocalCluster(t, "FERRY_GROUPS=1", "FERRY_TXN_TIMEOUT="+txnTimeout.String())
	c.waitMaster("g1", 30*time.Second, "at the start")
	// First: it counts the group's timeouts, and the other's checker
	// leaves none.
	t.Run("ProducerKilled", func(t *testing.T) { txnProducerKilled(t, c) })
	t.Run("ConsumeTransform", func(t *testing.T) { txnConsumeTransform(t, c) })
}

func startTxnProducerProc(t *testing.T, spec txnProducerSpec) *txnProducerProc {
	t.Helper()
	p := &txnProducerProc{lines: make(chan txnSentLine, 1)}
	p.childProc = startChild(t, "producer process "+spec.Identity, "TestHelperTxnProducer", txnProducerEnv, spec, func(b []byte) {
		var l txnSentLine
		if json.Unmarshal(b, &l) == nil && l.Event == "sent" {
			select {
			case p.lines <- l:
			default:
			}
		}
	})
	return p
}

// waitSent waits for the process's "sent" line: its transaction's messages
// are all stored.
func (p *txnProducerProc) waitSent() txnSentLine {
	p.t.Helper()
	select {
	case l := <-p.lines:
		if l.Err != "" {
			p.t.Fatalf("producer process %d: %s", p.pid, l.Err)
		}
		return l
	case <-p.exited:
		p.t.Fatalf("producer process %d exited without sending", p.pid)
	case <-time.After(60 * time.Second):
		p.t.Fatalf("producer process %d: no \"sent\" line in 60 s", p.pid)
	}
	return txnSentLine{}
}

// txnDecisions runs `ferryctl txn ls --json` and returns the open
// transactions' ids and the decisions not made by their producers, by id
// ("committed/by" or "aborted/by").
func (c *localCluster) txnDecisions() (open []string, decided map[string]string) {
	c.t.Helper()
	var lists []protocol.TxnList
	if err := json.Unmarshal([]byte(c.ctl("txn", "ls", "--json")), &lists); err != nil {
		c.t.Fatalf("ferryctl txn ls --json: %v", err)
	}
	decided = map[string]string{}
	for _, l := range lists {
		for _, o := range l.Open {
			open = append(open, o.ID)
		}
		for _, d := range l.Decided {
			outcome := "aborted"
			if d.Committed {
				outcome = "committed"
			}
			decided[d.ID] = outcome + "/" + d.By
		}
	}
	return open, decided
}

// deliveredBodies counts the deliveries of each body.
func (r *recorder) deliveredBodies() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for _, d := range r.list {
		out[d.body]++
	}
	return out
}

// txnTimeout is the brokers' -txn-timeout in these tests: long enough for
// a checker to resolve a transaction first, short enough to wait for.
const txnTimeout = 5 * time.Second

// txnProducerKilled kills -9 two producer processes, each between its
// transaction's messages and its commit. One's Identity comes back with a
// checker that answers commit: a consumer receives its messages, each
// once. The other's never comes back: the broker aborts it at its
// -txn-timeout, `ferryctl txn ls` and the broker's metrics say so, and a
// consumer reading past it never receives its messages.
func txnProducerKilled(t *testing.T, c *localCluster) {
	began := time.Now()
	c.ctl("topic", "create", "txkeep", "--queues", "2", "--groups", "g1")
	c.ctl("topic", "create", "txdrop", "--queues", "1", "--groups", "g1")
	meta := strings.Split(c.meta, ",")
	const n = 20
	keeper := startTxnProducerProc(t, txnProducerSpec{Meta: meta, Identity: "keeper", Topic: "txkeep", Count: n, Prefix: "keep"})
	dropper := startTxnProducerProc(t, txnProducerSpec{Meta: meta, Identity: "dropper", Topic: "txdrop", Count: n, Prefix: "drop"})
	kept, dropped := keeper.waitSent(), dropper.waitSent()
	keeper.kill9()
	dropper.kill9()
	killed := time.Now()
	t.Logf("KILLED the producer processes of %s (%d messages to txkeep) and %s (%d to txdrop)", kept.Txn, len(kept.Bodies), dropped.Txn, len(dropped.Bodies))

	// (a) The keeper's Identity again, with a checker that answers commit
	// (before the transaction's timeout, which counts from its first
	// message: the time left is logged).
	var asked atomic.Int64
	var askedAt atomic.Int64 // unix nanos of the first check
	var strange sync.Map
	p, err := producer.New(sdk.MetaAddrs(meta...), producer.Identity("keeper"), producer.TxnCheckInterval(200*time.Millisecond),
		producer.CheckTxns(func(_ context.Context, tc producer.TxnCheck) producer.TxnDecision {
			asked.Add(1)
			askedAt.CompareAndSwap(0, time.Now().UnixNano())
			if tc.ID.String() != kept.Txn || tc.Group != "g1" {
				strange.Store(tc.ID.String(), tc.Group)
				return producer.TxnUnknown
			}
			return producer.TxnCommit
		}, "txkeep"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	keepRec, dropRec := newRecorder(), newRecorder()
	startMember(t, c, keepRec, "readers-keep", "txkeep", "rk")
	startMember(t, c, dropRec, "readers-drop", "txdrop", "rd")
	testwait.For(t, 30*time.Second, "the consumer to receive the checked transaction's messages", func() bool {
		return keepRec.count() >= n
	})
	t.Logf("RESOLVED %s by its checker, first asked %v after the kill (asked %d times); %d messages received %v after the kill",
		kept.Txn, time.Unix(0, askedAt.Load()).Sub(killed).Round(time.Millisecond), asked.Load(), keepRec.count(), time.Since(killed).Round(time.Millisecond))

	// (b) Nobody resolves the dropper's: the broker aborts it at its
	// timeout.
	testwait.For(t, txnTimeout+20*time.Second, "ferryctl txn ls to show "+dropped.Txn+" decided", func() bool {
		_, decided := c.txnDecisions()
		return decided[dropped.Txn] != ""
	})
	open, decided := c.txnDecisions()
	if got := decided[dropped.Txn]; got != "aborted/"+protocol.TxnByTimeout {
		t.Errorf("ferryctl txn ls: %s decided %q, want aborted/timeout", dropped.Txn, got)
	}
	if got := decided[kept.Txn]; got != "committed/"+protocol.TxnByChecker {
		t.Errorf("ferryctl txn ls: %s decided %q, want committed/checker", kept.Txn, got)
	}
	if len(open) != 0 {
		t.Errorf("ferryctl txn ls: open transactions %v after both were decided", open)
	}
	m, ok := c.metrics("g1-master")
	if !ok || m["ferrymq_broker_txn_timeouts_total"] != 1 {
		t.Errorf("g1-master's ferrymq_broker_txn_timeouts_total = %v (answered %v), want 1", m["ferrymq_broker_txn_timeouts_total"], ok)
	}
	t.Logf("ABORTED %s by the timeout %v after the kill (-txn-timeout %v)", dropped.Txn, time.Since(killed).Round(time.Millisecond), txnTimeout)

	// Messages stored after the aborted ones in txdrop's one queue: once
	// the consumer received them it has read past the aborted transaction.
	var tail []string
	for i := range 3 {
		body := fmt.Sprintf("after-%d", i)
		if _, err := p.Send(context.Background(), &producer.Message{Topic: "txdrop", Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
		tail = append(tail, body)
	}
	testwait.For(t, 30*time.Second, "the consumer of txdrop to receive the messages stored after the aborted transaction", func() bool {
		return dropRec.count() >= len(tail)
	})

	if got := keepRec.deliveredBodies(); !sameOnce(got, kept.Bodies) {
		t.Errorf("txkeep's consumer received %v, want each of %v once", got, kept.Bodies)
	}
	if got := dropRec.deliveredBodies(); !sameOnce(got, tail) {
		t.Errorf("txdrop's consumer received %v, want each of %v once and nothing of the aborted %s", got, tail, dropped.Txn)
	}
	strange.Range(func(k, v any) bool {
		t.Errorf("the checker was asked about %v of group %v: only %s was left open", k, v, kept.Txn)
		return true
	})
	t.Logf("TIME %v in all", time.Since(began).Round(100*time.Millisecond))
}

// sameOnce reports whether got holds each of want once and nothing else.
func sameOnce(got map[string]int, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	for _, w := range want {
		if got[w] != 1 {
			return false
		}
	}
	return true
}

// Outcomes of a transaction as its producer learned them.
const (
	txnCommitted = "committed" // Commit returned nil
	txnAborted   = "aborted"   // meant to be aborted, or Commit returned ErrTxnAborted
	txnUnknown   = "unknown"   // Commit failed otherwise, again and again, and so did Abort
)

// loopTxn is one transaction of txnLoop.
type loopTxn struct {
	id      string
	bodies  []string
	queues  map[uint32]bool
	outcome string
	err     error // the last error Commit or Abort returned
}

// txnLoop runs transactions of 10 messages, one after another, every third
// one aborted on purpose, and records what the producer learned of each.
type txnLoop struct {
	meta  []string
	topic string
	// before, if set, is called before transaction i begins, committing
	// before its Commit is called (on the loop's goroutine).
	before, committing func(i int)

	committed atomic.Int64
	mu        sync.Mutex
	txns      []loopTxn
	producers int // instances of the Identity it used
}

// run runs transactions until stop is closed, max transactions are run or
// the deadline passes.
func (l *txnLoop) run(stop <-chan struct{}, max int, deadline time.Time) error {
	newProducer := func() (*producer.Client, error) {
		l.producers++
		return producer.New(sdk.MetaAddrs(l.meta...), producer.Identity("looper"), producer.Linger(0),
			producer.DeliveryTimeout(15*time.Second))
	}
	p, err := newProducer()
	if err != nil {
		return err
	}
	defer func() { p.Close() }()
	for i := 0; i < max && time.Now().Before(deadline); i++ {
		select {
		case <-stop:
			return nil
		default:
		}
		if l.before != nil {
			l.before(i)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		txn, err := p.BeginTxn(ctx)
		if errors.Is(err, producer.ErrTxnInProgress) {
			// The one before is left open (its commit and abort failed):
			// another instance of the Identity goes on.
			p.Close()
			if p, err = newProducer(); err == nil {
				txn, err = p.BeginTxn(ctx)
			}
		}
		if err != nil {
			cancel()
			return fmt.Errorf("transaction %d: BeginTxn: %w", i, err)
		}
		lt := loopTxn{id: txn.ID().String(), queues: map[uint32]bool{}}
		var qmu sync.Mutex
		var sent sync.WaitGroup
		for j := range 10 {
			body := fmt.Sprintf("%s-%d", lt.id, j)
			lt.bodies = append(lt.bodies, body)
			sent.Add(1)
			txn.SendAsync(ctx, &producer.Message{Topic: l.topic, Body: []byte(body)}, func(r producer.Result, err error) {
				defer sent.Done()
				if err == nil {
					qmu.Lock()
					lt.queues[r.Queue] = true
					qmu.Unlock()
				}
			})
		}
		if i%3 == 2 {
			lt.outcome, lt.err = txnAborted, txn.Abort(ctx)
		} else {
			if l.committing != nil {
				l.committing(i)
			}
			lt.outcome, lt.err = l.commit(ctx, txn)
		}
		sent.Wait() // the promises run after Commit or Abort saw the results
		cancel()
		l.mu.Lock()
		l.txns = append(l.txns, lt)
		l.mu.Unlock()
		if lt.outcome == txnCommitted {
			l.committed.Add(1)
		}
	}
	return nil
}

// commit commits txn, three times at most while the outcome is unknown,
// then aborts it.
func (l *txnLoop) commit(ctx context.Context, txn *producer.Txn) (string, error) {
	var err error
	for range 3 {
		err = txn.Commit(ctx)
		switch {
		case err == nil:
			return txnCommitted, nil
		case errors.Is(err, producer.ErrTxnAborted):
			return txnAborted, err
		}
	}
	if aerr := txn.Abort(ctx); aerr == nil {
		return txnAborted, err
	} else {
		return txnUnknown, errors.Join(err, aerr)
	}
}

// snapshot is what the loop recorded so far.
func (l *txnLoop) snapshot() []loopTxn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.txns)
}

// readCommittedQueues reads every queue of topic whole from the broker at
// addr as a reader of committed messages: the bodies in queue order.
func readCommittedQueues(t *testing.T, addr, topic string, queues int) [][]string {
	t.Helper()
	cl := transport.NewClient(addr, transport.ClientConfig{})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := make([][]string, queues)
	for q := range queues {
		req := protocol.PullRequest{Topic: topic, Queue: uint32(q), MaxBytes: 1 << 20}
		for range 100_000 {
			resp, err := cl.Call(ctx, protocol.CodePull, protocol.AppendPullRequest(nil, &req))
			if err != nil {
				t.Fatalf("pull %s/%d at %d from %s: %v", topic, q, req.Offset, addr, err)
			}
			pr, err := protocol.DecodePullResponse(resp.Body)
			if err != nil {
				t.Fatalf("pull %s/%d at %d from %s: %v", topic, q, req.Offset, addr, err)
			}
			for _, m := range pr.Messages {
				out[q] = append(out[q], string(m.Message.Body))
			}
			if pr.NextOffset == req.Offset {
				break
			}
			req.Offset = pr.NextOffset
		}
	}
	return out
}

// TestTxnFailoverKillMaster runs transactions against g1 (a master and a
// slave) and kills -9 the master while one commits: the slave, stopped
// (SIGSTOP) just before that transaction began, holds none of it, and the
// old master's log holds its messages and its commit mark, unconfirmed.
// The slave, continued, is promoted and the transactions go on against it
// (the group's MinInSync is 1, so it commits without a slave). A consumer
// group then receives every message of every committed transaction once,
// none of an aborted one, and of a transaction whose outcome the producer
// never learned all its messages or none. The old master rejoins as the
// slave and hands its cut tail over: the new master's committed messages
// are the same after.
func TestTxnFailoverKillMaster(t *testing.T) {
	skipShort(t)
	began := time.Now()
	c := startLocalCluster(t, "FERRY_GROUPS=1", "FERRY_TXN_TIMEOUT="+txnTimeout.String(),
		"FERRY_HEARTBEAT="+modelHeartbeat.String(), "FERRY_SESSION="+modelSession.String(), "FERRY_FAILOVER_MARGIN="+modelMargin.String())
	c.waitMaster("g1", 30*time.Second, "at the start")
	const topic, queues = "txfo", 3
	c.ctl("topic", "create", topic, "--queues", strconv.Itoa(queues), "--groups", "g1")
	// A commit waits for the sync set, as HIGH does: with one copy enough,
	// the new master commits alone until the old one rejoins, and while
	// the slave is in the set a commit still waits for it.
	c.ctl("broker", "set-group", "g1", "--min-insync", "1")
	args := c.cmdline("g1-master")

	// Once 20 transactions committed, the slave is stopped before the next
	// one to commit begins: its messages and its commit mark are in the
	// master's log only when the master is killed, a tail the slave,
	// promoted, does not have.
	loop := &txnLoop{meta: strings.Split(c.meta, ","), topic: topic}
	c.ctl("topic", "create", "txdrain", "--queues", "1", "--groups", "g1")
	drain, err := producer.New(sdk.MetaAddrs(loop.meta...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drain.Close() })
	var drainErr error
	slavePID := c.pid("g1-slave")
	slaveStopped, committing := make(chan struct{}), make(chan int, 1)
	var stopOnce sync.Once
	var commitsBefore float64 // g1-master's commit marks before the slave stopped
	loop.before = func(i int) {
		if i%3 != 2 && loop.committed.Load() >= 20 {
			stopOnce.Do(func() {
				m, _ := c.metrics("g1-master")
				commitsBefore = m["ferrymq_broker_txn_commits_total"]
				if syscall.Kill(slavePID, syscall.SIGSTOP) == nil {
					testwait.Until(10*time.Second, func() bool { return stopped(slavePID) })
				}
				// The slave's pending HA fetch is answered into its socket
				// with what is appended next, which it reads once continued:
				// a message of another topic takes that answer, so that
				// the slave holds nothing of the next transaction.
				if _, err := drain.Send(context.Background(), &producer.Message{Topic: "txdrain", Body: []byte("drain")}); err != nil {
					drainErr = err
				}
				close(slaveStopped)
			})
		}
	}
	loop.committing = func(i int) {
		select {
		case <-slaveStopped:
			select {
			case committing <- i:
			default:
			}
		default:
		}
	}
	loopStop := make(chan struct{})
	loopErr := make(chan error, 1)
	go func() { loopErr <- loop.run(loopStop, 600, time.Now().Add(90*time.Second)) }()
	stopLoop := sync.OnceValue(func() error {
		close(loopStop)
		select {
		case err := <-loopErr:
			return err
		case <-time.After(2 * time.Minute):
			return errors.New("the transaction loop did not end 2 minutes after it was stopped")
		}
	})
	t.Cleanup(func() { _ = stopLoop() })

	var commits float64
	select {
	case i := <-committing:
		if drainErr != nil {
			t.Fatalf("a message to take the stopped slave's pending fetch: %v", drainErr)
		}
		t.Logf("STOPPED g1-slave before transaction %d, which commits now", i)
	case <-time.After(60 * time.Second):
		t.Fatal("no transaction committing after 20 committed and the slave stopped, in 60 s")
	}
	// Well within the lag time: the slave stays in the sync set, so the
	// commit is not answered before the kill.
	testwait.For(t, 3*time.Second, "g1-master to write the commit mark its slave does not have", func() bool {
		m, ok := c.metrics("g1-master")
		commits = m["ferrymq_broker_txn_commits_total"]
		return ok && commits > commitsBefore
	})
	c.kill9("g1-master")
	killed := time.Now()
	c.signal("g1-slave", syscall.SIGCONT)
	atKill := loop.committed.Load()
	c.waitMembers("g1", "g1-slave", "", 2, failoverBound, "after kill -9 of g1-master")
	t.Logf("KILLED g1-master after it wrote %v commit marks, %d transactions committed; g1-slave promoted %v later", commits, atKill, time.Since(killed).Round(time.Millisecond))
	testwait.For(t, 60*time.Second, "20 more transactions committed after the kill", func() bool { return loop.committed.Load() >= atKill+20 })
	if err := stopLoop(); err != nil {
		t.Fatal(err)
	}
	txns := loop.snapshot()
	count := map[string]int{}
	for _, lt := range txns {
		count[lt.outcome]++
		if lt.outcome != txnCommitted && lt.err != nil {
			t.Logf("transaction %s %s: %v", lt.id, lt.outcome, lt.err)
		}
	}
	t.Logf("LOOP: %d transactions by %d producer instances: %v", len(txns), loop.producers, count)

	// A last committed transaction in every queue: once a consumer
	// received it, it has read past every transaction before it.
	fence := &txnLoop{meta: loop.meta, topic: topic}
	for range 5 {
		if err := fence.run(nil, 1, time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if f := fence.snapshot(); f[len(f)-1].outcome == txnCommitted && len(f[len(f)-1].queues) == queues {
			break
		}
	}
	last := fence.snapshot()
	final := last[len(last)-1]
	if final.outcome != txnCommitted || len(final.queues) != queues {
		t.Fatalf("no transaction after the loop committed in every queue: %+v", last)
	}
	txns = append(txns, last...)

	rec := newRecorder()
	startMember(t, c, rec, "readers", topic, "r1")
	testwait.For(t, txnTimeout+30*time.Second, "the consumer to receive the last transaction", func() bool {
		got := rec.deliveredBodies()
		for _, b := range final.bodies {
			if got[b] == 0 {
				return false
			}
		}
		return true
	})
	got := rec.deliveredBodies()
	var bad []string
	known := map[string]bool{}
	all := 0
	for _, lt := range txns {
		n, twice := 0, 0
		for _, b := range lt.bodies {
			known[b] = true
			if got[b] > 0 {
				n++
			}
			if got[b] > 1 {
				twice++
			}
		}
		all += n
		switch {
		case twice > 0:
			bad = append(bad, fmt.Sprintf("%s (%s): %d messages received more than once", lt.id, lt.outcome, twice))
		case lt.outcome == txnCommitted && n != len(lt.bodies):
			bad = append(bad, fmt.Sprintf("%s: Commit returned nil, and %d of its %d messages were received", lt.id, n, len(lt.bodies)))
		case lt.outcome == txnAborted && n != 0:
			bad = append(bad, fmt.Sprintf("%s aborted (%v): %d of its messages received", lt.id, lt.err, n))
		case lt.outcome == txnUnknown && n != 0 && n != len(lt.bodies):
			bad = append(bad, fmt.Sprintf("%s unknown: %d of its %d messages received", lt.id, n, len(lt.bodies)))
		}
	}
	for b := range got {
		if !known[b] {
			bad = append(bad, fmt.Sprintf("received %q, of no transaction the producer ran", b))
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d transactions break the promise: %s", len(bad), strings.Join(bad[:min(10, len(bad))], "; "))
	}
	t.Logf("RECEIVED %d messages (%d deliveries) of %d transactions", all, rec.count(), len(txns))

	// The old master rejoins as the slave and hands its cut tail over; the
	// new master's committed messages stay as they were.
	before := readCommittedQueues(t, c.addr("g1-slave"), topic, queues)
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
	after := readCommittedQueues(t, c.addr("g1-slave"), topic, queues)
	for q := range queues {
		if !slices.Equal(before[q], after[q]) {
			t.Errorf("queue %d's committed messages on the new master changed when the old master rejoined: %d before, %d after", q, len(before[q]), len(after[q]))
		}
	}
	t.Logf("TIME %v in all", time.Since(began).Round(100*time.Millisecond))
}
