package transport

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
)

// flipGuard is a Guard whose verdict is a switch shared by every reply:
// while it is off, Check rewrites the body to 'X's. It records what it
// decided, and when Sent came.
type flipGuard struct {
	on      *atomic.Bool
	checks  atomic.Int32
	allowed atomic.Bool // the verdict of the (only) Check
	sent    atomic.Int32
	checked *atomic.Int32 // every guard's Checks, together
}

func (g *flipGuard) Check(body []byte) {
	g.checks.Add(1)
	g.checked.Add(1)
	if g.on.Load() {
		g.allowed.Store(true)
		return
	}
	for i := range body {
		body[i] = 'X'
	}
}

func (g *flipGuard) Sent() { g.sent.Add(1) }

// A guarded reply is vetted when it is written, not when it is made: a
// peer that reads nothing until it has sent every request fills the socket,
// so later replies wait in the connection's buffer; the switch turned off
// then changes every reply not yet written, whichever goroutine writes it
// (a worker's flush, or the writer goroutine finishing a flush's rest).
// Each reply is checked once, arrives as its check decided, and is marked
// sent once it is all on the socket.
func TestGuardDecidesAtTheWrite(t *testing.T) {
	const n, size = 400, 60 << 10
	var on atomic.Bool
	on.Store(true)
	var checked atomic.Int32
	var mu sync.Mutex
	guards := map[uint32]*flipGuard{}
	s := NewServer(ServerConfig{Workers: 1, MaxWriteBuffer: 1 << 20})
	s.HandleWithReply(codeSized, func(r *Request) {
		g := &flipGuard{on: &on, checked: &checked}
		mu.Lock()
		guards[r.Opaque] = g
		mu.Unlock()
		_ = r.ReplyGuarded(bytes.Repeat(r.Body[:4], size/4), g)
	}, func([]byte) int { return size })
	rc, _ := sendUnread(t, s, n)
	on.Store(false)
	if c := checked.Load(); c >= n {
		t.Fatalf("all %d replies were checked before the peer read any: nothing waited in the buffer", c)
	}
	allowed, refused := 0, 0
	for _, f := range rc.recv(n) {
		mu.Lock()
		g := guards[f.Opaque]
		mu.Unlock()
		if g == nil || g.checks.Load() != 1 {
			t.Fatalf("opaque %d: reply arrived, its guard %v checked it %d times", f.Opaque, g != nil, g.checks.Load())
		}
		want := bytes.Repeat(binary.BigEndian.AppendUint32(nil, f.Opaque), size/4)
		if !g.allowed.Load() {
			want = bytes.Repeat([]byte{'X'}, size)
			refused++
		} else {
			allowed++
		}
		if !bytes.Equal(f.Body, want) {
			t.Fatalf("opaque %d: the body is not what its check decided (allowed %v)", f.Opaque, g.allowed.Load())
		}
	}
	testwait.For(t, 10*time.Second, "every reply to be marked sent", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, g := range guards {
			if g.sent.Load() != 1 {
				return false
			}
		}
		return true
	})
	if allowed == 0 || refused == 0 {
		t.Fatalf("%d replies allowed and %d rewritten: the switch should have caught replies on both sides", allowed, refused)
	}
	t.Logf("%d replies written as made, %d rewritten by their check at the write", allowed, refused)
}

// A reply is checked when its bytes go out, by either writer path, not
// when it was put: replies put while the switch was on and written after
// it turned off are all rewritten, and none is marked sent before it was
// written. A flush's rest (the socket was full) is checked again by the
// writer goroutine, which may write it long after the flush checked it.
func TestGuardChecksWhenWritten(t *testing.T) {
	for _, path := range []string{"flush", "run", "rest"} {
		t.Run(path, func(t *testing.T) {
			client, server := tcpPair(t)

			var on atomic.Bool
			on.Store(true)
			var checked atomic.Int32
			w := newWriter(1<<20, time.Second)
			w.raw = socketOf(server)
			filler := 0
			if path == "rest" {
				// Fill the socket (the peer reads nothing yet), so that a
				// flush leaves its whole batch to the writer goroutine.
				for {
					n, err := w.raw.tryWrite(make([]byte, 64<<10))
					if err != nil {
						t.Fatal(err)
					}
					if filler += n; n == 0 {
						break
					}
				}
			}
			var gs []*flipGuard
			for i := range 3 {
				g := &flipGuard{on: &on, checked: &checked}
				gs = append(gs, g)
				if err := w.put(&protocol.Frame{Flags: protocol.FlagResponse, Opaque: uint32(i + 1), Body: []byte("acknowledged")}, 0, g); err != nil {
					t.Fatal(err)
				}
			}
			if c := checked.Load(); c != 0 {
				t.Fatalf("%d replies checked when put", c)
			}
			if path == "rest" {
				w.flush() // checks all three, and the full socket takes none
				if len(w.rest) == 0 || checked.Load() != 3 {
					t.Fatalf("the flush left %d bytes to the writer goroutine, after %d checks", len(w.rest), checked.Load())
				}
			}
			on.Store(false)
			switch path {
			case "flush":
				w.flush()
			case "run", "rest":
				done := make(chan error, 1)
				go func() { done <- w.run(server) }()
				w.kick()
				defer func() {
					w.close(ErrConnLost)
					if err := <-done; err != nil {
						t.Errorf("run: %v", err)
					}
				}()
			}
			br := bufio.NewReader(client)
			if _, err := io.CopyN(io.Discard, br, int64(filler)); err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				f, err := readFrame(br, protocol.MaxFrameSize, readAtOnce)
				if err != nil {
					t.Fatal(err)
				}
				if string(f.Body) != "XXXXXXXXXXXX" {
					t.Fatalf("reply %d, put while allowed and written after: %q", i+1, f.Body)
				}
			}
			testwait.For(t, 5*time.Second, "the replies to be marked sent", func() bool {
				for _, g := range gs {
					if g.sent.Load() != 1 || g.checks.Load() < 1 {
						return false
					}
				}
				return true
			})
		})
	}
}
