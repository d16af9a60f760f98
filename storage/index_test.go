package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/storage/vfs"
)

// openCountingReads opens the log of cfg on a file system that counts the
// bytes Open and reads take from segment files.
func openCountingReads(t *testing.T, cfg Config) (*Log, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	efs := vfs.NewErrorFS(vfs.Default)
	efs.Inject(vfs.Fail(vfs.OpRead).Path("*.log").Where(func(c vfs.Call) bool {
		n.Add(int64(c.Len))
		return false // count, never fail
	}))
	cfg.FS = efs
	return openLog(t, cfg), &n
}

// waitIndexed waits until l's indexer has written every chunk cut.
func waitIndexed(t *testing.T, l *Log) {
	t.Helper()
	testwait.For(t, 10*time.Second, "the indexer to write every chunk cut", func() bool { return l.IndexStats().PendingCuts == 0 })
}

// fillQueues appends n records of size bytes round-robin over queues
// queues of topic "ix", one record per append, and returns what each
// queue holds.
func fillQueues(t *testing.T, l *Log, queues, n, size int) map[uint32][][]byte {
	t.Helper()
	held := map[uint32][][]byte{}
	for i := range n {
		q := uint32(i % queues)
		p := payloadFor("ix", q, int64(len(held[q])), size)
		mustAppend(t, l, []Entry{{Topic: "ix", Queue: q, Payload: p}}, false)
		held[q] = append(held[q], p)
	}
	return held
}

// checkQueues reads every queue whole, a few records at a time, and
// compares it with what was appended.
func checkQueues(t *testing.T, l *Log, held map[uint32][][]byte) {
	t.Helper()
	for q, want := range held {
		first, next := l.QueueRange("ix", q)
		if first != 0 || next != int64(len(want)) {
			t.Fatalf("queue %d: range [%d,%d), want [0,%d)", q, first, next, len(want))
		}
		for off := int64(0); off < next; {
			got, err := l.Read("ix", q, off, 700)
			if err != nil || len(got) == 0 {
				t.Fatalf("queue %d read at %d: %d entries, %v", q, off, len(got), err)
			}
			for _, e := range got {
				if e.QueueOffset != off || string(e.Payload) != string(want[off]) {
					t.Fatalf("queue %d offset %d: read %d %q", q, off, e.QueueOffset, e.Payload[:16])
				}
				off++
			}
		}
	}
}

// After a clean Close the index covers the whole log: Open reads no
// record, only the header of the last one, and every record reads back
// through the chunk files.
func TestOpenAfterCloseReadsNoRecord(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 16 << 10, IndexChunkBytes: 4 << 10}
	l := openLog(t, cfg)
	held := fillQueues(t, l, 5, 2000, 100)
	must(t, l.Close())

	l, read := openCountingReads(t, cfg)
	defer l.Close()
	if n := read.Load(); n > recordHeaderSize {
		t.Fatalf("Open read %d bytes of segments, want at most the %d of one record header", n, recordHeaderSize)
	}
	st := l.IndexStats()
	if st.IndexedOffset != l.EndOffset() || st.TailEntries != 0 || int64(st.Chunks) < l.EndOffset()/(4<<10) {
		t.Fatalf("index after a clean close: %+v, log end %d", st, l.EndOffset())
	}
	checkQueues(t, l, held)
}

// After a crash Open reads only what the chunks do not cover, and the
// index in memory holds about one chunk's worth of entries.
func TestCrashOpenReadsOnlyTheUnindexedTail(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 64 << 10, IndexChunkBytes: 8 << 10, FlushInterval: time.Hour}
	l := openLog(t, cfg)
	held := fillQueues(t, l, 3, 3000, 120)
	must(t, l.Flush())
	end := l.EndOffset()
	waitIndexed(t, l)
	st := l.IndexStats()
	if end-st.IndexedOffset >= cfg.IndexChunkBytes {
		t.Fatalf("index on disk ends at %d, log at %d: more than a chunk (%d) behind", st.IndexedOffset, end, cfg.IndexChunkBytes)
	}
	if per := int64(recordSize(2, 120)); st.TailEntries > cfg.IndexChunkBytes/per+1 {
		t.Fatalf("%d entries in memory, want at most a chunk's (%d)", st.TailEntries, cfg.IndexChunkBytes/per+1)
	}
	crash(l)

	l, read := openCountingReads(t, cfg)
	defer l.Close()
	if n, tail := read.Load(), end-st.IndexedOffset; n > tail+recordHeaderSize {
		t.Fatalf("Open read %d bytes of segments; the unindexed tail is %d", n, tail)
	}
	checkQueues(t, l, held)
}

// Chunks that claim records the log no longer holds (its tail lost with
// the checkpoint, a chunk of another log) are ignored and removed, and the
// log is rebuilt from its records.
func TestIndexAheadOfTheLogIsIgnored(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 1 << 20, IndexChunkBytes: 2 << 10}
	l := openLog(t, cfg)
	pos := appendEach(t, l, 400, 50)
	must(t, l.Close())
	chunksBefore := countChunks(t, dir)

	// The log loses its last 100 records, its checkpoint with them.
	cut := pos[300].LogOffset
	must(t, os.Truncate(filepath.Join(dir, fmt.Sprintf("%020d.log", 0)), cut))
	cp := &Log{cfg: Config{Dir: dir}, fs: vfs.Default}
	must(t, cp.openCheckpointFile())
	must(t, cp.putCheckpoint(cut))
	must(t, cp.checkpoint.Close())

	l = openLog(t, cfg)
	defer l.Close()
	if first, next := l.QueueRange("ix", 0); first != 0 || next != 300 {
		t.Fatalf("range [%d,%d), want [0,300)", first, next)
	}
	got, err := l.Read("ix", 0, 250, 1<<20)
	if err != nil || len(got) != 50 || got[49].QueueOffset != 299 {
		t.Fatalf("read 250..: %d entries, %v", len(got), err)
	}
	if n := countChunks(t, dir); n >= chunksBefore {
		t.Fatalf("%d chunk files after the reopen, %d before: those past the log were not removed", n, chunksBefore)
	}
	p := mustAppend(t, l, []Entry{{Topic: "ix", Payload: []byte("next")}}, true)
	if p[0].QueueOffset != 300 || p[0].LogOffset != cut {
		t.Fatalf("append after the reopen at %+v, want queue offset 300 at %d", p[0], cut)
	}
}

func countChunks(t *testing.T, dir string) int {
	t.Helper()
	names, err := os.ReadDir(filepath.Join(dir, indexDirName))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range names {
		if _, ok := parseIndexChunkName(e.Name()); ok {
			n++
		}
	}
	return n
}

// A flipped byte among a chunk's entries is not read by Open; the read
// that uses the entry finds a record other than the one it names and
// reports it, saying the index may be deleted. Deleting it makes Open
// rebuild it from the log.
func TestIndexEntryCorruptionIsReported(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, IndexChunkBytes: 1 << 20}
	l := openLog(t, cfg)
	held := fillQueues(t, l, 1, 50, 80)
	must(t, l.Close())

	flipEntryBit(t, dir, 10, 7, 0x40) // entry 10's log offset

	l = openLog(t, cfg)
	_, err := l.Read("ix", 0, 10, 1)
	var ce *CorruptError
	if !errors.As(err, &ce) && !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("read through a corrupt index entry: %v, want a *CorruptError", err)
	}
	if ce != nil && !strings.Contains(ce.Error(), "index") {
		t.Fatalf("the error does not point at the index: %v", ce)
	}
	must(t, l.Close())

	must(t, os.RemoveAll(filepath.Join(dir, indexDirName)))
	l = openLog(t, cfg)
	defer l.Close()
	checkQueues(t, l, held)
}

// Retention deletes the chunks that end before the new start, and a queue's
// first offset is its first record at or past the start, before and after
// a reopen, though a chunk that straddles the start still lists older ones.
func TestIndexAndRetention(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 4 << 10, IndexChunkBytes: 3 << 10}
	l := openLog(t, cfg)
	pos := appendEach(t, l, 600, 40)
	must(t, l.Flush())
	waitIndexed(t, l)
	chunks := l.IndexStats().Chunks
	start, err := l.DeleteBefore(pos[333].LogOffset)
	if err != nil {
		t.Fatal(err)
	}
	wantFirst := int64(0)
	for wantFirst < int64(len(pos)) && pos[wantFirst].LogOffset < start {
		wantFirst++
	}
	check := func(what string) {
		t.Helper()
		first, next := l.QueueRange("ix", 0)
		if first != wantFirst || next != 600 {
			t.Fatalf("%s: range [%d,%d), want [%d,600)", what, first, next, wantFirst)
		}
		if _, err := l.Read("ix", 0, wantFirst-1, 1); !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("%s: read before the first offset: %v", what, err)
		}
		got, err := l.Read("ix", 0, wantFirst, 1)
		if err != nil || len(got) != 1 || got[0].QueueOffset != wantFirst {
			t.Fatalf("%s: read at the first offset: %v, %v", what, got, err)
		}
		if qo, err := l.QueueOffsetAt("ix", 0, pos[400].LogOffset); err != nil || qo != 400 {
			t.Fatalf("%s: QueueOffsetAt(record 400) = %d, %v", what, qo, err)
		}
		// LogOffsetOf reads a chunk's entry (400 is indexed on disk) or
		// the tail's, and gives the end past the queue's.
		for _, qo := range []int64{wantFirst, 400, 599} {
			if at, err := l.LogOffsetOf("ix", 0, qo); err != nil || at != pos[qo].LogOffset {
				t.Fatalf("%s: LogOffsetOf(%d) = %d, %v; want %d", what, qo, at, err, pos[qo].LogOffset)
			}
		}
		if at, err := l.LogOffsetOf("ix", 0, 600); err != nil || at != l.EndOffset() {
			t.Fatalf("%s: LogOffsetOf(the end) = %d, %v; want the log's end %d", what, at, err, l.EndOffset())
		}
		if _, err := l.LogOffsetOf("ix", 0, wantFirst-1); !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("%s: LogOffsetOf below the first offset: %v", what, err)
		}
	}
	check("after the deletion")
	if after := l.IndexStats().Chunks; after >= chunks {
		t.Fatalf("%d chunks after the deletion, %d before", after, chunks)
	}
	must(t, l.Close())
	l = openLog(t, cfg)
	defer l.Close()
	check("after a reopen")
}

// A damaged entry that is not the first of a read (a log offset outside
// the log, or a size no record has) is reported, and leaves the log
// usable: appends and Close go on.
func TestDamagedIndexEntryMidReadIsReported(t *testing.T) {
	for _, c := range []struct {
		name string
		at   int // byte of entry 10 to flip
		bit  byte
	}{{"offset sign", 0, 0x80}, {"offset high", 2, 0x10}, {"size sign", 8, 0x80}, {"size high", 9, 0x40}} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := Config{Dir: dir, IndexChunkBytes: 1 << 20}
			l := openLog(t, cfg)
			fillQueues(t, l, 1, 50, 80)
			must(t, l.Close())
			flipEntryBit(t, dir, 10, c.at, c.bit)

			l = openLog(t, cfg)
			// Reads from entry 5 on (the damaged one is then not the
			// first) up to entry 10 (then it is): one of them uses it.
			reported := false
			for off := int64(5); off <= 10; off++ {
				got, err := l.Read("ix", 0, off, 1<<20)
				var ce *CorruptError
				switch {
				case errors.As(err, &ce):
					reported = true
				case err != nil:
					t.Fatalf("read at %d: %v", off, err)
				case len(got) > 0 && off+int64(len(got)) > 10:
					t.Fatalf("read at %d returned %d entries through the damaged one", off, len(got))
				}
			}
			if !reported {
				t.Fatal("no read reported the damaged entry")
			}
			mustAppend(t, l, []Entry{{Topic: "ix", Payload: []byte("after")}}, false)
			must(t, l.Close())
		})
	}
}

// A chunk file that cannot be read (an I/O error, not bad contents) fails
// Open and is kept: a passing error must not throw the index away.
func TestUnreadableIndexChunkFailsOpen(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 16 << 10, IndexChunkBytes: 4 << 10}
	l := openLog(t, cfg)
	held := fillQueues(t, l, 2, 300, 100)
	must(t, l.Close())
	before := countChunks(t, dir)

	efs := vfs.NewErrorFS(vfs.Default)
	efs.Inject(vfs.Fail(vfs.OpRead).Path("*.idx").Nth(2).With(syscall.EIO))
	cfg.FS = efs
	if _, err := Open(cfg); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Open with an unreadable index chunk: %v, want EIO", err)
	}
	if n := countChunks(t, dir); n != before {
		t.Fatalf("%d chunk files after the failed Open, %d before", n, before)
	}
	cfg.FS = nil
	l = openLog(t, cfg)
	defer l.Close()
	checkQueues(t, l, held)
}

// A reader of the whole history keeps at most maxOpenChunks chunk files
// open, and reads every record right.
func TestOpenChunkFilesAreBounded(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 64 << 10, IndexChunkBytes: 1 << 10}
	l := openLog(t, cfg)
	held := fillQueues(t, l, 3, 3000, 100)
	must(t, l.Close())
	l = openLog(t, cfg)
	defer l.Close()
	if n := l.IndexStats().Chunks; n <= maxOpenChunks {
		t.Fatalf("only %d chunks: the test needs more than %d", n, maxOpenChunks)
	}
	checkQueues(t, l, held)
	checkQueues(t, l, held) // again, through files closed and opened again
	open := 0
	for _, c := range l.chunks {
		c.mu.Lock()
		if c.f != nil {
			open++
		}
		c.mu.Unlock()
	}
	if open > maxOpenChunks {
		t.Fatalf("%d chunk files open, want at most %d", open, maxOpenChunks)
	}
}

// appendEach appends n records of size bytes to queue 0 of topic "ix", one
// append each, and returns their positions.
func appendEach(t *testing.T, l *Log, n, size int) []Position {
	t.Helper()
	var pos []Position
	for i := range n {
		pos = append(pos, mustAppend(t, l, []Entry{{Topic: "ix", Payload: payloadFor("ix", 0, int64(i), size)}}, false)...)
	}
	return pos
}

// flipEntryBit flips bits of byte at of entry i of the first queue in the
// index chunk at the start of dir's log.
func flipEntryBit(t *testing.T, dir string, i int64, at int, bits byte) {
	t.Helper()
	name := indexChunkName(dir, 0)
	oc, err := readIndexChunk(vfs.Default, name)
	must(t, err)
	b, err := os.ReadFile(name)
	must(t, err)
	b[oc.dir[0].at+i*indexEntrySize+int64(at)] ^= bits
	must(t, os.WriteFile(name, b, 0o644))
}
