package storage

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ferrymq/ferrymq/storage/vfs"
)

// fatalHelper is what testing.TB and *rapid.T have in common that the
// helpers use.
type fatalHelper interface {
	Helper()
	Fatal(args ...any)
}

// rawFrom is the log's bytes from log offset from to its end, through ReadRaw.
func rawFrom(t fatalHelper, l *Log, from int64) []byte {
	t.Helper()
	var out []byte
	for off := from; off < l.EndOffset(); {
		raw, err := l.ReadRaw(off, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, raw...)
		off += int64(len(raw))
	}
	return out
}

// truncEntry is the ith entry of the truncation tests: three queues, sizes
// that vary, every other entry stamped by producer 1 (sequences per queue).
func truncEntry(i int) Entry {
	q := uint32(i % 3)
	if i%2 == 0 {
		return se("tr", q, 1, 0, int64(i/6))
	}
	return Entry{Topic: "tr", Queue: q, Payload: payloadFor("tr", q, int64(i), 30+i%70)}
}

// truncLog appends n entries one at a time and returns each one's position.
func truncLog(t *testing.T, cfg Config, n int) (*Log, []Position) {
	t.Helper()
	l := openLog(t, cfg)
	var pos []Position
	for i := range n {
		p := mustAppend(t, l, []Entry{truncEntry(i)}, false)
		if p[0].Duplicate || p[0].Err != nil {
			t.Fatalf("entry %d: %+v", i, p[0])
		}
		pos = append(pos, p[0])
	}
	return l, pos
}

// segmentBases lists the bases of a log directory's segments.
func segmentBases(t testing.TB, dir string) []int64 {
	t.Helper()
	names, err := vfs.Default.List(dir)
	must(t, err)
	var out []int64
	for _, n := range names {
		if b, ok := RecordFileBase(n); ok && len(n) == 24 {
			out = append(out, b)
		}
	}
	return out
}

// checkTruncated checks a log cut at pos[cut].LogOffset (cut == len(pos):
// not cut) against a log that only ever had the first cut entries, in
// memory and after a reopen, then appends more to both and compares again.
func checkTruncated(t *testing.T, l *Log, cfg Config, pos []Position, cut int) *Log {
	t.Helper()
	ref, _ := truncLog(t, Config{Dir: t.TempDir(), SegmentSize: cfg.SegmentSize, ProducerStamp: testStamp}, cut)
	defer ref.Close()
	compare := func(what string) {
		t.Helper()
		if l.EndOffset() != ref.EndOffset() {
			t.Fatalf("%s: end %d, want %d", what, l.EndOffset(), ref.EndOffset())
		}
		if got, want := fmt.Sprint(dumpQueues(t, l)), fmt.Sprint(dumpQueues(t, ref)); got != want {
			t.Fatalf("%s: queues\n%s\nwant\n%s", what, got, want)
		}
		if got, want := stripSeen(dumpProducers(l)), stripSeen(dumpProducers(ref)); got != want {
			t.Fatalf("%s: producers\n%s\nwant\n%s", what, got, want)
		}
	}
	compare("after the truncation")
	if l.FlushedOffset() != l.EndOffset() {
		t.Fatalf("flushed %d after the truncation, want the end %d", l.FlushedOffset(), l.EndOffset())
	}
	inMemory := dumpProducers(l)
	must(t, l.Close())
	l = openLog(t, cfg)
	compare("after a reopen")
	if got := dumpProducers(l); got != inMemory {
		t.Fatalf("producer state after a reopen\n%s\nwant (as Truncate left it)\n%s", got, inMemory)
	}
	// Both go on alike: the cut producer sequences are taken again.
	for i := cut; i < cut+10; i++ {
		p := mustAppend(t, l, []Entry{truncEntry(i)}, false)
		r := mustAppend(t, ref, []Entry{truncEntry(i)}, false)
		if p[0] != r[0] || p[0].Duplicate || p[0].Err != nil {
			t.Fatalf("entry %d appended after the truncation at %+v, want %+v", i, p[0], r[0])
		}
	}
	compare("after more appends")
	must(t, l.Close())
	l = openLog(t, cfg)
	compare("after more appends and a reopen")
	return l
}

// stripSeen drops the last-seen times, which differ between two logs
// written at different times.
func stripSeen(s string) string {
	var out []string
	for _, line := range bytes.Split([]byte(s), []byte("\n")) {
		if i := bytes.Index(line, []byte(" seen ")); i >= 0 {
			j := bytes.IndexByte(line[i+6:], ':')
			line = append(line[:i:i], line[i+6+j:]...)
		}
		out = append(out, string(line))
	}
	return fmt.Sprint(out)
}

func TestTruncate(t *testing.T) {
	const n = 60
	cases := map[string]func(pos []Position, bases []int64) int{
		"mid-segment": func(pos []Position, bases []int64) int {
			for i := len(pos) - 2; i > 0; i-- {
				if s := pos[i].LogOffset; !contains(bases, s) && !contains(bases, pos[i+1].LogOffset) {
					return i
				}
			}
			panic("no record in the middle of a segment")
		},
		"segment base": func(pos []Position, bases []int64) int {
			for i, p := range pos {
				if p.LogOffset == bases[len(bases)-2] {
					return i
				}
			}
			panic("no record at a segment base")
		},
		"across segments": func(pos []Position, bases []int64) int { return 3 },
		"everything":      func(pos []Position, bases []int64) int { return 0 },
		"last record":     func(pos []Position, bases []int64) int { return len(pos) - 1 },
	}
	for name, pick := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := Config{Dir: dir, SegmentSize: 1024, ProducerStamp: testStamp}
			l, pos := truncLog(t, cfg, n)
			bases := segmentBases(t, dir)
			if len(bases) < 4 {
				t.Fatalf("only %d segments", len(bases))
			}
			cut := pick(pos, bases)
			offset, end := pos[cut].LogOffset, l.EndOffset()
			cutBytes := rawFrom(t, l, offset)
			side := filepath.Join(dir, "truncated", SideFileName(offset, 3))
			res, err := l.Truncate(offset, side)
			must(t, err)
			if want := (TruncateResult{From: offset, To: end, Records: n - cut, SideFile: side}); res != want {
				t.Fatalf("result %+v, want %+v", res, want)
			}
			got, err := os.ReadFile(side)
			must(t, err)
			if !bytes.Equal(got, cutBytes) {
				t.Fatalf("side file holds %d bytes, not the %d cut", len(got), len(cutBytes))
			}
			if _, err := os.Stat(side + ".tmp"); !os.IsNotExist(err) {
				t.Fatalf("temporary side file left: %v", err)
			}
			var recs []RecordInfo
			must(t, ReadRecordFile(side, func(r RecordInfo) error { recs = append(recs, r); return nil }))
			if len(recs) != n-cut {
				t.Fatalf("side file read as %d records, want %d", len(recs), n-cut)
			}
			for i, r := range recs {
				e, p := truncEntry(cut+i), pos[cut+i]
				if r.Offset != p.LogOffset || r.Topic != e.Topic || r.Queue != e.Queue || r.QueueOffset != p.QueueOffset ||
					!bytes.Equal(r.Payload, e.Payload) || int64(r.Size) != p.End-p.LogOffset || r.StoreTime == 0 {
					t.Fatalf("side file record %d: %+v, want entry %+v at %+v", i, r, e, p)
				}
			}
			for _, b := range segmentBases(t, dir) {
				if b > offset {
					t.Fatalf("segment %d past the cut at %d left", b, offset)
				}
			}
			l = checkTruncated(t, l, cfg, pos, cut)
			must(t, l.Close())
		})
	}
}

func contains(s []int64, v int64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestTruncateNothingToDo(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 1024, ProducerStamp: testStamp}
	l, pos := truncLog(t, cfg, 20)
	defer l.Close()
	end := l.EndOffset()
	side := filepath.Join(dir, "truncated", SideFileName(end, 1))
	for _, off := range []int64{end, end + 100} {
		res, err := l.Truncate(off, side)
		if err != nil || res != (TruncateResult{From: end, To: end}) {
			t.Fatalf("truncate at %d (the end is %d): %+v %v", off, end, res, err)
		}
	}
	if _, err := os.Stat(filepath.Dir(side)); !os.IsNotExist(err) {
		t.Fatalf("a no-op truncation made the side directory: %v", err)
	}
	if l.EndOffset() != end {
		t.Fatalf("end %d, want %d", l.EndOffset(), end)
	}
	p := mustAppend(t, l, []Entry{truncEntry(20)}, false)
	if p[0].LogOffset != end || p[0].QueueOffset != pos[17].QueueOffset+1 {
		t.Fatalf("append after a no-op truncation at %+v", p[0])
	}
}

func TestTruncateRefusals(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 1024, ProducerStamp: testStamp}
	l, pos := truncLog(t, cfg, 40)
	defer func() { must(t, l.Close()) }()
	before, prods, end := dumpQueues(t, l), dumpProducers(l), l.EndOffset()
	side := filepath.Join(dir, "truncated", "x.log")
	unchanged := func(what string) {
		t.Helper()
		if l.EndOffset() != end || fmt.Sprint(dumpQueues(t, l)) != fmt.Sprint(before) || dumpProducers(l) != prods {
			t.Fatalf("%s changed the log", what)
		}
		if _, err := os.Stat(side); !os.IsNotExist(err) {
			t.Fatalf("%s wrote a side file: %v", what, err)
		}
	}
	for _, off := range []int64{pos[5].LogOffset + 1, pos[30].End - 1} {
		if _, err := l.Truncate(off, side); !errors.Is(err, ErrNotBoundary) {
			t.Fatalf("truncate inside a record at %d: %v", off, err)
		}
		unchanged("a truncation inside a record")
	}
	if _, err := l.Truncate(-1, side); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("truncate at -1: %v", err)
	}
	if _, err := l.Truncate(pos[5].LogOffset, ""); err == nil {
		t.Fatal("truncate with no side file worked")
	}
	if _, err := l.Truncate(pos[5].LogOffset, filepath.Join(dir, SideFileName(pos[5].LogOffset, 1))); err == nil {
		t.Fatal("truncate with the side file in the log directory worked")
	}
	unchanged("refused truncations")

	// Retention deleted the records before the log start: truncating there
	// is out of range.
	start, err := l.DeleteBefore(pos[20].LogOffset)
	must(t, err)
	if start == 0 {
		t.Fatal("nothing deleted")
	}
	before = dumpQueues(t, l)
	if _, err := l.Truncate(start-1, side); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("truncate before the start %d: %v", start, err)
	}
	unchanged("a truncation before the start")

	// At the start itself it cuts everything; the queues keep their offsets
	// (from the queues file, after a reopen too).
	ranges := map[uint32][2]int64{}
	for q := range uint32(3) {
		k := queueKey{"tr", q}
		first := l.index[k].base + int64(len(l.index[k].pos))
		for i, p := range pos {
			if truncEntry(i).Queue == q && p.LogOffset >= start {
				first = p.QueueOffset
				break
			}
		}
		ranges[q] = [2]int64{first, first}
	}
	if _, err := l.Truncate(start, side); err != nil {
		t.Fatal(err)
	}
	check := func(what string) {
		t.Helper()
		if l.EndOffset() != start || l.StartOffset() != start {
			t.Fatalf("%s: log [%d,%d), want empty at %d", what, l.StartOffset(), l.EndOffset(), start)
		}
		for q, want := range ranges {
			if first, next := l.QueueRange("tr", q); first != want[0] || next != want[1] {
				t.Fatalf("%s: queue %d range [%d,%d), want %v", what, q, first, next, want)
			}
		}
	}
	check("after cutting everything")
	must(t, l.Close())
	l = openLog(t, cfg)
	check("after cutting everything and a reopen")
}

// A failure before the cut changes nothing, and the log goes on.
func TestTruncateSideFileFailure(t *testing.T) {
	for _, op := range []vfs.Op{vfs.OpMkdirAll, vfs.OpCreate, vfs.OpWrite, vfs.OpSync, vfs.OpRename, vfs.OpSyncDir} {
		t.Run(op.String(), func(t *testing.T) {
			dir := t.TempDir()
			efs := vfs.NewErrorFS(vfs.Default)
			cfg := Config{Dir: dir, FS: efs, SegmentSize: 1024, ProducerStamp: testStamp}
			l, pos := truncLog(t, cfg, 30)
			before, prods, end := dumpQueues(t, l), dumpProducers(l), l.EndOffset()
			side := filepath.Join(dir, "truncated", SideFileName(pos[10].LogOffset, 1))
			rule := vfs.Fail(op).Where(func(c vfs.Call) bool { return strings.Contains(c.Path, "truncated") })
			efs.Inject(rule)
			_, err := l.Truncate(pos[10].LogOffset, side)
			isInjected(t, err, nil)
			if errors.Is(err, ErrBroken) {
				t.Fatalf("a failed side file broke the log: %v", err)
			}
			efs.DropAll()
			if l.EndOffset() != end || fmt.Sprint(dumpQueues(t, l)) != fmt.Sprint(before) || dumpProducers(l) != prods {
				t.Fatal("a failed truncation changed the log")
			}
			p := mustAppend(t, l, []Entry{truncEntry(30)}, false)
			if p[0].LogOffset != end {
				t.Fatalf("append after a failed truncation at %+v, want log offset %d", p[0], end)
			}
			must(t, l.Close())
			l = openLog(t, Config{Dir: dir, SegmentSize: 1024, ProducerStamp: testStamp})
			defer l.Close()
			if l.EndOffset() != p[0].End {
				t.Fatalf("reopened at %d, want %d", l.EndOffset(), p[0].End)
			}
		})
	}
}

// A producer whose later sequences were cut sends them again, and they are
// stored; the ones before the cut are still duplicates. A producer whose
// new epoch was cut is back in its old epoch.
func TestTruncateProducerState(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 1024, ProducerStamp: testStamp}
	l := openLog(t, cfg)
	defer func() { must(t, l.Close()) }()
	var first []Position
	for s := range int64(10) {
		first = append(first, mustAppend(t, l, []Entry{se("p", 0, 1, 0, s)}, false)[0])
		mustAppend(t, l, []Entry{se("p", 0, 2, 0, s)}, false)
		if s == 2 {
			mustAppend(t, l, []Entry{se("p", 1, 3, 0, 0), se("p", 1, 3, 0, 1)}, false)
		}
	}
	mustAppend(t, l, []Entry{se("p", 1, 3, 1, 0)}, false) // a new instance of producer 3
	cutAt := first[6].LogOffset
	_, err := l.Truncate(cutAt, filepath.Join(dir, "truncated", SideFileName(cutAt, 2)))
	must(t, err)

	check := func(what string) {
		t.Helper()
		end := l.EndOffset()
		pos := mustAppend(t, l, []Entry{se("p", 0, 1, 0, 3), se("p", 0, 1, 0, 5), se("p", 0, 1, 0, 7), se("p", 1, 3, 0, 1)}, false)
		if pos[3].Duplicate != true || pos[3].Err != nil {
			t.Fatalf("%s: producer 3's sequence 1 of epoch 0 answered %+v (its epoch 1 was cut)", what, pos[3])
		}
		checkPositions(t, what, pos[:3], []Position{dupOf(first[3]), dupOf(first[5]), refused(ErrOutOfOrderSequence)})
		if l.EndOffset() != end {
			t.Fatalf("%s: duplicates or refusals were stored", what)
		}
	}
	check("after the truncation")
	state := dumpProducers(l)
	must(t, l.Close())
	l = openLog(t, cfg)
	check("after a reopen")
	if got := dumpProducers(l); got != state {
		t.Fatalf("producer state after the reopen\n%s\nwant (as Truncate left it)\n%s", got, state)
	}

	end := l.EndOffset()
	pos := mustAppend(t, l, []Entry{se("p", 0, 1, 0, 6), se("p", 0, 1, 0, 7), se("p", 0, 2, 0, 6), se("p", 1, 3, 0, 2)}, false)
	for i, p := range pos {
		if p.Duplicate || p.Err != nil {
			t.Fatalf("resent cut entry %d answered %+v", i, p)
		}
	}
	if pos[0].QueueOffset != first[6].QueueOffset || pos[0].LogOffset != end {
		t.Fatalf("sequence 6 stored at %+v, want queue offset %d at %d", pos[0], first[6].QueueOffset, end)
	}
	again := mustAppend(t, l, []Entry{se("p", 0, 1, 0, 6), se("p", 1, 3, 1, 0)}, false)
	checkPositions(t, "after the resends", again, []Position{dupOf(pos[0]), stored(again[1])})
	if again[1].Duplicate || again[1].Err != nil {
		t.Fatalf("producer 3's epoch 1 again: %+v", again[1])
	}
}

// Reads run while the log is truncated and appended to again: they may fail
// with ErrReadTruncated, but what they return is whole, checked records of
// the queue and offsets asked for.
func TestTruncateWhileReading(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, Config{Dir: dir, SegmentSize: 4096})
	defer l.Close()
	appendN := func(from, n int, tag string) []Position {
		var out []Position
		for i := from; i < from+n; i++ {
			q := uint32(i % 2)
			p := payloadFor("r", q, int64(i/2), 100)
			copy(p[len(p)-16:], tag)
			out = append(out, mustAppend(t, l, []Entry{{Topic: "r", Queue: q, Payload: p}}, false)[0])
		}
		return out
	}
	pos := appendN(0, 200, "old")
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	var reads atomic.Int64
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				reads.Add(1)
				q := uint32(r % 2)
				first, next := l.QueueRange("r", q)
				if next < first {
					errs <- fmt.Errorf("range [%d,%d)", first, next)
					return
				}
				if r < 2 {
					es, err := l.Read("r", q, first, 1<<20)
					if err != nil {
						if !errors.Is(err, ErrReadTruncated) {
							errs <- err
							return
						}
						continue
					}
					for i, e := range es {
						want := fmt.Sprintf("r/%d/%d|", q, first+int64(i))
						if e.QueueOffset != first+int64(i) || !bytes.HasPrefix(e.Payload, []byte(want)) {
							errs <- fmt.Errorf("queue %d offset %d read as %d %q", q, first+int64(i), e.QueueOffset, e.Payload[:12])
							return
						}
					}
					continue
				}
				for off := int64(0); ; {
					raw, err := l.ReadRaw(off, 2000)
					if err != nil {
						if !errors.Is(err, ErrReadTruncated) && !errors.Is(err, ErrOutOfRange) {
							errs <- err
							return
						}
						break
					}
					if len(raw) == 0 {
						break
					}
					for b := raw; len(b) > 0; {
						n, err := recordLen(b, maxRecordSize)
						if err == nil && n <= len(b) {
							_, err = decodeRecord(b[:n])
						} else if err == nil {
							err = errors.New("partial record")
						}
						if err != nil {
							errs <- fmt.Errorf("ReadRaw at %d: %v", off, err)
							return
						}
						b = b[n:]
					}
					off += int64(len(raw))
				}
			}
		}()
	}
	for round := range 5 {
		cut := 150 - round*10
		_, err := l.Truncate(pos[cut].LogOffset, filepath.Join(dir, "truncated", SideFileName(pos[cut].LogOffset, uint32(round))))
		must(t, err)
		pos = append(pos[:cut], appendN(cut, 200-cut, fmt.Sprintf("new%d", round))...)
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if reads.Load() == 0 {
		t.Fatal("no reads ran")
	}
}

// Appends queued with a Truncate are ordered with it by the writer.
func TestTruncateAfterFlushWaiters(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, Config{Dir: dir, Flush: FlushSync})
	defer l.Close()
	var pos []Position
	for i := range 10 {
		pos = append(pos, mustAppend(t, l, []Entry{{Topic: "w", Payload: []byte(fmt.Sprint(i))}}, true)[0])
	}
	res, err := l.Truncate(pos[4].LogOffset, filepath.Join(dir, "t", "side.log"))
	must(t, err)
	if res.Records != 6 || l.FlushedOffset() != pos[4].LogOffset {
		t.Fatalf("%+v, flushed %d", res, l.FlushedOffset())
	}
	must(t, l.Flush())
	p := mustAppend(t, l, []Entry{{Topic: "w", Payload: []byte("after")}}, true)
	if p[0].QueueOffset != 4 || p[0].LogOffset != pos[4].LogOffset || l.FlushedOffset() != p[0].End {
		t.Fatalf("append after the truncation: %+v, flushed %d", p[0], l.FlushedOffset())
	}
	// A side file not named by SideFileName reads with offsets from 0.
	var offs []int64
	must(t, ReadRecordFile(res.SideFile, func(r RecordInfo) error { offs = append(offs, r.Offset); return nil }))
	if len(offs) != 6 || offs[0] != 0 || offs[1] != pos[5].LogOffset-pos[4].LogOffset {
		t.Fatalf("offsets %v", offs)
	}
}

func TestReadRecordFileErrors(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, Config{Dir: dir})
	pos := mustAppend(t, l, []Entry{{Topic: "e", Payload: []byte("one")}, {Topic: "e", Payload: []byte("two")}}, false)
	must(t, l.Close())
	seg := segName(dir, 0)
	if err := ReadRecordFile(filepath.Join(dir, "missing.log"), func(RecordInfo) error { return nil }); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	var n int
	must(t, ReadRecordFile(seg, func(RecordInfo) error { n++; return nil }))
	if n != 2 {
		t.Fatalf("segment read as %d records", n)
	}
	stop := errors.New("stop")
	if err := ReadRecordFile(seg, func(RecordInfo) error { return stop }); err != stop {
		t.Fatalf("fn's error: %v", err)
	}
	data, err := os.ReadFile(seg)
	must(t, err)
	bad := filepath.Join(t.TempDir(), SideFileName(1000, 1))
	flipped := bytes.Clone(data)
	flipped[pos[1].LogOffset+12] ^= 1
	for name, c := range map[string]struct {
		b    []byte
		at   int64
		good int
	}{
		"torn":    {data[:len(data)-2], pos[1].LogOffset, 1},
		"stray":   {append(bytes.Clone(data), 1, 2, 3), pos[1].End, 2},
		"flipped": {flipped, pos[1].LogOffset, 1},
	} {
		must(t, os.WriteFile(bad, c.b, 0o644))
		n = 0
		err := ReadRecordFile(bad, func(RecordInfo) error { n++; return nil })
		var ce *CorruptError
		if !errors.As(err, &ce) || ce.Offset != 1000+c.at || n != c.good {
			t.Fatalf("%s: %v after %d records", name, err, n)
		}
	}
}
