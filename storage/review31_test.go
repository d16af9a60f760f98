package storage

import (
	"errors"
	"math"
	"testing"
)

// Review of issue 31: the console's Messages page looks a message up at a
// handle (GROUP@OFFSET) the browser gives; an offset near MaxInt64
// overflows RecordAt's bounds check (at+recordHeaderSize), the read goes
// to the file at a huge offset, and the broker answers STORE_ERROR naming
// its data directory's file (the page shows a 502 with the path) instead
// of NOT_FOUND.
func TestReview31ReadRecordAtHugeOffset(t *testing.T) {
	l := openLog(t, Config{Dir: t.TempDir()})
	defer l.Close()
	if _, err := l.Append([]Entry{{Topic: "a", Queue: 1, Payload: []byte("one")}}, false); err != nil {
		t.Fatal(err)
	}
	for _, at := range []int64{math.MaxInt64, math.MaxInt64 - recordHeaderSize + 1} {
		if _, err := l.ReadRecordAt(at); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("ReadRecordAt(%d): %v, want ErrOutOfRange", at, err)
		}
	}
}
