package delay

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/storage"
)

// TestMovedToAfterReset: an entry moved twice (retention appended it again,
// then again), both older records deleted with their segments. MovedTo
// follows the first handle to the newest record, and still does after a
// Reset (what a failover's truncation makes the broker call) and in an
// index rebuilt from the log.
func TestMovedToAfterReset(t *testing.T) {
	dir, l, clk, x := testIndex(t, 1024)
	due := clk.now.UnixMilli() + 3_600_000
	filler := func() { // a segment's worth of other records
		for range 3 {
			appendLog(t, l, true, storage.Entry{Topic: "other", Queue: 0, Payload: []byte(strings.Repeat("x", 400))})
		}
	}
	var first int64
	move := func(at int64) int64 { // as the broker moves: naming the previous record and the first
		t.Helper()
		if err := x.Follow(); err != nil {
			t.Fatal(err)
		}
		if _, _, ok, err := x.Claim(at, due); !ok || err != nil {
			t.Fatalf("claim %d: %v %v", at, ok, err)
		}
		p := appendLog(t, l, true, movedEntry("t", 0, due, at, first))[0]
		x.Release(at, true)
		return p.LogOffset
	}
	first = appendLog(t, l, true, delayedEntry("t", 0, due, -1))[0].LogOffset
	filler()
	second := move(first)
	filler()
	newest := move(second)
	filler()
	if err := x.Follow(); err != nil {
		t.Fatal(err)
	}
	if start, err := l.DeleteBefore(newest); err != nil || start <= second {
		t.Fatalf("DeleteBefore(%d): start %d, %v (the moved records at %d, %d)", newest, start, err, first, second)
	}
	if err := x.Follow(); err != nil {
		t.Fatal(err)
	}
	check := func(x *Index, what string) {
		t.Helper()
		if to, ok, err := x.MovedTo(first, due); err != nil || !ok || to != newest {
			t.Errorf("%s: MovedTo(%d) = %d %v %v, want %d (moved to %d, then %d)", what, first, to, ok, err, newest, second, newest)
		}
	}
	check(x, "followed")
	if err := x.Reset(); err != nil {
		t.Fatal(err)
	}
	check(x, "after Reset")
	y, err := Open(Config{Log: l, Dir: filepath.Join(dir, "rebuilt"), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer y.Close()
	check(y, "rebuilt")
}
