package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The gate and the token login are the transport's, without this package
// importing it.
var (
	_ transport.Gate  = (*Gate)(nil)
	_ transport.Login = TokenLogin("")
)

const (
	appToken = "app1-token-app1-token-app1-token-xx"
	// codeWhoIs answers the caller's principal; codeUnchecked answers
	// anyone with its address (its handler checks nothing: only the gate
	// keeps strangers out).
	codeWhoIs     protocol.Code = 1000
	codeUnchecked protocol.Code = 1001
)

// gateServer is a server behind a Gate with cfg whose AUTH is Login in a
// table that knows appToken, whose codeWhoIs answers the caller's
// principal (Resolve), and whose codeUnchecked answers the caller's
// address. logins counts AUTH requests.
type gateServer struct {
	*transport.Server
	gate   *Gate
	addr   string
	logins atomic.Int64
	table  atomic.Pointer[Table]
}

func startGateServer(t *testing.T, cfg GateConfig, tcfg transport.ServerConfig) *gateServer {
	t.Helper()
	table, err := NewTable(1, []Principal{{Name: "app1", TokenHash: HashToken(appToken), Permissions: []Permission{Describe}}}, Builtins{})
	if err != nil {
		t.Fatal(err)
	}
	gs := &gateServer{gate: NewGate(cfg)}
	tcfg.Gate = gs.gate
	gs.Server = transport.NewServer(tcfg)
	gs.table.Store(table)
	gs.Handle(protocol.CodeAuth, func(r *transport.Request) {
		gs.logins.Add(1)
		if BeginLogin(r) {
			AnswerLogin(r, r.Body, gs.table.Load(), gs.table.Load)
		}
	})
	gs.Handle(codeWhoIs, func(r *transport.Request) {
		p, err := Resolve(r, gs.table.Load())
		if err != nil {
			r.ReplyError(err)
			return
		}
		_ = r.Reply([]byte(p.Name))
	})
	gs.Handle(codeUnchecked, func(r *transport.Request) { _ = r.Reply([]byte(r.RemoteAddr().String())) })
	addr, err := gs.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs.addr = addr.String()
	t.Cleanup(func() { _ = gs.Close() })
	return gs
}

func client(t *testing.T, addr string, login transport.Login) *transport.Client {
	c := transport.NewClient(addr, transport.ClientConfig{Login: login})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// request writes one request of code with body on nc and reads its answer.
func request(t *testing.T, nc net.Conn, code protocol.Code, body string) (protocol.Frame, error) {
	t.Helper()
	b, err := protocol.AppendFrame(nil, &protocol.Frame{Code: code, Opaque: 1, Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Write(b); err != nil {
		return protocol.Frame{}, err
	}
	var lenBuf [4]byte
	if _, err := io.ReadFull(nc, lenBuf[:]); err != nil {
		return protocol.Frame{}, err
	}
	n, err := protocol.FrameLength(lenBuf[:])
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, n)
	copy(buf, lenBuf[:])
	if _, err := io.ReadFull(nc, buf[4:]); err != nil {
		return protocol.Frame{}, err
	}
	return protocol.DecodeFrame(buf)
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(time.Minute)) // a broken server must not hang the test
	return nc
}

// A stranger that never authenticates gets IDENTIFY and AUTH through and
// "authenticate first" for anything else, and is cut at AuthTimeout
// however busy it keeps its connection; a client that authenticated
// before it goes on, on the same connection.
func TestGateCutsTheStrangerAtTheDeadline(t *testing.T) {
	gs := startGateServer(t, GateConfig{RequestTimeout: time.Minute, AuthTimeout: 300 * time.Millisecond},
		transport.ServerConfig{HandshakeTimeout: time.Minute})
	app := client(t, gs.addr, TokenLogin(appToken))
	if resp, err := app.Call(context.Background(), codeWhoIs, nil); err != nil || string(resp.Body) != "app1" {
		t.Fatalf("the authenticated client: %q, %v", resp.Body, err)
	}
	appConn, err := app.Call(context.Background(), codeUnchecked, nil)
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	nc := dial(t, gs.addr)
	var cut error
	for i := 0; cut == nil; i++ {
		code := []protocol.Code{protocol.CodeIdentify, codeUnchecked, protocol.CodeAuth}[i%3]
		f, err := request(t, nc, code, "")
		switch {
		case err != nil:
			cut = err
		case code == codeUnchecked && (f.Status != protocol.StatusNotAuthorized || !strings.Contains(string(f.Body), "authenticate first")):
			t.Fatalf("a stranger's request: %v %q, want NOT_AUTHORIZED: authenticate first", f.Status, f.Body)
		case code == protocol.CodeIdentify && f.Status != protocol.StatusUnknownCode:
			t.Fatalf("a stranger's IDENTIFY: %v %q, want it past the gate (UNKNOWN_CODE here)", f.Status, f.Body)
		case code == protocol.CodeAuth && f.Status != protocol.StatusNotAuthorized:
			t.Fatalf("a stranger's AUTH without a token: %v %q, want NOT_AUTHORIZED", f.Status, f.Body)
		}
	}
	var ne net.Error
	if errors.As(cut, &ne) && ne.Timeout() {
		t.Fatal("the stranger was still connected after a minute")
	}
	if held := time.Since(start); held < 300*time.Millisecond {
		t.Fatalf("the stranger was cut after %v, before its AuthTimeout", held)
	}
	testwait.For(t, 5*time.Second, "the stranger counted cut and gone from the gate", func() bool {
		return gs.Stats().UntrustedTimeouts == 1 && gs.gate.Unauthenticated() == 0
	})
	if resp, err := app.Call(context.Background(), codeWhoIs, nil); err != nil || string(resp.Body) != "app1" {
		t.Fatalf("the authenticated client after the stranger was cut: %q, %v", resp.Body, err)
	}
	if resp, err := app.Call(context.Background(), codeUnchecked, nil); err != nil || string(resp.Body) != string(appConn.Body) {
		t.Fatalf("the authenticated client is now %q (%v), was %q: it dialed again", resp.Body, err, appConn.Body)
	}
}

// Strangers from one address hold at most their share of the
// connections that have not authenticated (here all of MaxUnauthConns):
// one more is answered BUSY saying so, and closed; one that authenticates
// leaves the count, so the next stranger gets in; an authenticated client
// is served throughout. A stranger that only idles is cut at
// RequestTimeout.
func TestGateCapsStrangers(t *testing.T) {
	gs := startGateServer(t, GateConfig{MaxUnauthConns: 2, RequestTimeout: 2 * time.Second},
		transport.ServerConfig{HandshakeTimeout: time.Minute})
	app := client(t, gs.addr, TokenLogin(appToken))
	whoIs := func(when string) {
		t.Helper()
		if resp, err := app.Call(context.Background(), codeWhoIs, nil); err != nil || string(resp.Body) != "app1" {
			t.Fatalf("the authenticated client %s: %q, %v", when, resp.Body, err)
		}
	}
	whoIs("first")
	var strangers []net.Conn
	for range 2 {
		nc := dial(t, gs.addr)
		if f, err := request(t, nc, protocol.CodeIdentify, ""); err != nil || f.Status != protocol.StatusUnknownCode {
			t.Fatalf("a stranger under the cap: %v %q %v", f.Status, f.Body, err)
		}
		strangers = append(strangers, nc)
	}
	if n := gs.gate.Unauthenticated(); n != 2 {
		t.Fatalf("%d unauthenticated connections counted, want the 2 strangers", n)
	}
	over := dial(t, gs.addr)
	f, err := request(t, over, protocol.CodeIdentify, "")
	if err != nil || f.Status != protocol.StatusBusy || !strings.Contains(string(f.Body), "2 connections from 127.0.0.1 that have not authenticated are open, its share") {
		t.Fatalf("a stranger over the cap: %v %q %v, want BUSY saying why", f.Status, f.Body, err)
	}
	whoIs("with the cap full")

	// One of them authenticates: it leaves the count, and the next stranger gets in.
	if f, err := request(t, strangers[0], protocol.CodeAuth, appToken); err != nil || f.Status != protocol.StatusOK {
		t.Fatalf("a stranger's AUTH: %v %q %v", f.Status, f.Body, err)
	}
	if n := gs.gate.Unauthenticated(); n != 1 {
		t.Fatalf("%d unauthenticated connections counted after one authenticated, want 1", n)
	}
	if f, err := request(t, dial(t, gs.addr), protocol.CodeIdentify, ""); err != nil || f.Status != protocol.StatusUnknownCode {
		t.Fatalf("a stranger once one left the count: %v %q %v", f.Status, f.Body, err)
	}
	testwait.For(t, 10*time.Second, "the idle strangers to be cut", func() bool {
		return gs.Stats().UntrustedTimeouts == 2 && gs.gate.Unauthenticated() == 0
	})
	if f, err := request(t, strangers[0], codeWhoIs, ""); err != nil || string(f.Body) != "app1" {
		t.Fatalf("the stranger that authenticated, after the others were cut: %v %q %v", f.Status, f.Body, err)
	}
	whoIs("last")
	if st := gs.Stats(); st.Refused != 1 {
		t.Fatalf("%d connections refused, want 1", st.Refused)
	}
}

// The limits and admission of a connection, at given times: a request
// within RequestTimeout, and authenticated within AuthTimeout of its
// acceptance; frames within MaxUnauthFrame and AUTH or IDENTIFY only,
// unless a TLS client certificate was verified. It counts until it
// authenticates or closes, once.
func TestGateAdmission(t *testing.T) {
	g := NewGate(GateConfig{MaxUnauthConns: 1, MaxUnauthFrame: 1000, RequestTimeout: time.Second, AuthTimeout: 3 * time.Second})
	t0 := time.Unix(1000, 0)
	a, err := g.Open(nil, t0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Open(nil, t0, nil); err == nil || g.Unauthenticated() != 1 {
		t.Fatalf("a second connection over a cap of 1: %v, %d counted", err, g.Unauthenticated())
	}
	verified := &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{{}}}}
	for _, c := range []struct {
		at       time.Duration
		st       *tls.ConnectionState
		deadline time.Duration
		maxFrame int
	}{
		{0, nil, time.Second, 1000},
		{2500 * time.Millisecond, nil, 3 * time.Second, 1000}, // AuthTimeout comes first
		{0, verified, time.Second, protocol.MaxFrameSize},
	} {
		d, m := a.Limits(t0.Add(c.at), c.st)
		if !d.Equal(t0.Add(c.deadline)) || m != c.maxFrame {
			t.Errorf("Limits at %v (certificate %v): %v, %d; want %v, %d", c.at, c.st != nil, d.Sub(t0), m, c.deadline, c.maxFrame)
		}
	}
	for _, code := range []protocol.Code{protocol.CodeAuth, protocol.CodeIdentify} {
		if err := a.Admit(protocol.Frame{Code: code}, nil); err != nil {
			t.Errorf("%v before authenticating: %v", code, err)
		}
	}
	if err := a.Admit(protocol.Frame{Code: protocol.CodeSend}, nil); !errors.Is(err, protocol.ErrNotAuthorized) {
		t.Errorf("SEND before authenticating: %v, want NOT_AUTHORIZED", err)
	}
	if err := a.Admit(protocol.Frame{Code: protocol.CodeSend}, verified); err != nil {
		t.Errorf("SEND with a verified certificate: %v, want it to its handler", err)
	}
	a.Trusted()
	a.Closed()
	a.Trusted()
	if n := g.Unauthenticated(); n != 0 {
		t.Fatalf("%d counted after the connection authenticated and closed", n)
	}
	b, err := g.Open(nil, t0, nil)
	if err != nil {
		t.Fatalf("a connection once the first left the count: %v", err)
	}
	b.Closed()
	if n := g.Unauthenticated(); n != 0 {
		t.Fatalf("%d counted after the connection closed", n)
	}
}

// TokenLogin presents its token with AUTH on every connection: a wrong one
// fails the call with the server's words, "" presents nothing, and a
// server without AUTH is used as it is.
func TestTokenLogin(t *testing.T) {
	gs := startGateServer(t, GateConfig{}, transport.ServerConfig{})
	_, err := client(t, gs.addr, TokenLogin("not-the-token-of-anyone-at-all-xyz")).Call(context.Background(), codeWhoIs, nil)
	want := "transport: AUTH to " + gs.addr + ": ferrymq: NOT_AUTHORIZED: token not recognised"
	if err == nil || err.Error() != want {
		t.Fatalf("a wrong token: %v, want %s", err, want)
	}
	_, err = client(t, gs.addr, TokenLogin("")).Call(context.Background(), codeWhoIs, nil)
	if !errors.Is(err, protocol.ErrNotAuthorized) || !strings.Contains(err.Error(), "authenticate first") {
		t.Fatalf("no token: %v, want NOT_AUTHORIZED: authenticate first", err)
	}
	if n := gs.logins.Load(); n != 1 {
		t.Fatalf("%d AUTH requests, want 1: no token presents nothing", n)
	}

	open := transport.NewServer(transport.ServerConfig{})
	open.Handle(codeWhoIs, func(r *transport.Request) { _ = r.Reply([]byte("anyone")) })
	addr, err := open.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = open.Close() })
	if resp, err := client(t, addr.String(), TokenLogin(appToken)).Call(context.Background(), codeWhoIs, nil); err != nil || string(resp.Body) != "anyone" {
		t.Fatalf("a token to a server without AUTH: %q, %v", resp.Body, err)
	}
}
