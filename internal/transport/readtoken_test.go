package transport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
)

// fakeServer is a server the test drives frame by frame: it accepts one
// connection at a time and hands the test its requests.
type fakeServer struct {
	t     *testing.T
	ln    net.Listener
	conns chan *fakeConn
	last  *fakeConn // the connection a test accepted last (its own use)
}

type fakeConn struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

func startFake(t *testing.T) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := &fakeServer{t: t, ln: ln, conns: make(chan *fakeConn, 4)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			fs.conns <- &fakeConn{t: t, nc: nc, br: bufio.NewReader(nc)}
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		for {
			select {
			case fc := <-fs.conns:
				_ = fc.nc.Close()
			default:
				return
			}
		}
	})
	return fs
}

func (fs *fakeServer) accept() *fakeConn {
	fs.t.Helper()
	select {
	case fc := <-fs.conns:
		fs.t.Cleanup(func() { _ = fc.nc.Close() })
		return fc
	case <-time.After(10 * time.Second):
		fs.t.Fatal("no connection came")
		return nil
	}
}

// request reads the next request.
func (fc *fakeConn) request() protocol.Frame {
	fc.t.Helper()
	_ = fc.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, err := readFrame(fc.br, protocol.MaxFrameSize, readAtOnce)
	if err != nil {
		fc.t.Fatalf("reading a request: %v", err)
	}
	return f
}

// answer encodes the answer to req with body.
func answerTo(req protocol.Frame, body []byte) []byte {
	b, err := protocol.AppendFrame(nil, &protocol.Frame{Flags: protocol.FlagResponse, Code: req.Code, Opaque: req.Opaque, Body: body})
	if err != nil {
		panic(err)
	}
	return b
}

func (fc *fakeConn) write(b []byte) {
	fc.t.Helper()
	if _, err := fc.nc.Write(b); err != nil {
		fc.t.Fatalf("writing: %v", err)
	}
}

// call runs c.Call in a goroutine; its outcome comes on the channel.
func callAsync(c *Client, ctx context.Context, body string) chan result {
	out := make(chan result, 1)
	go func() {
		f, err := c.Call(ctx, codeEcho, []byte(body))
		out <- result{frame: f, err: err}
	}()
	return out
}

// waitCallerHolds waits until a call of c's holds its connection's read
// token.
func waitCallerHolds(t *testing.T, c *Client) {
	t.Helper()
	testwait.For(t, 10*time.Second, "the call to hold the read token", func() bool {
		cc := conn(c)
		if cc == nil {
			return false
		}
		cc.mu.Lock()
		defer cc.mu.Unlock()
		return cc.holder == tokenCaller
	})
}

func conn(c *Client) *clientConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn
}

// waitNoIdleWatch sets idleWatch to an hour for the test: whatever it
// shows happens without the reader goroutine's idle timer.
func waitNoIdleWatch(t *testing.T) {
	old := idleWatch
	idleWatch = time.Hour
	t.Cleanup(func() { idleWatch = old })
}

func TestLoneCallReadsItsOwnAnswer(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := newClient(t, ts.addr, ClientConfig{})
	for i := range 100 {
		body := []byte{byte(i)}
		f, err := c.Call(context.Background(), codeEcho, body)
		if err != nil || !bytes.Equal(f.Body, body) {
			t.Fatalf("call %d: %v %q", i, err, f.Body)
		}
	}
	// The reader goroutine may hold the token for the first call (and after
	// a pause of idleWatch, which a loaded machine may make): most calls
	// read their own answers.
	if n := conn(c).ownReads.Load(); n < 50 {
		t.Fatalf("%d of 100 one-at-a-time calls read their own answers, want most", n)
	}
}

// A call that reads its own answer and gives up while the answer is half
// arrived leaves the stream whole: the answer is dropped and the next call
// gets its own.
func TestReadTokenHolderCancelledMidFrame(t *testing.T) {
	fs := startFake(t)
	c := newClient(t, fs.ln.Addr().String(), ClientConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	first := callAsync(c, ctx, "first")
	fc := fs.accept()
	req := fc.request()
	waitCallerHolds(t, c)
	late := answerTo(req, bytes.Repeat([]byte("x"), 1000))
	fc.write(late[:500])
	cancel()
	if r := <-first; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled call: %v, want context.Canceled", r.err)
	}
	second := callAsync(c, context.Background(), "second")
	req2 := fc.request()
	fc.write(late[500:])
	fc.write(answerTo(req2, []byte("second answer")))
	r := <-second
	if r.err != nil || string(r.frame.Body) != "second answer" {
		t.Fatalf("call after a cancelled one: %v %q", r.err, r.frame.Body)
	}
}

// The holder hands the answers it reads to their calls, and when its own
// deadline passes, the reader goroutine reads for the calls still pending.
func TestReadTokenHolderHandsOthersTheirAnswers(t *testing.T) {
	waitNoIdleWatch(t) // the holder wakes the reader goroutine when it gives up
	fs := startFake(t)
	c := newClient(t, fs.ln.Addr().String(), ClientConfig{})
	short, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	holder := callAsync(c, short, "holder")
	fc := fs.accept()
	reqH := fc.request()
	waitCallerHolds(t, c)
	a := callAsync(c, context.Background(), "a")
	b := callAsync(c, context.Background(), "b")
	reqs := map[string]protocol.Frame{}
	for range 2 {
		r := fc.request()
		reqs[string(r.Body)] = r
	}
	// a's answer first: the holder reads it and hands it over.
	fc.write(answerTo(reqs["a"], []byte("A")))
	if r := <-a; r.err != nil || string(r.frame.Body) != "A" {
		t.Fatalf("a: %v %q", r.err, r.frame.Body)
	}
	// The holder gives up; b's answer is read by the reader goroutine.
	cancel()
	if r := <-holder; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("holder: %v, want context.Canceled", r.err)
	}
	fc.write(answerTo(reqs["b"], []byte("B")))
	if r := <-b; r.err != nil || string(r.frame.Body) != "B" {
		t.Fatalf("b: %v %q", r.err, r.frame.Body)
	}
	// The holder's answer, late, is dropped; the connection still works.
	fc.write(answerTo(reqH, []byte("late")))
	next := callAsync(c, context.Background(), "next")
	req := fc.request()
	fc.write(answerTo(req, []byte("N")))
	if r := <-next; r.err != nil || string(r.frame.Body) != "N" {
		t.Fatalf("next: %v %q", r.err, r.frame.Body)
	}
}

func TestReadTokenHolderDeadline(t *testing.T) {
	fs := startFake(t)
	c := newClient(t, fs.ln.Addr().String(), ClientConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	r := callAsync(c, ctx, "x")
	fc := fs.accept()
	fc.request()
	got := <-r
	if !errors.Is(got.err, protocol.ErrTimeout) || !errors.Is(got.err, context.DeadlineExceeded) {
		t.Fatalf("call past its deadline: %v, want ErrTimeout and DeadlineExceeded", got.err)
	}
}

// An answer larger than the read buffer, to a lone call, is read by the
// reader goroutine.
func TestLoneCallLargeAnswer(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := newClient(t, ts.addr, ClientConfig{})
	for _, n := range []int{10, readBufSize - 100, readBufSize, 3 * readBufSize, 10} {
		body := bytes.Repeat([]byte{byte(n)}, n)
		f, err := c.Call(context.Background(), codeEcho, body)
		if err != nil || !bytes.Equal(f.Body, body) {
			t.Fatalf("%d bytes: %v, got %d bytes", n, err, len(f.Body))
		}
	}
}

// The holder learns at once of a connection that breaks under it.
func TestReadTokenHolderConnLost(t *testing.T) {
	fs := startFake(t)
	c := newClient(t, fs.ln.Addr().String(), ClientConfig{})
	r := callAsync(c, context.Background(), "x")
	fc := fs.accept()
	fc.request()
	waitCallerHolds(t, c)
	_ = fc.nc.Close()
	if got := <-r; !errors.Is(got.err, ErrConnLost) {
		t.Fatalf("call on a connection the server closed: %v, want ErrConnLost", got.err)
	}
}

// A connection the server closes while nothing is pending is noticed
// without a call: the reader goroutine watches an idle socket.
func TestIdleConnectionLossNoticed(t *testing.T) {
	fs := startFake(t)
	c := newClient(t, fs.ln.Addr().String(), ClientConfig{})
	r := callAsync(c, context.Background(), "x")
	fc := fs.accept()
	fc.write(answerTo(fc.request(), []byte("ok")))
	if got := <-r; got.err != nil {
		t.Fatal(got.err)
	}
	_ = fc.nc.Close()
	testwait.For(t, 10*time.Second, "the client to drop the closed connection", func() bool { return conn(c) == nil })
}

// A Handle gives a call up, whether the call reads its own answer or
// waits for another to read it; the connection stays usable.
func TestHandleGivesUpACall(t *testing.T) {
	fs := startFake(t)
	c := newClient(t, fs.ln.Addr().String(), ClientConfig{})
	cause := errors.New("the route moved")
	var holderH, waiterH Handle
	untilAsync := func(h *Handle, body string) chan result {
		out := make(chan result, 1)
		go func() {
			f, err := c.CallUntil(time.Now().Add(time.Hour), h, codeEcho, []byte(body))
			out <- result{frame: f, err: err}
		}()
		return out
	}
	holder := untilAsync(&holderH, "holder")
	fc := fs.accept()
	fc.request()
	waitCallerHolds(t, c)
	waiter := untilAsync(&waiterH, "waiter")
	fc.request()
	waiterH.GiveUp(cause)
	if r := <-waiter; !errors.Is(r.err, cause) || !errors.Is(r.err, errGivenUp) {
		t.Fatalf("waiting call given up: %v, want its cause", r.err)
	}
	holderH.GiveUp(cause)
	if r := <-holder; !errors.Is(r.err, cause) {
		t.Fatalf("reading call given up: %v, want its cause", r.err)
	}
	if holderH.Cause() != cause {
		t.Fatalf("Cause() = %v", holderH.Cause())
	}
	next := callAsync(c, context.Background(), "next")
	req := fc.request()
	fc.write(answerTo(req, []byte("N")))
	if r := <-next; r.err != nil || string(r.frame.Body) != "N" {
		t.Fatalf("next: %v %q", r.err, r.frame.Body)
	}
	// Given up before it started: it does not go.
	var early Handle
	early.GiveUp(cause)
	if _, err := c.CallUntil(time.Now().Add(time.Hour), &early, codeEcho, nil); !errors.Is(err, cause) {
		t.Fatalf("call given up before it began: %v", err)
	}
}

func TestCallUntilDeadline(t *testing.T) {
	fs := startFake(t)
	c := newClient(t, fs.ln.Addr().String(), ClientConfig{})
	r := make(chan error, 1)
	go func() {
		_, err := c.CallUntil(time.Now().Add(50*time.Millisecond), nil, codeEcho, nil)
		r <- err
	}()
	fc := fs.accept()
	fc.request()
	if err := <-r; !errors.Is(err, protocol.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("CallUntil past its deadline: %v, want ErrTimeout and DeadlineExceeded", err)
	}
}

// A PooledAnswers connection's answers, large as HA fetches' or small, are
// read by the reader goroutine at once: no call waits for its idle timer.
func TestPooledAnswersReadByTheReader(t *testing.T) {
	waitNoIdleWatch(t)
	fs := startFake(t)
	c := newClient(t, fs.ln.Addr().String(), ClientConfig{PooledAnswers: true})
	for i, n := range []int{10, 3 * readBufSize, 100} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		type out struct {
			f       protocol.Frame
			release func()
			err     error
		}
		got := make(chan out, 1)
		go func() {
			f, release, err := c.CallPooled(ctx, codeEcho, nil)
			got <- out{f, release, err}
		}()
		var fc *fakeConn
		if i == 0 {
			fc = fs.accept()
			t.Cleanup(func() { _ = fc.nc.Close() })
		} else {
			fc = fs.last
		}
		fs.last = fc
		fc.write(answerTo(fc.request(), bytes.Repeat([]byte{1}, n)))
		o := <-got
		cancel()
		if o.err != nil || len(o.f.Body) != n {
			t.Fatalf("answer %d of %d bytes: %v, got %d bytes", i, n, o.err, len(o.f.Body))
		}
		o.release()
	}
	if n := conn(c).ownReads.Load(); n != 0 {
		t.Fatalf("%d answers read by their calls on a PooledAnswers connection, want 0", n)
	}
}

// Calls of every kind on one connection at once (lone and overlapping,
// answered at once or later and in any order, timing out, cancelled,
// given up) each get their own answer or their own error: the read token
// passes between the calls and the reader goroutine without an answer
// going to the wrong call, a stream cut mid-frame or a call left unread.
func TestReadTokenUnderMixedCalls(t *testing.T) {
	waitNoIdleWatch(t)
	ts := startServer(t, ServerConfig{})
	stop := make(chan struct{})
	released := make(chan struct{})
	go func() { // answers held requests in a shuffled order, some late
		defer close(released)
		var held []*Request
		rng := rand.New(rand.NewPCG(1, 2))
		tick := time.NewTicker(time.Millisecond) // none is held for good
		defer tick.Stop()
		for {
			select {
			case r := <-ts.held:
				held = append(held, r)
				if len(held) < 3 && rng.IntN(4) != 0 {
					continue
				}
			case <-tick.C:
			case <-stop:
				for _, r := range held {
					_ = r.Reply(r.Body)
				}
				return
			}
			rng.Shuffle(len(held), func(i, j int) { held[i], held[j] = held[j], held[i] })
			for _, r := range held {
				_ = r.Reply(r.Body)
			}
			held = held[:0]
		}
	}()
	c := newClient(t, ts.addr, ClientConfig{})
	if _, err := c.Call(context.Background(), codeEcho, nil); err != nil {
		t.Fatal(err)
	}
	first := conn(c)
	const workers, calls = 6, 120
	var wg sync.WaitGroup
	var answered, failed atomic.Int64
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range calls {
				body := []byte(fmt.Sprintf("w%d-c%d-%s", w, i, strings.Repeat("x", rng.IntN(3)*40000)))
				code := codeEcho
				if rng.IntN(3) == 0 {
					code = codeHold
				}
				var f protocol.Frame
				var err error
				switch rng.IntN(4) {
				case 0: // a deadline that often passes
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(2000))*time.Microsecond)
					f, err = c.Call(ctx, code, body)
					cancel()
				case 1: // cancelled from elsewhere
					ctx, cancel := context.WithCancel(context.Background())
					if rng.IntN(2) == 0 {
						go cancel()
					}
					f, err = c.Call(ctx, code, body)
					cancel()
				case 2: // given up from elsewhere
					var h Handle
					if rng.IntN(2) == 0 {
						go h.GiveUp(errors.New("moved"))
					}
					f, err = c.CallUntil(time.Now().Add(10*time.Second), &h, code, body)
				default:
					f, err = c.Call(context.Background(), code, body)
				}
				if err != nil {
					if errors.Is(err, ErrConnLost) {
						errs <- fmt.Errorf("call %s: %w", body[:12], err)
						return
					}
					failed.Add(1)
					continue
				}
				if !bytes.Equal(f.Body, body) {
					errs <- fmt.Errorf("a call got another's answer: sent %.20q, got %.20q", body, f.Body)
					return
				}
				answered.Add(1)
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-released
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// The connection is whole: a plain call still gets its answer on it.
	if f, err := c.Call(context.Background(), codeEcho, []byte("last")); err != nil || string(f.Body) != "last" {
		t.Fatalf("after the mixed calls: %v %q", err, f.Body)
	}
	if conn(c) != first {
		t.Fatal("the connection was lost during the mixed calls")
	}
	t.Logf("%d answered, %d timed out, cancelled or given up; %d read by their own calls",
		answered.Load(), failed.Load(), conn(c).ownReads.Load())
	if answered.Load() == 0 {
		t.Fatal("no call was answered")
	}
}

// The answer to a call that gave up is still read at once: a server
// writing a large one does not stall, and with it the next call's large
// request (the server reads no request while the answers it owes do not
// fit its buffer).
func TestAbandonedAnswerIsRead(t *testing.T) {
	waitNoIdleWatch(t)
	ts := startServer(t, ServerConfig{})
	c := newClient(t, ts.addr, ClientConfig{WriteTimeout: 5 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, codeHold, nil)
		done <- err
	}()
	var held *Request
	select {
	case held = <-ts.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the held request did not come")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	big := bytes.Repeat([]byte("a"), 12<<20)
	_ = held.Reply(big)
	f, err := c.Call(context.Background(), codeEcho, big)
	if err != nil || len(f.Body) != len(big) {
		t.Fatalf("a large call after a large abandoned answer: %v (%d bytes)", err, len(f.Body))
	}
}
