package transport

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
)

const codeOrdered protocol.Code = 1020 // body: u32 connection, u32 index

func orderedBody(conn, i int) []byte {
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, uint32(conn)), uint32(i))
}

func parseOrdered(body []byte) (conn, i int) {
	return int(binary.BigEndian.Uint32(body)), int(binary.BigEndian.Uint32(body[4:]))
}

// goid is the id of the calling goroutine, to tell workers apart.
func goid() string {
	b := make([]byte, 64)
	return strings.Fields(string(b[:runtime.Stack(b, false)]))[1]
}

// rawConn is a peer that writes frames itself and reads the answers.
type rawConn struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

// serve listens on a free loopback port and closes s when the test ends.
func serve(t *testing.T, s *Server) net.Addr {
	t.Helper()
	addr, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return addr
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return &rawConn{t: t, nc: nc, br: bufio.NewReader(nc)}
}

// send writes frames in one write: the server reads them pipelined.
func (rc *rawConn) send(frames ...protocol.Frame) {
	rc.t.Helper()
	writeFrames(rc.t, rc.nc, frames...)
}

// recv reads n responses.
func (rc *rawConn) recv(n int) []protocol.Frame {
	rc.t.Helper()
	_ = rc.nc.SetReadDeadline(time.Now().Add(20 * time.Second))
	out := make([]protocol.Frame, 0, n)
	for range n {
		f, err := readFrame(rc.br, protocol.MaxFrameSize, readAtOnce)
		if err != nil {
			rc.t.Fatalf("after %d of %d responses: %v", len(out), n, err)
		}
		out = append(out, f)
	}
	return out
}

// checkInOrder fails unless got is 0, 1, ..., n-1.
func checkInOrder(t *testing.T, what string, got []int, n int) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("%s: %d requests handled, want %d", what, len(got), n)
	}
	for i, v := range got {
		if v != i {
			t.Fatalf("%s: handler %d ran request %d (order %v)", what, i, v, got)
		}
	}
}

// Requests pipelined on a connection to an ordered code are handled in the
// order they were sent, while several connections do the same at once, the
// handlers yield, sleep, reply later from other goroutines or panic, and
// unordered requests are mixed in. The record of each connection is kept
// without a lock: the race detector checks that each handler happens after
// the previous one of its connection.
func TestOrderedRunsInArrivalOrder(t *testing.T) {
	const conns, n = 4, 400
	s := NewServer(ServerConfig{Workers: 8})
	var (
		order   [conns][]int
		workers [conns]map[string]bool
		handled atomic.Int64
	)
	for i := range workers {
		workers[i] = make(map[string]bool)
	}
	s.HandleOrdered(codeOrdered, func(r *Request) {
		c, i := parseOrdered(r.Body)
		order[c] = append(order[c], i)
		workers[c][goid()] = true
		handled.Add(1)
		switch {
		case i%97 == 50:
			panic("ordered handler panics") // answered INTERNAL; the next ones run
		case i%13 == 0:
			time.Sleep(200 * time.Microsecond)
		case i%3 == 0:
			runtime.Gosched()
		}
		if i%2 == 0 {
			_ = r.Reply(r.Body)
			return
		}
		body := r.Body
		go func() { _ = r.Reply(body) }() // answered after the handler returned
	}, nil)
	s.Handle(codeEcho, func(r *Request) { _ = r.Reply(r.Body) })
	addr := serve(t, s)

	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for c := range conns {
		rc := dialRaw(t, addr.String())
		var frames []protocol.Frame
		for i := range n {
			frames = append(frames, protocol.Frame{Code: codeOrdered, Opaque: uint32(len(frames) + 1), Body: orderedBody(c, i)})
			if i%10 == 0 {
				frames = append(frames, protocol.Frame{Code: codeEcho, Opaque: uint32(len(frames) + 1), Body: []byte("echo")})
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				rc.send(frames...)
				seen := make(map[uint32]bool)
				for _, f := range rc.recv(len(frames)) {
					want := frames[f.Opaque-1]
					panicked := false
					if want.Code == codeOrdered {
						_, i := parseOrdered(want.Body)
						panicked = i%97 == 50
					}
					switch {
					case seen[f.Opaque]:
						return fmt.Errorf("conn %d: opaque %d answered twice", c, f.Opaque)
					case panicked:
						if f.Status != protocol.StatusInternal {
							return fmt.Errorf("conn %d: opaque %d: status %v, want INTERNAL", c, f.Opaque, f.Status)
						}
					case f.Status != protocol.StatusOK || string(f.Body) != string(want.Body):
						return fmt.Errorf("conn %d: opaque %d: status %v body %q", c, f.Opaque, f.Status, f.Body)
					}
					seen[f.Opaque] = true
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 10*time.Second, "every ordered handler to run", func() bool { return handled.Load() == conns*n })
	for c := range conns {
		checkInOrder(t, fmt.Sprintf("conn %d", c), order[c], n)
		if len(workers[c]) < 2 {
			t.Errorf("conn %d: its ordered requests all ran on one worker; the test wants them on several", c)
		}
		t.Logf("conn %d: ordered requests ran on %d workers", c, len(workers[c]))
	}
}

// A connection whose ordered handler is held takes one worker: with two
// workers, another connection's ordered requests and the same connection's
// unordered ones are still served, and the held connection's next ordered
// requests start only once the held one returned.
func TestOrderedConnectionsProgressIndependently(t *testing.T) {
	const nA, nB = 20, 50
	s := NewServer(ServerConfig{Workers: 2})
	var (
		order    [2][]int
		started  [2]atomic.Int64
		holding  = make(chan struct{})
		release  = make(chan struct{})
		returned [2]atomic.Int64
	)
	s.HandleOrdered(codeOrdered, func(r *Request) {
		c, i := parseOrdered(r.Body)
		started[c].Add(1)
		order[c] = append(order[c], i)
		if c == 0 && i == 0 {
			close(holding)
			<-release
		}
		_ = r.Reply(r.Body)
		returned[c].Add(1)
	}, nil)
	s.Handle(codeEcho, func(r *Request) { _ = r.Reply(r.Body) })
	addr := serve(t, s)

	a, b := dialRaw(t, addr.String()), dialRaw(t, addr.String())
	var framesA []protocol.Frame
	for i := range nA {
		framesA = append(framesA, protocol.Frame{Code: codeOrdered, Opaque: uint32(i + 1), Body: orderedBody(0, i)})
	}
	a.send(framesA...)
	<-holding
	testwait.For(t, 5*time.Second, "connection A's requests to be read", func() bool { return s.inflight.Load() == nA })

	// B's ordered requests complete while A's handler is held.
	var framesB []protocol.Frame
	for i := range nB {
		framesB = append(framesB, protocol.Frame{Code: codeOrdered, Opaque: uint32(i + 1), Body: orderedBody(1, i)})
	}
	b.send(framesB...)
	for _, f := range b.recv(nB) {
		if f.Status != protocol.StatusOK {
			t.Fatalf("B: opaque %d: status %v", f.Opaque, f.Status)
		}
	}
	testwait.For(t, 5*time.Second, "B's handlers to return", func() bool { return returned[1].Load() == nB })
	checkInOrder(t, "B", order[1], nB)
	// An unordered request of A is not held behind A's ordered ones.
	a.send(protocol.Frame{Code: codeEcho, Opaque: 1000, Body: []byte("echo")})
	if f := a.recv(1)[0]; f.Opaque != 1000 || f.Status != protocol.StatusOK {
		t.Fatalf("A: first answer is opaque %d status %v, want the echo (1000)", f.Opaque, f.Status)
	}
	// The held handler has not returned, so A's next ordered request has not started.
	if n := started[0].Load(); n != 1 {
		t.Fatalf("%d of A's ordered requests started while the first was held", n)
	}

	close(release)
	for i, f := range a.recv(nA) {
		if f.Opaque != uint32(i+1) || f.Status != protocol.StatusOK {
			t.Fatalf("A: answer %d is opaque %d status %v", i, f.Opaque, f.Status)
		}
	}
	testwait.For(t, 5*time.Second, "A's handlers to return", func() bool { return returned[0].Load() == nA })
	checkInOrder(t, "A", order[0], nA)
}

// Close answers every ordered request already read, those queued behind a
// held one included: they run after Close closed the task queue.
func TestCloseAnswersQueuedOrderedRequests(t *testing.T) {
	const n = 30
	s := NewServer(ServerConfig{MaxInflightPerConn: 64})
	var (
		order   []int
		holding = make(chan struct{})
		release = make(chan struct{})
	)
	s.HandleOrdered(codeOrdered, func(r *Request) {
		_, i := parseOrdered(r.Body)
		order = append(order, i)
		if i == 0 {
			close(holding)
			<-release
		}
		_ = r.Reply(r.Body)
	}, nil)
	addr, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rc := dialRaw(t, addr.String())
	var frames []protocol.Frame
	for i := range n {
		frames = append(frames, protocol.Frame{Code: codeOrdered, Opaque: uint32(i + 1), Body: orderedBody(0, i)})
	}
	rc.send(frames...)
	<-holding
	testwait.For(t, 5*time.Second, "every request to be read", func() bool { return s.inflight.Load() == n })

	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	testwait.For(t, 5*time.Second, "Close to close the task queue", func() bool {
		s.tasksMu.RLock()
		defer s.tasksMu.RUnlock()
		return s.tasksClosed
	})
	close(release)
	for i, f := range rc.recv(n) {
		if f.Opaque != uint32(i+1) || f.Status != protocol.StatusOK {
			t.Fatalf("answer %d is opaque %d status %v %q", i, f.Opaque, f.Status, f.Body)
		}
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	checkInOrder(t, "after Close", order, n) // Close returned: the workers are done
}

// queuedOrdered is how many ordered requests of c wait behind the running one.
func (c *serverConn) queuedOrdered() int {
	c.omu.Lock()
	defer c.omu.Unlock()
	return len(c.oq) - c.oh
}

// Ordered requests queued on their connection were admitted like any other:
// the queue stops growing when MaxInflightPerConn is reached, or when the
// replies' reservations fill MaxWriteBuffer.
func TestOrderedQueueIsBounded(t *testing.T) {
	const n = 8
	cases := map[string]struct {
		cfg       ServerConfig
		replySize int
		admitted  int // requests read while the first is held
	}{
		"MaxInflightPerConn": {cfg: ServerConfig{MaxInflightPerConn: 4}, replySize: 16, admitted: 4},
		// 3 replies of 300 KiB fit in 1 MiB, a 4th does not.
		"MaxWriteBuffer": {cfg: ServerConfig{MaxWriteBuffer: 1 << 20}, replySize: 300 << 10, admitted: 3},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := NewServer(tc.cfg)
			var (
				order   []int
				holding = make(chan struct{})
				release = make(chan struct{})
			)
			// body: u32 reply size (for sizedReply), u32 index
			s.HandleOrdered(codeOrdered, func(r *Request) {
				i := int(binary.BigEndian.Uint32(r.Body[4:]))
				order = append(order, i)
				if i == 0 {
					close(holding)
					<-release
				}
				_ = r.Reply(make([]byte, sizedReply(r.Body)))
			}, sizedReply)
			addr, err := s.Listen("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			rc := dialRaw(t, addr.String())
			var frames []protocol.Frame
			for i := range n {
				frames = append(frames, protocol.Frame{Code: codeOrdered, Opaque: uint32(i + 1),
					Body: binary.BigEndian.AppendUint32(sizedBody(tc.replySize), uint32(i))})
			}
			rc.send(frames...)
			<-holding
			var c *serverConn
			testwait.For(t, 5*time.Second, "the connection to be registered", func() bool {
				c = s.connFrom(rc.nc.LocalAddr())
				return c != nil
			})
			testwait.For(t, 5*time.Second, fmt.Sprintf("%d requests to be read", tc.admitted), func() bool {
				return s.inflight.Load() == int64(tc.admitted) && c.queuedOrdered() == tc.admitted-1
			})
			if name == "MaxWriteBuffer" {
				testwait.For(t, 5*time.Second, "the reader to wait for room", c.waitingForRoom)
			}
			if got := s.inflight.Load(); got != int64(tc.admitted) {
				t.Fatalf("%d requests read, want %d", got, tc.admitted)
			}
			close(release)
			for i, f := range rc.recv(n) {
				if f.Opaque != uint32(i+1) || f.Status != protocol.StatusOK || len(f.Body) != tc.replySize {
					t.Fatalf("answer %d: opaque %d status %v, %d bytes", i, f.Opaque, f.Status, len(f.Body))
				}
			}
			testwait.For(t, 5*time.Second, "every request to be released", func() bool { return s.inflight.Load() == 0 })
			checkInOrder(t, name, order, n)
		})
	}
}
