package fsm

import (
	"errors"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/protocol"
)

func TestSetAndRemovePrincipal(t *testing.T) {
	f := seeded(t)
	registry := f.Version()
	if f.ACLVersion() != 0 || len(f.Principals()) != 0 {
		t.Fatalf("a fresh registry has ACL version %d and %v", f.ACLVersion(), f.Principals())
	}
	tok := auth.HashToken("app1-token-app1-token-app1-token")
	r := mustApply(t, f, &SetPrincipal{Name: "app1", TokenHash: tok, Permissions: []string{"produce:orders.*", "describe", "produce:orders.*"}})
	if !r.Changed || r.Version != 1 || f.ACLVersion() != 1 {
		t.Fatalf("create: %+v, ACL version %d", r, f.ACLVersion())
	}
	want := []PrincipalRecord{{Name: "app1", TokenHash: tok, Permissions: []string{"describe", "produce:orders.*"}}}
	if got := f.Principals(); !reflect.DeepEqual(got, want) {
		t.Fatalf("principals %+v, want %+v (canonical: sorted, no duplicates)", got, want)
	}
	// The same again, in another order: nothing changes.
	if r := mustApply(t, f, &SetPrincipal{Name: "app1", TokenHash: tok, Permissions: []string{"describe", "produce:orders.*"}}); r.Changed || r.Version != 1 {
		t.Fatalf("a retried set: %+v", r)
	}
	// Replace: the new permissions and no token (certificate only).
	if r := mustApply(t, f, &SetPrincipal{Name: "app1", Permissions: []string{"consume:orders:billing"}}); !r.Changed || r.Version != 2 {
		t.Fatalf("replace: %+v", r)
	}
	mustApply(t, f, &SetPrincipal{Name: "ops", Permissions: []string{"admin"}})
	got := f.Principals()
	if len(got) != 2 || got[0].Name != "app1" || !got[0].TokenHash.IsZero() || !slices.Equal(got[0].Permissions, []string{"consume:orders:billing"}) || got[1].Name != "ops" {
		t.Fatalf("after replace: %+v", got)
	}
	if r := mustApply(t, f, &RemovePrincipal{Name: "app1"}); !r.Changed || r.Version != 4 {
		t.Fatalf("remove: %+v", r)
	}
	if r := mustApply(t, f, &RemovePrincipal{Name: "app1"}); r.Changed || r.Version != 4 {
		t.Fatalf("removing an absent principal: %+v", r)
	}
	if got := f.Principals(); len(got) != 1 || got[0].Name != "ops" {
		t.Fatalf("after remove: %+v", got)
	}
	if f.Version() != registry {
		t.Fatalf("ACL commands moved the registry version %d -> %d (every cached route would be dropped)", registry, f.Version())
	}
	// Principals returns copies.
	got = f.Principals()
	got[0].Permissions[0] = "describe"
	if f.Principals()[0].Permissions[0] != "admin" {
		t.Fatal("Principals shares the state's slices")
	}
}

// TestSetPrincipalRefusals: a bad command is refused with an error naming
// what is wrong, and nothing of it is applied.
func TestSetPrincipalRefusals(t *testing.T) {
	f := New()
	tok := auth.HashToken("shared-token-shared-token-shared-token")
	mustApply(t, f, &SetPrincipal{Name: "app1", TokenHash: tok, Permissions: []string{"produce:a"}})
	before := registry(f)
	cases := []struct {
		cmd    Command
		status protocol.Status
		want   string
	}{
		{&SetPrincipal{Name: "app2", Permissions: []string{"produce:b", "write:x"}}, protocol.StatusInvalid,
			`principal "app2": permission "write:x": unknown kind "write"`},
		{&SetPrincipal{Name: "app1", TokenHash: tok, Permissions: []string{"produce:a", "consume:a"}}, protocol.StatusInvalid,
			`principal "app1": permission "consume:a": want consume:<topic-pattern>:<group-pattern>`},
		{&SetPrincipal{Name: "app1", Permissions: []string{"produce:or*ders"}}, protocol.StatusInvalid, "'*' may only end a pattern"},
		{&SetPrincipal{Name: "a b", Permissions: []string{"admin"}}, protocol.StatusInvalid, `character ' ' at position 2`},
		{&SetPrincipal{Name: "", Permissions: []string{"admin"}}, protocol.StatusInvalid, "principal name is empty"},
		{&SetPrincipal{Name: auth.AdminName, Permissions: []string{"admin"}}, protocol.StatusInvalid, "reserved for the built-in principal"},
		{&SetPrincipal{Name: auth.ClusterName, Permissions: []string{"cluster"}}, protocol.StatusInvalid, "reserved"},
		{&SetPrincipal{Name: "app2", TokenHash: tok, Permissions: []string{"produce:b"}}, protocol.StatusConflict,
			`principal "app1" has the same token`},
		{&SetPrincipal{Name: "app2", Permissions: []string{"produce:b"}, ExpectVersion: 7}, protocol.StatusConflict,
			"the ACL is at version 1, not 7"},
		{&RemovePrincipal{Name: "app1", ExpectVersion: 2}, protocol.StatusConflict, "the ACL is at version 1, not 2"},
	}
	for _, c := range cases {
		_, err := apply(t, f, c.cmd)
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Status != c.status || !strings.Contains(pe.Message, c.want) {
			t.Errorf("%+v: %v; want %v saying %q", c.cmd, err, c.status, c.want)
		}
	}
	if !reflect.DeepEqual(registry(f), before) || f.ACLVersion() != 1 {
		t.Fatalf("a refused command changed the state (ACL version %d)", f.ACLVersion())
	}
	// The right version is taken.
	mustApply(t, f, &SetPrincipal{Name: "app2", Permissions: []string{"produce:b"}, ExpectVersion: 1})
	mustApply(t, f, &RemovePrincipal{Name: "app2", ExpectVersion: 2})
}

func TestSetPrincipalLimit(t *testing.T) {
	f := New()
	f.s.Principals = make(map[string]*PrincipalRecord, MaxPrincipals)
	for i := range MaxPrincipals {
		name := "p" + strconv.Itoa(i)
		f.s.Principals[name] = &PrincipalRecord{Name: name}
	}
	if _, err := apply(t, f, &SetPrincipal{Name: "one-more"}); !errors.Is(err, protocol.ErrInvalid) || !strings.Contains(err.Error(), "its limit") {
		t.Fatalf("principal %d: %v", MaxPrincipals+1, err)
	}
	// Replacing one is still possible at the limit.
	for name := range f.s.Principals {
		mustApply(t, f, &SetPrincipal{Name: name, Permissions: []string{"describe"}})
		break
	}
}

// TestACLTable: the table a server checks against, built from the
// registry at its current version.
func TestACLTable(t *testing.T) {
	f := New()
	empty := f.ACL()
	if empty.Version() != 0 || len(empty.Principals()) != 0 {
		t.Fatalf("empty registry's table: version %d, %v", empty.Version(), empty.Principals())
	}
	token := auth.NewToken()
	mustApply(t, f, &SetPrincipal{Name: "app1", TokenHash: auth.HashToken(token), Permissions: []string{"produce:orders"}})
	tab := f.ACL()
	p, ok := tab.Authenticate(token)
	if !ok || p.Name != "app1" || tab.Version() != 1 {
		t.Fatalf("app1 by token: %+v %v (table version %d)", p, ok, tab.Version())
	}
	if err := auth.Authorize(p, protocol.CodeSend, auth.Topic("orders")); err != nil {
		t.Fatal(err)
	}
	if err := auth.Authorize(p, protocol.CodeSend, auth.Topic("payments")); !errors.Is(err, protocol.ErrNotAuthorized) {
		t.Fatalf("SEND to payments: %v", err)
	}
	// While the ACL does not change, the same table, for free.
	if allocs := testing.AllocsPerRun(50, func() {
		if f.ACL() != tab {
			t.Fatal("a new table without an ACL change")
		}
	}); allocs != 0 {
		t.Fatalf("%v allocations per ACL() without a change", allocs)
	}
	// A revocation is in the next table.
	mustApply(t, f, &RemovePrincipal{Name: "app1"})
	if _, ok := f.ACL().Authenticate(token); ok || f.ACL().Version() != 2 {
		t.Fatal("a removed principal still authenticates")
	}
	// The old table is a snapshot: it does not change under its holder.
	if _, ok := tab.Authenticate(token); !ok {
		t.Fatal("a table changed after it was built")
	}
}

func TestACLSnapshotRestore(t *testing.T) {
	f := seeded(t)
	tok := auth.HashToken(auth.NewToken())
	mustApply(t, f, &SetPrincipal{Name: "app1", TokenHash: tok, Permissions: []string{"produce:orders", "consume:orders:billing"}})
	mustApply(t, f, &SetPrincipal{Name: "ops", Permissions: []string{"admin"}})
	mustApply(t, f, &SetPrincipal{Name: "gone", Permissions: []string{"describe"}})
	mustApply(t, f, &RemovePrincipal{Name: "gone"})
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, f, &RemovePrincipal{Name: "ops"}) // after the snapshot: not in it
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	g := New()
	_ = g.ACL() // a table built before the restore must not outlive it
	if err := g.Restore(io.NopCloser(&sink)); err != nil {
		t.Fatal(err)
	}
	if g.ACLVersion() != 4 {
		t.Fatalf("restored ACL version %d, want 4", g.ACLVersion())
	}
	want := []PrincipalRecord{
		{Name: "app1", TokenHash: tok, Permissions: []string{"consume:orders:billing", "produce:orders"}},
		{Name: "ops", Permissions: []string{"admin"}},
	}
	if got := g.Principals(); !reflect.DeepEqual(got, want) {
		t.Fatalf("restored principals %+v, want %+v", got, want)
	}
	if p, ok := g.ACL().AuthenticateHash(tok); !ok || p.Name != "app1" || g.ACL().Version() != 4 {
		t.Fatalf("restored table: %+v %v", p, ok)
	}
	// It goes on from there as the original did.
	if r := mustApply(t, g, &RemovePrincipal{Name: "ops"}); r.Version != 5 || f.ACLVersion() != 5 {
		t.Fatalf("after restore: %+v; original at %d", r, f.ACLVersion())
	}

	// A snapshot from before the ACL has none, at version 0.
	old := New()
	if err := old.Restore(io.NopCloser(strings.NewReader(`{"version":3,"groups":{},"topics":{},"members":{}}`))); err != nil {
		t.Fatal(err)
	}
	if old.ACLVersion() != 0 || len(old.Principals()) != 0 {
		t.Fatalf("old snapshot: ACL version %d, %v", old.ACLVersion(), old.Principals())
	}
	mustApply(t, old, &SetPrincipal{Name: "app1", Permissions: []string{"describe"}})
}

func TestACLCommandsEncoding(t *testing.T) {
	if TypeSetPrincipal != 16 || TypeRemovePrincipal != 17 || TypeSetPrincipal&IgnoreUnknown != 0 || TypeRemovePrincipal&IgnoreUnknown != 0 {
		t.Fatal("the ACL commands are 16 and 17, and no node may skip them")
	}
	tok := auth.HashToken("x")
	for _, c := range []Command{
		&SetPrincipal{Name: "a", TokenHash: tok, Permissions: []string{"admin"}, ExpectVersion: 3},
		&SetPrincipal{Name: "b"},
		&RemovePrincipal{Name: "a", ExpectVersion: 9},
	} {
		b, err := Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Decode(b)
		if err != nil || !reflect.DeepEqual(back, c) {
			t.Fatalf("%+v came back as %+v, %v", c, back, err)
		}
	}
	// The log holds the hash in hex, never the token.
	b, _ := Encode(&SetPrincipal{Name: "a", TokenHash: tok})
	if !strings.Contains(string(b), `"token_sha256":"`+tok.String()+`"`) {
		t.Fatalf("entry %s", b)
	}
}
