package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/internal/loadgen"
)

// TestOperatorUsageErrors runs what an operator found exiting otherwise
// than the README says, against a running cluster: each is a usage error
// (exit 2) naming the flag and the values it takes, and changes nothing.
func TestOperatorUsageErrors(t *testing.T) {
	meta := "--meta=" + startCluster(t)
	mustCtl(t, meta, "topic", "create", "demo", "--queues", "2")
	mustCtl(t, meta, "send", "demo", "--body", "one", "--key", "k")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"read", "demo", "--queue", "0", "--limit", "-1"}, "--limit -1: want 1 to 100000"}, // it panicked
		{[]string{"read", "demo", "--queue", "0", "--limit", "0"}, "--limit 0: want 1 to 100000"},
		{[]string{"read", "demo", "--from", "-5"}, "--from -5: want 0 to "},
		{[]string{"read", "demo", "--queue", "-1"}, "--queue -1: want 0 to 4294967295"},
		{[]string{"--timeout", "0s", "topics"}, "--timeout 0s: want a duration from 1ms to 24h0m0s"},
		{[]string{"--timeout", "-1s", "topics"}, "--timeout -1s: want"},
		{[]string{"--timeout", "1000h", "topics"}, "--timeout 1000h: want"},
		{[]string{"topic", "add-queues", "demo", "--count", "0"}, "--count 0: want 1 to 4096"},
		{[]string{"topic", "create", "other", "--queues", "99999999999999999999"}, "--queues 99999999999999999999: want 1 to 4096"},
		{[]string{"bench", "--producers", "0"}, "--producers 0: want 1 to 1024"},
		{[]string{"bench", "--rate", "NaN"}, "--rate NaN: want 0 (as fast as the cluster takes them) or a number from 0.001 to 1e+09"},
		{[]string{"consume", "demo", "--group", "g", "--from", "middle"}, "--from middle: want earliest or latest"},
		{[]string{"group", "reset-offsets", "g", "--topic", "demo", "--to-offset", "-3"}, "--to-offset -3: want 0 to"},
		{[]string{"read", "主题-ü"}, "read: topic name"},
		{[]string{"broker", "readonly", ""}, "broker readonly: GROUP is empty"},
		{[]string{"topic", "frobnicate"}, "unknown command frobnicate for ferryctl topic: want add-queues, create"},
	} {
		code, out, errOut := ctl(append([]string{meta}, c.args...)...)
		if code != exitUsage || !strings.HasPrefix(errOut, "ferryctl: "+c.want) || out != "" {
			t.Errorf("ferryctl %q: exit %d, stderr %q, stdout %q; want exit 2 and %q", c.args, code, errOut, out, "ferryctl: "+c.want)
		}
		checkOneErrorLine(t, strings.Join(c.args, " "), code, errOut)
	}
	// add-queues --count 0 added nothing.
	var topics []map[string]any
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "topics", "--json")), &topics); err != nil || len(topics) != 1 || len(topics[0]["queues"].([]any)) != 2 {
		t.Fatalf("topics after the refused add-queues: %v %v", topics, err)
	}
	// A well-formed read of the same queue works.
	if out := mustCtl(t, meta, "read", "demo", "--queue", "0", "--limit", "1", "--json"); !strings.HasPrefix(strings.TrimSpace(out), "[") {
		t.Fatalf("read: %s", out)
	}

	// --meta is parsed before any dial: a bad one is refused at once, not
	// after --timeout of retries.
	for _, m := range []string{"garbage", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:http", ":7101", ",", ""} {
		code, _, errOut := ctl("--meta", m, "--timeout", "1h", "topics")
		if code != exitUsage || !strings.HasPrefix(errOut, "ferryctl: --meta ") || !strings.Contains(errOut, "host:port") {
			t.Errorf("--meta %q: exit %d, %q", m, code, errOut)
		}
	}
	code, _, errOut := ctl("--meta", "127.0.0.1:1,bad", "topics")
	if code != exitUsage || !strings.Contains(errOut, "bad is not host:port") {
		t.Errorf("--meta with one bad address of two: exit %d, %q", code, errOut)
	}
}

// TestUnreachable: a metaserver address where nothing listens exits 3
// with one line, for a command of each kind.
func TestUnreachable(t *testing.T) {
	for _, args := range [][]string{{"topics"}, {"routes", "t"}, {"read", "t"}, {"send", "t", "--body", "b"}, {"bench", "--count", "1"},
		{"consume", "t", "--group", "g"}, {"group", "describe", "g"}, {"group", "reset-offsets", "g", "--topic", "t", "--to-latest"}} {
		code, _, errOut := ctl(append([]string{"--meta", nowhere, "--timeout", "1s"}, args...)...)
		if code != exitUnreachable || !strings.HasPrefix(errOut, "ferryctl: cannot reach the cluster: ") {
			t.Errorf("%v: exit %d, %q", args, code, errOut)
		}
		checkOneErrorLine(t, strings.Join(args, " "), code, errOut)
	}
}

// TestEnvironment: FERRY_META, FERRY_TIMEOUT and FERRY_JSON stand for the
// global flags; a flag on the command line wins; without either --meta is
// the local cluster's.
func TestEnvironment(t *testing.T) {
	addr := startCluster(t)
	mustCtl(t, "--meta", addr, "topic", "create", "envtopic", "--queues", "1")

	t.Setenv("FERRY_META", addr)
	if out := mustCtl(t, "topics"); !strings.Contains(out, "envtopic") || !strings.Contains(out, "TOPIC") {
		t.Fatalf("topics with FERRY_META: %s", out)
	}
	t.Setenv("FERRY_JSON", "true")
	var topics []map[string]any
	if err := json.Unmarshal([]byte(mustCtl(t, "topics")), &topics); err != nil || len(topics) != 1 {
		t.Fatalf("topics with FERRY_JSON=true: %v %v", topics, err)
	}
	if out := mustCtl(t, "--json=false", "topics"); !strings.Contains(out, "TOPIC") {
		t.Fatalf("--json=false over FERRY_JSON=true: %s", out)
	}
	t.Setenv("FERRY_JSON", "")
	os.Unsetenv("FERRY_JSON")

	// The command line wins over the environment.
	t.Setenv("FERRY_META", nowhere)
	if out := mustCtl(t, "--meta", addr, "topics"); !strings.Contains(out, "envtopic") {
		t.Fatalf("--meta over FERRY_META: %s", out)
	}
	t.Setenv("FERRY_TIMEOUT", "1s")
	code, _, errOut := ctl("topics")
	if code != exitUnreachable {
		t.Fatalf("FERRY_META=%s: exit %d %q", nowhere, code, errOut)
	}

	// A bad value from the environment is a usage error naming the variable.
	t.Setenv("FERRY_META", addr)
	for _, c := range []struct{ name, value, want string }{
		{"FERRY_TIMEOUT", "0s", "ferryctl: FERRY_TIMEOUT=0s: want a duration from 1ms to 24h0m0s"},
		{"FERRY_META", "garbage", "ferryctl: FERRY_META=garbage: want a comma-separated list of host:port"},
		{"FERRY_JSON", "maybe", "ferryctl: FERRY_JSON=maybe: want true or false"},
	} {
		t.Setenv(c.name, c.value)
		code, _, errOut := ctl("topics")
		if code != exitUsage || !strings.HasPrefix(errOut, c.want) {
			t.Errorf("%s=%s: exit %d %q, want 2 and %q", c.name, c.value, code, errOut, c.want)
		}
		// ... unless the command line gives the flag.
		if c.name != "FERRY_META" {
			flag := "--" + strings.ToLower(strings.TrimPrefix(c.name, "FERRY_"))
			val := map[string]string{"--timeout": "5s", "--json": "false"}[flag]
			mustCtl(t, flag+"="+val, "topics")
		}
		t.Setenv(c.name, map[string]string{"FERRY_META": addr, "FERRY_TIMEOUT": "5s", "FERRY_JSON": "false"}[c.name])
	}

	// Neither: the local cluster's addresses.
	os.Unsetenv("FERRY_META")
	root, g := newRoot(strings.NewReader(""), &bytes.Buffer{})
	if err := root.ParseFlags(nil); err != nil {
		t.Fatal(err)
	}
	if err := applyEnv(root, g); err != nil || g.meta != "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103" {
		t.Fatalf("default --meta %q %v", g.meta, err)
	}
}

// TestSendBody: a message needs exactly one body source, not empty and at
// most 4 MiB, checked before the network; a 3 MiB file is sent whole and
// --body - reads stdin.
func TestSendBody(t *testing.T) {
	meta := "--meta=" + startCluster(t)
	mustCtl(t, meta, "topic", "create", "bodies", "--queues", "1")
	dir := t.TempDir()
	big, large := filepath.Join(dir, "5mib"), filepath.Join(dir, "3mib")
	if err := os.WriteFile(big, bytes.Repeat([]byte("x"), 5<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	body3 := bytes.Repeat([]byte("0123456789abcdef"), 3<<20/16)
	if err := os.WriteFile(large, body3, 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		args  []string
		stdin string
		want  string
	}{
		{[]string{"send", "bodies"}, "", "a message needs a body"},
		{[]string{"send", "bodies", "--body", ""}, "", "a message needs a body"},
		{[]string{"send", "bodies", "--body", "-"}, "", "a message needs a body"},
		{[]string{"send", "bodies", "--body-file", empty}, "", "a message needs a body"},
		{[]string{"send", "bodies", "--body", "x", "--body-file", large}, "", "give only one of --body and --body-file"},
		{[]string{"send", "bodies", "--body-file", big}, "", "a body of 5242880 bytes is over the cap of 4194304 bytes (4 MiB)"},
		{[]string{"send", "bodies", "--body", "-"}, strings.Repeat("y", 4<<20+1), "over the cap of 4194304 bytes (4 MiB)"},
		{[]string{"send", "bodies", "--body-file", filepath.Join(dir, "absent")}, "", "no such file"},
	} {
		code, out, errOut := ctlIn(strings.NewReader(c.stdin), append([]string{meta}, c.args...)...)
		if code != exitUsage || !strings.Contains(errOut, c.want) || out != "" {
			t.Errorf("%q: exit %d, %q; want 2 and %q", c.args, code, errOut, c.want)
		}
		checkOneErrorLine(t, strings.Join(c.args, " "), code, errOut)
	}

	var sent sendJSON
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "send", "bodies", "--body-file", large, "--json")), &sent); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := ctlIn(strings.NewReader("from stdin\n"), meta, "send", "bodies", "--body", "-", "--json")
	if code != 0 {
		t.Fatalf("--body -: exit %d %q", code, errOut)
	}
	var sent2 sendJSON
	if err := json.Unmarshal([]byte(out), &sent2); err != nil || sent2.QueueOffset != sent.QueueOffset+1 {
		t.Fatalf("--body -: %+v %v (after %+v)", sent2, err, sent)
	}
	var read []storedJSON
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "read", "bodies", "--from", fmt.Sprint(sent.QueueOffset), "--json")), &read); err != nil || len(read) != 2 {
		t.Fatalf("read back: %d messages, %v", len(read), err)
	}
	if read[0].ID != sent.ID || read[0].Body != string(body3) {
		t.Errorf("the 3 MiB body read back: id %s (sent %s), %d bytes, equal %v", read[0].ID, sent.ID, len(read[0].Body), read[0].Body == string(body3))
	}
	if read[1].Body != "from stdin\n" {
		t.Errorf("the stdin body read back: %q", read[1].Body)
	}
}

// TestBenchDuration: --duration alone sends until it ends (no count), and
// neither is the default count. (How the two limits end a run together is
// the load generator's, tested in internal/loadgen.)
func TestBenchDuration(t *testing.T) {
	meta := "--meta=" + startCluster(t)
	var res loadgen.Result
	out := mustCtl(t, meta, "bench", "--topic", "b", "--queues", "2", "--producers", "1", "--size", "16", "--json", "--duration", "1s", "--rate", "200")
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench --duration 1s: %v\n%s", err, out)
	}
	if res.Count != 0 || res.DurationSeconds != 1 || res.Seconds < 1 || res.Sent == 0 || res.Errors != 0 {
		t.Errorf("--duration 1s: count %d, duration %vs, ran %.3fs, sent %d, errors %d; want no count and at least 1s", res.Count, res.DurationSeconds, res.Seconds, res.Sent, res.Errors)
	}
	// Neither: the default count.
	root, _ := newRoot(nil, &bytes.Buffer{})
	cmd, _, err := root.Find([]string{"bench"})
	if err != nil || cmd.Flags().Lookup("count").DefValue != "100000" || cmd.Flags().Lookup("duration").DefValue != "0s" {
		t.Fatalf("bench defaults: %v", err)
	}
}

// TestBenchFailedSends: a run in which sends fail exits 1 and names the
// causes with their counts; --json has them too.
func TestBenchFailedSends(t *testing.T) {
	meta := "--meta=" + startCluster(t)
	mustCtl(t, meta, "topic", "create", "stuck", "--queues", "2", "--groups", "g1")
	mustCtl(t, meta, "broker", "readonly", "g1")
	code, out, errOut := ctl(meta, "bench", "--topic", "stuck", "--count", "7", "--producers", "1", "--delivery-timeout", "300ms", "--linger", "0s")
	if code != exitError {
		t.Fatalf("bench into a read-only group: exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "ERRORS") {
		t.Errorf("the result table is printed: %q", out)
	}
	lines := strings.Split(strings.TrimRight(errOut, "\n"), "\n")
	if lines[0] != "ferryctl: bench: 7 of 7 sends failed" || len(lines) < 2 || len(lines) > 1+maxCausesShown+1 {
		t.Fatalf("stderr:\n%s", errOut)
	}
	total := 0
	for _, l := range lines[1:] {
		var n int
		if _, err := fmt.Sscanf(l, "  %d x ", &n); err != nil {
			t.Fatalf("cause line %q: %v", l, err)
		}
		total += n
	}
	if total != 7 {
		t.Errorf("the causes count %d sends, want 7:\n%s", total, errOut)
	}
	checkOneErrorLine(t, "bench", code, errOut)

	code, out, errOut = ctl(meta, "bench", "--topic", "stuck", "--count", "3", "--producers", "1", "--delivery-timeout", "300ms", "--linger", "0s", "--json")
	var res loadgen.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != exitError || res.Errors != 3 || res.Sent != 0 || len(res.ErrorCauses) == 0 {
		t.Fatalf("--json: exit %d %+v %v %q", code, res, err, errOut)
	}
	n := int64(0)
	for _, c := range res.ErrorCauses {
		n += c.Count
		if c.Cause == "" || c.Example == "" {
			t.Errorf("cause %+v", c)
		}
	}
	if n != 3 {
		t.Errorf("error_causes count %d, want 3: %+v", n, res.ErrorCauses)
	}
	checkSnakeKeys(t, "bench (failed)", out)

	// Writable again: the same run succeeds.
	mustCtl(t, meta, "broker", "writable", "g1")
	mustCtl(t, meta, "bench", "--topic", "stuck", "--count", "7", "--producers", "1")
}

// TestSendFailures: bench's error after failed sends says how many failed,
// then one line per cause (the load generator's grouping, most frequent
// first) with its count and its first error when that says more, and at
// most maxCausesShown of them.
func TestSendFailures(t *testing.T) {
	causes := []loadgen.ErrorCause{
		{Cause: "READ_ONLY", Count: 3, Example: "ferrymq: READ_ONLY: group g1"},
		{Cause: "something else", Count: 2, Example: "something else"},
		{Cause: "BUSY", Count: 1, Example: "dial: ferrymq: BUSY"},
	}
	err := sendFailures(loadgen.Result{Sent: 4, Errors: 6, ErrorCauses: causes})
	want := "bench: 6 of 10 sends failed\n3 x READ_ONLY: ferrymq: READ_ONLY: group g1\n2 x something else\n1 x BUSY: dial: ferrymq: BUSY"
	if err.Error() != want {
		t.Fatalf("%q\nwant %q", err, want)
	}
	for i := range 10 {
		causes = append(causes, loadgen.ErrorCause{Cause: fmt.Sprint("cause ", i), Count: 1, Example: fmt.Sprint("cause ", i)})
	}
	if lines := strings.Split(sendFailures(loadgen.Result{ErrorCauses: causes}).Error(), "\n"); len(lines) != 2+maxCausesShown ||
		!strings.Contains(lines[len(lines)-1], "and 8 more causes") {
		t.Fatalf("%q", lines)
	}
}

var snakeKey = regexp.MustCompile(`^[a-z0-9]+(_[a-z0-9]+)*$`)

// checkSnakeKeys checks every key of every JSON value in out (one value or
// several, one a line) is snake_case; the keys of "properties" are the
// messages' own and are not checked.
func checkSnakeKeys(t *testing.T, what, out string) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(out))
	n := 0
	for dec.More() {
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Errorf("%s: not JSON: %v\n%s", what, err, out)
			return
		}
		n++
		var bad []string
		walkKeys(v, what, &bad)
		for _, b := range bad {
			t.Errorf("%s: key %s is not snake_case", what, b)
		}
	}
	if n == 0 {
		t.Errorf("%s printed no JSON", what)
	}
}

func walkKeys(v any, path string, bad *[]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if !snakeKey.MatchString(k) {
				*bad = append(*bad, path+"."+k)
			}
			if k != "properties" {
				walkKeys(x, path+"."+k, bad)
			}
		}
	case []any:
		for i, x := range v {
			walkKeys(x, fmt.Sprintf("%s[%d]", path, i), bad)
		}
	}
}

// TestJSONKeys runs every command that prints with --json and checks that
// every key is snake_case.
func TestJSONKeys(t *testing.T) {
	addr := startCluster(t)
	meta := "--meta=" + addr
	side, _ := sideFile(t)
	var sent sendJSON
	steps := []struct {
		what string
		args []string
		keep func(out string)
	}{
		{what: "topic create", args: []string{"topic", "create", "orders", "--queues", "2"}},
		{what: "topic add-queues", args: []string{"topic", "add-queues", "orders", "--count", "1"}},
		{what: "topics", args: []string{"topics"}},
		{what: "routes", args: []string{"routes"}},
		{what: "routes TOPIC", args: []string{"routes", "orders"}},
		{what: "send", args: []string{"send", "orders", "--body", "b", "--key", "k", "--prop", "a=b"}, keep: func(out string) {
			if err := json.Unmarshal([]byte(out), &sent); err != nil {
				t.Fatal(err)
			}
		}},
		{what: "brokers", args: []string{"brokers"}},
		{what: "broker readonly", args: []string{"broker", "readonly", "g2"}},
		{what: "broker writable", args: []string{"broker", "writable", "g2"}},
		{what: "broker add-group", args: []string{"broker", "add-group", "g2"}},
		{what: "broker retire-group", args: []string{"broker", "retire-group", "g2", "--dry-run"}},
		{what: "meta status", args: []string{"meta", "status"}},
		{what: "truncated", args: []string{"truncated", side}},
		{what: "consume", args: []string{"consume", "orders", "--group", "c1", "--count", "1"}},
		{what: "groups", args: []string{"groups"}},
		{what: "group describe", args: []string{"group", "describe", "c1"}},
		{what: "group reset-offsets", args: []string{"group", "reset-offsets", "c1", "--topic", "orders", "--to-earliest", "--dry-run"}},
		{what: "bench", args: []string{"bench", "--topic", "orders", "--count", "40", "--producers", "1", "--consumers", "1"}},
	}
	for _, s := range steps {
		out := mustCtl(t, append([]string{meta, "--json"}, s.args...)...)
		checkSnakeKeys(t, s.what, out)
		if s.keep != nil {
			s.keep(out)
		}
	}
	out := mustCtl(t, meta, "--json", "read", "orders", "--queue", fmt.Sprint(sent.Queue))
	checkSnakeKeys(t, "read", out)
	if !strings.Contains(out, `"properties"`) || !strings.Contains(out, `"queue_offset"`) {
		t.Errorf("read --json: %s", out)
	}
	if sent.ID == "" || sent.Topic != "orders" || sent.Broker == "" || sent.ProducerID == 0 {
		t.Errorf("send --json: %+v", sent)
	}
	// The walk finds a key that is not snake_case.
	var bad []string
	walkKeys(map[string]any{"ok_key": []any{map[string]any{"QueueOffset": 1}}, "properties": map[string]any{"Mixed": 1}}, "x", &bad)
	if len(bad) != 1 || bad[0] != "x.ok_key[0].QueueOffset" {
		t.Fatalf("walkKeys: %v", bad)
	}
}
