package broker_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/testlog"
)

const childEnv = "FERRY_BROKER_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChildBroker()
		return
	}
	goleak.VerifyTestMain(m)
}

// runChildBroker runs a broker in this process until it is killed: the
// test binary re-executed, so a test can kill -9 a real broker process.
func runChildBroker() {
	var cfg broker.Config
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &cfg); err != nil {
		fmt.Println("ERR", err)
		os.Exit(2)
	}
	cfg.Logger = testlog.New("child")
	b, err := broker.New(cfg)
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(2)
	}
	fmt.Println("ADDR", b.Addr())
	select {} // until killed
}

// startChild starts a master broker in a child process and returns its
// address and the process.
func startChild(t testing.TB, cfg broker.Config) (string, *exec.Cmd) {
	t.Helper()
	cfg.Logger = nil
	enc, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(enc))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ADDR ") {
		t.Fatalf("child broker did not start: %q %v", line, err)
	}
	return strings.TrimSpace(strings.TrimPrefix(line, "ADDR ")), cmd
}

func kill9(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}
