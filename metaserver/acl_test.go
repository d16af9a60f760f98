package metaserver_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/protocol"
)

// aclOf is what a node's table says of a set of tokens: the principal each
// authenticates as, with its permissions, and the table's version.
func aclOf(s *metaserver.Server, tokens ...string) string {
	t := s.ACL()
	var b strings.Builder
	fmt.Fprintf(&b, "v%d", t.Version())
	for _, tok := range tokens {
		if p, ok := t.Authenticate(tok); ok {
			fmt.Fprintf(&b, " %s%v", p.Name, auth.Strings(p.Permissions))
		} else {
			b.WriteString(" -")
		}
	}
	return b.String()
}

// everyNodeSees waits until every running node's table says want.
func everyNodeSees(t *testing.T, m *testcluster.Meta, want string, tokens ...string) {
	t.Helper()
	for _, s := range m.Nodes {
		if s == nil {
			continue
		}
		testwait.For(t, 10*time.Second, "node "+s.ID()+" to see "+want, func() bool { return aclOf(s, tokens...) == want })
	}
}

// snapshotIndex is the log index of the newest finished raft snapshot in a
// node's data directory (0: none). Snapshot directories are named
// term-index-time.
func snapshotIndex(dir string) uint64 {
	entries, _ := os.ReadDir(filepath.Join(dir, "snapshots"))
	var best uint64
	for _, e := range entries {
		parts := strings.Split(e.Name(), "-")
		if !e.IsDir() || strings.HasSuffix(e.Name(), ".tmp") || len(parts) != 3 {
			continue
		}
		if i, err := strconv.ParseUint(parts[1], 10, 64); err == nil && i > best {
			best = i
		}
	}
	return best
}

// TestACLReplicatesAndSurvives: a principal set on the leader is in every
// node's table; it survives a snapshot and a restart of every node from
// it, and a leader change; the built-in admin is every node's, from its
// config, with nothing in the registry; a follower refuses to write.
func TestACLReplicatesAndSurvives(t *testing.T) {
	adminTok, clusterTok, app1Tok, app2Tok := auth.NewToken(), auth.NewToken(), auth.NewToken(), auth.NewToken()
	m := testcluster.StartMeta(t, 3, func(c *metaserver.Config) {
		c.SnapshotInterval, c.SnapshotThreshold = 20*time.Millisecond, 16
		c.Auth = auth.Builtins{Admin: auth.HashToken(adminTok), Cluster: auth.HashToken(clusterTok)}
	})
	ctx := context.Background()
	tokens := []string{adminTok, clusterTok, app1Tok, app2Tok}

	// Auth on, nothing in the registry: only the built-ins get in.
	everyNodeSees(t, m, "v0 admin[admin] cluster[cluster] - -", tokens...)

	li, leader := m.Leader()
	ch, err := leader.SetPrincipal(ctx, "app1", auth.HashToken(app1Tok), []string{"produce:orders.*", "consume:orders.*:billing"}, 0)
	if err != nil || !ch.Changed || ch.Version != 1 {
		t.Fatalf("set app1: %+v %v", ch, err)
	}
	setAt := leader.RaftStatus().AppliedIndex
	everyNodeSees(t, m, "v1 admin[admin] cluster[cluster] app1[consume:orders.*:billing produce:orders.*] -", tokens...)

	// A follower does not write; it names the leader.
	follower := m.Nodes[(li+1)%3]
	if _, err := follower.SetPrincipal(ctx, "app2", auth.HashToken(app2Tok), []string{"describe"}, 0); !errors.Is(err, protocol.ErrNotLeader) ||
		!strings.Contains(err.Error(), leader.RPCAddr()) {
		t.Fatalf("set on a follower: %v", err)
	}
	// A bad permission is refused before the log, and nothing changes.
	if _, err := leader.SetPrincipal(ctx, "app2", auth.HashToken(app2Tok), []string{"describe", "produce:a b"}, 0); !errors.Is(err, protocol.ErrInvalid) ||
		!strings.Contains(err.Error(), `permission "produce:a b"`) {
		t.Fatalf("a bad permission: %v", err)
	}
	if _, err := leader.SetPrincipal(ctx, auth.AdminName, auth.HashToken(app2Tok), []string{"admin"}, 0); !errors.Is(err, protocol.ErrInvalid) {
		t.Fatalf("a principal named like the built-in admin: %v", err)
	}
	if _, err := leader.RemovePrincipal(ctx, "app1", 7); !errors.Is(err, protocol.ErrConflict) {
		t.Fatalf("remove at a stale version: %v", err)
	}
	if v := leader.FSM().ACLVersion(); v != 1 {
		t.Fatalf("refused changes moved the ACL version to %d", v)
	}

	// Enough changes for every node to snapshot past app1's entry, so a
	// restart reads app1 from a snapshot, not from the log.
	for i := range 20 {
		if _, err := leader.SetPrincipal(ctx, fmt.Sprintf("filler%02d", i), auth.TokenHash{}, []string{"describe"}, 0); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range m.Cfgs {
		testwait.For(t, 10*time.Second, c.ID+" to snapshot past app1's entry", func() bool { return snapshotIndex(c.Dir) >= setAt })
	}

	// A leader change: the new leader has the ACL and goes on from its
	// version.
	m.Stop(li)
	_, leader = m.Leader()
	if v := leader.FSM().ACLVersion(); v != 21 {
		t.Fatalf("the new leader is at ACL version %d, want 21", v)
	}
	if ch, err := leader.SetPrincipal(ctx, "app2", auth.HashToken(app2Tok), []string{"describe"}, 21); err != nil || ch.Version != 22 {
		t.Fatalf("set app2 on the new leader: %+v %v", ch, err)
	}
	if ch, err := leader.RemovePrincipal(ctx, "filler00", 0); err != nil || !ch.Changed || ch.Version != 23 {
		t.Fatalf("remove on the new leader: %+v %v", ch, err)
	}
	want := "v23 admin[admin] cluster[cluster] app1[consume:orders.*:billing produce:orders.*] app2[describe]"
	everyNodeSees(t, m, want, tokens...)
	wantPrincipals := leader.FSM().Principals()
	if len(wantPrincipals) != 21 {
		t.Fatalf("%d principals", len(wantPrincipals))
	}

	// Every node restarts from its snapshot and log, the old leader
	// included, and has the same ACL.
	m.StopAll()
	for i := range m.Nodes {
		m.Restart(i)
	}
	m.Leader()
	everyNodeSees(t, m, want, tokens...)
	for _, s := range m.Nodes {
		if got := s.FSM().Principals(); !reflect.DeepEqual(got, wantPrincipals) {
			t.Fatalf("node %s after the restart: %+v", s.ID(), got)
		}
		p, ok := s.ACL().Authenticate(app1Tok)
		if !ok || auth.Authorize(p, protocol.CodeSend, auth.Topic("orders.eu")) != nil ||
			!errors.Is(auth.Authorize(p, protocol.CodeSend, auth.Topic("payments")), protocol.ErrNotAuthorized) {
			t.Fatalf("node %s: app1 is %+v (%v)", s.ID(), p, ok)
		}
	}
}

// TestACLBuiltinsAreTheNodes: the built-ins are each node's own config,
// never the registry's: a node given another admin token lets that one in
// and not the others'.
func TestACLBuiltinsAreTheNodes(t *testing.T) {
	tok := auth.NewToken()
	m := testcluster.StartMeta(t, 1, func(c *metaserver.Config) { c.Auth.Admin = auth.HashToken(tok) })
	_, s := m.Leader()
	if p, ok := s.ACL().Authenticate(tok); !ok || !p.IsAdmin() || !p.BuiltIn {
		t.Fatalf("the admin token: %+v %v", p, ok)
	}
	if _, ok := s.ACL().Authenticate(auth.NewToken()); ok {
		t.Fatal("another token is the admin")
	}
	if _, ok := s.ACL().Lookup(auth.AdminName); ok {
		t.Fatal("the built-in admin is found by name (a certificate could claim it)")
	}
	if n := len(s.FSM().Principals()); n != 0 {
		t.Fatalf("the registry holds %d principals", n)
	}
	same := auth.HashToken(tok)
	cfg := testcluster.MetaConfig("x", t.TempDir())
	cfg.Auth = auth.Builtins{Admin: same, Cluster: same}
	if _, err := metaserver.New(cfg); err == nil || !strings.Contains(err.Error(), "the bootstrap admin and the cluster have the same token") {
		t.Fatalf("one token for both built-ins: %v", err)
	}
}
