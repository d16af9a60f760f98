package auth

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/protocol"
)

func mustTable(t *testing.T, version uint64, ps []Principal, b Builtins) *Table {
	t.Helper()
	tab, err := NewTable(version, ps, b)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

func TestAuthenticate(t *testing.T) {
	appTok, adminTok, clusterTok := NewToken(), NewToken(), NewToken()
	app := Principal{Name: "app1", Permissions: []Permission{Produce("orders")}, TokenHash: HashToken(appTok)}
	cert := Principal{Name: "svc", Permissions: []Permission{Describe}}
	tab := mustTable(t, 7, []Principal{app, cert}, Builtins{Admin: HashToken(adminTok), Cluster: HashToken(clusterTok)})
	if tab.Version() != 7 {
		t.Fatalf("version %d", tab.Version())
	}
	if p, ok := tab.Authenticate(appTok); !ok || p.Name != "app1" || p.BuiltIn || !p.Has(Produce("orders")) {
		t.Fatalf("app1's token: %+v %v", p, ok)
	}
	if p, ok := tab.Authenticate(adminTok); !ok || p.Name != AdminName || !p.BuiltIn || !p.IsAdmin() {
		t.Fatalf("admin's token: %+v %v", p, ok)
	}
	if p, ok := tab.Authenticate(clusterTok); !ok || p.Name != ClusterName || !p.BuiltIn || p.IsAdmin() || !p.Has(Cluster) {
		t.Fatalf("cluster's token: %+v %v", p, ok)
	}
	for _, tok := range []string{"", appTok[:len(appTok)-1], appTok + "x", NewToken(), HashToken(appTok).String()} {
		if p, ok := tab.Authenticate(tok); ok {
			t.Fatalf("%q authenticated as %+v", tok, p)
		}
	}
	if p, ok := tab.AuthenticateHash(HashToken(appTok)); !ok || p.Name != "app1" {
		t.Fatalf("by hash: %+v %v", p, ok)
	}
	if _, ok := tab.AuthenticateHash(TokenHash{}); ok {
		t.Fatal("the zero hash authenticated")
	}
	// A certificate's identity finds registry principals by name, never a
	// built-in.
	if p, ok := tab.Lookup("svc"); !ok || !p.Has(Describe) {
		t.Fatalf("svc: %+v %v", p, ok)
	}
	for _, name := range []string{AdminName, ClusterName, "nobody"} {
		if _, ok := tab.Lookup(name); ok {
			t.Fatalf("%q found by name", name)
		}
	}
	if got := tab.Principals(); len(got) != 2 || got[0].Name != "app1" || got[1].Name != "svc" {
		t.Fatalf("principals %+v", got)
	}
}

// TestEmptyTableLetsOnlyTheBootstrapAdminIn: auth on with nothing in the
// registry.
func TestEmptyTableLetsOnlyTheBootstrapAdminIn(t *testing.T) {
	adminTok := NewToken()
	tab := mustTable(t, 0, nil, Builtins{Admin: HashToken(adminTok)})
	p, ok := tab.Authenticate(adminTok)
	if !ok || Authorize(p, protocol.CodeAdminAddVoter, Target{}) != nil {
		t.Fatalf("bootstrap admin: %+v %v", p, ok)
	}
	if _, ok := tab.Authenticate(NewToken()); ok {
		t.Fatal("a stranger's token authenticated")
	}
	if tab.HasCluster() || !tab.HasAdmin() {
		t.Fatal("built-ins")
	}
	// No built-ins at all: nobody.
	if _, ok := mustTable(t, 0, nil, Builtins{}).Authenticate(""); ok {
		t.Fatal("the empty token authenticated against an empty table")
	}
}

func TestBuiltinWinsOverARegistryPrincipalWithItsToken(t *testing.T) {
	tok := NewToken()
	tab := mustTable(t, 1, []Principal{{Name: "x", TokenHash: HashToken(tok)}}, Builtins{Cluster: HashToken(tok)})
	if p, _ := tab.Authenticate(tok); p.Name != ClusterName {
		t.Fatalf("authenticated as %q", p.Name)
	}
}

func TestNewTableRefusesWhatTheRegistryNeverHolds(t *testing.T) {
	tok := HashToken(NewToken())
	cases := map[string]struct {
		ps []Principal
		b  Builtins
	}{
		"reserved for the built-in":            {ps: []Principal{{Name: "admin"}}},
		"not allowed":                          {ps: []Principal{{Name: "a b"}}},
		`principal "a" is listed twice`:        {ps: []Principal{{Name: "a"}, {Name: "a"}}},
		`principals "a" and "b" have the same`: {ps: []Principal{{Name: "a", TokenHash: tok}, {Name: "b", TokenHash: tok}}},
		"the bootstrap admin and the cluster":  {b: Builtins{Admin: tok, Cluster: tok}},
	}
	for want, c := range cases {
		if _, err := NewTable(1, c.ps, c.b); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", want, err)
		}
	}
	// Principals without tokens share the zero hash: that is no conflict.
	mustTable(t, 1, []Principal{{Name: "a"}, {Name: "b"}}, Builtins{})
}

func TestTokens(t *testing.T) {
	a, b := NewToken(), NewToken()
	if a == b || len(a) != 43 {
		t.Fatalf("tokens %q %q", a, b)
	}
	if raw, err := base64.RawURLEncoding.DecodeString(a); err != nil || len(raw) != 32 {
		t.Fatalf("token %q: %d bytes, %v", a, len(raw), err)
	}
	if err := ValidateToken(a); err != nil {
		t.Fatal(err)
	}
	if got, err := ParseToken([]byte("  " + a + "\n")); err != nil || got != a {
		t.Fatalf("ParseToken: %q %v", got, err)
	}
	for tok, want := range map[string]string{
		"short":                        "32 to 512 characters, got 5",
		strings.Repeat("x", 513):       "got 513",
		strings.Repeat("x", 40) + " y": "character 41 is not",
		strings.Repeat("é", 20):        "printable ASCII",
	} {
		if err := ValidateToken(tok); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidateToken(%.10q...) = %v; want %q", tok, err, want)
		}
	}
}

func TestTokenHashText(t *testing.T) {
	h := HashToken("secret-token")
	b, err := json.Marshal(struct{ H TokenHash }{h})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"H":"` + h.String() + `"}`; string(b) != want || len(h.String()) != 64 {
		t.Fatalf("got %s, want %s", b, want)
	}
	var back struct{ H TokenHash }
	if err := json.Unmarshal(b, &back); err != nil || back.H != h {
		t.Fatalf("read back %v %v", back.H, err)
	}
	if err := json.Unmarshal([]byte(`{"H":""}`), &back); err != nil || !back.H.IsZero() {
		t.Fatalf(`"" reads as %v %v`, back.H, err)
	}
	for _, bad := range []string{`"abc"`, `"` + strings.Repeat("zz", 32) + `"`} {
		if err := json.Unmarshal([]byte(`{"H":`+bad+`}`), &back); err == nil {
			t.Errorf("%s read as a hash", bad)
		}
	}
	if (TokenHash{}).String() != "" {
		t.Fatal("the zero hash has text")
	}
}

// TestWithBuiltins: a server layers its built-ins over the registry's
// table; asking again with the same ones costs nothing.
func TestWithBuiltins(t *testing.T) {
	appTok, adminTok, clusterTok := NewToken(), NewToken(), NewToken()
	reg := mustTable(t, 3, []Principal{{Name: "app1", TokenHash: HashToken(appTok)}}, Builtins{})
	if _, ok := reg.Authenticate(adminTok); ok {
		t.Fatal("the admin's token authenticated before the built-ins were added")
	}
	b := Builtins{Admin: HashToken(adminTok), Cluster: HashToken(clusterTok)}
	tab := reg.WithBuiltins(b)
	if p, ok := tab.Authenticate(adminTok); !ok || !p.IsAdmin() || !p.BuiltIn {
		t.Fatalf("admin: %+v %v", p, ok)
	}
	if p, ok := tab.Authenticate(clusterTok); !ok || p.Name != ClusterName {
		t.Fatalf("cluster: %+v %v", p, ok)
	}
	if p, ok := tab.Authenticate(appTok); !ok || p.Name != "app1" || tab.Version() != 3 {
		t.Fatalf("app1: %+v %v, version %d", p, ok, tab.Version())
	}
	if allocs := testing.AllocsPerRun(50, func() {
		if reg.WithBuiltins(b) != tab {
			t.Fatal("a second table for the same built-ins")
		}
	}); allocs != 0 {
		t.Fatalf("%v allocations per WithBuiltins with the same built-ins", allocs)
	}
	// Other built-ins: the old admin's token no longer gets in.
	other := reg.WithBuiltins(Builtins{Admin: HashToken(NewToken())})
	if _, ok := other.Authenticate(adminTok); ok {
		t.Fatal("a replaced admin token still authenticates")
	}
	if _, ok := other.Authenticate(clusterTok); ok || other.HasCluster() {
		t.Fatal("a removed cluster token still authenticates")
	}
}

// A token an operator chose is refused below MinTokenBits by the stated
// estimate (length x log2 of its distinct characters), saying why; a
// random one passes.
func TestWeakTokensRefused(t *testing.T) {
	for token, want := range map[string]string{
		strings.Repeat("a", 32):                          "at least 8 distinct characters; this one has 1",
		strings.Repeat("ab", 40):                         "at least 8 distinct characters; this one has 2",
		"passwordpasswordpasswordpassword":               "at least 8 distinct characters; this one has 7",
		"abcdefghijklabcdefghijklabcdefghijkl":           "repeats its first 12 characters",
		"01234567899876543210012345678998765":            "35 characters of an alphabet of 10, about 116 bits",
		"0f3a9c27b1e84d56c0a7f2e9b3d1846a":               "",
		"Zm9vYmFyLWJhei1xdXV4LXRva2VuLTEyMzQ1Njc4OTAhQA": "",
	} {
		err := ValidateToken(token)
		if want == "" {
			if err != nil {
				t.Errorf("%q: %v, want it taken", token, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want refused: %s", token, err, want)
		}
	}
	// 32 random hex digits (openssl rand -hex 16) are taken.
	for range 100 {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		if tok := hex.EncodeToString(b); ValidateToken(tok) != nil {
			t.Fatalf("hex %q: %v", tok, ValidateToken(tok))
		}
	}
	for range 100 {
		if tok := NewToken(); ValidateToken(tok) != nil {
			t.Fatalf("NewToken's %q: %v", tok, ValidateToken(tok))
		}
	}
	if _, err := ParseToken([]byte(strings.Repeat("a", 32) + "\n")); err == nil {
		t.Fatal("a token file of 32 x a was taken")
	}
}
