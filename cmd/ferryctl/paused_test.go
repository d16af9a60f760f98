package main

import (
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/protocol"
)

// TestPausedFirstMeta: with a paused metaserver first in --meta, the
// commands reach the others within the default --timeout: routes, topics
// and meta status (which shows the three members reachable).
func TestPausedFirstMeta(t *testing.T) {
	m := testcluster.StartMeta(t, 3, nil)
	testcluster.StartGroup(t, m.Addrs(), "g1", testcluster.GroupOpts{Edit: testcluster.SteadyBroker})
	meta := "--meta=" + testcluster.SilentAddr(t) + "," + strings.Join(m.Addrs(), ",")
	mustCtl(t, meta, "topic", "create", "orders", "--queues", "1")
	mustCtl(t, meta, "routes", "orders")
	if out := mustCtl(t, meta, "topics"); !strings.Contains(out, "orders") {
		t.Fatalf("topics:\n%s", out)
	}
	if out := mustCtl(t, meta, "meta", "status"); !strings.Contains(out, "3 of 3 members reachable") {
		t.Fatalf("meta status:\n%s", out)
	}
}

// TestMetaStatusNoMemberAnswers: the configuration comes, but no member
// answers at its RPC address (here: the address it advertises is wrong):
// meta status prints them unreachable and exits 1.
func TestMetaStatusNoMemberAnswers(t *testing.T) {
	rpc, wrong := testcluster.FreeAddr(t), testcluster.FreeAddr(t)
	testcluster.StartMeta(t, 1, func(c *metaserver.Config) { c.RPCAddr, c.AdvertiseRPC = rpc, wrong })
	code, out, errOut := ctl("--meta="+rpc, "meta", "status", "--member-timeout", "200ms")
	if code != exitError || !strings.Contains(out, "0 of 1 members reachable") || !strings.Contains(errOut, "none of the 1 members answered") {
		t.Fatalf("meta status with no member answering: exit %d, stdout %q, stderr %q; want exit 1", code, out, errOut)
	}
}

// TestExitCodeOfAServersError: a server's INVALID whose text says
// "unknown command" is the cluster saying no (exit 1), not a usage error;
// cobra's own refusals still are (exit 2).
func TestExitCodeOfAServersError(t *testing.T) {
	err := &protocol.Error{Status: protocol.StatusInvalid, Message: "unknown command *fsm.Frobnicate"}
	if code := exitCode(err); code != exitError {
		t.Fatalf("exitCode(%v) = %d, want %d", err, code, exitError)
	}
	for _, args := range [][]string{
		{"frobnicate"},
		{"meta", "add-voter", "m9"}, // required flags missing
		{"meta", "status", "--member-timeout", "5ms"},
		{"--meta", "a b:1", "topics"},
	} {
		if code, _, errOut := ctl(args...); code != exitUsage {
			t.Errorf("ferryctl %q: exit %d (%q), want %d", args, code, errOut, exitUsage)
		}
	}
}
