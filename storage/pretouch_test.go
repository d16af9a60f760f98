package storage

import (
	"os"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
)

// The zeros a pre-touched segment holds past the log's end are never part
// of it: sealed segments end where the next begins, reads and raw reads
// stop at the log's end, a crash leaves them for Open to cut, and Close
// cuts them.
func TestPretouchedZerosAreNeverInTheLog(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 16 << 10, Pretouch: 4 << 10, FlushInterval: time.Hour}
	l := openLog(t, cfg)
	held := fillQueues(t, l, 2, 400, 100) // about 3.5 segments
	end := l.EndOffset()
	segs := segmentBases(t, dir)
	active := segs[len(segs)-1]
	testwait.For(t, 10*time.Second, "the toucher to get ahead of the writer", func() bool {
		return fileSize(t, l.segmentPath(active)) > end-active
	})
	for i, base := range segs[:len(segs)-1] {
		if size := fileSize(t, l.segmentPath(base)); base+size != segs[i+1] {
			t.Fatalf("sealed segment %d is %d bytes; the next starts at %d", base, size, segs[i+1])
		}
	}
	raw := rawFrom(t, l, active)
	if int64(len(raw)) != end-active {
		t.Fatalf("raw read of the active segment: %d bytes, the log has %d", len(raw), end-active)
	}
	must(t, l.Flush())
	crash(l)

	l = openLog(t, cfg)
	if l.EndOffset() != end {
		t.Fatalf("reopened at %d, want %d", l.EndOffset(), end)
	}
	checkQueues(t, l, held)
	p := mustAppend(t, l, []Entry{{Topic: "ix", Queue: 0, Payload: []byte("after")}}, false)
	if p[0].LogOffset != end {
		t.Fatalf("append after the reopen at %d, want %d", p[0].LogOffset, end)
	}
	must(t, l.Close())
	segs = segmentBases(t, dir)
	last := segs[len(segs)-1]
	if size := fileSize(t, l.segmentPath(last)); last+size != p[0].End {
		t.Fatalf("after Close the last segment ends at %d, the log at %d", last+size, p[0].End)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkPretouch appends 1 KiB entries from 64 goroutines into a fresh
// log (flush async), with and without pre-touching.
//
//	go test -run '^$' -bench Pretouch -count 5 ./storage/
func BenchmarkPretouch(b *testing.B) {
	for _, pt := range []int64{-1, 0} {
		name := "on"
		if pt < 0 {
			name = "off"
		}
		b.Run(name, func(b *testing.B) {
			l := openLog(b, Config{Dir: b.TempDir(), SegmentSize: 256 << 20, Pretouch: pt})
			defer l.Close()
			benchAppends(b, l, 64, false)
		})
	}
}
