package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/internal/loadgen"
	"github.com/ferrymq/ferrymq/internal/testcluster"
)

func TestMain(m *testing.M) {
	// The tests give the global flags themselves: none comes from the
	// environment of whoever runs them.
	for _, name := range globalFlags {
		os.Unsetenv(envName(name))
	}
	goleak.VerifyTestMain(m)
}

// startCluster starts a metaserver and two single-broker groups, g1 and g2,
// in-process, and returns the metaserver's RPC address.
func startCluster(t *testing.T) string {
	t.Helper()
	return testcluster.Start(t, testcluster.Opts{Groups: []string{"g1", "g2"}}).MetaAddr()
}

// ctl runs ferryctl with an empty stdin and returns its exit code, stdout
// and stderr.
func ctl(args ...string) (int, string, string) {
	return ctlIn(strings.NewReader(""), args...)
}

// ctlIn runs ferryctl with stdin and returns its exit code, stdout and
// stderr.
func ctlIn(stdin io.Reader, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(args, stdin, &out, &errOut)
	return code, out.String(), errOut.String()
}

func mustCtl(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errOut := ctl(args...)
	if code != 0 {
		t.Fatalf("ferryctl %v: exit %d: %s", args, code, errOut)
	}
	return out
}

func TestCommands(t *testing.T) {
	meta := "--meta=" + startCluster(t)

	out := mustCtl(t, meta, "topic", "create", "orders", "--queues", "4")
	if !strings.Contains(out, "TOPIC") || strings.Count(out, "orders") != 4 || !strings.Contains(out, "g1") || !strings.Contains(out, "g2") {
		t.Fatalf("topic create:\n%s", out)
	}
	out = mustCtl(t, meta, "topics")
	if !strings.Contains(out, "orders") || !strings.Contains(out, "g1,g2") {
		t.Fatalf("topics:\n%s", out)
	}
	var topics []map[string]any
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "topics", "--json")), &topics); err != nil || len(topics) != 1 || topics[0]["name"] != "orders" {
		t.Fatalf("topics --json: %v %v", topics, err)
	}

	out = mustCtl(t, meta, "send", "orders", "--body", "hello world", "--prop", "a=b", "--key", "k1")
	if !strings.Contains(out, "QUEUE-OFFSET") || !strings.Contains(out, "orders") {
		t.Fatalf("send:\n%s", out)
	}
	var sent map[string]any
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "send", "orders", "--key", "k1", "--body", "second", "--json")), &sent); err != nil {
		t.Fatal(err)
	}
	queue := sent["queue"].(float64)

	out = mustCtl(t, meta, "read", "orders", "--queue", fmt.Sprint(int(queue)))
	if !strings.Contains(out, `"hello world"`) || !strings.Contains(out, `"second"`) || !strings.Contains(out, "a=b") {
		t.Fatalf("read:\n%s", out)
	}
	var read []map[string]any
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "read", "orders", "--queue", fmt.Sprint(int(queue)), "--json")), &read); err != nil || len(read) != 2 || read[1]["body"] != "second" {
		t.Fatalf("read --json: %v %v", read, err)
	}

	out = mustCtl(t, meta, "routes", "orders")
	if strings.Count(out, "RW") != 4 {
		t.Fatalf("routes:\n%s", out)
	}
	out = mustCtl(t, meta, "brokers")
	if !strings.Contains(out, "g1") || !strings.Contains(out, "RW") || !strings.Contains(out, "ago") || !strings.Contains(out, "DUPLICATES") {
		t.Fatalf("brokers:\n%s", out)
	}
	out = mustCtl(t, meta, "broker", "readonly", "g1")
	if !strings.Contains(out, "RO") || !strings.Contains(out, "admin") {
		t.Fatalf("broker readonly:\n%s", out)
	}
	var groups []map[string]any
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "brokers", "--json")), &groups); err != nil || len(groups) != 2 || groups[0]["state"] != "RO" || groups[0]["reason"] != "admin" {
		t.Fatalf("brokers --json: %v %v", groups, err)
	}
	if out = mustCtl(t, meta, "routes", "orders"); strings.Count(out, "RO\n") != 2 {
		t.Fatalf("routes after readonly:\n%s", out)
	}
	mustCtl(t, meta, "broker", "writable", "g1")

	out = mustCtl(t, meta, "meta", "status")
	if !strings.Contains(out, "leader m1") || !strings.Contains(out, "Voter") {
		t.Fatalf("meta status:\n%s", out)
	}
	var st map[string]any
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "meta", "status", "--json")), &st); err != nil || st["leader_id"] != "m1" {
		t.Fatalf("meta status --json: %v %v", st, err)
	}

	out = mustCtl(t, meta, "bench", "--count", "2000", "--producers", "2", "--size", "100")
	if !strings.Contains(out, "MSGS/S") || !strings.Contains(out, "2000") {
		t.Fatalf("bench:\n%s", out)
	}
	var res loadgen.Result
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "bench", "--count", "500", "--mode", "sync", "--json")), &res); err != nil || res.Sent != 500 || res.Errors != 0 || res.P50Micros <= 0 {
		t.Fatalf("bench --json: %+v %v", res, err)
	}
	// The async shape with the SDK's batching knobs and the profiles: every
	// message is counted (the run waits for every promise), and the CPU
	// time and both profiles are written.
	dir := t.TempDir()
	cpuProf, memProf := filepath.Join(dir, "cpu.pprof"), filepath.Join(dir, "mem.pprof")
	res = loadgen.Result{}
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "bench", "--count", "2000", "--producers", "2", "--window", "300",
		"--batch-bytes", "65536", "--max-inflight", "2", "--cpuprofile", cpuProf, "--memprofile", memProf, "--json")), &res); err != nil ||
		res.Sent != 2000 || res.Errors != 0 || res.CPUSeconds <= 0 {
		t.Fatalf("bench async --json: %+v %v", res, err)
	}
	for _, f := range []string{cpuProf, memProf} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Fatalf("profile %s: %v", f, err)
		}
	}
}

func TestErrors(t *testing.T) {
	for _, args := range [][]string{{"topics"}, {"brokers"}, {"meta", "status"}, {"send", "x", "--body", "b"}} {
		code, _, errOut := ctl(append([]string{"--meta", "127.0.0.1:1", "--timeout", "300ms"}, args...)...)
		if code != exitUnreachable || !strings.Contains(errOut, "cannot reach the cluster") {
			t.Fatalf("%v against nothing: exit %d, %q", args, code, errOut)
		}
	}
	if code, _, _ := ctl("topic", "create"); code != exitUsage {
		t.Fatalf("missing argument: exit %d", code)
	}
	if code, _, _ := ctl("frobnicate"); code != exitUsage {
		t.Fatalf("unknown command: exit %d", code)
	}
	meta := "--meta=" + startCluster(t)
	code, _, errOut := ctl(meta, "broker", "readonly", "nope")
	if code != exitError || !strings.Contains(errOut, "NOT_FOUND") {
		t.Fatalf("unknown group: exit %d %q", code, errOut)
	}
	code, _, errOut = ctl(meta, "read", "missing")
	if code != exitError || !strings.Contains(errOut, "UNKNOWN_TOPIC") {
		t.Fatalf("read unknown topic: exit %d %q", code, errOut)
	}
}
