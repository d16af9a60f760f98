package outbox

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/sdk"
)

// childEnv, when set, makes the test binary a child application (runChild)
// instead of running tests; it holds a childSpec in JSON.
const childEnv = "FERRYMQ_OUTBOX_CHILD"

// childSpec is what the child application does.
type childSpec struct {
	Driver  string
	Dialect Dialect
	DSN     string
	Table   string
	Meta    string
	Topic   string
	N       int
	Batch   int
	// Relay: start the relay after committing, and stop dead after the
	// first pass's sends were answered (before their rows are deleted).
	// Otherwise the child stops dead after committing.
	Relay bool
}

// runChild is the child application: it commits N messages, one per
// transaction, printing "id ID" for each, then "committed"; with Relay it
// relays them and prints "sent N" after the first pass's sends. It then
// waits to be killed.
func runChild() int {
	var spec childSpec
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	db, err := sql.Open(spec.Driver, spec.DSN)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	hook := afterSend(func(sent int) bool {
		fmt.Printf("sent %d\n", sent)
		time.Sleep(time.Hour) // the parent kills the process here
		return true
	})
	o, err := New(db, "relay-"+spec.Table, WithDialect(spec.Dialect), Table(spec.Table), Client(sdk.MetaAddrs(spec.Meta)),
		LeaseTTL(time.Second), PollInterval(50*time.Millisecond), BatchSize(spec.Batch), hook)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx := context.Background()
	for i := range spec.N {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		m := &Message{Topic: spec.Topic, Body: []byte(fmt.Sprintf("child-%d", i))}
		if i%2 == 0 {
			m.Key = fmt.Sprintf("k%d", i%6)
		}
		id, err := o.Add(ctx, tx, m)
		if err == nil {
			err = tx.Commit()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		fmt.Printf("id %s\n", id)
	}
	fmt.Println("committed")
	if spec.Relay {
		if err := o.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		o.Notify()
	}
	time.Sleep(time.Hour) // the parent kills the process here
	return 0
}

// child is a running child application.
type child struct {
	cmd   *exec.Cmd
	lines chan string
	ids   []string
}

// startChild re-executes the test binary as a child application.
func startChild(t *testing.T, spec childSpec) *child {
	t.Helper()
	js, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(js))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := &child{cmd: cmd, lines: make(chan string, 1024)}
	go func() {
		defer close(ch.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ch.lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() { ch.kill(t) })
	return ch
}

// await reads the child's lines until one starting with prefix (collecting
// the ids printed), and returns it.
func (ch *child) await(t *testing.T, prefix string, within time.Duration) string {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case l, ok := <-ch.lines:
			if !ok {
				t.Fatalf("the child exited before printing %q", prefix)
			}
			if id, ok := strings.CutPrefix(l, "id "); ok {
				ch.ids = append(ch.ids, id)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-timeout:
			t.Fatalf("the child printed no %q within %v", prefix, within)
		}
	}
}

// kill kills the child with SIGKILL, by its PID, and reaps it.
func (ch *child) kill(t *testing.T) {
	if ch.cmd.ProcessState != nil {
		return
	}
	if err := syscall.Kill(ch.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Logf("kill %d: %v", ch.cmd.Process.Pid, err)
	}
	_ = ch.cmd.Wait()
	for range ch.lines { // the reader ends with the pipe
	}
}

// The application is killed (SIGKILL, a real process) between its commits
// and the relay, and then in the middle of relaying (after a pass's sends
// were stored, before their rows were deleted): a relay started afterwards
// stores every committed message exactly once.
func TestKilledApplication(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *cluster, b backend, dsn string, db *sql.DB) {
		table := newTable()
		o := c.newOutbox(t, db, b.dialect, table, BatchSize(10))
		if err := o.EnsureTable(context.Background()); err != nil {
			t.Fatal(err)
		}
		spec := childSpec{Driver: b.driver, Dialect: b.dialect, DSN: dsn, Table: table, Meta: c.MetaAddr(), Topic: c.topic, N: 25, Batch: 10}

		// Killed after its commits, before relaying anything.
		first := startChild(t, spec)
		first.await(t, "committed", 30*time.Second)
		first.kill(t)
		// Killed after a pass's sends, before deleting their rows.
		spec.Relay = true
		second := startChild(t, spec)
		line := second.await(t, "sent ", 30*time.Second)
		second.kill(t)
		if line != "sent 10" {
			t.Fatalf("the child's first pass: %q, want sent 10", line)
		}
		ids := append(first.ids, second.ids...)
		if len(ids) != 50 || rowsLeft(t, db, table) != 50 {
			t.Fatalf("%d ids printed, %d rows: want 50 of each", len(ids), rowsLeft(t, db, table))
		}

		if err := o.Start(); err != nil {
			t.Fatal(err)
		}
		waitEmpty(t, db, table, 30*time.Second)
		exactlyOnce(t, c.counts(t), ids)
		// The dead relay's 10 were found stored, not sent again.
		if s := o.Stats(); s.Resolved != 10 || s.Sent != 40 {
			t.Errorf("relay: %+v, want 10 found stored and 40 sent", s)
		}
	})
}
