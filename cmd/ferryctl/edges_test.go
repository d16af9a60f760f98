package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
)

// TestMissingQueueExitCode: a queue the topic does not have is bad usage,
// exit 2 with the same message, for read and for group reset-offsets alike
// (docs/ferryctl.md's exit-code table).
func TestMissingQueueExitCode(t *testing.T) {
	meta := "--meta=" + startCluster(t)
	mustCtl(t, meta, "topic", "create", "orders", "--queues", "2")
	for _, args := range [][]string{
		{"read", "orders", "--queue", "7"},
		{"group", "reset-offsets", "readers", "--topic", "orders", "--to-earliest", "--queues", "7", "--create"},
	} {
		code, _, errOut := ctl(append([]string{meta}, args...)...)
		if code != exitUsage || !strings.Contains(errOut, "topic orders has 2 queues; no queue 7") {
			t.Errorf("ferryctl %v: exit %d, %q; want exit 2 saying the topic has 2 queues", args, code, errOut)
		}
	}
}

// TestVoterChangesAreGuarded: remove-voter of an id the Raft configuration
// does not have is an error (exit 1) naming the members, and changes
// nothing; add-voter asks the node first, and refuses (exit 1, nothing
// changed) a node that does not answer or answers as another id, so the
// leader is not left replicating to a dead voter; a running node is added,
// and removed again.
func TestVoterChangesAreGuarded(t *testing.T) {
	m := testcluster.StartMeta(t, 1, nil)
	meta := "--meta=" + m.Addr()
	members := func() []string {
		var st api.RaftStatus
		if err := json.Unmarshal([]byte(mustCtl(t, meta, "meta", "status", "--json")), &st); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, mb := range st.Members {
			ids = append(ids, mb.ID)
		}
		return ids
	}

	code, _, errOut := ctl(meta, "meta", "remove-voter", "nosuch")
	if code != exitError || !strings.Contains(errOut, `no metaserver "nosuch"`) || !strings.Contains(errOut, "members: m1") {
		t.Fatalf("remove-voter nosuch: exit %d, %q; want exit 1 naming the members", code, errOut)
	}

	dead := testcluster.FreeAddr(t)
	started := time.Now()
	code, _, errOut = ctl(meta, "--timeout", "1m", "meta", "add-voter", "m9", "--raft-addr", testcluster.FreeAddr(t), "--rpc-addr", dead)
	if code != exitError || !strings.Contains(errOut, "does not answer") || !strings.Contains(errOut, "--force") {
		t.Fatalf("add-voter of a node not running: exit %d, %q; want exit 1 saying it does not answer", code, errOut)
	}
	if took := time.Since(started); took > 30*time.Second {
		t.Fatalf("add-voter of a node not running took %v", took)
	}
	if ids := members(); !slices.Equal(ids, []string{"m1"}) {
		t.Fatalf("members after the refused add-voter: %v", ids)
	}

	// A node started without peers, to join.
	cfg := testcluster.MetaConfig("m2", t.TempDir())
	s, err := metaserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Start(nil); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = ctl(meta, "meta", "add-voter", "m7", "--raft-addr", s.RaftAddr(), "--rpc-addr", s.RPCAddr())
	if code != exitError || !strings.Contains(errOut, "is the metaserver m2, not m7") {
		t.Fatalf("add-voter m7 at m2's address: exit %d, %q; want exit 1 naming m2", code, errOut)
	}
	mustCtl(t, meta, "meta", "add-voter", "m2", "--raft-addr", s.RaftAddr(), "--rpc-addr", s.RPCAddr())
	if ids := members(); !slices.Equal(ids, []string{"m1", "m2"}) {
		t.Fatalf("members after add-voter m2: %v", ids)
	}
	mustCtl(t, meta, "meta", "remove-voter", "m2")
	if ids := members(); !slices.Equal(ids, []string{"m1"}) {
		t.Fatalf("members after remove-voter m2: %v", ids)
	}
}

// TestLongValuesAreCut: a long value in an error (a 5,000-byte --key,
// --prop or id) is shown once, cut to its first 64 bytes and its length,
// by ferryctl's own checks and in the metaserver's answers.
func TestLongValuesAreCut(t *testing.T) {
	m := testcluster.StartMeta(t, 1, nil)
	long := strings.Repeat("x", 5000)
	for _, tc := range []struct {
		args []string
		code int
		cut  string // the length shown after the cut value
	}{
		{[]string{"send", "t", "--body", "b", "--key", long}, exitUsage, "(5000 bytes)"},
		{[]string{"send", "t", "--body", "b", "--prop", "k=" + long}, exitUsage, "(5002 bytes)"},
		{[]string{"send", "t", "--body", "b", "--prop", long}, exitUsage, "(5000 bytes)"},
		{[]string{"send", "t", "--body", "b", "--prop", "a=b,k=" + long}, exitUsage, "(5006 bytes)"},
		{[]string{"meta", "remove-voter", long}, exitError, "(5000 bytes)"},
	} {
		code, _, errOut := ctl(append([]string{"--meta", m.Addr()}, tc.args...)...)
		if code != tc.code || len(errOut) > 400 || strings.Count(errOut, "...(") != 1 || strings.Count(errOut, strings.Repeat("x", 70)) != 0 || strings.Count(errOut, tc.cut) != 1 {
			t.Errorf("ferryctl %s ...: exit %d, %d bytes on stderr: %.400q; want exit %d and the value once, cut to 64 bytes and %q",
				tc.args[0], code, len(errOut), errOut, tc.code, tc.cut)
		}
	}
}

// TestNewTopicNameRules: topic create refuses, before any network call, a
// name of dots alone and '%' outside a dead-letter topic's prefix (exit 2,
// saying why), as the metaserver does; a dead-letter topic is created; a
// broker id with a space is refused as brokers refuse it.
func TestNewTopicNameRules(t *testing.T) {
	for _, tc := range []struct{ name, want string }{{"..", "only dots"}, {"%", "reserved"}, {"a%b", "reserved"}} {
		code, _, errOut := ctl("--meta", "127.0.0.1:1", "topic", "create", tc.name, "--queues", "1")
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("topic create %q: exit %d, %q; want exit 2 saying %q", tc.name, code, errOut, tc.want)
		}
	}
	if code, _, errOut := ctl("--meta", "127.0.0.1:1", "broker", "resync", "bad id"); code != exitUsage || !strings.Contains(errOut, "not allowed") {
		t.Errorf("broker resync 'bad id': exit %d, %q; want exit 2", code, errOut)
	}
	meta := "--meta=" + startCluster(t)
	mustCtl(t, meta, "topic", "create", "%DLQ%billing", "--queues", "1")
}

// TestTLSMismatchAtOnce: TLS settings that do not match the cluster's are
// known at the first handshake, and ferryctl says so then, with the cause,
// exit 2, without retrying out its --timeout: a CA against a plaintext
// cluster, and no client certificate on a cluster that requires one (for a
// metaserver call and for the producer).
func TestTLSMismatchAtOnce(t *testing.T) {
	tlsMeta, flags := startTLSCluster(t)
	plainMeta := "--meta=" + startCluster(t)
	caOnly := flags[:2]
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a CA against a plaintext cluster", append(append([]string{plainMeta}, flags...), "topics"), "the server is not TLS"},
		{"no client certificate", append(append([]string{tlsMeta}, caOnly...), "topics"), "requires a client certificate"},
		{"no client certificate, the producer", append(append([]string{tlsMeta}, caOnly...), "send", "orders", "--body", "b"), "requires a client certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			code, _, errOut := ctl(append([]string{"--timeout", "1m"}, tc.args...)...)
			took := time.Since(start)
			if code != exitUsage || !strings.Contains(errOut, tc.want) || !strings.Contains(errOut, "--tls-ca") || strings.Contains(errOut, "cannot reach") {
				t.Fatalf("exit %d, %q; want exit 2 saying %q and naming the TLS flags", code, errOut, tc.want)
			}
			// A retry loop would take the minute; the handshake takes
			// milliseconds (the bound allows a loaded machine).
			if took > 10*time.Second {
				t.Fatalf("took %v: the cause was known at the first handshake", took)
			}
		})
	}
}
