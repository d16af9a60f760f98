package auth

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/protocol"
)

type fakeConn struct {
	peer  any
	tls   *tls.ConnectionState
	authd bool
	// onPeer, when set, runs once after the next Peer: what another
	// goroutine (a concurrent AUTH) did meanwhile.
	onPeer func(c *fakeConn)
}

func (c *fakeConn) Peer() any {
	p := c.peer
	if f := c.onPeer; f != nil {
		c.onPeer = nil
		f(c)
	}
	return p
}
func (c *fakeConn) SetPeer(v any) { c.peer = v }
func (c *fakeConn) CompareAndSwapPeer(old, v any) bool {
	if c.peer != old {
		return false
	}
	c.peer = v
	return true
}
func (c *fakeConn) TLS() *tls.ConnectionState { return c.tls }
func (c *fakeConn) Authenticate()             { c.authd = true }
func certConn(cn string) *fakeConn {
	cert := &x509.Certificate{Subject: pkix.Name{CommonName: cn}}
	return &fakeConn{tls: &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}}
}

func notAuthorized(t *testing.T, err error, want string) {
	t.Helper()
	if !errors.Is(err, protocol.ErrNotAuthorized) || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want NOT_AUTHORIZED saying %q", err, want)
	}
}

// A connection is its AUTH token's principal, or its certificate's; it is
// looked up again in every new table, so a removed principal is refused on
// its next request.
func TestSession(t *testing.T) {
	app := Principal{Name: "app1", TokenHash: HashToken("app1-token-app1-token-app1-token-xx"), Permissions: []Permission{Produce("orders")}}
	svc := Principal{Name: "svc", Permissions: []Permission{Describe}}
	adminTok := "the-bootstrap-admin-token-0123456789"
	b := Builtins{Admin: HashToken(adminTok)}
	t1, err := NewTable(1, []Principal{app, svc}, b)
	if err != nil {
		t.Fatal(err)
	}
	t2, _ := NewTable(2, []Principal{svc}, b) // app1 removed

	var c fakeConn
	_, err = Resolve(&c, t1)
	notAuthorized(t, err, "authenticate first")
	_, err = Login(&c, t1, []byte("not a token anyone has, not at all"))
	notAuthorized(t, err, "token not recognised")
	if c.peer != nil || c.authd {
		t.Fatal("a refused AUTH changed the connection")
	}
	reply, err := Login(&c, t1, []byte("app1-token-app1-token-app1-token-xx"))
	if err != nil || reply.Principal != "app1" || len(reply.Permissions) != 1 || reply.Permissions[0] != "produce:orders" || !c.authd {
		t.Fatalf("AUTH: %+v, %v", reply, err)
	}
	if err := Check(&c, t1, protocol.CodeSend, Topic("orders")); err != nil {
		t.Fatal(err)
	}
	notAuthorized(t, Check(&c, t1, protocol.CodeSend, Topic("payments")), `principal "app1" lacks produce:payments`)
	allocs := testing.AllocsPerRun(100, func() { _, _ = Resolve(&c, t1) })
	if allocs != 0 {
		t.Fatalf("%v allocations per Resolve in the same table", allocs)
	}
	notAuthorized(t, Check(&c, t2, protocol.CodeSend, Topic("orders")), "token not recognised")

	// The bootstrap admin is in every table with the same built-ins.
	var a fakeConn
	if reply, err := Login(&a, t1, []byte(adminTok)); err != nil || reply.Principal != AdminName {
		t.Fatalf("admin: %+v, %v", reply, err)
	}
	if p, err := Resolve(&a, t2); err != nil || !p.IsAdmin() {
		t.Fatalf("admin in the next table: %+v, %v", p, err)
	}

	// A certificate names a registry principal; a token given later wins.
	cc := certConn("svc")
	if p, err := Resolve(cc, t1); err != nil || p.Name != "svc" {
		t.Fatalf("certificate svc: %+v, %v", p, err)
	}
	_, err = Resolve(certConn("stranger"), t1)
	notAuthorized(t, err, `certificate's name "stranger" is not a principal`)
	if _, err := Login(cc, t1, []byte(adminTok)); err != nil {
		t.Fatal(err)
	}
	if p, _ := Resolve(cc, t1); p.Name != AdminName {
		t.Fatalf("after AUTH the certificate's connection is %q, want the token's principal", p.Name)
	}
}

// A certificate authenticates its connection only if it names a principal:
// the transport leaves that to Resolve (a stranger's certificate must not
// lift the limits of a connection that has not authenticated).
func TestCertificateAuthenticatesOnlyAPrincipal(t *testing.T) {
	tab, err := NewTable(1, []Principal{{Name: "svc", Permissions: []Permission{Describe}}}, Builtins{})
	if err != nil {
		t.Fatal(err)
	}
	stranger := certConn("stranger")
	if _, err := Resolve(stranger, tab); err == nil || stranger.authd {
		t.Fatalf("a certificate that names no principal: %v, authenticated %v", err, stranger.authd)
	}
	svc := certConn("svc")
	if _, err := Resolve(svc, tab); err != nil || !svc.authd {
		t.Fatalf("a certificate that names a principal: %v, authenticated %v", err, svc.authd)
	}
	// One added to the table later authenticates the connection then.
	tab2, _ := NewTable(2, []Principal{{Name: "stranger", Permissions: []Permission{Describe}}}, Builtins{})
	if _, err := Resolve(stranger, tab2); err != nil || !stranger.authd {
		t.Fatalf("the certificate's principal added: %v, authenticated %v", err, stranger.authd)
	}
}

// An AUTH that lands while Resolve builds a certificate's session is kept:
// the connection is the token's principal, not the certificate's.
func TestResolveKeepsAConcurrentLogin(t *testing.T) {
	tok := "the-bootstrap-admin-token-0123456789"
	tab, err := NewTable(1, []Principal{{Name: "svc", Permissions: []Permission{Describe}}}, Builtins{Admin: HashToken(tok)})
	if err != nil {
		t.Fatal(err)
	}
	c := certConn("svc")
	c.onPeer = func(c *fakeConn) {
		if _, err := Login(c, tab, []byte(tok)); err != nil {
			t.Fatal(err)
		}
	}
	if p, err := Resolve(c, tab); err != nil || p.Name != AdminName {
		t.Fatalf("Resolve during AUTH: %+v, %v; want the token's principal", p, err)
	}
	if p, err := Resolve(c, tab); err != nil || p.Name != AdminName {
		t.Fatalf("after: %+v, %v; the certificate's session replaced the token's", p, err)
	}
}
