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

// With PooledAnswers, large answers are read into recycled buffers: an
// answer released by its CallPooled caller holds a later one, whole, and an
// answer never released (Call's, or CallPooled's kept) is not overwritten
// by later answers.
func TestPooledAnswersHoldLaterAnswers(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // a GC may empty the pool
	s := NewServer(ServerConfig{})
	s.Handle(codeEcho, func(r *Request) { _ = r.Reply(r.Body) })
	addr := serve(t, s)
	c := NewClient(addr.String(), ClientConfig{PooledAnswers: true})
	defer func() { _ = c.Close() }()

	kept, err := c.Call(context.Background(), codeEcho, bytes.Repeat([]byte{0xee}, 300<<10))
	if err != nil {
		t.Fatal(err)
	}
	keptPooled, _, err := c.CallPooled(context.Background(), codeEcho, bytes.Repeat([]byte{0xdd}, 300<<10))
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	bufs := map[*byte]int{}
	for i := range n {
		body := bytes.Repeat([]byte{byte(i)}, 400<<10-i*1000) // each shorter than the one before
		resp, release, err := c.CallPooled(context.Background(), codeEcho, body)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(resp.Body, body) {
			t.Fatalf("answer %d: %d bytes, not the %d sent", i, len(resp.Body), len(body))
		}
		bufs[&resp.Body[0]]++
		release()
	}
	if len(bufs) >= n { // not one each: sync.Pool is per P (and drops some under -race)
		t.Fatalf("%d buffers for %d released answers, want them reused", len(bufs), n)
	}
	if bytes.Count(kept.Body, []byte{0xee}) != 300<<10 || bytes.Count(keptPooled.Body, []byte{0xdd}) != 300<<10 {
		t.Fatal("an answer never released was overwritten by later ones")
	}
	// A small answer, and an error, still come back with a release.
	resp, release, err := c.CallPooled(context.Background(), codeEcho, []byte("small"))
	if err != nil || string(resp.Body) != "small" {
		t.Fatalf("a small answer: %q, %v", resp.Body, err)
	}
	release()
	_, release, err = c.CallPooled(context.Background(), protocol.Code(9999), []byte("x"))
	if err == nil {
		t.Fatal("an unknown code answered without an error")
	}
	release()
}
