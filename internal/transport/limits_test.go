package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
)

// stranger dials addr and sends one request of code, unanswered yet.
func stranger(t *testing.T, addr string, code protocol.Code) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	strangerRequest(t, nc, code)
	return nc
}

func strangerRequest(t *testing.T, nc net.Conn, code protocol.Code) {
	t.Helper()
	b, err := protocol.AppendFrame(nil, &protocol.Frame{Code: code, Opaque: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
}

// closedByServer reports whether the server closed nc: its next read ends
// (a safety deadline, far beyond the server's, keeps a broken server from
// hanging the test).
func closedByServer(nc net.Conn) bool {
	_ = nc.SetReadDeadline(time.Now().Add(time.Minute))
	_, err := nc.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// With a gate like the servers', strangers that send IDENTIFY and then
// idle hold no connection for long and never more than the gate's cap at
// once; a client that authenticated is served throughout, and one that
// connects once they are gone authenticates and is served.
func TestStrangersCannotHoldConnections(t *testing.T) {
	const maxConns, maxUnauth, strangers = 5, 2, 8
	var logins atomic.Int64
	g := gateLike(500 * time.Millisecond)
	g.maxUntrusted = maxUnauth
	ts := authServerWith(t, ServerConfig{MaxConns: maxConns, HandshakeTimeout: 500 * time.Millisecond}, g, &logins)
	whoami := func(c *Client, when string) {
		t.Helper()
		if resp, err := c.Call(context.Background(), codeWhoAmI, nil); err != nil || string(resp.Body) != "alice" {
			t.Fatalf("%s: %q, %v", when, resp.Body, err)
		}
	}
	c := newClient(t, ts.addr, ClientConfig{Login: tokenLogin(goodToken)})
	whoami(c, "before the strangers")

	var admitted []net.Conn
	refused := 0
	for range strangers {
		nc := stranger(t, ts.addr, protocol.CodeIdentify)
		f, err := readFrame(nc, protocol.MaxFrameSize, readAtOnce)
		switch {
		case err == nil && f.Status == protocol.StatusBusy:
			refused++
		case err == nil:
			admitted = append(admitted, nc) // IDENTIFY answered (UNKNOWN_CODE here): it idles now
		default:
			t.Fatalf("stranger's IDENTIFY: %v", err)
		}
		if n := g.untrusted.Load(); n > maxUnauth {
			t.Fatalf("%d unauthenticated connections open, the cap is %d", n, maxUnauth)
		}
		whoami(c, "while strangers idle")
	}
	for i, nc := range admitted {
		if !closedByServer(nc) {
			t.Fatalf("stranger %d of %d admitted: its connection is still open after it idled past HandshakeTimeout", i, len(admitted))
		}
	}
	testwait.For(t, 10*time.Second, "the strangers' connections to be counted closed", func() bool {
		st := ts.Stats()
		return st.UntrustedTimeouts == int64(len(admitted)) && g.untrusted.Load() == 0 && st.Conns == 1
	})
	if st := ts.Stats(); st.Refused != int64(refused) || len(admitted)+refused != strangers {
		t.Fatalf("%d admitted, %d answered BUSY, stats %+v", len(admitted), refused, st)
	}
	whoami(c, "after the strangers")
	whoami(newClient(t, ts.addr, ClientConfig{Login: tokenLogin(goodToken)}), "a client connecting after the strangers")
}

// With a gate like the servers', a stranger that keeps sending requests
// without authenticating is closed all the same, at the gate's deadline
// for the whole connection (four handshakes after it connected).
func TestStrangerClosedWithoutAuthenticating(t *testing.T) {
	var logins atomic.Int64
	ts := authServerWith(t, ServerConfig{HandshakeTimeout: 100 * time.Millisecond}, gateLike(100*time.Millisecond), &logins)
	nc := stranger(t, ts.addr, protocol.CodeIdentify)
	giveUp := time.Now().Add(time.Minute) // a broken server must not hang the test
	_ = nc.SetReadDeadline(giveUp)
	for i := 0; ; i++ {
		_, err := readFrame(nc, protocol.MaxFrameSize, readAtOnce)
		var ne net.Error
		if (err == nil && time.Now().After(giveUp)) || errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("a stranger that sent %d requests without authenticating for a minute is still connected", i)
		}
		if err != nil {
			break
		}
		strangerRequest(t, nc, []protocol.Code{protocol.CodeIdentify, codeEcho}[i%2])
	}
	testwait.For(t, 10*time.Second, "the stranger to be counted closed", func() bool { return ts.Stats().UntrustedTimeouts == 1 })
}

// declareHuge has n strangers each send prelude requests (answered), then
// declare a frame of size bytes, send 100 bytes of it and hang up; it
// returns the bytes the process allocated meanwhile, measured once the
// server closed every one of them.
func declareHuge(t *testing.T, ts *testServer, n int, prelude []protocol.Code, size int) uint64 {
	t.Helper()
	conns0 := ts.Stats().Conns
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range n {
		nc, err := net.Dial("tcp", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		for _, code := range prelude {
			strangerRequest(t, nc, code)
			if _, err := readFrame(nc, protocol.MaxFrameSize, readAtOnce); err != nil {
				t.Fatal(err)
			}
		}
		part := make([]byte, 4+100)
		binary.BigEndian.PutUint32(part, uint32(size))
		if _, err := nc.Write(part); err != nil {
			t.Fatal(err)
		}
		_ = nc.(*net.TCPConn).CloseWrite()
		_, _ = io.Copy(io.Discard, nc) // until the server closes its side
		_ = nc.Close()
	}
	testwait.For(t, 10*time.Second, "the server to close the strangers", func() bool { return ts.Stats().Conns == conns0 })
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d strangers (prelude %v) declared %d bytes each: %d bytes allocated", n, prelude, size, alloc)
	return alloc
}

// Without authorization, a stranger is trusted after one request, but a
// frame it declares huge still costs the server about what it sent, not
// what it declared.
func TestHugeDeclaredFrameCostsWhatWasSent(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	const n = 20
	alloc := declareHuge(t, ts, n, []protocol.Code{codeEcho}, protocol.MaxFrameSize)
	if limit := uint64(n) << 20; alloc > limit {
		t.Fatalf("%d strangers that declared %d-byte frames and sent 100 bytes made the process allocate %d bytes (over %d)",
			n, protocol.MaxFrameSize, alloc, limit)
	}
}

// With a gate, a frame under the gate's cap from a connection that is not
// trusted costs the server about what was sent too.
func TestUnauthFrameCostsWhatWasSent(t *testing.T) {
	var logins atomic.Int64
	const unauthFrame = 1 << 20
	g := gateLike(5 * time.Second)
	g.frameCap = unauthFrame
	ts := authServerWith(t, ServerConfig{}, g, &logins)
	const n = 40
	for _, prelude := range [][]protocol.Code{nil, {protocol.CodeIdentify}} {
		alloc := declareHuge(t, ts, n, prelude, unauthFrame)
		if limit := uint64(n) * unauthFrame / 4; alloc > limit {
			t.Fatalf("prelude %v: %d strangers that declared %d-byte frames and sent 100 bytes made the process allocate %d bytes (over %d)",
				prelude, n, unauthFrame, alloc, limit)
		}
	}
}
