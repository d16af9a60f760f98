package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/internal/testlog"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
)

const codeSized protocol.Code = 1010 // body: u32 size of the wanted reply body

// sizedBody asks for a reply of n bytes.
func sizedBody(n int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(n)) }

// sizedReply is the exact reply size of a codeSized request: its estimator.
func sizedReply(body []byte) int {
	if len(body) < 4 {
		return DefaultReplySize
	}
	return int(binary.BigEndian.Uint32(body))
}

// connFrom is the server's connection whose peer is at remote, or nil.
func (s *Server) connFrom(remote net.Addr) *serverConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if c.raw.RemoteAddr().String() == remote.String() {
			return c
		}
	}
	return nil
}

// waitingForRoom tells whether c's reader waits in admit.
func (c *serverConn) waitingForRoom() bool {
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	return c.w.admitWaiting > 0
}

// writeRequests writes one request frame per body to nc, as a peer that
// never reads would.
func writeRequests(t *testing.T, nc net.Conn, code protocol.Code, bodies ...[]byte) {
	t.Helper()
	frames := make([]protocol.Frame, len(bodies))
	for i, b := range bodies {
		frames[i] = protocol.Frame{Code: code, Opaque: uint32(i + 1), Body: b}
	}
	writeFrames(t, nc, frames...)
}

// writeFrames writes frames to nc in one write: the server reads them
// pipelined.
func writeFrames(t *testing.T, nc net.Conn, frames ...protocol.Frame) {
	t.Helper()
	var out []byte
	for i := range frames {
		var err error
		if out, err = protocol.AppendFrame(out, &frames[i]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := nc.Write(out); err != nil {
		t.Fatal(err)
	}
}

// A peer that sends requests with large answers and never reads: the
// goroutine that answers (standing in for the commit log's writer) never
// waits, other connections keep being answered by it, and the stuck
// connection's reader stops admitting requests once their replies fill
// MaxWriteBuffer, whether the replies are copied into the connection's
// buffer (Reply) or handed to it (ReplyGiven).
func TestStuckPeerDoesNotBlockReplier(t *testing.T) {
	t.Run("copied", func(t *testing.T) { testStuckPeer(t, false) })
	t.Run("given", func(t *testing.T) { testStuckPeer(t, true) })
}

func testStuckPeer(t *testing.T, given bool) {
	const (
		maxBuf    = 1 << 20
		stuckBody = 256 << 10
		frame     = protocol.FixedHeaderSize + stuckBody
		sent      = 200 // 50 MiB of answers: far more than socket buffers hold
	)
	s := NewServer(ServerConfig{MaxWriteBuffer: maxBuf, WriteTimeout: time.Minute})
	work := make(chan *Request, 1024)
	var mu sync.Mutex
	handled := map[string]int{} // handler calls per peer
	answered := map[string]int{}
	s.HandleWithReply(codeSized, func(r *Request) {
		mu.Lock()
		handled[r.RemoteAddr().String()]++
		mu.Unlock()
		work <- r
	}, sizedReply)
	addr, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}

	// The replier: the one goroutine that answers every request, as the
	// commit log's writer does. It counts answers per peer.
	var slowest time.Duration
	replierDone := make(chan struct{})
	go func() {
		defer close(replierDone)
		for r := range work {
			start := time.Now()
			if body := make([]byte, sizedReply(r.Body)); given {
				_ = r.ReplyGiven(body, nil)
			} else {
				_ = r.Reply(body)
			}
			d := time.Since(start)
			mu.Lock()
			answered[r.RemoteAddr().String()]++
			slowest = max(slowest, d)
			mu.Unlock()
		}
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			_ = s.Close()
			close(work)
			<-replierDone
		}
	}
	defer stop()
	answeredBy := func(a net.Addr) int {
		mu.Lock()
		defer mu.Unlock()
		return answered[a.String()]
	}
	handledFor := func(a net.Addr) int {
		mu.Lock()
		defer mu.Unlock()
		return handled[a.String()]
	}

	stuck, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Close()
	bodies := make([][]byte, sent)
	for i := range bodies {
		bodies[i] = sizedBody(stuckBody)
	}
	writeRequests(t, stuck, codeSized, bodies...)

	var sc *serverConn
	testwait.For(t, 5*time.Second, "the stuck connection to be accepted", func() bool { sc = s.connFrom(stuck.LocalAddr()); return sc != nil })
	// Stuck: its reader waits for room with only the request it read taking
	// a slot (every request admitted was answered), and every Reply call of
	// the replier for that peer returned.
	stuckNow := func() bool {
		return sc.waitingForRoom() && len(sc.sem) == 1 && answeredBy(stuck.LocalAddr()) == handledFor(stuck.LocalAddr())
	}
	testwait.For(t, 5*time.Second, "the stuck connection's reader to stop admitting with every admitted request answered", stuckNow)
	admitted := answeredBy(stuck.LocalAddr())
	written := int(sc.w.written.Load())
	if admitted >= sent {
		t.Fatalf("all %d requests of a peer that reads nothing were admitted", sent)
	}
	// Every admission happened with the connection's queued plus reserved
	// reply bytes within maxBuf, and what left the buffer was written.
	if admitted*frame > written+maxBuf {
		t.Fatalf("admitted %d requests of %d reply bytes each with %d written: over MaxWriteBuffer %d", admitted, frame, written, maxBuf)
	}

	// Other connections are answered by the same replier meanwhile.
	var wg sync.WaitGroup
	errs := make(chan error, 4*20)
	for range 4 {
		c := newClient(t, addr.String(), ClientConfig{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := c.Call(ctx, codeSized, sizedBody(64<<10))
				cancel()
				if err == nil && len(resp.Body) != 64<<10 {
					err = errors.New("short reply")
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a healthy client while another peer is stuck: %v", err)
	}
	// The stuck connection is still there, its reader waiting, and the
	// bound still holds.
	if s.connFrom(stuck.LocalAddr()) == nil {
		t.Fatal("the stuck connection is gone: the test proves nothing")
	}
	testwait.For(t, 5*time.Second, "the stuck connection's reader to wait again", stuckNow)
	admitted, written = handledFor(stuck.LocalAddr()), int(sc.w.written.Load())
	if admitted >= sent || admitted*frame > written+maxBuf {
		t.Fatalf("admitted %d of %d requests of %d reply bytes each with %d written: over MaxWriteBuffer %d", admitted, sent, frame, written, maxBuf)
	}
	mu.Lock()
	t.Logf("stuck peer: %d of %d requests admitted, %d bytes written; slowest Reply %v", admitted, sent, written, slowest)
	mu.Unlock()

	// The peer leaves: its connection goes, and Close is prompt.
	_ = stuck.Close()
	testwait.For(t, 5*time.Second, "the stuck connection to go after its peer left", func() bool { return s.connFrom(stuck.LocalAddr()) == nil })
	stop()
}

// The reader admits a request only while its reply's reservation fits in
// MaxWriteBuffer, and always one when nothing is queued or reserved.
func TestAdmissionBoundedByReplyReservations(t *testing.T) {
	for _, tc := range []struct {
		name     string
		estimate int
		want     int // admitted before any answer
	}{
		{"three fit", 300, 3}, // 3 * (18+300) = 954 <= 1000 < 4 * 318
		{"one over the cap", 5000, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewServer(ServerConfig{MaxWriteBuffer: 1000})
			held := make(chan *Request, 64)
			s.HandleWithReply(codeHold, func(r *Request) { held <- r }, func([]byte) int { return tc.estimate })
			addr, err := s.Listen("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			c := newClient(t, addr.String(), ClientConfig{})
			const calls = 10
			errs := make(chan error, calls)
			for range calls {
				go func() {
					_, err := c.Call(context.Background(), codeHold, []byte("x"))
					errs <- err
				}()
			}
			var sc *serverConn
			testwait.For(t, 5*time.Second, "the connection", func() bool {
				s.mu.Lock()
				defer s.mu.Unlock()
				for c := range s.conns {
					sc = c
				}
				return sc != nil
			})
			for answered := 0; answered < calls; answered++ {
				// Either the reader waits for room, or every call left is admitted.
				want := min(tc.want, calls-answered)
				ok := testwait.Until(5*time.Second, func() bool {
					return len(held) == want && (sc.waitingForRoom() || calls-answered <= tc.want)
				})
				if !ok {
					sc.w.mu.Lock()
					used := fmt.Sprintf("buffered %d, writing %d, reserved %d", len(sc.w.buf), sc.w.writing, sc.w.reserved)
					sc.w.mu.Unlock()
					t.Fatalf("after %d answers: %d requests held, want %d; reader waiting for room: %v; %s",
						answered, len(held), want, sc.waitingForRoom(), used)
				}
				if n := s.inflight.Load(); n != int64(want) {
					t.Fatalf("%d requests admitted, want %d", n, want)
				}
				r := <-held
				if err := r.Reply([]byte("0123456789")); err != nil {
					t.Fatal(err)
				}
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// A peer that stops reading is disconnected after WriteTimeout with one
// warning naming it, and replies to its unanswered requests fail at once.
func TestPeerThatStopsReadingIsClosed(t *testing.T) {
	logs := testlog.NewCapture("rpc", hclog.Warn)
	s := NewServer(ServerConfig{MaxWriteBuffer: 256 << 10, WriteTimeout: 100 * time.Millisecond, Logger: logs})
	held := make(chan *Request, 1)
	s.Handle(codeHold, func(r *Request) { held <- r })
	s.HandleWithReply(codeSized, func(r *Request) { _ = r.Reply(make([]byte, sizedReply(r.Body))) }, sizedReply)
	addr, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	stuck, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Close()
	writeRequests(t, stuck, codeHold, nil)
	var r *Request
	select {
	case r = <-held:
	case <-time.After(5 * time.Second):
		t.Fatal("the held request never reached its handler")
	}
	bodies := make([][]byte, 200)
	for i := range bodies {
		bodies[i] = sizedBody(128 << 10)
	}
	writeRequests(t, stuck, codeSized, bodies...)

	const said = "did not read for"
	testwait.For(t, 10*time.Second, "a warning about a peer that stopped reading", func() bool { return len(logs.Lines(said)) > 0 })
	// The handler's late answer fails (and returns: it never waits).
	if err := r.Reply([]byte("late")); !errors.Is(err, ErrWriteTimeout) {
		t.Fatalf("reply to a connection closed for not reading: %v", err)
	}
	testwait.For(t, 5*time.Second, "the connection and its requests to go", func() bool { return s.connFrom(stuck.LocalAddr()) == nil && s.inflight.Load() == 0 })
	lines := logs.Lines(said)
	if len(lines) != 1 || !strings.Contains(lines[0], stuck.LocalAddr().String()) ||
		!strings.Contains(lines[0], "[WARN]") || !strings.Contains(lines[0], "100ms") {
		t.Fatalf("want one warning naming %s and the timeout, got %q", stuck.LocalAddr(), lines)
	}
	if all := logs.Lines("["); len(all) != 1 {
		t.Fatalf("want that one log line only, got %q", all)
	}
	// The peer sees its connection closed (after the answers already sent).
	_ = stuck.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, stuck); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the server did not close the connection")
	}
	// Others are still served.
	c := newClient(t, addr.String(), ClientConfig{})
	if resp, err := c.Call(context.Background(), codeSized, sizedBody(10)); err != nil || len(resp.Body) != 10 {
		t.Fatalf("a new client after the stuck one: %v", err)
	}
}

// A server that stops reading fails the client's connection after
// WriteTimeout: every call returns ErrConnLost (none waits for CallTimeout),
// and the next call dials again.
func TestClientWriteTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- nc // held open, never read
		}
	}()
	defer func() {
		_ = ln.Close()
		for nc := range accepted {
			_ = nc.Close()
		}
	}()
	c := newClient(t, ln.Addr().String(), ClientConfig{WriteTimeout: 100 * time.Millisecond, CallTimeout: time.Minute})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// 8 MiB: more than socket buffers take from a peer that never reads
			_, err := c.Call(context.Background(), codeEcho, make([]byte, 8<<20))
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, ErrConnLost) || !errors.Is(err, ErrWriteTimeout) {
			t.Fatalf("call to a server that does not read: %v", err)
		}
	}
}

// Replies go to the buffer whatever its size: nothing waits for the peer.
func TestPutNeverWaits(t *testing.T) {
	w := newWriter(1024, time.Second) // no writer goroutine: nothing is ever written
	body := make([]byte, 16<<10)
	for i := range 32 {
		if err := w.put(&protocol.Frame{Flags: protocol.FlagResponse, Opaque: uint32(i), Body: body}, 0, nil); err != nil {
			t.Fatal(err)
		}
	}
	// A client's enqueue, by contrast, waits for room, up to its context.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := w.enqueue(ctx, time.Time{}, &protocol.Frame{Body: body}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("enqueue on a full buffer: %v", err)
	}
	// Admission, too, waits, until the writer closes.
	var admitted atomic.Bool
	done := make(chan error)
	go func() {
		err := w.admit(10, nil)
		admitted.Store(err == nil)
		done <- err
	}()
	testwait.For(t, 5*time.Second, "admit to wait", func() bool { w.mu.Lock(); defer w.mu.Unlock(); return w.admitWaiting == 1 })
	w.close(ErrConnLost)
	if err := <-done; !errors.Is(err, ErrConnLost) || admitted.Load() {
		t.Fatalf("admit on a closed writer: %v", err)
	}
}
