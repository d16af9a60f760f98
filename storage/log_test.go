package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/storage/vfs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func openLog(t testing.TB, cfg Config) *Log {
	t.Helper()
	l, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// payloadFor makes a payload that names its queue and queue offset, so a
// reader can tell a right record from a wrong one.
func payloadFor(topic string, queue uint32, qo int64, size int) []byte {
	p := make([]byte, max(size, 24))
	copy(p, fmt.Sprintf("%s/%d/%d|", topic, queue, qo))
	for i := len(p) - 8; i < len(p); i++ {
		p[i] = byte(qo)
	}
	return p
}

func mustAppend(t testing.TB, l *Log, entries []Entry, flush bool) []Position {
	t.Helper()
	pos, err := l.Append(entries, flush)
	if err != nil {
		t.Fatal(err)
	}
	return pos
}

func TestAppendAndRead(t *testing.T) {
	l := openLog(t, Config{Dir: t.TempDir()})
	defer l.Close()
	var want = map[queueKey][][]byte{}
	end := int64(0)
	for i := range 50 {
		var batch []Entry
		for j := range i%5 + 1 {
			k := queueKey{fmt.Sprintf("t%d", j%2), uint32((i + j) % 3)}
			p := payloadFor(k.topic, k.queue, int64(len(want[k])), 10+i*j)
			want[k] = append(want[k], p) // tentative; offsets are checked below
			batch = append(batch, Entry{Topic: k.topic, Queue: k.queue, Payload: p})
		}
		pos := mustAppend(t, l, batch, false)
		for j, p := range pos {
			if p.LogOffset != end {
				t.Fatalf("batch %d entry %d at log offset %d, want %d (records must be contiguous)", i, j, p.LogOffset, end)
			}
			end = p.End
		}
	}
	if l.EndOffset() != end {
		t.Fatalf("EndOffset %d, want %d", l.EndOffset(), end)
	}
	for k, payloads := range want {
		first, next := l.QueueRange(k.topic, k.queue)
		if first != 0 || next != int64(len(payloads)) {
			t.Fatalf("%v: range [%d,%d), want [0,%d)", k, first, next, len(payloads))
		}
		got, err := l.Read(k.topic, k.queue, 0, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(payloads) {
			t.Fatalf("%v: read %d entries, want %d", k, len(got), len(payloads))
		}
		for i, e := range got {
			if e.QueueOffset != int64(i) || !bytes.Equal(e.Payload, payloads[i]) {
				t.Fatalf("%v offset %d: got queue offset %d payload %q", k, i, e.QueueOffset, e.Payload[:16])
			}
		}
		// maxBytes caps a read, but a read returns at least one entry.
		one, err := l.Read(k.topic, k.queue, 1, 1)
		if err != nil || len(one) != 1 || one[0].QueueOffset != 1 {
			t.Fatalf("%v: small read gave %d entries, %v", k, len(one), err)
		}
		if past, err := l.Read(k.topic, k.queue, next, 1<<20); err != nil || len(past) != 0 {
			t.Fatalf("%v: read at the end gave %d entries, %v", k, len(past), err)
		}
	}
	if got, err := l.Read("nope", 0, 0, 100); err != nil || got != nil {
		t.Fatalf("unknown queue: %v %v", got, err)
	}
}

func TestInvalidEntries(t *testing.T) {
	l := openLog(t, Config{Dir: t.TempDir(), MaxPayloadSize: 100})
	defer l.Close()
	for name, e := range map[string]Entry{
		"empty topic":     {Topic: "", Payload: []byte("x")},
		"long topic":      {Topic: string(make([]byte, 256)), Payload: []byte("x")},
		"payload too big": {Topic: "t", Payload: make([]byte, 101)},
	} {
		if _, err := l.Append([]Entry{{Topic: "ok"}, e}, false); !errors.Is(err, ErrInvalidEntry) {
			t.Errorf("%s: got %v, want ErrInvalidEntry", name, err)
		}
	}
	if l.EndOffset() != 0 {
		t.Fatalf("a refused batch wrote %d bytes", l.EndOffset())
	}
}

func TestSegmentsRollAndReopenExactly(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 1024}
	l := openLog(t, cfg)
	for i := range 200 {
		mustAppend(t, l, []Entry{{Topic: "roll", Queue: uint32(i % 4), Payload: payloadFor("roll", uint32(i%4), int64(i/4), 40+i%100)}}, false)
	}
	// One entry bigger than a segment gets a segment of its own.
	mustAppend(t, l, []Entry{{Topic: "big", Payload: make([]byte, 3000)}}, false)
	end := l.EndOffset()
	before := dumpQueues(t, l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	names, _ := vfs.Default.List(dir)
	segs := 0
	var total int64
	for _, n := range names {
		if filepath.Ext(n) == ".log" {
			segs++
			st, _ := os.Stat(filepath.Join(dir, n))
			if st.Size() > 1024 && st.Size() < 3000 {
				t.Errorf("segment %s has %d bytes, over the 1024 size without a single big record", n, st.Size())
			}
			total += st.Size()
		}
	}
	if segs < 10 || total != end {
		t.Fatalf("%d segments holding %d bytes; want many segments holding %d", segs, total, end)
	}

	l = openLog(t, cfg)
	defer l.Close()
	if l.EndOffset() != end || l.FlushedOffset() != end {
		t.Fatalf("reopened end %d flushed %d, want %d", l.EndOffset(), l.FlushedOffset(), end)
	}
	after := dumpQueues(t, l)
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatal("queues differ after a clean close and reopen")
	}
	pos := mustAppend(t, l, []Entry{{Topic: "roll", Queue: 1, Payload: []byte("next")}}, false)
	if pos[0].QueueOffset != 50 || pos[0].LogOffset != end {
		t.Fatalf("append after reopen at %+v, want queue offset 50 at %d", pos[0], end)
	}
}

// dumpQueues reads every queue whole: key -> entries.
func dumpQueues(t fatalHelper, l *Log) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	var keys []queueKey
	firsts := map[queueKey]int64{}
	l.Queues(func(topic string, queue uint32, first, next int64) {
		keys = append(keys, queueKey{topic, queue})
		firsts[queueKey{topic, queue}] = first
		out[fmt.Sprint(queueKey{topic, queue})] = []string{fmt.Sprintf("range [%d,%d)", first, next)}
	})
	for _, k := range keys {
		es, err := l.Read(k.topic, k.queue, firsts[k], 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			out[fmt.Sprint(k)] = append(out[fmt.Sprint(k)], fmt.Sprintf("%d@%d:%x", e.QueueOffset, e.LogOffset, e.Payload))
		}
	}
	return out
}

func TestConcurrentAppendsAndReads(t *testing.T) {
	l := openLog(t, Config{Dir: t.TempDir(), SegmentSize: 64 << 10})
	defer l.Close()
	const writers, perWriter = 8, 150
	var wg sync.WaitGroup
	errs := make(chan error, writers+4)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := uint32(w % 4)
			for i := range perWriter {
				e := Entry{Topic: "c", Queue: q, Payload: []byte(fmt.Sprintf("w%d-%d", w, i))}
				if _, err := l.Append([]Entry{e, e}, i%10 == 0); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	stop := make(chan struct{})
	var rg sync.WaitGroup
	for q := range uint32(4) {
		rg.Add(1)
		go func() {
			defer rg.Done()
			var next int64
			lastSeen := map[string]int{}
			for {
				select {
				case <-stop:
					return
				default:
				}
				es, err := l.Read("c", q, next, 4096)
				if err != nil {
					errs <- err
					return
				}
				for _, e := range es {
					if e.QueueOffset != next {
						errs <- fmt.Errorf("queue %d: got offset %d, want %d", q, e.QueueOffset, next)
						return
					}
					var w, i int
					if _, err := fmt.Sscanf(string(e.Payload), "w%d-%d", &w, &i); err != nil {
						errs <- fmt.Errorf("queue %d offset %d: garbage payload %q", q, next, e.Payload)
						return
					}
					// Each writer's entries appear in its order (each twice).
					key := fmt.Sprint(w)
					if prev, ok := lastSeen[key]; ok && i < prev {
						errs <- fmt.Errorf("writer %d: entry %d after %d", w, i, prev)
						return
					}
					lastSeen[key] = i
					next++
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	rg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := int64(0)
	for q := range uint32(4) {
		_, next := l.QueueRange("c", q)
		total += next
	}
	if total != writers*perWriter*2 {
		t.Fatalf("%d entries stored, want %d", total, writers*perWriter*2)
	}
}

func TestSyncModeGroupCommit(t *testing.T) {
	efs := vfs.NewErrorFS(vfs.Default)
	l := openLog(t, Config{Dir: t.TempDir(), FS: efs, Flush: FlushSync})
	defer l.Close()
	syncsBefore := efs.Calls(vfs.OpSync)
	const appenders = 64
	var wg sync.WaitGroup
	for i := range appenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pos, err := l.Append([]Entry{{Topic: "s", Queue: uint32(i % 2), Payload: make([]byte, 100)}}, false)
			if err != nil {
				t.Error(err)
				return
			}
			// Complete means synced.
			if f := l.FlushedOffset(); f < pos[0].End {
				t.Errorf("append completed at end %d with the log flushed only to %d", pos[0].End, f)
			}
		}()
	}
	wg.Wait()
	syncsAfter := efs.Calls(vfs.OpSync)
	syncs := syncsAfter - syncsBefore
	t.Logf("%d sync appends shared %d syncs", appenders, syncs)
	if syncs < 1 || syncs > appenders/2 {
		t.Fatalf("%d concurrent sync appends took %d syncs; waiting appends must share syncs", appenders, syncs)
	}
}

func TestAsyncFlush(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, Config{Dir: dir, FlushInterval: 20 * time.Millisecond})
	defer l.Close()
	pos := mustAppend(t, l, []Entry{{Topic: "a", Payload: []byte("x")}}, false)
	testwait.For(t, 5*time.Second, "the async flusher to sync", func() bool { return l.FlushedOffset() >= pos[0].End })
	// Asking for the flush of one append waits for it.
	l2 := openLog(t, Config{Dir: t.TempDir(), FlushInterval: time.Hour})
	defer l2.Close()
	pos = mustAppend(t, l2, []Entry{{Topic: "a", Payload: []byte("y")}}, true)
	if l2.FlushedOffset() < pos[0].End {
		t.Fatal("append with flush=true completed before its flush")
	}
	mustAppend(t, l2, []Entry{{Topic: "a", Payload: []byte("z")}}, false)
	if l2.FlushedOffset() == l2.EndOffset() {
		t.Fatal("an async append with an hour's interval was synced at once")
	}
	if err := l2.Flush(); err != nil || l2.FlushedOffset() != l2.EndOffset() {
		t.Fatalf("Flush: %v, flushed %d of %d", err, l2.FlushedOffset(), l2.EndOffset())
	}
}

func TestRawReplicationIsByteIdentical(t *testing.T) {
	master := openLog(t, Config{Dir: t.TempDir(), SegmentSize: 2048})
	defer master.Close()
	slave := openLog(t, Config{Dir: t.TempDir(), SegmentSize: 2048})
	defer slave.Close()
	for i := range 300 {
		topic := []string{"r", "s"}[i/5%2] // runs of one topic, then the other: the slave's index keys follow
		mustAppend(t, master, []Entry{{Topic: topic, Queue: uint32(i % 3), Payload: payloadFor(topic, uint32(i%3), int64(i/3), i%200)}}, false)
		if i%37 == 0 { // the slave copies while the master writes
			copyLog(t, master, slave, 700)
		}
	}
	copyLog(t, master, slave, 1500)
	if slave.EndOffset() != master.EndOffset() {
		t.Fatalf("slave ends at %d, master at %d", slave.EndOffset(), master.EndOffset())
	}
	if !bytes.Equal(rawFrom(t, master, 0), rawFrom(t, slave, 0)) {
		t.Fatal("slave log differs from the master's")
	}
	if fmt.Sprint(dumpQueues(t, master)) != fmt.Sprint(dumpQueues(t, slave)) {
		t.Fatal("slave index differs from the master's")
	}

	// Bytes that do not continue the log are refused and leave no trace.
	end := slave.EndOffset()
	raw, _ := master.ReadRaw(0, 100)
	if _, err := slave.AppendRaw(end, raw, false); !errors.Is(err, ErrOffsetMismatch) {
		t.Fatalf("records with old queue offsets: %v", err)
	}
	if _, err := slave.AppendRaw(end-1, raw, false); !errors.Is(err, ErrOffsetMismatch) {
		t.Fatalf("raw append at the wrong offset: %v", err)
	}
	mustAppend(t, master, []Entry{{Topic: "r", Queue: 0, Payload: []byte("fresh")}}, false)
	fresh, _ := master.ReadRaw(end, 1<<20)
	bad := bytes.Clone(fresh)
	bad[len(bad)-1] ^= 0xff
	if _, err := slave.AppendRaw(end, bad, false); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("corrupt raw record: %v", err)
	}
	if _, err := slave.AppendRaw(end, fresh[:len(fresh)-1], false); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("torn raw record: %v", err)
	}
	if slave.EndOffset() != end {
		t.Fatal("a refused raw append changed the slave")
	}
	if got, err := slave.AppendRaw(end, fresh, false); err != nil || got != master.EndOffset() {
		t.Fatalf("good raw append: %d, %v", got, err)
	}
	if _, err := master.ReadRaw(master.EndOffset()+1, 10); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("ReadRaw past the end: %v", err)
	}
}

// copyLog streams master into slave from the slave's end, as HA sync does.
func copyLog(t testing.TB, master, slave *Log, chunk int) {
	t.Helper()
	for {
		from := slave.EndOffset()
		raw, err := master.ReadRaw(from, chunk)
		if err != nil {
			t.Fatal(err)
		}
		if len(raw) == 0 {
			return
		}
		if _, err := slave.AppendRaw(from, raw, false); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTornTailIsTruncated(t *testing.T) {
	cases := map[string]func(t *testing.T, path string, size int64){
		"cut mid-record": func(t *testing.T, path string, size int64) { must(t, os.Truncate(path, size-7)) },
		"cut mid-header": func(t *testing.T, path string, size int64) {
			last := lastRecordStart(t, path)
			must(t, os.Truncate(path, last+3))
		},
		"garbage appended": func(t *testing.T, path string, size int64) {
			writeAt(t, path, size, []byte("\x00\x00\x01\x00garbage that is not a record"))
		},
		"zeros appended":       func(t *testing.T, path string, size int64) { writeAt(t, path, size, make([]byte, 4096)) },
		"last record bit flip": func(t *testing.T, path string, size int64) { flipByte(t, path, size-3) },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			l := openLog(t, Config{Dir: dir})
			mustAppend(t, l, []Entry{{Topic: "t", Payload: []byte("durable-0")}, {Topic: "t", Payload: []byte("durable-1")}}, true)
			durable := l.EndOffset()
			mustAppend(t, l, []Entry{{Topic: "t", Payload: []byte("unsynced")}}, false)
			crash(l)
			path := filepath.Join(dir, fmt.Sprintf("%020d.log", 0))
			st, _ := os.Stat(path)
			mutate(t, path, st.Size())

			l = openLog(t, Config{Dir: dir})
			defer l.Close()
			es, err := l.Read("t", 0, 0, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			if len(es) < 2 || string(es[0].Payload) != "durable-0" || string(es[1].Payload) != "durable-1" {
				t.Fatalf("durable records lost: %d entries", len(es))
			}
			if len(es) == 3 && string(es[2].Payload) != "unsynced" {
				t.Fatalf("read back garbage: %q", es[2].Payload)
			}
			if l.EndOffset() < durable {
				t.Fatalf("end %d before the durable %d", l.EndOffset(), durable)
			}
			pos := mustAppend(t, l, []Entry{{Topic: "t", Payload: []byte("next")}}, false)
			if pos[0].QueueOffset != int64(len(es)) {
				t.Fatalf("append after recovery got queue offset %d, want %d", pos[0].QueueOffset, len(es))
			}
		})
	}
}

func TestMidLogCorruptionIsReported(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, Config{Dir: dir, SegmentSize: 512})
	var second Position
	for i := range 40 {
		pos := mustAppend(t, l, []Entry{{Topic: "m", Payload: payloadFor("m", 0, int64(i), 60)}}, false)
		if i == 5 {
			second = pos[0]
		}
	}
	must(t, l.Close())
	// Flip a byte inside record 5, long before the checkpoint.
	seg, local := locate(t, dir, second.LogOffset+20)
	st, _ := os.Stat(seg)
	flipByte(t, seg, local)

	// The index covers the record: Open does not read it again, a read
	// reports it, and the records around it still read.
	l = openLog(t, Config{Dir: dir, SegmentSize: 512})
	if got, err := l.Read("m", 0, 0, 5*100); err != nil || len(got) != 5 {
		t.Fatalf("read before the corruption: %d entries, %v", len(got), err)
	}
	_, err := l.Read("m", 0, 5, 1)
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Offset != second.LogOffset {
		t.Fatalf("read of the corrupt record: %v, want a *CorruptError at %d", err, second.LogOffset)
	}
	if got, err := l.Read("m", 0, 6, 1); err != nil || len(got) != 1 || got[0].QueueOffset != 6 {
		t.Fatalf("read after the corruption: %v, %v", got, err)
	}
	must(t, l.Close())

	// Without the index, Open checks every record and refuses the log.
	must(t, os.RemoveAll(filepath.Join(dir, indexDirName)))
	_, err = Open(Config{Dir: dir, SegmentSize: 512})
	if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open over mid-log corruption: got %v, want a *CorruptError", err)
	}
	if ce.Offset != second.LogOffset {
		t.Fatalf("corruption reported at %d, want %d", ce.Offset, second.LogOffset)
	}
	if st2, _ := os.Stat(seg); st2.Size() != st.Size() {
		t.Fatal("open truncated a corrupt segment in the middle of the log")
	}
}

func crash(l *Log) {
	l.crashed = true
	_ = l.Close()
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func writeAt(t testing.TB, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	must(t, err)
	defer f.Close()
	_, err = f.WriteAt(b, off)
	must(t, err)
}

func flipByte(t testing.TB, path string, off int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	b[off] ^= 0x5a
	must(t, os.WriteFile(path, b, 0o644))
}

// lastRecordStart walks a segment's records and returns where the last begins.
func lastRecordStart(t testing.TB, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	at, last := 0, 0
	for at+8 <= len(b) {
		n := int(binary.BigEndian.Uint32(b[at:])) + 8
		if at+n > len(b) {
			break
		}
		last = at
		at += n
	}
	return int64(last)
}

// locate maps a log offset to its segment file and the offset in it.
func locate(t testing.TB, dir string, off int64) (string, int64) {
	t.Helper()
	names, err := vfs.Default.List(dir)
	must(t, err)
	var path string
	var base int64
	for _, n := range names {
		var b int64
		if _, err := fmt.Sscanf(n, "%020d.log", &b); err == nil && b <= off {
			path, base = filepath.Join(dir, n), b
		}
	}
	return path, off - base
}

// BenchmarkAppend appends 1 KiB entries one at a time from 1 or 64
// goroutines, unstamped and stamped (each goroutine a producer with its own
// sequence, 8 queues), to show what the deduplication checks cost.
func BenchmarkAppend(b *testing.B) {
	for _, mode := range []FlushMode{FlushAsync, FlushSync} {
		for _, conc := range []int{1, 64} {
			for _, stamped := range []bool{false, true} {
				b.Run(fmt.Sprintf("flush=%v/appenders=%d/stamps=%v/1KiB", mode, conc, stamped), func(b *testing.B) {
					l := openLog(b, Config{Dir: b.TempDir(), Flush: mode, SegmentSize: 256 << 20, ProducerStamp: testStamp})
					defer l.Close()
					benchAppends(b, l, conc, stamped)
				})
			}
		}
	}
}

// benchAppends appends b.N 1 KiB entries one at a time from conc
// goroutines over 8 queues, each goroutine a producer if stamped.
func benchAppends(b *testing.B, l *Log, conc int, stamped bool) {
	var wg sync.WaitGroup
	per := b.N/conc + 1
	b.SetBytes(1024)
	b.ResetTimer()
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e := Entry{Topic: "bench", Queue: uint32(g % 8), Payload: make([]byte, 1024)}
			for seq := range int64(per) {
				if stamped {
					e.Producer = ProducerStamp{ID: uint64(g + 1), Seq: seq}
				}
				pos, err := l.Append([]Entry{e}, false)
				if err != nil || pos[0].Err != nil || pos[0].Duplicate {
					b.Errorf("%v %+v", err, pos)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// MaxPayloadSize limits new appends only: records stored under a larger cap
// (or copied from a master with one) stay readable, recoverable and copyable.
func TestPayloadCapIsForNewAppendsOnly(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, Config{Dir: dir})
	big := payloadFor("p", 0, 0, 100<<10)
	mustAppend(t, l, []Entry{{Topic: "p", Payload: big}}, false)
	mustAppend(t, l, []Entry{{Topic: "p", Payload: []byte("small")}}, false)
	raw, err := l.ReadRaw(0, 1<<20)
	must(t, err)
	must(t, l.Close())

	small := Config{Dir: dir, MaxPayloadSize: 1024}
	l = openLog(t, small)
	defer l.Close()
	es, err := l.Read("p", 0, 0, 1<<20)
	if err != nil || len(es) != 2 || !bytes.Equal(es[0].Payload, big) {
		t.Fatalf("reopened with a smaller cap: %d entries, %v", len(es), err)
	}
	if _, err := l.Append([]Entry{{Topic: "p", Payload: make([]byte, 1025)}}, false); !errors.Is(err, ErrInvalidEntry) {
		t.Fatalf("append over the new cap: %v", err)
	}
	slave := openLog(t, Config{Dir: t.TempDir(), MaxPayloadSize: 1024})
	defer slave.Close()
	if end, err := slave.AppendRaw(0, raw, false); err != nil || end != int64(len(raw)) {
		t.Fatalf("copying a record over the slave's cap: %d, %v", end, err)
	}
}

// ReadRawTo appends what ReadRaw returns to the caller's buffer, and
// leaves it as it was on an error.
func TestReadRawToAppends(t *testing.T) {
	l := openLog(t, Config{Dir: t.TempDir()})
	defer l.Close()
	for i := range 20 {
		mustAppend(t, l, []Entry{{Topic: "r", Payload: payloadFor("r", 0, int64(i), 90)}}, false)
	}
	want, err := l.ReadRaw(0, 1000)
	must(t, err)
	buf := append(make([]byte, 0, 8), "head"...)
	got, err := l.ReadRawTo(buf, 0, 1000)
	must(t, err)
	if string(got[:4]) != "head" || !bytes.Equal(got[4:], want) {
		t.Fatalf("ReadRawTo: %d bytes after the prefix, ReadRaw %d; prefix %q", len(got)-4, len(want), got[:4])
	}
	got, err = l.ReadRawTo(buf, l.EndOffset()+1, 1000)
	if !errors.Is(err, ErrOutOfRange) || string(got) != "head" {
		t.Fatalf("past the end: %q, %v", got, err)
	}
}

// ReadAppend hands each entry to emit while its payload lies in the
// caller's buffer past what emit appended so far: an emit that writes a
// 32-byte header and then the payload, in place, gets every payload intact,
// across runs broken by other queues' records and by segments, with the
// shortest topic (the shortest stored header) and after a prefix the
// caller put in the buffer.
func TestReadAppendRewritesInPlace(t *testing.T) {
	l := openLog(t, Config{Dir: t.TempDir(), SegmentSize: 4 << 10})
	defer l.Close()
	var want [][]byte
	for i := range 60 {
		p := payloadFor("a", 0, int64(i), 24+i*37%300)
		want = append(want, p)
		batch := []Entry{{Topic: "a", Payload: p}}
		if i%7 == 3 {
			batch = append(batch, Entry{Topic: "a", Queue: 1, Payload: payloadFor("a", 1, int64(i), 50)})
		}
		mustAppend(t, l, batch, false)
	}
	for _, from := range []int64{0, 17} {
		var header [32]byte
		got, err := l.ReadAppend([]byte("head"), "a", 0, from, 1<<30, func(dst []byte, e StoredEntry) []byte {
			binary.BigEndian.PutUint64(header[:], uint64(e.QueueOffset))
			dst = append(dst, header[:]...)
			return append(dst, e.Payload...)
		})
		must(t, err)
		if string(got[:4]) != "head" {
			t.Fatalf("from %d: the caller's prefix became %q", from, got[:4])
		}
		rest := got[4:]
		for i := from; i < int64(len(want)); i++ {
			if len(rest) < 32 || int64(binary.BigEndian.Uint64(rest)) != i {
				t.Fatalf("from %d: entry %d missing or out of place", from, i)
			}
			p := want[i]
			if !bytes.Equal(rest[32:32+len(p)], p) {
				t.Fatalf("from %d: entry %d's payload damaged: %q", from, i, rest[32:min(len(rest), 48)])
			}
			rest = rest[32+len(p):]
		}
		if len(rest) != 0 {
			t.Fatalf("from %d: %d bytes past the last entry", from, len(rest))
		}
	}
}

// BenchmarkAppendRaw appends a master's log to a slave's as HA sync does:
// raw answers of about 800 KiB (1 KiB entries over 8 queues), each checked
// and indexed record by record.
func BenchmarkAppendRaw(b *testing.B) {
	const entries, chunk = 1 << 15, 800 << 10
	master := openLog(b, Config{Dir: b.TempDir(), SegmentSize: 256 << 20, Pretouch: -1})
	defer master.Close()
	batch := make([]Entry, 64)
	for i := 0; i < entries; i += len(batch) {
		for j := range batch {
			batch[j] = Entry{Topic: "bench", Queue: uint32(j % 8), Payload: make([]byte, 1024)}
		}
		mustAppend(b, master, batch, false)
	}
	var chunks [][]byte
	for at := int64(0); at < master.EndOffset(); {
		raw, err := master.ReadRaw(at, chunk)
		if err != nil {
			b.Fatal(err)
		}
		chunks = append(chunks, raw)
		at += int64(len(raw))
	}
	var slave *Log
	next := len(chunks)
	b.SetBytes(int64(len(chunks[0])))
	b.ResetTimer()
	for range b.N {
		if next == len(chunks) {
			b.StopTimer()
			if slave != nil {
				_ = slave.Close()
			}
			slave = openLog(b, Config{Dir: b.TempDir(), SegmentSize: 256 << 20, Pretouch: -1})
			next = 0
			b.StartTimer()
		}
		if _, err := slave.AppendRaw(slave.EndOffset(), chunks[next], false); err != nil {
			b.Fatal(err)
		}
		next++
	}
	b.StopTimer()
	_ = slave.Close()
}
