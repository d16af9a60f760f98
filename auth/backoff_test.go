package auth

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

// syncBuffer is a log's output that a test reads while the server writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// pending is a request written and its answer, read in the background.
type pending struct {
	nc   net.Conn
	done chan struct{}
	f    protocol.Frame
	err  error
}

// send writes an AUTH of token on nc with opaque and reads one answer in
// the background (the caller reads a connection's answers one at a time).
func sendAuth(t *testing.T, nc net.Conn, opaque uint32, token string) {
	t.Helper()
	b, err := protocol.AppendFrame(nil, &protocol.Frame{Code: protocol.CodeAuth, Opaque: opaque, Body: []byte(token)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
}

// readAnswer reads nc's next answer in the background.
func readAnswer(nc net.Conn) *pending {
	p := &pending{nc: nc, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		var lenBuf [4]byte
		if _, p.err = io.ReadFull(nc, lenBuf[:]); p.err != nil {
			return
		}
		n, err := protocol.FrameLength(lenBuf[:])
		if err != nil {
			p.err = err
			return
		}
		buf := make([]byte, n)
		copy(buf, lenBuf[:])
		if _, p.err = io.ReadFull(nc, buf[4:]); p.err != nil {
			return
		}
		p.f, p.err = protocol.DecodeFrame(buf)
	}()
	return p
}

// answered reports whether p's answer has arrived.
func (p *pending) answered() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *pending) wait(t *testing.T) (protocol.Frame, error) {
	t.Helper()
	select {
	case <-p.done:
		return p.f, p.err
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10 s")
		return protocol.Frame{}, nil
	}
}

// timers waits until the fake clock holds n timers (answers held back).
func timers(t *testing.T, clock *clockwork.FakeClock, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clock.BlockUntilContext(ctx, n); err != nil {
		t.Fatalf("waiting for %d held answers: %v", n, err)
	}
}

// A wrong token is answered late, later at each failure (250 ms, doubling);
// an AUTH sent while an answer is held back is not checked, even with the
// right token; the fifth failure closes the connection. A new connection
// from the same address starts where the address left off. One WARN names
// the address per interval, with the count; every failure is counted.
func TestAuthFailuresCostTheGuesser(t *testing.T) {
	clock := clockwork.NewFakeClock()
	var logs syncBuffer
	lg := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn})
	gs := startGateServer(t, GateConfig{Clock: clock, Logger: lg, WarnInterval: 10 * time.Second}, transport.ServerConfig{HandshakeTimeout: time.Minute})
	nc := dial(t, gs.addr)

	// Failure 1, then the right token at once: not checked, failure 2.
	sendAuth(t, nc, 1, "wrong-token-number-1")
	timers(t, clock, 1)
	sendAuth(t, nc, 2, appToken)
	timers(t, clock, 2)
	first := readAnswer(nc)
	clock.Advance(249 * time.Millisecond)
	if first.answered() {
		t.Fatal("the first failure was answered before 250 ms")
	}
	clock.Advance(time.Millisecond)
	if f, err := first.wait(t); err != nil || f.Opaque != 1 || f.Status != protocol.StatusNotAuthorized || string(f.Body) != "token not recognised" {
		t.Fatalf("the first wrong AUTH: %d %v %q %v", f.Opaque, f.Status, f.Body, err)
	}
	second := readAnswer(nc)
	clock.Advance(250 * time.Millisecond) // 500 ms after it was sent
	if f, err := second.wait(t); err != nil || f.Opaque != 2 || f.Status != protocol.StatusNotAuthorized || !strings.Contains(string(f.Body), "token not checked") {
		t.Fatalf("the right token sent during the backoff: %d %v %q %v, want it not checked", f.Opaque, f.Status, f.Body, err)
	}

	// Failures 3, 4 and 5: 1 s, 2 s, 2 s (the most); the fifth closes the
	// connection.
	for i, d := range []time.Duration{time.Second, 2 * time.Second, 2 * time.Second} {
		sendAuth(t, nc, uint32(3+i), "wrong-token-number-x")
		timers(t, clock, 1)
		p := readAnswer(nc)
		clock.Advance(d - time.Millisecond)
		if p.answered() {
			t.Fatalf("failure %d was answered before %v", 3+i, d)
		}
		clock.Advance(time.Millisecond)
		f, err := p.wait(t)
		if err != nil || f.Status != protocol.StatusNotAuthorized {
			t.Fatalf("failure %d: %v %q %v", 3+i, f.Status, f.Body, err)
		}
		if last := i == 2; last != strings.Contains(string(f.Body), "5 AUTHs of this connection failed: it is closed") {
			t.Fatalf("failure %d: %q", 3+i, f.Body)
		}
	}
	if _, err := readAnswer(nc).wait(t); !errors.Is(err, io.EOF) {
		t.Fatalf("after the fifth failure: %v, want the connection closed", err)
	}

	// The address's failures follow it to a new connection (within a
	// minute): its first failure waits the longest delay. The WARN
	// interval is over: it warns again, with the count since.
	clock.Advance(10 * time.Second)
	nc2 := dial(t, gs.addr)
	sendAuth(t, nc2, 1, "wrong-token-number-6")
	timers(t, clock, 1)
	p := readAnswer(nc2)
	clock.Advance(2*time.Second - time.Millisecond)
	if p.answered() {
		t.Fatal("a new connection's first failure was answered before 2 s")
	}
	clock.Advance(time.Millisecond)
	if f, err := p.wait(t); err != nil || string(f.Body) != "token not recognised" {
		t.Fatalf("the new connection's failure: %q %v", f.Body, err)
	}

	if n := gs.gate.AuthFailures(); n != 6 {
		t.Fatalf("%d failures counted, want 6", n)
	}
	warns := strings.Count(logs.String(), "failed AUTHs from 127.0.0.1:")
	if warns != 2 || !strings.Contains(logs.String(), "failed AUTHs from 127.0.0.1: 1 since") ||
		!strings.Contains(logs.String(), "failed AUTHs from 127.0.0.1: 5 since") {
		t.Fatalf("%d WARNs, want one for the first failure and one 10 s later counting the 5 since:\n%s", warns, logs.String())
	}
	// The right token, once nothing is held back, is taken.
	if f, err := request(t, nc2, protocol.CodeAuth, appToken); err != nil || f.Status != protocol.StatusOK {
		t.Fatalf("the right token after the backoff: %v %q %v", f.Status, f.Body, err)
	}
}

// A server closing gives the answers it holds back at once: its Close
// does not wait for the backoff.
func TestHeldAnswersGivenAtClose(t *testing.T) {
	clock := clockwork.NewFakeClock()
	gs := startGateServer(t, GateConfig{Clock: clock}, transport.ServerConfig{HandshakeTimeout: time.Minute, ShutdownGrace: time.Minute})
	nc := dial(t, gs.addr)
	sendAuth(t, nc, 1, "wrong-token-number-1")
	timers(t, clock, 1)
	p := readAnswer(nc)
	start := time.Now()
	if err := gs.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("Close took %v", took)
	}
	if f, err := p.wait(t); err != nil || string(f.Body) != "token not recognised" {
		t.Fatalf("the held answer at Close: %q %v", f.Body, err)
	}
}
