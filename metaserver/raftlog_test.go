package metaserver

import (
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/internal/testlog"
)

// TestRaftErrorsWhileStoppingAreInfo: raft's errors are ERROR while the
// node runs, and INFO marked stopping=true once it stops (its peers
// stopping with it are no fault), through the loggers raft derives too.
func TestRaftErrorsWhileStoppingAreInfo(t *testing.T) {
	logs := testlog.NewCapture("raft", hclog.Info)
	stop := make(chan struct{})
	l := quietWhenStopping(logs, stop)
	l.Error("failed to heartbeat to", "peer", "m2")
	l.Error("failed to take snapshot", "error", "disk full")
	close(stop)
	l.Error("failed to make requestVote RPC", "target", "m1")
	l.Named("net").With("node", "m3").Log(hclog.Error, "failed to appendEntries to", "peer", "m2")
	l.Warn("a warning stays a warning")
	if got := logs.Lines("[ERROR]"); len(got) != 1 || !strings.Contains(got[0], "failed to take snapshot") {
		t.Fatalf("ERROR lines %q; want only the snapshot's, logged before the stop", got)
	}
	for _, msg := range []string{"failed to make requestVote RPC", "failed to appendEntries to"} {
		got := logs.Lines(msg)
		if len(got) != 1 || !strings.Contains(got[0], "[INFO]") || !strings.Contains(got[0], "stopping=true") {
			t.Fatalf("%q while stopping: %q; want one INFO line marked stopping=true", msg, got)
		}
	}
	// A peer not reached is a WARN, stop or no stop (a peer may stop
	// before this node's own signal arrives).
	if got := logs.Lines("failed to heartbeat to"); len(got) != 1 || !strings.Contains(got[0], "[WARN]") {
		t.Fatalf("a failed heartbeat before the stop: %q; want one WARN", got)
	}
	if len(logs.Lines("[WARN]")) != 2 {
		t.Fatalf("the warning: %q", logs.Lines("a warning"))
	}
}
