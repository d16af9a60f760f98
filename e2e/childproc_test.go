package e2e

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childProc is a process of the test binary run again as one of its
// TestHelper* functions, given its spec (JSON) in an environment
// variable: a consumer group member, a transaction producer, a transform.
// Its stdout is read line by line (each JSON line handed to the caller),
// its stderr kept in a log file that a failed test prints the end of, and
// the test's cleanup kills it by PID, reaps it and fails on a data race it
// reported.
type childProc struct {
	t      *testing.T
	what   string // "member m1", for messages
	pid    int
	stdin  io.WriteCloser
	log    string        // its stderr
	exited chan struct{} // its stdout is read to the end and it was reaped
	code   int           // its exit code, once exited
}

// startChild starts helper (a TestHelper* name) with env=spec and hands
// every stdout line that starts with '{' to onLine, on a goroutine of its
// own, until the process ends.
func startChild(t *testing.T, what, helper, env string, spec any, onLine func([]byte)) *childProc {
	t.Helper()
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), strings.ReplaceAll(what, " ", "-")+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+helper+"$")
	cmd.Env = append(os.Environ(), env+"="+string(raw))
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &childProc{t: t, what: what, pid: cmd.Process.Pid, stdin: stdin, log: logPath, exited: make(chan struct{})}
	go func() {
		defer close(p.exited)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if b := sc.Bytes(); len(b) > 0 && b[0] == '{' {
				onLine(b)
			}
		}
		_ = cmd.Wait()
		p.code = cmd.ProcessState.ExitCode()
		logf.Close()
	}()
	t.Cleanup(func() {
		if alive(p.pid) {
			_ = syscall.Kill(p.pid, syscall.SIGCONT) // a stopped one cannot die
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
		stdin.Close()
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("%s (pid %d) not reaped 10 s after SIGKILL", what, p.pid)
		}
		b, _ := os.ReadFile(logPath)
		if strings.Contains(string(b), "WARNING: DATA RACE") {
			t.Errorf("%s (pid %d) reported a data race:\n%s", what, p.pid, b)
		} else if t.Failed() {
			lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
			t.Logf("%s (pid %d) logged (last 25 lines):\n%s", what, p.pid, strings.Join(lines[max(0, len(lines)-25):], "\n"))
		}
	})
	return p
}

// kill9 kills the process with SIGKILL and waits until it is reaped.
func (p *childProc) kill9() {
	p.t.Helper()
	if err := syscall.Kill(p.pid, syscall.SIGKILL); err != nil {
		p.t.Fatalf("kill -9 %s (pid %d): %v", p.what, p.pid, err)
	}
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.t.Fatalf("%s (pid %d) not gone 10 s after SIGKILL", p.what, p.pid)
	}
}
