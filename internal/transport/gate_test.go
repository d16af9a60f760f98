package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
)

// testGate is the tests' Gate: it lets in at most maxUntrusted untrusted
// connections at once, gives an untrusted connection perFrame for each
// frame and total since it was opened (0: no limit), caps its frames at
// frameCap (0: none), and lets through only the codes in pass, or any
// code from a verified TLS client certificate. It records what the server
// told it, and any breach of the Gate contract, which checkContract
// reports once the server is closed.
type testGate struct {
	maxUntrusted    int64
	perFrame, total time.Duration
	frameCap        int
	pass            []protocol.Code

	untrusted                               atomic.Int64
	opened, refused, trusted, closed, polls atomic.Int64

	mu         sync.Mutex
	breaches   []string
	admissions []*testAdmission // in the order opened
}

// admission returns the i-th connection's admission.
func (g *testGate) admission(i int) *testAdmission {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.admissions[i]
}

// gateLike is a testGate with the policy the servers' gate (package auth)
// has by default, its times in handshakes: the request and AUTH code pass.
func gateLike(handshake time.Duration) *testGate {
	return &testGate{maxUntrusted: 256, perFrame: handshake, total: 4 * handshake, frameCap: 64 << 10,
		pass: []protocol.Code{codeAuth, protocol.CodeIdentify}}
}

func (g *testGate) breach(format string, args ...any) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.breaches = append(g.breaches, fmt.Sprintf(format, args...))
}

var errGateFull = errors.New("the test gate is full")

func (g *testGate) Open(remote net.Addr, now time.Time, drop func(error)) (Admission, error) {
	if g.maxUntrusted > 0 && g.untrusted.Add(1) > g.maxUntrusted {
		g.untrusted.Add(-1)
		g.refused.Add(1)
		return nil, errGateFull
	} else if g.maxUntrusted <= 0 {
		g.untrusted.Add(1)
	}
	g.opened.Add(1)
	a := &testAdmission{g: g, opened: now, remote: remote.String(), drop: drop}
	a.held.Store(true)
	g.mu.Lock()
	g.admissions = append(g.admissions, a)
	g.mu.Unlock()
	return a, nil
}

// checkContract fails t if the server broke the Gate contract: every
// connection opened must have been closed once, trusted at most once, and
// never asked about once trusted.
func (g *testGate) checkContract(t *testing.T) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, b := range g.breaches {
		t.Error("gate contract: " + b)
	}
	if o, c := g.opened.Load(), g.closed.Load(); o != c {
		t.Errorf("gate contract: %d connections opened, %d closed, after the server closed", o, c)
	}
	if n := g.untrusted.Load(); n != 0 {
		t.Errorf("gate contract: %d connections still counted untrusted after the server closed", n)
	}
}

type testAdmission struct {
	g       *testGate
	opened  time.Time
	remote  string
	drop    func(error)
	held    atomic.Bool // counted in g.untrusted
	trusted atomic.Int32
	closed  atomic.Int32
	polls   atomic.Int32 // Limits and Admit calls
}

func (a *testAdmission) asked(what string) {
	a.polls.Add(1)
	a.g.polls.Add(1)
	if a.trusted.Load() > 0 {
		a.g.breach("%s asked about %s after Trusted", what, a.remote)
	}
}

func (a *testAdmission) Limits(now time.Time, st *tls.ConnectionState) (time.Time, int) {
	a.asked("Limits")
	var d time.Time
	if a.g.perFrame > 0 {
		d = now.Add(a.g.perFrame)
	}
	if end := a.opened.Add(a.g.total); a.g.total > 0 && (d.IsZero() || end.Before(d)) {
		d = end
	}
	if st != nil && len(st.VerifiedChains) > 0 {
		return d, 0
	}
	return d, a.g.frameCap
}

func (a *testAdmission) Admit(f protocol.Frame, st *tls.ConnectionState) error {
	a.asked("Admit")
	if slices.Contains(a.g.pass, f.Code) || (st != nil && len(st.VerifiedChains) > 0) {
		return nil
	}
	return &protocol.Error{Status: protocol.StatusNotAuthorized, Message: "authenticate first (the test gate)"}
}

func (a *testAdmission) Trusted() {
	if a.trusted.Add(1) > 1 {
		a.g.breach("Trusted twice for %s", a.remote)
	}
	a.g.trusted.Add(1)
	a.release()
}

func (a *testAdmission) Closed() {
	if a.closed.Add(1) > 1 {
		a.g.breach("Closed twice for %s", a.remote)
	}
	a.g.closed.Add(1)
	a.release()
}

func (a *testAdmission) release() {
	if a.held.CompareAndSwap(true, false) {
		a.g.untrusted.Add(-1)
	}
}

// gatedServer starts a server with g as its Gate (cfg.Gate is set) and the
// test handlers, codeAuth among them (it trusts its connection); the
// contract is checked once the server is closed.
func gatedServer(t *testing.T, cfg ServerConfig, g *testGate, extra ...func(*testServer)) *testServer {
	t.Helper()
	t.Cleanup(func() { g.checkContract(t) }) // after the server's Close, which is registered later
	cfg.Gate = g
	return startServer(t, cfg, append([]func(*testServer){func(ts *testServer) {
		ts.Handle(codeAuth, func(r *Request) {
			r.Authenticate()
			_ = r.Reply(nil)
		})
	}}, extra...)...)
}

// tokenLogin is the tests' Login: it presents a token with codeAuth, like
// auth.TokenLogin.
type tokenLogin string

func (l tokenLogin) Login(ctx context.Context, call func(context.Context, protocol.Code, []byte) (protocol.Frame, error)) error {
	_, err := call(ctx, codeAuth, []byte(l))
	return err
}

// A connection the gate refuses is answered BUSY with the gate's reason
// and closed, counted as refused; it is never opened at the gate, and a
// trusted connection is served throughout.
func TestGateRefusal(t *testing.T) {
	g := &testGate{maxUntrusted: 1, pass: []protocol.Code{codeAuth}}
	ts := gatedServer(t, ServerConfig{}, g)
	good := newClient(t, ts.addr, ClientConfig{Login: tokenLogin("")})
	if _, err := good.Call(context.Background(), codeEcho, []byte("in")); err != nil {
		t.Fatal(err)
	}
	idle := stranger(t, ts.addr, codeEcho) // untrusted, holding the gate's one place
	if f, err := readFrame(idle, protocol.MaxFrameSize, readAtOnce); err != nil || f.Status != protocol.StatusNotAuthorized {
		t.Fatalf("the idle stranger's request: %v %v, want NOT_AUTHORIZED from the gate", f.Status, err)
	}
	turnedAway := stranger(t, ts.addr, codeEcho)
	f, err := readFrame(turnedAway, protocol.MaxFrameSize, readAtOnce)
	if err != nil || f.Status != protocol.StatusBusy || !strings.Contains(string(f.Body), errGateFull.Error()) {
		t.Fatalf("a connection over the gate's cap: %v %q %v, want BUSY saying %q", f.Status, f.Body, err, errGateFull)
	}
	if !closedByServer(turnedAway) {
		t.Fatal("the refused connection is still open")
	}
	testwait.For(t, 5*time.Second, "the refusal counted", func() bool { return ts.Stats().Refused == 1 })
	if o, r := g.opened.Load(), g.refused.Load(); o != 2 || r != 1 {
		t.Fatalf("the gate opened %d and refused %d connections, want 2 and 1", o, r)
	}
	if _, err := good.Call(context.Background(), codeEcho, []byte("still")); err != nil {
		t.Fatalf("the trusted client after the refusal: %v", err)
	}
}

// Until it is trusted, a connection's requests are the gate's to admit:
// a refused one gets the gate's error and never reaches its handler (a
// oneway one is dropped); once a handler trusts the connection, the gate is
// told once and asked nothing more, and every request reaches its handler.
func TestGateAdmitsUntilTrusted(t *testing.T) {
	g := &testGate{pass: []protocol.Code{codeAuth}}
	ts := gatedServer(t, ServerConfig{}, g)
	c := newClient(t, ts.addr, ClientConfig{})
	_, err := c.Call(context.Background(), codeEcho, []byte("x"))
	if !errors.Is(err, protocol.ErrNotAuthorized) || !strings.Contains(err.Error(), "the test gate") {
		t.Fatalf("a request the gate does not admit: %v, want its error", err)
	}
	if err := c.Send(context.Background(), codeCount, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(context.Background(), codeAuth, nil); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "the gate to be told the connection is trusted", func() bool { return g.trusted.Load() == 1 })
	polls := g.polls.Load()
	for range 3 {
		if resp, err := c.Call(context.Background(), codeEcho, []byte("in")); err != nil || string(resp.Body) != "in" {
			t.Fatalf("once trusted: %q, %v", resp.Body, err)
		}
	}
	if err := c.Send(context.Background(), codeCount, nil); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "the oneway request once trusted to be handled", func() bool { return ts.counted.Load() >= 1 })
	if n := ts.counted.Load(); n != 1 {
		t.Fatalf("%d oneway requests handled; the one the gate refused must not be", n)
	}
	if p := g.polls.Load(); p != polls {
		t.Fatalf("the gate was asked %d more times about a trusted connection", p-polls)
	}
	if a := g.untrusted.Load(); a != 0 {
		t.Fatalf("%d connections counted untrusted, want 0 once the only one is trusted", a)
	}
}

// The deadline the gate sets closes a connection still untrusted when it
// passes (counted in UntrustedTimeouts, the gate told it closed); one that
// was trusted before it goes on being served.
func TestGateDeadlineCutsOnlyTheUntrusted(t *testing.T) {
	g := &testGate{perFrame: 200 * time.Millisecond, pass: []protocol.Code{codeAuth}}
	ts := gatedServer(t, ServerConfig{HandshakeTimeout: time.Minute}, g, func(ts *testServer) {
		ts.Handle(codeWho, func(r *Request) { _ = r.Reply([]byte(fmt.Sprint(r.Authenticated()))) })
	})
	trusted := newClient(t, ts.addr, ClientConfig{Login: tokenLogin("")})
	if resp, err := trusted.Call(context.Background(), codeWho, nil); err != nil || string(resp.Body) != "true" {
		t.Fatalf("the trusted connection: %q, %v", resp.Body, err)
	}
	idle := stranger(t, ts.addr, codeEcho)
	if _, err := readFrame(idle, protocol.MaxFrameSize, readAtOnce); err != nil {
		t.Fatal(err)
	}
	if !closedByServer(idle) {
		t.Fatal("the untrusted connection outlived its gate's deadline")
	}
	testwait.For(t, 5*time.Second, "the timeout counted and the gate told", func() bool {
		return ts.Stats().UntrustedTimeouts == 1 && g.closed.Load() == 1
	})
	// The trusted connection was opened first: its deadline, had it kept
	// one, has passed too. A new connection would be refused codeWho.
	if resp, err := trusted.Call(context.Background(), codeWho, nil); err != nil || string(resp.Body) != "true" {
		t.Fatalf("the trusted connection after the untrusted one was cut: %q, %v", resp.Body, err)
	}
	if o := g.opened.Load(); o != 2 {
		t.Fatalf("%d connections opened at the gate, want 2: the trusted client dialed again", o)
	}
}

// The gate's frame cap closes an untrusted connection that declares more
// (counted in Oversize); once trusted, a connection's frames are not capped.
func TestGateFrameCap(t *testing.T) {
	g := &testGate{frameCap: 4 << 10, pass: []protocol.Code{codeAuth, codeEcho}}
	ts := gatedServer(t, ServerConfig{}, g)
	big := make([]byte, 64<<10)
	c := newClient(t, ts.addr, ClientConfig{})
	if resp, err := c.Call(context.Background(), codeEcho, big[:1<<10]); err != nil || len(resp.Body) != 1<<10 {
		t.Fatalf("a request under the cap: %d bytes, %v", len(resp.Body), err)
	}
	if _, err := c.Call(context.Background(), codeEcho, big); !errors.Is(err, ErrConnLost) {
		t.Fatalf("a request over the cap before trust: %v, want the connection closed", err)
	}
	testwait.For(t, 5*time.Second, "the oversize frame counted", func() bool { return ts.Stats().Oversize == 1 })
	trusted := newClient(t, ts.addr, ClientConfig{Login: tokenLogin("")})
	if resp, err := trusted.Call(context.Background(), codeEcho, big); err != nil || len(resp.Body) != len(big) {
		t.Fatalf("a request over the cap once trusted: %d bytes, %v", len(resp.Body), err)
	}
}
