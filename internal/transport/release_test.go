package transport

import (
	"bytes"
	"context"
	"runtime/debug"
	"sync"
	"testing"

	"github.com/ferrymq/ferrymq/protocol"
)

// A released request's buffer holds a later frame of the code (no fresh
// buffer to allocate, clear and collect per large SEND), and every frame
// read into a recycled buffer is whole: nothing of the frame before shows.
// A code whose handler does not release keeps fresh buffers.
func TestReleasedBuffersHoldLaterFrames(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // a GC may empty the pool
	s := NewServer(ServerConfig{})
	var mu sync.Mutex
	bufs := map[*byte]int{}
	record := func(r *Request) {
		mu.Lock()
		bufs[&r.Body[0]]++
		mu.Unlock()
		if bytes.Count(r.Body, r.Body[:1]) != len(r.Body) {
			_ = r.Reply([]byte("mixed"))
			return
		}
		_ = r.Reply(r.Body[:8])
	}
	s.HandleOrderedInline(codeOrdered, func(r *Request) { record(r); r.Release() }, nil)
	s.Releases(codeOrdered)
	s.Handle(codeEcho, record)
	addr := serve(t, s)
	c := NewClient(addr.String(), ClientConfig{})
	defer func() { _ = c.Close() }()

	const n = 20
	for _, code := range []protocol.Code{codeOrdered, codeEcho} {
		mu.Lock()
		clear(bufs)
		mu.Unlock()
		for i := range n {
			body := bytes.Repeat([]byte{byte(i)}, 48<<10-i*100) // each shorter than the one before
			resp, err := c.Call(context.Background(), code, body)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(resp.Body, body[:8]) {
				t.Fatalf("code %v, frame %d: answered %x, want %x", code, i, resp.Body, body[:8])
			}
		}
		mu.Lock()
		used := len(bufs)
		mu.Unlock()
		if code == codeOrdered && used >= n { // not one each: sync.Pool is per P (and drops some under -race)
			t.Fatalf("%d buffers for %d released frames, want them reused", used, n)
		}
		if code == codeEcho && used != n {
			t.Fatalf("%d buffers for %d frames never released, want %d", used, n, n)
		}
	}
}
