package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/consumer"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/sdk"
)

// Consumer group members in processes of their own, for the tests that
// pause (SIGSTOP) or kill (SIGKILL) a member: the test binary runs itself
// again with -test.run=^TestHelperMember$ and memberEnv, and that process
// runs a consumer.Consumer (Run) whose handler writes one JSON line to
// stdout per call: the member, its process, its generation when the call
// began, the message's queue, offset, id and store time, and when the call
// began and ended. The parent reads the lines as they come; a process
// killed with SIGKILL loses only the call under way (its line is written
// after the call ends, unbuffered).

// memberEnv carries a member process's spec (JSON); without it
// TestHelperMember skips.
const memberEnv = "FERRY_TEST_MEMBER"

// memberSpec is what a member process runs.
type memberSpec struct {
	Meta      []string      `json:"meta"`
	Group     string        `json:"group"`
	Topic     string        `json:"topic"`
	Member    string        `json:"member"`
	Session   time.Duration `json:"session"`
	Heartbeat time.Duration `json:"heartbeat"`
	// Work is how long each handler call takes (it sleeps: the handler's
	// work, which ignores its context as a careless handler would).
	Work time.Duration `json:"work"`
}

// memberRecord is one line of a member process: a handler call (Event "")
// or an event ("ready", "run-ended", "closed"; Err is the error of Run or
// Close, "" for nil).
type memberRecord struct {
	Event  string `json:"event,omitempty"`
	Err    string `json:"err,omitempty"`
	Member string `json:"member"`
	PID    int    `json:"pid"`
	Gen    uint64 `json:"gen,omitempty"`
	Queue  uint32 `json:"queue,omitempty"`
	Offset int64  `json:"offset,omitempty"`
	ID     string `json:"id,omitempty"`
	Stored int64  `json:"stored,omitempty"` // unix nanos
	Start  int64  `json:"start,omitempty"`  // unix nanos
	End    int64  `json:"end,omitempty"`    // unix nanos
}

// deliverer names one member process: a member id restarted is another.
func (r *memberRecord) deliverer() string { return fmt.Sprintf("%s/%d", r.Member, r.PID) }

func (r *memberRecord) start() time.Time { return time.Unix(0, r.Start) }

// TestHelperMember is a member process of the consumer group tests, not a
// test: it runs only with memberEnv set, until SIGTERM or its stdin closes
// (then it Closes the consumer) or Run ends.
func TestHelperMember(t *testing.T) {
	raw := os.Getenv(memberEnv)
	if raw == "" {
		t.Skip("a consumer group member process, started by the tests of owners_test.go")
	}
	os.Exit(runMember(raw))
}

// lineWriter writes one JSON line per record, unbuffered, one at a time.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) write(r memberRecord) {
	b, _ := json.Marshal(r)
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.w.Write(append(b, '\n'))
}

func runMember(raw string) int {
	var s memberSpec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		fmt.Fprintf(os.Stderr, "member spec %q: %v\n", raw, err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("member", s.Member)
	c, err := consumer.New(s.Group, []string{s.Topic}, sdk.MetaAddrs(s.Meta...), consumer.MemberID(s.Member),
		consumer.Session(s.Session), consumer.Heartbeat(s.Heartbeat), consumer.StartFrom(consumer.Earliest), sdk.Logger(log))
	if err != nil {
		fmt.Fprintf(os.Stderr, "consumer.New: %v\n", err)
		return 2
	}
	out := &lineWriter{w: os.Stdout}
	pid := os.Getpid()
	event := func(name string, err error) {
		r := memberRecord{Event: name, Member: s.Member, PID: pid, Start: time.Now().UnixNano()}
		if err != nil {
			r.Err = err.Error()
		}
		out.write(r)
	}
	// Close on SIGTERM, or once the parent is gone (its end of stdin closed).
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	orphaned := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(orphaned)
	}()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		select {
		case <-term:
		case <-orphaned:
		}
		event("closed", c.Close())
	}()
	event("ready", nil)
	err = c.Run(context.Background(), func(_ context.Context, m *consumer.Message) error {
		start := time.Now()
		gen := c.Stats().Generation
		time.Sleep(s.Work)
		out.write(memberRecord{Member: s.Member, PID: pid, Gen: gen, Queue: m.Queue, Offset: m.Offset, ID: m.ID,
			Stored: m.StoreTime.UnixNano(), Start: start.UnixNano(), End: time.Now().UnixNano()})
		return nil
	})
	event("run-ended", err)
	if err != nil {
		// Refused for good: nothing will Close it otherwise.
		event("closed", c.Close())
		return 1
	}
	<-closed
	return 0
}

// memberProc is a member process the test started.
type memberProc struct {
	*childProc
	id string
}

// groupRecords collects the records of every member process of a group.
type groupRecords struct {
	mu     sync.Mutex
	calls  []memberRecord
	events []memberRecord
}

func (g *groupRecords) add(r memberRecord) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if r.Event != "" {
		g.events = append(g.events, r)
	} else {
		g.calls = append(g.calls, r)
	}
}

func (g *groupRecords) snapshot() []memberRecord {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.calls)
}

// any reports whether a recorded call matches.
func (g *groupRecords) any(f func(r *memberRecord) bool) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range g.calls {
		if f(&g.calls[i]) {
			return true
		}
	}
	return false
}

// event returns a process's event by name.
func (g *groupRecords) event(pid int, name string) (memberRecord, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, e := range g.events {
		if e.PID == pid && e.Event == name {
			return e, true
		}
	}
	return memberRecord{}, false
}

// delivered returns the set of (queue, offset, id) handled so far.
func (g *groupRecords) delivered() map[qoff]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[qoff]int, len(g.calls))
	for _, r := range g.calls {
		out[qoff{r.Queue, r.Offset, r.ID}]++
	}
	return out
}

// startMemberProc starts a member process of spec's group and waits until
// it has made its consumer. The test's cleanup kills it by PID if it is
// still running.
func startMemberProc(t *testing.T, recs *groupRecords, spec memberSpec) *memberProc {
	t.Helper()
	p := launchMemberProc(t, recs, spec)
	p.waitReady(recs)
	return p
}

// waitReady waits until the process has made its consumer (it runs Run
// next).
func (p *memberProc) waitReady(recs *groupRecords) {
	p.t.Helper()
	testwait.For(p.t, 30*time.Second, "member process "+p.id+" to start", func() bool {
		_, ok := recs.event(p.pid, "ready")
		return ok
	})
}

// launchMemberProc is startMemberProc without the wait.
func launchMemberProc(t *testing.T, recs *groupRecords, spec memberSpec) *memberProc {
	t.Helper()
	c := startChild(t, "member "+spec.Member, "TestHelperMember", memberEnv, spec, func(line []byte) {
		var r memberRecord
		if json.Unmarshal(line, &r) == nil {
			recs.add(r)
		}
	})
	return &memberProc{childProc: c, id: spec.Member}
}

// terminate sends SIGTERM (the process Closes its consumer: commit, leave)
// without waiting.
func (p *memberProc) terminate() {
	if err := syscall.Kill(p.pid, syscall.SIGTERM); err != nil {
		p.t.Fatalf("SIGTERM to member %s (pid %d): %v", p.id, p.pid, err)
	}
}

// waitClosed waits until a terminated process has exited, and checks that
// Close and Run returned nil.
func (p *memberProc) waitClosed(recs *groupRecords) {
	p.t.Helper()
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		p.t.Fatalf("member %s (pid %d) still running 20 s after SIGTERM", p.id, p.pid)
	}
	if e, ok := recs.event(p.pid, "closed"); !ok || e.Err != "" {
		p.t.Errorf("member %s (pid %d): Close returned %q (recorded %v), want nil", p.id, p.pid, e.Err, ok)
	}
	if e, ok := recs.event(p.pid, "run-ended"); !ok || e.Err != "" {
		p.t.Errorf("member %s (pid %d): Run returned %q (recorded %v) after Close, want nil", p.id, p.pid, e.Err, ok)
	}
}

// stop sends SIGSTOP and returns once every thread of the process stopped.
func (p *memberProc) stop() time.Time {
	p.t.Helper()
	if err := syscall.Kill(p.pid, syscall.SIGSTOP); err != nil {
		p.t.Fatalf("SIGSTOP to member %s: %v", p.id, err)
	}
	testwait.For(p.t, 10*time.Second, "member "+p.id+" to stop", func() bool { return stopped(p.pid) })
	return time.Now()
}

// cont sends SIGCONT; it returns the time just before.
func (p *memberProc) cont() time.Time {
	p.t.Helper()
	at := time.Now()
	if err := syscall.Kill(p.pid, syscall.SIGCONT); err != nil {
		p.t.Fatalf("SIGCONT to member %s: %v", p.id, err)
	}
	return at
}
