package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
)

// DropConns closes the trusted connections whose identity its match
// names, and only them: a call in flight on one fails with the connection
// lost (its handler's later answer has nowhere to go); the others are
// served on, on the same connection.
func TestDropConnsByIdentity(t *testing.T) {
	ts := gatedServer(t, ServerConfig{}, gateLike(time.Minute), func(ts *testServer) {
		ts.Handle(codeAuth, func(r *Request) { // an identity per token
			r.SetPeer(string(r.Body))
			r.Authenticate()
			_ = r.Reply(nil)
		})
	})
	alice := newClient(t, ts.addr, ClientConfig{Login: tokenLogin("alice")})
	bob := newClient(t, ts.addr, ClientConfig{Login: tokenLogin("bob")})
	ctx := context.Background()
	if _, err := bob.Call(ctx, codeEcho, nil); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := alice.Call(ctx, codeHold, nil)
		done <- err
	}()
	held := <-ts.held
	stranger, err := net.Dial("tcp", ts.addr) // not trusted: never matched
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stranger.Close() }()

	if n := ts.DropConns(func(peer any) bool { return peer == "alice" || peer == nil }, errors.New("alice was revoked")); n != 1 {
		t.Fatalf("DropConns closed %d connections, want alice's", n)
	}
	if err := <-done; !errors.Is(err, ErrConnLost) {
		t.Fatalf("alice's call in flight: %v, want the connection lost", err)
	}
	testwait.For(t, 5*time.Second, "alice's connection gone", func() bool { return ts.Stats().Conns == 2 })
	if err := held.Reply(nil); err == nil {
		t.Fatal("the answer to alice's held request was taken after her connection was dropped")
	}
	if resp, err := bob.Call(ctx, codeEcho, []byte("still")); err != nil || string(resp.Body) != "still" {
		t.Fatalf("bob after alice was dropped: %q, %v", resp.Body, err)
	}
	if st := ts.Stats(); st.Dropped != 1 {
		t.Fatalf("%d dropped, want 1", st.Dropped)
	}
}

// A gate's drop closes a connection it has not trusted, whether it is
// still before its first frame or past it, without a word in the log's
// warnings (the gate says why) and without counting it as anything else.
func TestGateDrop(t *testing.T) {
	g := gateLike(time.Minute)
	ts := gatedServer(t, ServerConfig{HandshakeTimeout: time.Minute}, g)
	silent, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = silent.Close() }()
	testwait.For(t, 5*time.Second, "the silent connection opened at the gate", func() bool { return g.opened.Load() == 1 })
	talked, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = talked.Close() }()
	b, _ := protocol.AppendFrame(nil, &protocol.Frame{Code: protocol.CodeIdentify, Opaque: 1})
	if _, err := talked.Write(b); err != nil {
		t.Fatal(err)
	}
	var lenBuf [4]byte
	_ = talked.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(talked, lenBuf[:]); err != nil { // its first request answered: past open
		t.Fatal(err)
	}
	n, _ := protocol.FrameLength(lenBuf[:])
	if _, err := io.ReadFull(talked, make([]byte, n-4)); err != nil {
		t.Fatal(err)
	}
	for i, nc := range []net.Conn{silent, talked} {
		g.admission(i).drop(errors.New("dropped by the test gate"))
		_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := nc.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("connection %d after its gate dropped it: %v, want EOF", i, err)
		}
	}
	testwait.For(t, 5*time.Second, "both closed at the gate", func() bool { return g.closed.Load() == 2 })
	if st := ts.Stats(); st.Dropped != 2 || st.UntrustedTimeouts != 0 || st.HandshakeTimeouts != 0 || st.HandshakeFailures != 0 {
		t.Fatalf("stats after two drops: %+v", st)
	}
}
