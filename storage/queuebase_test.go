package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func appendTo(t *testing.T, l *Log, topic string, queue uint32, n int) []Position {
	t.Helper()
	var es []Entry
	for i := range n {
		es = append(es, Entry{Topic: topic, Queue: queue, Payload: []byte(fmt.Sprintf("%s/%d #%d", topic, queue, i))})
	}
	return mustAppend(t, l, es, false)
}

func wantRange(t *testing.T, l *Log, topic string, queue uint32, first, next int64) {
	t.Helper()
	if f, n := l.QueueRange(topic, queue); f != first || n != next {
		t.Fatalf("%s/%d: range [%d,%d), want [%d,%d)", topic, queue, f, n, first, next)
	}
}

// A queue moved here continues at its base: its first record gets the
// base as its queue offset, the range starts there, reads before it are out
// of range, and the log reopens with it (from its index or, with the index
// gone, from its records).
func TestSetQueueBase(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, Config{Dir: dir, IndexChunkBytes: 256})
	appendTo(t, l, "other", 0, 3)
	if err := l.SetQueueBase("moved", 2, 100); err != nil {
		t.Fatal(err)
	}
	wantRange(t, l, "moved", 2, 100, 100)
	pos := appendTo(t, l, "moved", 2, 3)
	for i, p := range pos {
		if p.QueueOffset != int64(100+i) {
			t.Fatalf("record %d of the moved queue at queue offset %d, want %d", i, p.QueueOffset, 100+i)
		}
	}
	wantRange(t, l, "moved", 2, 100, 103)
	if es, err := l.Read("moved", 2, 100, 1<<20); err != nil || len(es) != 3 || es[0].QueueOffset != 100 {
		t.Fatalf("read from the base: %d entries, %v", len(es), err)
	}
	if _, err := l.Read("moved", 2, 5, 1<<20); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("read before the base: %v", err)
	}
	if at, err := l.QueueOffsetAt("moved", 2, 0); err != nil || at != 100 {
		t.Fatalf("QueueOffsetAt the log's start: %d, %v", at, err)
	}

	// The queue's next offset is nothing to set; below it, or above it for
	// a queue with records, is refused and changes nothing.
	if err := l.SetQueueBase("moved", 2, 103); err != nil {
		t.Fatalf("the next offset as a base: %v", err)
	}
	if err := l.SetQueueBase("moved", 2, 50); !errors.Is(err, ErrBaseBelowNext) {
		t.Fatalf("a base below the next offset: %v", err)
	}
	if err := l.SetQueueBase("other", 0, 50); !errors.Is(err, ErrQueueHasRecords) {
		t.Fatalf("a base past a queue's records: %v", err)
	}
	if err := l.SetQueueBase("", 0, 50); !errors.Is(err, ErrInvalidEntry) {
		t.Fatalf("no topic: %v", err)
	}
	wantRange(t, l, "moved", 2, 100, 103)
	wantRange(t, l, "other", 0, 0, 3)
	if p := appendTo(t, l, "other", 0, 1); p[0].QueueOffset != 3 {
		t.Fatalf("the refused base moved another queue: offset %d", p[0].QueueOffset)
	}
	want := dumpQueues(t, l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	l = openLog(t, Config{Dir: dir, IndexChunkBytes: 256})
	if got := dumpQueues(t, l); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("reopened:\n got %v\nwant %v", got, want)
	}
	if p := appendTo(t, l, "moved", 2, 1); p[0].QueueOffset != 103 {
		t.Fatalf("after a reopen the queue goes on at %d, want 103", p[0].QueueOffset)
	}
	want = dumpQueues(t, l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, indexDirName)); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, Config{Dir: dir})
	defer l.Close()
	if got := dumpQueues(t, l); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("recovered from the records:\n got %v\nwant %v", got, want)
	}
}

// A base is held in memory until the queue's first record: its owner sets
// it again after a reopen.
func TestQueueBaseWithoutRecordsIsNotKept(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, Config{Dir: dir})
	if err := l.SetQueueBase("moved", 0, 40); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, Config{Dir: dir})
	defer l.Close()
	wantRange(t, l, "moved", 0, 0, 0)
	if err := l.SetQueueBase("moved", 0, 40); err != nil {
		t.Fatal(err)
	}
	wantRange(t, l, "moved", 0, 40, 40)
}

// A slave copies a moved queue as it copies everything: its first raw
// record starts the queue at the master's base, with no base set on the
// slave; a raw record that leaves a gap in a queue the slave holds records
// of is still refused.
func TestAppendRawStartsAMovedQueue(t *testing.T) {
	master := openLog(t, Config{Dir: t.TempDir()})
	defer master.Close()
	sdir := t.TempDir()
	slave := openLog(t, Config{Dir: sdir})
	appendTo(t, master, "q", 0, 2)
	copyLog(t, master, slave, 1<<20)

	if err := master.SetQueueBase("moved", 1, 70); err != nil {
		t.Fatal(err)
	}
	appendTo(t, master, "moved", 1, 2)
	appendTo(t, master, "q", 0, 1)
	copyLog(t, master, slave, 1<<20)
	wantRange(t, slave, "moved", 1, 70, 72)
	if fmt.Sprint(dumpQueues(t, slave)) != fmt.Sprint(dumpQueues(t, master)) {
		t.Fatalf("slave %v, master %v", dumpQueues(t, slave), dumpQueues(t, master))
	}

	// A gap in a queue with records: the master never writes one.
	other := openLog(t, Config{Dir: t.TempDir()})
	defer other.Close()
	if err := other.SetQueueBase("q", 0, 3); err != nil {
		t.Fatal(err)
	}
	appendTo(t, other, "q", 0, 1) // q/0 at queue offset 3
	gap := openLog(t, Config{Dir: t.TempDir()})
	defer gap.Close()
	first, _ := master.ReadRaw(0, 1) // q/0 at 0
	if _, err := gap.AppendRaw(0, first, false); err != nil {
		t.Fatal(err)
	}
	skip, _ := other.ReadRaw(0, 1) // q/0 would jump from 1 to 3
	if _, err := gap.AppendRaw(gap.EndOffset(), skip, false); !errors.Is(err, ErrOffsetMismatch) {
		t.Fatalf("a gap in a queue with records: %v", err)
	}
	if err := slave.Close(); err != nil {
		t.Fatal(err)
	}
	slave = openLog(t, Config{Dir: sdir})
	defer slave.Close()
	wantRange(t, slave, "moved", 1, 70, 72)
}

// A truncation that cuts every record of a moved queue leaves the queue as
// the log before them had it (none); its owner sets the base again before
// it appends.
func TestTruncateAMovedQueue(t *testing.T) {
	l := openLog(t, Config{Dir: t.TempDir()})
	defer l.Close()
	appendTo(t, l, "q", 0, 2)
	cut := l.EndOffset()
	if err := l.SetQueueBase("moved", 0, 9); err != nil {
		t.Fatal(err)
	}
	appendTo(t, l, "moved", 0, 2)
	if _, err := l.Truncate(cut, filepath.Join(t.TempDir(), "side.log")); err != nil {
		t.Fatal(err)
	}
	wantRange(t, l, "moved", 0, 0, 0)
	if err := l.SetQueueBase("moved", 0, 9); err != nil {
		t.Fatal(err)
	}
	if p := appendTo(t, l, "moved", 0, 1); p[0].QueueOffset != 9 {
		t.Fatalf("after the cut the queue goes on at %d, want 9", p[0].QueueOffset)
	}
}
