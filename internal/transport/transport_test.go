package transport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	codeEcho  protocol.Code = 1000
	codeHold  protocol.Code = 1001
	codeFail  protocol.Code = 1002
	codePanic protocol.Code = 1003
	codeCount protocol.Code = 1004
)

type testServer struct {
	*Server
	addr    string
	held    chan *Request
	counted atomic.Int64
}

// startServer starts a server with the test handlers; extra registers more
// before it listens.
func startServer(t *testing.T, cfg ServerConfig, extra ...func(*testServer)) *testServer {
	t.Helper()
	ts := &testServer{Server: NewServer(cfg), held: make(chan *Request, 1024)}
	for _, f := range extra {
		f(ts)
	}
	ts.Handle(codeEcho, func(r *Request) { _ = r.Reply(r.Body) })
	ts.Handle(codeHold, func(r *Request) { ts.held <- r })
	ts.Handle(codeFail, func(r *Request) { r.ReplyError(protocol.ErrorForStatus(protocol.StatusReadOnly, "group g1")) })
	ts.Handle(codePanic, func(r *Request) { panic("boom") })
	ts.Handle(codeCount, func(r *Request) { ts.counted.Add(1) })
	addr, err := ts.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts.addr = addr.String()
	t.Cleanup(func() { _ = ts.Close() })
	return ts
}

func newClient(t *testing.T, addr string, cfg ClientConfig) *Client {
	c := NewClient(addr, cfg)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestConcurrentCalls(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := newClient(t, ts.addr, ClientConfig{})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				body := bytes.Repeat([]byte{byte(g), byte(i)}, (g*i)%5000)
				resp, err := c.Call(context.Background(), codeEcho, body)
				if err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(resp.Body, body) {
					errs <- fmt.Errorf("goroutine %d call %d: response does not match its request", g, i)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestStatusErrorsAndUnknownCode(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := newClient(t, ts.addr, ClientConfig{})
	ctx := context.Background()

	_, err := c.Call(ctx, codeFail, nil)
	if !errors.Is(err, protocol.ErrReadOnly) || !protocol.IsRetriable(err) {
		t.Fatalf("got %v, want READ_ONLY", err)
	}
	// The status's name is said once, not once per hop.
	if got := err.Error(); got != "ferrymq: READ_ONLY: group g1" {
		t.Fatalf("error text %q, want %q", got, "ferrymq: READ_ONLY: group g1")
	}
	_, err = c.Call(ctx, 4242, []byte("x"))
	if !errors.Is(err, protocol.ErrUnknownCode) {
		t.Fatalf("got %v, want UNKNOWN_CODE", err)
	}
	_, err = c.Call(ctx, codePanic, nil)
	if !errors.Is(err, protocol.ErrInternal) {
		t.Fatalf("got %v, want INTERNAL after a handler panic", err)
	}
	// The connection still serves after all of those.
	if resp, err := c.Call(ctx, codeEcho, []byte("ok")); err != nil || string(resp.Body) != "ok" {
		t.Fatalf("echo after errors: %q, %v", resp.Body, err)
	}
}

func TestCallTimeout(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := newClient(t, ts.addr, ClientConfig{CallTimeout: 50 * time.Millisecond})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := c.Call(ctx, codeHold, nil); !errors.Is(err, protocol.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ctx deadline: got %v", err)
	}
	// No deadline on ctx: CallTimeout applies.
	if _, err := c.Call(context.Background(), codeHold, nil); !errors.Is(err, protocol.ErrTimeout) {
		t.Fatalf("default deadline: got %v", err)
	}
	// The late answers are dropped and the connection keeps working.
	for range 2 {
		r := <-ts.held
		_ = r.Reply([]byte("late"))
	}
	if resp, err := c.Call(context.Background(), codeEcho, []byte("on time")); err != nil || string(resp.Body) != "on time" {
		t.Fatalf("after timeouts: %q, %v", resp.Body, err)
	}
}

// A lost connection fails every pending call at once, and the next call dials
// a new connection.
func TestConnLostFailsPendingAndReconnects(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peerDone := make(chan error, 1)
	go func() {
		peerDone <- func() error {
			// First connection: read three requests, then drop it.
			nc, err := ln.Accept()
			if err != nil {
				return err
			}
			br := bufio.NewReader(nc)
			for range 3 {
				if _, err := readFrame(br, protocol.MaxFrameSize, readAtOnce); err != nil {
					return err
				}
			}
			nc.Close()
			// Second connection: answer one request.
			nc, err = ln.Accept()
			if err != nil {
				return err
			}
			defer nc.Close()
			f, err := readFrame(bufio.NewReader(nc), protocol.MaxFrameSize, readAtOnce)
			if err != nil {
				return err
			}
			out, _ := protocol.AppendFrame(nil, &protocol.Frame{Flags: protocol.FlagResponse, Code: f.Code, Opaque: f.Opaque, Body: []byte("again")})
			_, err = nc.Write(out)
			return err
		}()
	}()

	// A call that waited for its 10 s deadline would fail with TIMEOUT, not
	// ErrConnLost.
	c := newClient(t, ln.Addr().String(), ClientConfig{CallTimeout: 10 * time.Second})
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = c.Call(context.Background(), codeEcho, []byte("x"))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, ErrConnLost) {
			t.Fatalf("call %d: got %v, want ErrConnLost", i, err)
		}
	}
	resp, err := c.Call(context.Background(), codeEcho, []byte("x"))
	if err != nil || string(resp.Body) != "again" {
		t.Fatalf("call after reconnect: %q, %v", resp.Body, err)
	}
	if err := <-peerDone; err != nil {
		t.Fatal(err)
	}
}

func TestClientCloseFailsPending(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := NewClient(ts.addr, ClientConfig{})
	done := make(chan error, 1)
	go func() {
		_, err := c.Call(context.Background(), codeHold, nil)
		done <- err
	}()
	r := <-ts.held
	_ = c.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("pending call after Close: %v", err)
	}
	_ = r.Reply(nil)
	if _, err := c.Call(context.Background(), codeEcho, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("call after Close: %v", err)
	}
}

func TestOneway(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := newClient(t, ts.addr, ClientConfig{})
	for range 10 {
		if err := c.Send(context.Background(), codeCount, []byte("hb")); err != nil {
			t.Fatal(err)
		}
	}
	// A call after the oneways is answered after they were read; the
	// handlers may still be running, so wait for the count.
	if _, err := c.Call(context.Background(), codeEcho, nil); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "the 10 oneway requests to be handled", func() bool { return ts.counted.Load() == 10 })
	if n := ts.inflight.Load(); n != 0 {
		t.Fatalf("%d requests still counted in flight", n)
	}
}

// Close answers every request already read before closing the connections.
func TestServerCloseIsGraceful(t *testing.T) {
	s := NewServer(ServerConfig{})
	s.Handle(codeEcho, func(r *Request) {
		go func() { // answer later, from another goroutine
			time.Sleep(50 * time.Millisecond)
			_ = r.Reply(r.Body)
		}()
	})
	addr, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, addr.String(), ClientConfig{})
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Call(context.Background(), codeEcho, []byte("x"))
			errs <- err
		}()
	}
	testwait.For(t, 5*time.Second, "20 calls in flight", func() bool { return s.inflight.Load() >= 20 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a request read before Close was not answered: %v", err)
		}
	}
	if _, err := c.Call(context.Background(), codeEcho, nil); !errors.Is(err, ErrConnLost) {
		t.Fatalf("call to a closed server: %v", err)
	}
}

// A peer that sends something that is not a frame loses its connection;
// every other connection keeps being served.
func TestBadPeersAreDisconnected(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	good := newClient(t, ts.addr, ClientConfig{})

	valid, _ := protocol.AppendFrame(nil, &protocol.Frame{Code: codeEcho, Opaque: 1, Body: []byte("hello")})
	response, _ := protocol.AppendFrame(nil, &protocol.Frame{Flags: protocol.FlagResponse, Code: codeEcho, Opaque: 1})
	badMagic := bytes.Clone(valid)
	badMagic[4] = 0
	cases := map[string]struct {
		send      []byte
		closeSend bool // close our write side after sending
	}{
		"garbage":               {send: []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")},
		"length over the cap":   {send: []byte{0x7f, 0xff, 0xff, 0xff, 0xfe, 0x77}},
		"length under a header": {send: []byte{0, 0, 0, 2}},
		"bad magic":             {send: badMagic},
		"response to a server":  {send: response},
		"half a frame":          {send: valid[:len(valid)/2], closeSend: true},
		"closed mid-length":     {send: valid[:2], closeSend: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			nc, err := net.Dial("tcp", ts.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			if _, err := nc.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			if tc.closeSend {
				_ = nc.(*net.TCPConn).CloseWrite()
			}
			// The good client is served while the bad peer is handled.
			if resp, err := good.Call(context.Background(), codeEcho, []byte(name)); err != nil || string(resp.Body) != name {
				t.Fatalf("good client: %q, %v", resp.Body, err)
			}
			_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := io.Copy(io.Discard, nc)
			if err != nil {
				t.Fatalf("server did not close the bad connection: %v", err)
			}
			if n != 0 {
				t.Fatalf("server answered a bad frame with %d bytes", n)
			}
		})
	}
	testwait.For(t, 5*time.Second, "bad connections to be dropped", func() bool {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		return len(ts.conns) == 1
	})
}

func TestOversizedResponseBecomesError(t *testing.T) {
	s := NewServer(ServerConfig{})
	s.Handle(codeEcho, func(r *Request) { _ = r.Reply(make([]byte, protocol.MaxFrameSize)) })
	addr, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := newClient(t, addr.String(), ClientConfig{})
	if _, err := c.Call(context.Background(), codeEcho, nil); !errors.Is(err, protocol.ErrMessageTooLarge) {
		t.Fatalf("got %v, want MESSAGE_TOO_LARGE", err)
	}
	// A request over the cap fails on the client before it is sent.
	if _, err := c.Call(context.Background(), codeEcho, make([]byte, protocol.MaxFrameSize)); !errors.Is(err, protocol.ErrFrameTooLarge) {
		t.Fatalf("got %v, want ErrFrameTooLarge", err)
	}
}

// BenchmarkRoundTrip calls on one connection, with the handler registered
// with Handle (handler=unordered) or HandleOrdered (handler=ordered: the
// connection's requests run one at a time); a 4 MiB body, one at a time.
func BenchmarkRoundTrip(b *testing.B) {
	for _, ordered := range []bool{false, true} {
		for _, size := range []int{128, 64 << 10} {
			for _, inflight := range []int{1, 64} {
				benchmarkRoundTrip(b, ordered, size, inflight)
			}
		}
		// Over growAbove: read as its bytes arrive.
		benchmarkRoundTrip(b, ordered, 4<<20, 1)
	}
}

func benchmarkRoundTrip(b *testing.B, ordered bool, size, inflight int) {
	mode := "unordered"
	if ordered {
		mode = "ordered"
	}
	b.Run(fmt.Sprintf("handler=%s/body=%d/inflight=%d", mode, size, inflight), func(b *testing.B) {
		s := NewServer(ServerConfig{})
		echo := func(r *Request) { _ = r.Reply(r.Body[:8]) }
		if ordered {
			s.HandleOrdered(codeEcho, echo, nil)
		} else {
			s.Handle(codeEcho, echo)
		}
		addr, err := s.Listen("127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		c := NewClient(addr.String(), ClientConfig{})
		defer c.Close()
		body := make([]byte, size)
		var next atomic.Int64
		var wg sync.WaitGroup
		b.SetBytes(int64(size))
		b.ResetTimer()
		for range inflight {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(b.N) {
					if _, err := c.Call(context.Background(), codeEcho, body); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	})
}

// Bodies from the size an inline write sends from where they are (writev)
// arrive whole and in order, among small ones, from concurrent callers;
// and the caller's body is not kept once Call returns.
func TestLargeBodiesWrittenInPieces(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := newClient(t, ts.addr, ClientConfig{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := make([]byte, 0, 300<<10)
			for i := range 40 {
				n := []int{inlineCopyMax - 1, inlineCopyMax, inlineCopyMax + 1, 300 << 10, 10}[(g+i)%5]
				body = body[:n]
				for j := range body {
					body[j] = byte(g*31 + i + j)
				}
				want := bytes.Clone(body)
				resp, err := c.Call(context.Background(), codeEcho, body)
				if err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(resp.Body, want) {
					errs <- fmt.Errorf("goroutine %d call %d (%d bytes): the answer does not match the request", g, i, n)
					return
				}
				clear(body) // the next call reuses it, as the producer does
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
