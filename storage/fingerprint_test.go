package storage

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// testFingerprint is the Config.Fingerprint of the tests: the 4 bytes
// before a payload's last 8, where fpPayload puts them.
func testFingerprint(p []byte) uint32 {
	if len(p) < 12 {
		return 0
	}
	return binary.BigEndian.Uint32(p[len(p)-12:])
}

// fpPayload is payloadFor("ix", ...) carrying fingerprint fp.
func fpPayload(q uint32, qo int64, fp uint32, size int) []byte {
	p := payloadFor("ix", q, qo, max(size, 40))
	binary.BigEndian.PutUint32(p[len(p)-12:], fp)
	return p
}

// fpLog is a queue model: each queue's fingerprints, positions and
// payloads by queue offset.
type fpLog struct {
	fps  map[uint32][]uint32
	pos  map[uint32][]Position
	body map[uint32][][]byte
}

func newFPLog() *fpLog {
	return &fpLog{fps: map[uint32][]uint32{}, pos: map[uint32][]Position{}, body: map[uint32][][]byte{}}
}

// add appends a record of size bytes with fingerprint fp to queue q.
func (m *fpLog) add(t fatalHelper, l *Log, q uint32, fp uint32, size int) {
	t.Helper()
	p := fpPayload(q, int64(len(m.fps[q])), fp, size)
	pos, err := l.Append([]Entry{{Topic: "ix", Queue: q, Payload: p}}, false)
	if err != nil {
		t.Fatal("append:", err)
	}
	m.fps[q] = append(m.fps[q], fp)
	m.pos[q] = append(m.pos[q], pos[0])
	m.body[q] = append(m.body[q], p)
}

// checkFingerprints reads every queue whole and checks that each entry
// carries its record's fingerprint, and that CountMatching counts by them.
func checkFingerprints(t testing.TB, l *Log, m *fpLog) {
	t.Helper()
	for q, want := range m.fps {
		for off := int64(0); off < int64(len(want)); {
			got, err := l.Read("ix", q, off, 4<<10)
			if err != nil || len(got) == 0 {
				t.Fatalf("queue %d read at %d: %d entries, %v", q, off, len(got), err)
			}
			for _, e := range got {
				if e.QueueOffset != off || e.Fingerprint != want[off] || testFingerprint(e.Payload) != want[off] {
					t.Fatalf("queue %d offset %d: read offset %d fingerprint %#x, want %#x", q, off, e.QueueOffset, e.Fingerprint, want[off])
				}
				off++
			}
		}
		for _, fp := range []uint32{1, 2, 3} {
			wantN := int64(0)
			for _, f := range want {
				if f == fp {
					wantN++
				}
			}
			n, to, err := l.CountMatching("ix", q, 0, math.MaxInt64, func(f uint32) bool { return f == fp }, math.MaxInt)
			if err != nil || n != wantN || to != int64(len(want)) {
				t.Fatalf("queue %d: CountMatching fingerprint %d = %d up to %d, %v; want %d up to %d", q, fp, n, to, err, wantN, len(want))
			}
		}
	}
}

// Fingerprints reach the index through every path that indexes a record:
// appends, a slave's raw appends, index chunks read back, a rebuild after
// the index directory is removed, and the recovery of an unindexed tail.
func TestFingerprintsSurviveEveryPath(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 32 << 10, IndexChunkBytes: 4 << 10, FlushInterval: time.Hour, Fingerprint: testFingerprint}
	l := openLog(t, cfg)
	m := newFPLog()
	for i := range 600 {
		m.add(t, l, uint32(i%3), uint32(1+i*7%3), 60+i%50)
	}
	must(t, l.Flush())
	waitIndexed(t, l)
	if st := l.IndexStats(); st.Chunks == 0 || st.TailEntries == 0 {
		t.Fatalf("want entries both in chunks and in the tail: %+v", st)
	}
	checkFingerprints(t, l, m) // appends, tail and chunks

	slave := openLog(t, Config{Dir: t.TempDir(), Fingerprint: testFingerprint})
	copyLog(t, l, slave, 3<<10)
	checkFingerprints(t, slave, m) // raw appends
	must(t, slave.Close())

	crash(l) // the records past the last chunk are the unindexed tail
	l = openLog(t, cfg)
	if st := l.IndexStats(); st.TailEntries == 0 {
		t.Fatalf("no unindexed tail recovered: %+v", st)
	}
	checkFingerprints(t, l, m)
	must(t, l.Close())

	l = openLog(t, cfg) // all in chunks
	if st := l.IndexStats(); st.TailEntries != 0 {
		t.Fatalf("after a clean close the index is not all in chunks: %+v", st)
	}
	checkFingerprints(t, l, m)
	must(t, l.Close())

	must(t, os.RemoveAll(filepath.Join(dir, indexDirName)))
	l = openLog(t, cfg) // rebuilt from every record
	defer l.Close()
	checkFingerprints(t, l, m)
}

// An index chunk of version 1 (entries of 12 bytes, without fingerprints)
// is dropped, and Open rebuilds the index, fingerprints included, from the
// log.
func TestVersion1IndexChunksAreRebuilt(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, IndexChunkBytes: 4 << 10, Fingerprint: testFingerprint}
	l := openLog(t, cfg)
	m := newFPLog()
	for i := range 300 {
		m.add(t, l, uint32(i%2), uint32(1+i%3), 80)
	}
	must(t, l.Close())

	names, err := os.ReadDir(filepath.Join(dir, indexDirName))
	must(t, err)
	if len(names) < 2 {
		t.Fatalf("%d index chunks, want several", len(names))
	}
	for _, n := range names {
		writeVersion1(t, filepath.Join(dir, indexDirName, n.Name()))
	}

	l, read := openCountingReads(t, cfg)
	defer l.Close()
	if n := read.Load(); n < l.EndOffset() {
		t.Fatalf("Open read %d bytes of a log of %d: it did not rebuild the index", n, l.EndOffset())
	}
	checkFingerprints(t, l, m)
	must(t, l.Close())
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, indexDirName, n.Name()))
		if err == nil && binary.BigEndian.Uint16(b[4:]) != 2 {
			t.Fatalf("%s is still of version %d", n.Name(), binary.BigEndian.Uint16(b[4:]))
		}
	}
}

// writeVersion1 rewrites an index chunk file in the layout of version 1:
// the same header, directory and snapshot, entries without fingerprints,
// the CRCs made right.
func writeVersion1(t *testing.T, name string) {
	t.Helper()
	b, err := os.ReadFile(name)
	must(t, err)
	dirLen := int(binary.BigEndian.Uint32(b[48:]))
	n := int(binary.BigEndian.Uint64(b[40:]))
	entriesAt := indexHeaderSize + dirLen
	out := slices.Clone(b[:entriesAt])
	binary.BigEndian.PutUint16(out[4:], 1)
	for i := range n {
		e := b[entriesAt+i*indexEntrySize:]
		out = append(out, e[:12]...)
	}
	binary.BigEndian.PutUint32(out[60:], crc32.Checksum(out[entriesAt:], castagnoli))
	out = append(out, b[entriesAt+n*indexEntrySize:]...)
	hc := crc32.Update(crc32.Checksum(out[:56], castagnoli), castagnoli, out[indexHeaderSize:entriesAt])
	binary.BigEndian.PutUint32(out[56:], hc)
	must(t, os.WriteFile(name, out, 0o644))
}

// readAll reads queue q with ReadMatching from offset until it answers
// nothing, maxBytes at a time, and returns the entries and the final next.
func readAll(t *testing.T, l *Log, q uint32, offset int64, maxBytes int, stopAt int64, want func(uint32) bool) ([]StoredEntry, int64) {
	t.Helper()
	var out []StoredEntry
	for {
		var got []StoredEntry
		_, next, err := l.ReadMatching(nil, "ix", q, offset, maxBytes, stopAt, want, func(dst []byte, e StoredEntry) []byte {
			e.Payload = slices.Clone(e.Payload)
			got = append(got, e)
			return dst
		})
		if err != nil {
			t.Fatalf("ReadMatching from %d: %v", offset, err)
		}
		if next < offset || next == offset && len(got) > 0 {
			t.Fatalf("ReadMatching from %d: next %d after %d entries", offset, next, len(got))
		}
		out = append(out, got...)
		if next == offset {
			return out, next
		}
		offset = next
	}
}

// ReadMatching skips the entries its filter rejects by the index alone:
// those records are corrupt on disk, and it reads the others through the
// tail and through a chunk file all the same; next passes trailing skipped
// entries, and stopAt ends a read at a log offset.
func TestReadMatchingSkipsByTheIndexAlone(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, IndexChunkBytes: 1 << 30, Fingerprint: testFingerprint}
	l := openLog(t, cfg)
	m := newFPLog()
	const n = 1500
	for i := range n {
		fp := uint32(2)
		if i%10 == 3 || i < 2 {
			fp = 1
		}
		m.add(t, l, 0, fp, 5000) // records farther apart than readGap
	}
	for i, fp := range m.fps[0] {
		if fp != 1 && i != n-1 { // the last record is left whole for the reopen
			p := m.pos[0][i]
			path, off := locate(t, dir, p.LogOffset)
			writeAt(t, path, off, make([]byte, p.End-p.LogOffset)) // a record of length 0: corrupt
		}
	}
	var ce *CorruptError
	if _, err := l.ReadAppend(nil, "ix", 0, 2, 1<<20, func(dst []byte, _ StoredEntry) []byte { return dst }); !errors.As(err, &ce) {
		t.Fatalf("reading a corrupted record: %v, want a *CorruptError", err)
	}
	matching := func(fp uint32) bool { return fp == 1 }
	check := func(where string) {
		t.Helper()
		for _, maxBytes := range []int{1, 6000, 20000, 1 << 20} {
			got, next := readAll(t, l, 0, 0, maxBytes, -1, matching)
			var qos []int64
			for _, e := range got {
				if e.Fingerprint != 1 || string(e.Payload) != string(m.body[0][e.QueueOffset]) {
					t.Fatalf("%s: entry %d fingerprint %d, payload %q", where, e.QueueOffset, e.Fingerprint, e.Payload[:12])
				}
				qos = append(qos, e.QueueOffset)
			}
			var want []int64
			for i, fp := range m.fps[0] {
				if fp == 1 {
					want = append(want, int64(i))
				}
			}
			if !slices.Equal(qos, want) || next != n {
				t.Fatalf("%s, maxBytes %d: read %v up to %d, want %v up to %d", where, maxBytes, qos, next, want, n)
			}
		}
		// Trailing skipped entries: next passes them.
		got, next := readAll(t, l, 0, n-6, 1<<20, -1, matching)
		if len(got) != 0 || next != n {
			t.Fatalf("%s: nothing matches from %d: %d entries, next %d, want %d", where, n-6, len(got), next, n)
		}
		// stopAt at a skipped entry and at a matching one.
		for _, stop := range []int64{17, 23, 1} {
			got, next := readAll(t, l, 0, 0, 1<<20, m.pos[0][stop].LogOffset, matching)
			var qos []int64
			for _, e := range got {
				qos = append(qos, e.QueueOffset)
			}
			want := []int64{0, 1, 3, 13}
			want = slices.DeleteFunc(want, func(qo int64) bool { return qo >= stop })
			if !slices.Equal(qos, want) || next != stop {
				t.Fatalf("%s: stopAt the entry %d: read %v up to %d, want %v up to %d", where, stop, qos, next, want, stop)
			}
		}
		// stopAt inside the record of entry 50, and past the end.
		if _, next := readAll(t, l, 0, 0, 1<<20, m.pos[0][50].LogOffset+1, matching); next != 51 {
			t.Fatalf("%s: stopAt inside entry 50's record: next %d, want 51", where, next)
		}
		if _, next := readAll(t, l, 0, 0, 1<<20, l.EndOffset()+100, matching); next != n {
			t.Fatalf("%s: stopAt past the end: next %d, want %d", where, next, n)
		}
	}
	check("tail")
	must(t, l.Close())
	l = openLog(t, cfg)
	defer l.Close()
	if st := l.IndexStats(); st.TailEntries != 0 {
		t.Fatalf("the index is not all in chunks: %+v", st)
	}
	check("chunk")
}

// One read looks at a bounded number of entries: ReadMatching stops after
// maxSkipScan when nothing matches and says where.
func TestReadMatchingScanIsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("appends maxSkipScan records")
	}
	cfg := Config{Dir: t.TempDir(), IndexChunkBytes: 1 << 20, Fingerprint: testFingerprint}
	l := openLog(t, cfg)
	defer l.Close()
	const batch = 4096
	entries := make([]Entry, batch)
	for i := range entries {
		entries[i] = Entry{Topic: "ix", Payload: make([]byte, 12)}
	}
	total := int64(0)
	for total < maxSkipScan+10 {
		mustAppend(t, l, entries, false)
		total += batch
	}
	must(t, l.Flush())
	waitIndexed(t, l)
	none := func(uint32) bool { return false }
	for _, from := range []int64{0, 5} {
		_, next, err := l.ReadMatching(nil, "ix", 0, from, 1<<20, -1, none, func(dst []byte, _ StoredEntry) []byte { return dst })
		if err != nil || next != from+maxSkipScan {
			t.Fatalf("from %d, nothing matching: next %d, %v; want %d", from, next, err, from+maxSkipScan)
		}
	}
	if n, to, err := l.CountMatching("ix", 0, 0, total, none, maxSkipScan); err != nil || n != 0 || to != maxSkipScan {
		t.Fatalf("CountMatching up to %d: %d up to %d, %v; want 0 up to %d", total, n, to, err, maxSkipScan)
	}
}

// fpModelRead is what ReadMatching (looking at most at maxScan entries)
// answers by the model: the queue offsets read and next.
func fpModelRead(fps []uint32, pos []Position, offset int64, maxBytes int, stopAt int64, want func(uint32) bool, maxScan int) ([]int64, int64) {
	var out []int64
	total := 0
	looked := 0
	qo := offset
	for ; qo < int64(len(fps)); qo++ {
		if stopAt >= 0 && pos[qo].LogOffset >= stopAt || want != nil && looked == maxScan {
			break
		}
		if want == nil || want(fps[qo]) {
			size := int(pos[qo].End - pos[qo].LogOffset)
			if len(out) > 0 && total+size > maxBytes {
				break
			}
			out = append(out, qo)
			total += size
		}
		looked++
	}
	return out, max(qo, offset)
}

// ReadMatching and CountMatching answer what a model (a slice of
// fingerprints) does, for random fingerprints, filters, sizes, offsets,
// stops and scan bounds, over entries in chunk files and in the tail.
func TestReadMatchingModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		dir, err := os.MkdirTemp("", "fpmodel")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(dir)
		cfg := Config{Dir: dir, IndexChunkBytes: int64(rapid.IntRange(1<<10, 8<<10).Draw(rt, "chunk")), FlushInterval: time.Hour, Fingerprint: testFingerprint}
		l, err := Open(cfg)
		if err != nil {
			rt.Fatal(err)
		}
		defer func() { _ = l.Close() }()
		m := newFPLog()
		n := rapid.IntRange(1, 250).Draw(rt, "n")
		for range n {
			q := uint32(rapid.IntRange(0, 1).Draw(rt, "queue"))
			m.add(rt, l, q, uint32(rapid.IntRange(0, 3).Draw(rt, "fp")), rapid.IntRange(40, 300).Draw(rt, "size"))
		}
		if rapid.Bool().Draw(rt, "indexed") {
			if err := l.Flush(); err != nil {
				rt.Fatal(err)
			}
			waitIndexed(t, l)
		}
		if rapid.Bool().Draw(rt, "reopen") {
			if err := l.Close(); err != nil {
				rt.Fatal(err)
			}
			if l, err = Open(cfg); err != nil {
				rt.Fatal(err)
			}
		}
		for range 20 {
			q := uint32(rapid.IntRange(0, 1).Draw(rt, "read queue"))
			fps, pos := m.fps[q], m.pos[q]
			var want func(uint32) bool
			if set := rapid.IntRange(0, 16).Draw(rt, "want set"); set < 16 {
				want = func(fp uint32) bool { return set&(1<<fp) != 0 }
			}
			offset := int64(rapid.IntRange(0, len(fps)+1).Draw(rt, "offset"))
			maxBytes := rapid.IntRange(1, 3000).Draw(rt, "maxBytes")
			maxScan := rapid.IntRange(1, 300).Draw(rt, "maxScan")
			stopAt := int64(-1)
			if len(pos) > 0 && rapid.Bool().Draw(rt, "stop") {
				i := rapid.IntRange(0, len(pos)-1).Draw(rt, "stop entry")
				stopAt = pos[i].LogOffset + int64(rapid.IntRange(0, 1).Draw(rt, "stop inside"))
			}
			var got []int64
			_, next, err := l.read(nil, "ix", q, offset, maxBytes, stopAt, want, maxScan, func(dst []byte, e StoredEntry) []byte {
				if e.Fingerprint != fps[e.QueueOffset] || string(e.Payload) != string(m.body[q][e.QueueOffset]) {
					rt.Fatalf("entry %d: fingerprint %d, want %d, or a wrong payload", e.QueueOffset, e.Fingerprint, fps[e.QueueOffset])
				}
				got = append(got, e.QueueOffset)
				return dst
			})
			if err != nil {
				rt.Fatalf("read: %v", err)
			}
			wantQOs, wantNext := fpModelRead(fps, pos, offset, maxBytes, stopAt, want, maxScan)
			if !slices.Equal(got, wantQOs) || next != wantNext {
				rt.Fatalf("queue %d from %d (maxBytes %d, stopAt %d, maxScan %d): read %v up to %d, want %v up to %d",
					q, offset, maxBytes, stopAt, maxScan, got, next, wantQOs, wantNext)
			}

			from := int64(rapid.IntRange(0, len(fps)+1).Draw(rt, "count from"))
			to := int64(rapid.IntRange(0, len(fps)+2).Draw(rt, "count to"))
			cnt, scanned, err := l.CountMatching("ix", q, from, to, want, maxScan)
			wantN, wantTo := int64(0), from
			for qo := from; qo < min(to, int64(len(fps))) && (want == nil || qo-from < int64(maxScan)); qo++ {
				if want == nil || want(fps[qo]) {
					wantN++
				}
				wantTo = qo + 1
			}
			if err != nil || cnt != wantN || scanned != wantTo {
				rt.Fatalf("CountMatching queue %d [%d,%d) maxScan %d: %d up to %d, %v; want %d up to %d", q, from, to, maxScan, cnt, scanned, err, wantN, wantTo)
			}
		}
	})
}

// BenchmarkReadMatchingSkip reads a queue of 64k small records whole with
// ReadMatching, its entries in the tail or in chunk files, 10% or none of
// them matching, and reports the time per entry scanned (none: the cost
// of skipping alone).
func BenchmarkReadMatchingSkip(b *testing.B) {
	const n = 1 << 16
	for _, where := range []string{"tail", "chunk"} {
		cfg := Config{Dir: b.TempDir(), IndexChunkBytes: 1 << 30, Fingerprint: testFingerprint}
		if where == "chunk" {
			cfg.IndexChunkBytes = 1 << 20
		}
		l := openLog(b, cfg)
		const batch = 1024
		for i := 0; i < n; i += batch {
			es := make([]Entry, batch)
			for j := range es {
				fp := uint32(2)
				if (i+j)%10 == 0 {
					fp = 1
				}
				es[j] = Entry{Topic: "ix", Payload: fpPayload(0, int64(i+j), fp, 40)}
			}
			mustAppend(b, l, es, false)
		}
		must(b, l.Close())
		if where == "tail" {
			must(b, os.RemoveAll(filepath.Join(cfg.Dir, indexDirName)))
			cfg.IndexChunkBytes = 1 << 30 // Open indexes the whole log in memory
		}
		l = openLog(b, cfg)
		if st := l.IndexStats(); where == "tail" && st.TailEntries != n || where == "chunk" && st.TailEntries != 0 {
			b.Fatalf("%s: %+v", where, st)
		}
		for _, match := range []string{"10pct", "none"} {
			want := func(fp uint32) bool { return fp == 1 }
			if match == "none" {
				want = func(fp uint32) bool { return fp == 3 }
			}
			b.Run(where+"/"+match, func(b *testing.B) {
				buf := make([]byte, 0, 128<<10)
				emit := func(dst []byte, e StoredEntry) []byte { return append(dst, e.Payload...) }
				for b.Loop() {
					for off := int64(0); off < n; {
						out, next, err := l.ReadMatching(buf[:0], "ix", 0, off, 64<<10, -1, want, emit)
						if err != nil {
							b.Fatal(err)
						}
						buf, off = out, next
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/entry")
			})
		}
		must(b, l.Close())
	}
}
