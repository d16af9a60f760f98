package producer

import "testing"

// TestBodyBufs: encode buffers are reused, never too small, sized so that a
// batch near the cap gets one every later batch fits in, and at most keep
// are kept (the largest ones).
func TestBodyBufs(t *testing.T) {
	p := &bodyBufs{keep: 2, limit: 1 << 20}
	if b := p.get(100); cap(b) != 64<<10 || len(b) != 0 {
		t.Fatalf("a small body: len %d cap %d, want an empty 64 KiB buffer", len(b), cap(b))
	}
	if b := p.get(200 << 10); cap(b) != 256<<10 {
		t.Fatalf("200 KiB: cap %d, want 256 KiB", cap(b))
	}
	big := p.get(1<<20 - 100)
	if cap(big) != 1<<20 {
		t.Fatalf("a body near the cap: cap %d, want the cap, 1 MiB", cap(big))
	}
	if b := p.get(3 << 20); cap(b) != 3<<20 {
		t.Fatalf("one message over the cap: cap %d, want exactly 3 MiB", cap(b))
	}

	big = append(big, "some bytes"...)
	p.put(big)
	if b := p.get(1<<20 - 50); cap(b) != 1<<20 || len(b) != 0 || &b[:1][0] != &big[0] {
		t.Fatalf("got len %d cap %d, want the buffer put back, emptied", len(b), cap(b))
	}
	small := p.get(10)
	p.put(small)
	p.put(make([]byte, 0, 128<<10))
	p.put(big) // 2 are kept: big replaces the smallest
	if len(p.bufs) != 2 {
		t.Fatalf("%d buffers kept, want 2", len(p.bufs))
	}
	for _, b := range p.bufs {
		if cap(b) == 64<<10 {
			t.Fatalf("the smallest buffer was kept over a larger one: caps %d, %d", cap(p.bufs[0]), cap(p.bufs[1]))
		}
	}
	if b := p.get(900 << 10); cap(b) != 1<<20 {
		t.Fatalf("a kept buffer large enough: cap %d, want 1 MiB", cap(b))
	}
}
