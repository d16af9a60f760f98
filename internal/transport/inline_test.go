package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
)

// onReader tells whether the caller runs on a connection's read goroutine.
func onReader() bool {
	b := make([]byte, 8<<10)
	return strings.Contains(string(b[:runtime.Stack(b, false)]), "(*serverConn).readLoop")
}

// A lone request of a HandleOrderedInline code runs on its connection's
// reader; requests pipelined behind it go to the workers; on every
// connection, all run in arrival order, mixed with unordered requests and
// answers made after the handler returned.
func TestOrderedInlineRunsInArrivalOrder(t *testing.T) {
	const conns, n = 3, 300
	s := NewServer(ServerConfig{Workers: 4})
	var (
		mu      sync.Mutex
		order   [conns][]int
		inline  [conns]int
		handled int
	)
	s.HandleOrderedInline(codeOrdered, func(r *Request) {
		c, i := parseOrdered(r.Body)
		mu.Lock()
		order[c] = append(order[c], i)
		if onReader() {
			inline[c]++
		}
		handled++
		mu.Unlock()
		if i%5 == 0 {
			body := r.Body
			go func() { _ = r.Reply(body) }() // answered after the handler returned
			return
		}
		_ = r.Reply(r.Body)
	}, nil)
	s.Handle(codeEcho, func(r *Request) {
		if onReader() {
			t.Error("an unordered request ran on the reader")
		}
		_ = r.Reply(r.Body)
	})
	addr := serve(t, s)

	var wg sync.WaitGroup
	for c := range conns {
		rc := dialRaw(t, addr.String())
		wg.Add(1)
		go func() {
			defer wg.Done()
			opaque := uint32(0)
			for i := 0; i < n; {
				// Alternately one request alone (answered before the next
				// is sent) and a pipelined burst with an unordered one in it.
				burst := 1
				if (i/7)%2 == 1 {
					burst = min(1+i%9, n-i)
				}
				var frames []protocol.Frame
				for j := range burst {
					opaque++
					frames = append(frames, protocol.Frame{Code: codeOrdered, Opaque: opaque, Body: orderedBody(c, i+j)})
					if burst > 3 && j == 1 {
						opaque++
						frames = append(frames, protocol.Frame{Code: codeEcho, Opaque: opaque, Body: []byte("echo")})
					}
				}
				rc.send(frames...)
				got := map[uint32]bool{}
				for _, f := range rc.recv(len(frames)) {
					if f.Status != protocol.StatusOK || got[f.Opaque] {
						t.Errorf("conn %d: opaque %d: status %v (seen %v)", c, f.Opaque, f.Status, got[f.Opaque])
					}
					got[f.Opaque] = true
				}
				i += burst
			}
		}()
	}
	wg.Wait()
	testwait.For(t, 10*time.Second, "every handler to run", func() bool { mu.Lock(); defer mu.Unlock(); return handled == conns*n })
	mu.Lock()
	defer mu.Unlock()
	for c := range conns {
		checkInOrder(t, fmt.Sprintf("conn %d", c), order[c], n)
		// Every lone request ran on the reader: at least half of them.
		if inline[c] < n/4 {
			t.Errorf("conn %d: %d of %d ordered requests ran on the reader; the lone ones (about half) should", c, inline[c], n)
		}
		t.Logf("conn %d: %d of %d ordered requests ran on the reader", c, inline[c], n)
	}
}

// A reply that the socket cannot take whole when a worker flushes it is
// finished by the writer goroutine before any other byte: a peer that reads
// nothing until it has sent every request then reads every answer whole.
// (One worker: each reply is flushed by it alone, the writer goroutine idle,
// until the socket fills in the middle of one.)
func TestFlushRestKeepsFramesWhole(t *testing.T) {
	const n, size = 400, 60 << 10
	s := NewServer(ServerConfig{Workers: 1})
	s.HandleWithReply(codeSized, func(r *Request) {
		body := bytes.Repeat(r.Body[:4], size/4)
		_ = r.Reply(body)
	}, func([]byte) int { return size })
	rc, sc := sendUnread(t, s, n)
	seen := map[uint32]bool{}
	for _, f := range rc.recv(n) {
		want := bytes.Repeat(binary.BigEndian.AppendUint32(nil, f.Opaque), size/4)
		if f.Status != protocol.StatusOK || seen[f.Opaque] || !bytes.Equal(f.Body, want) {
			t.Fatalf("opaque %d: status %v, %d bytes, seen %v", f.Opaque, f.Status, len(f.Body), seen[f.Opaque])
		}
		seen[f.Opaque] = true
	}
	t.Logf("%d flush rests written by the writer goroutine", sc.w.rests.Load())
}

// sendUnread serves s, sends it n codeSized requests numbered 1 to n from
// a peer that reads nothing yet, and returns once a worker's flush left a
// rest to the writer goroutine (the socket filled in the middle of a
// reply).
func sendUnread(t *testing.T, s *Server, n int) (*rawConn, *serverConn) {
	t.Helper()
	addr := serve(t, s)
	rc := dialRaw(t, addr.String())
	var frames []protocol.Frame
	for i := range n {
		frames = append(frames, protocol.Frame{Code: codeSized, Opaque: uint32(i + 1), Body: binary.BigEndian.AppendUint32(nil, uint32(i+1))})
	}
	rc.send(frames...)
	var sc *serverConn
	testwait.For(t, 10*time.Second, "a flush to leave a rest to the writer", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for c := range s.conns {
			sc = c
		}
		return sc != nil && sc.w.rests.Load() > 0
	})
	return rc, sc
}

// A client calling a HandleOrderedInline code one call at a time gets its
// answers, and closing the server while calls run answers or fails each.
func TestOrderedInlineClientCalls(t *testing.T) {
	s := NewServer(ServerConfig{})
	s.HandleOrderedInline(codeOrdered, func(r *Request) { _ = r.Reply(r.Body) }, nil)
	addr := serve(t, s)
	c := NewClient(addr.String(), ClientConfig{})
	defer c.Close()
	for i := range 200 {
		body := orderedBody(0, i)
		f, err := c.Call(context.Background(), codeOrdered, body)
		if err != nil || !bytes.Equal(f.Body, body) {
			t.Fatalf("call %d: %v %q", i, err, f.Body)
		}
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				body := orderedBody(g, i)
				f, err := c.Call(context.Background(), codeOrdered, body)
				if err != nil {
					return // the server closed
				}
				if !bytes.Equal(f.Body, body) {
					t.Errorf("goroutine %d call %d: answer %q", g, i, f.Body)
					return
				}
			}
		}()
	}
	testwait.For(t, 10*time.Second, "calls to run", func() bool { return s.inflight.Load() > 0 })
	_ = s.Close()
	wg.Wait()
}
