package transport

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
)

const goodToken = "the-one-token-this-server-knows"

// authServer is a server whose gate is like the servers' (gateLike) and
// whose AUTH handler knows one token: it stores the peer's name in the
// connection's slot and trusts it; codeWhoAmI answers the slot.
func authServer(t *testing.T, logins *atomic.Int64) *testServer {
	return authServerWith(t, ServerConfig{}, gateLike(5*time.Second), logins)
}

// authServerWith is authServer with cfg and g.
func authServerWith(t *testing.T, cfg ServerConfig, g *testGate, logins *atomic.Int64) *testServer {
	// These handlers are registered after gatedServer's codeAuth: this one wins.
	return gatedServer(t, cfg, g, func(ts *testServer) {
		ts.Handle(protocol.CodeAuth, func(r *Request) {
			logins.Add(1)
			if string(r.Body) != goodToken {
				r.ReplyError(&protocol.Error{Status: protocol.StatusNotAuthorized, Message: "token not recognised"})
				return
			}
			r.SetPeer("alice")
			r.Authenticate()
			_ = r.Reply(nil)
		})
		ts.Handle(codeWhoAmI, func(r *Request) {
			name, _ := r.Peer().(string)
			_ = r.Reply([]byte(name))
		})
	})
}

const codeWhoAmI protocol.Code = 1022

// With a gate like the servers', a connection that has not authenticated
// gets nothing but NOT_AUTHORIZED "authenticate first" (a oneway request
// is dropped before its handler); IDENTIFY and AUTH go through.
func TestGateServesNothingBeforeAuth(t *testing.T) {
	var logins atomic.Int64
	ts := authServer(t, &logins)
	c := newClient(t, ts.addr, ClientConfig{})
	for _, code := range []protocol.Code{codeEcho, codeWhoAmI, codeFail, protocol.CodeSend, 4321} {
		_, err := c.Call(context.Background(), code, []byte("x"))
		if !errors.Is(err, protocol.ErrNotAuthorized) || !strings.Contains(err.Error(), "authenticate first") {
			t.Fatalf("%v before AUTH: %v, want NOT_AUTHORIZED: authenticate first", code, err)
		}
	}
	if err := c.Send(context.Background(), codeCount, nil); err != nil {
		t.Fatal(err)
	}
	// IDENTIFY is not refused (this server has no handler: UNKNOWN_CODE).
	if _, err := c.Call(context.Background(), protocol.CodeIdentify, nil); !errors.Is(err, protocol.ErrUnknownCode) {
		t.Fatalf("IDENTIFY before AUTH: %v, want it past the gate (UNKNOWN_CODE here)", err)
	}
	if _, err := c.Call(context.Background(), protocol.CodeAuth, []byte("wrong")); !errors.Is(err, protocol.ErrNotAuthorized) {
		t.Fatalf("AUTH with a wrong token: %v", err)
	}
	if _, err := c.Call(context.Background(), codeEcho, nil); !errors.Is(err, protocol.ErrNotAuthorized) {
		t.Fatalf("echo after a refused AUTH: %v, want still refused", err)
	}
	if _, err := c.Call(context.Background(), protocol.CodeAuth, []byte(goodToken)); err != nil {
		t.Fatal(err)
	}
	if resp, err := c.Call(context.Background(), codeWhoAmI, nil); err != nil || string(resp.Body) != "alice" {
		t.Fatalf("after AUTH: %q, %v; want the peer the AUTH handler stored", resp.Body, err)
	}
	if err := c.Send(context.Background(), codeCount, nil); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "the oneway request after AUTH to be handled", func() bool { return ts.counted.Load() >= 1 })
	if n := ts.counted.Load(); n != 1 {
		t.Fatalf("%d oneway requests handled; the one sent before AUTH must not be", n)
	}
}

// A client with a Login runs it on every connection before its first
// request; a token the server does not recognise fails the call with the
// server's words, and the client dials again (and logs in again) on its
// next call.
func TestClientToken(t *testing.T) {
	var logins atomic.Int64
	ts := authServer(t, &logins)
	c := newClient(t, ts.addr, ClientConfig{Login: tokenLogin(goodToken)})
	if resp, err := c.Call(context.Background(), codeWhoAmI, nil); err != nil || string(resp.Body) != "alice" {
		t.Fatalf("with the token: %q, %v", resp.Body, err)
	}
	if _, err := c.Call(context.Background(), codeEcho, []byte("again")); err != nil {
		t.Fatal(err)
	}
	if n := logins.Load(); n != 1 {
		t.Fatalf("%d AUTH requests for one connection", n)
	}

	bad := newClient(t, ts.addr, ClientConfig{Login: tokenLogin("not-the-token")})
	for i := range 2 {
		_, err := bad.Call(context.Background(), codeEcho, []byte("x"))
		want := "transport: AUTH to " + ts.addr + ": ferrymq: NOT_AUTHORIZED: token not recognised"
		if !errors.Is(err, protocol.ErrNotAuthorized) || err.Error() != want {
			t.Fatalf("call %d with a wrong token: %v\nwant %s", i, err, want)
		}
		if errors.Is(err, ErrConnLost) {
			t.Fatalf("a refused token is not a lost connection: %v", err)
		}
	}
	if n := logins.Load(); n != 3 {
		t.Fatalf("%d AUTH requests, want 3: the wrong token was presented again on the second call", n)
	}
}
