package storage

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/storage/vfs"
)

// testLookupKeys is the Config.LookupKeys of the tests: a payload
// "K<key>|<key>|...#<anything>" has those keys; any other has none.
func testLookupKeys(p []byte, add func([]byte)) {
	if len(p) == 0 || p[0] != 'K' {
		return
	}
	p = p[1:]
	if i := bytes.IndexByte(p, '#'); i >= 0 {
		p = p[:i]
	}
	for k := range bytes.SplitSeq(p, []byte("|")) {
		if len(k) > 0 {
			add(k)
		}
	}
}

// keyedPayload is a payload of about size bytes with these keys.
func keyedPayload(keys []string, size int) []byte {
	p := []byte("K" + strings.Join(keys, "|") + "#")
	return append(p, bytes.Repeat([]byte{'.'}, max(size-len(p), 1))...)
}

// keyTB is what testing.TB and *rapid.T have in common that the key
// tests' helpers use.
type keyTB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

func noErr(t keyTB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// keyRec is a record the key tests appended.
type keyRec struct {
	at, time int64
	keys     []string
}

// keyModel is what the tests appended, in log order.
type keyModel struct{ recs []keyRec }

// want is what walking a lookup to its end must give: the offsets of the
// records holding key in the window, at or past start, newest first.
func (m *keyModel) want(key string, since, until, start int64) []int64 {
	var out []int64
	for i := len(m.recs) - 1; i >= 0; i-- {
		r := m.recs[i]
		if r.at >= start && r.time >= since && (until == 0 || r.time < until) && slices.Contains(r.keys, key) {
			out = append(out, r.at)
		}
	}
	return out
}

// walk pages through a lookup to its end and checks each page's promises:
// offsets newest first, below the cursor, at most Limit, a cursor that
// goes down.
func walk(t keyTB, l *Log, q LookupQuery) []int64 {
	t.Helper()
	var all []int64
	for range 100000 {
		res, err := l.Lookup(q)
		if err != nil {
			t.Fatalf("lookup %+v: %v", q, err)
		}
		if len(res.Offsets) > max(q.Limit, 1) {
			t.Fatalf("lookup %+v: %d offsets, over the limit", q, len(res.Offsets))
		}
		for _, o := range res.Offsets {
			if q.Before > 0 && o >= q.Before || len(all) > 0 && o >= all[len(all)-1] {
				t.Fatalf("lookup %+v: offset %d out of order after %v", q, o, all)
			}
			all = append(all, o)
		}
		if res.Next == 0 {
			return all
		}
		if q.Before > 0 && res.Next >= q.Before {
			t.Fatalf("lookup %+v: the cursor did not go down: next %d", q, res.Next)
		}
		q.Before = res.Next
	}
	t.Fatalf("lookup %+v: never ends", q)
	return nil
}

func keyConfig(dir string, now *int64) Config {
	return Config{
		Dir: dir, IndexChunkBytes: 2 << 10, SegmentSize: 4 << 10, FlushInterval: time.Hour,
		LookupKeys: testLookupKeys,
		Now:        func() time.Time { return time.UnixMilli(*now) },
	}
}

// appendKeyed appends one record with keys at store time now.
func (m *keyModel) appendKeyed(t keyTB, l *Log, now *int64, tm int64, keys []string, size int) {
	t.Helper()
	*now = tm
	pos, err := l.Append([]Entry{{Topic: "kx", Queue: uint32(len(m.recs) % 3), Payload: keyedPayload(keys, size)}}, false)
	noErr(t, err)
	m.recs = append(m.recs, keyRec{at: pos[0].LogOffset, time: tm, keys: keys})
}

// Walking a lookup to its end, in pages of random Limit and MaxBytes,
// gives exactly the offsets of the records holding the key in the window
// (a model's), newest first, none twice, over the tail and chunks (with
// and without key tables), across reopens and retention.
func TestLookupModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		dir, err := os.MkdirTemp("", "keymodel")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(dir)
		var now int64
		cfg := keyConfig(dir, &now)
		cfg.IndexChunkBytes = int64(rapid.IntRange(1<<10, 8<<10).Draw(rt, "chunk"))
		l, err := Open(cfg)
		if err != nil {
			rt.Fatal(err)
		}
		defer func() { _ = l.Close() }()
		keys := []string{"a", "b", "c", "order-17", "i:x"}
		var m keyModel
		start := int64(0)
		for range rapid.IntRange(1, 6).Draw(rt, "rounds") {
			for range rapid.IntRange(0, 60).Draw(rt, "n") {
				ks := rapid.SliceOfN(rapid.SampledFrom(keys), 0, 3).Draw(rt, "keys")
				m.appendKeyed(rt, l, &now, int64(rapid.IntRange(0, 100).Draw(rt, "time")), ks, rapid.IntRange(10, 400).Draw(rt, "size"))
			}
			switch rapid.IntRange(0, 4).Draw(rt, "then") {
			case 1:
				noErr(rt, l.Flush())
				waitIndexed(t, l)
			case 2:
				noErr(rt, l.Close())
				if rapid.Bool().Draw(rt, "drop key tables") {
					removeKeyTables(rt, dir)
				}
				if l, err = Open(cfg); err != nil {
					rt.Fatal(err)
				}
			case 3:
				noErr(rt, l.Flush())
				if start, err = l.DeleteBefore(int64(rapid.IntRange(0, int(l.EndOffset())).Draw(rt, "delete before"))); err != nil {
					rt.Fatal(err)
				}
			}
			for range 5 {
				key := rapid.SampledFrom(append(keys, "none")).Draw(rt, "key")
				since := int64(rapid.IntRange(-1, 101).Draw(rt, "since"))
				until := int64(rapid.IntRange(0, 102).Draw(rt, "until"))
				q := LookupQuery{Key: []byte(key), Since: since, Until: until,
					Limit: rapid.IntRange(0, 7).Draw(rt, "limit"), MaxBytes: int64(rapid.IntRange(0, 9000).Draw(rt, "max bytes"))}
				got, want := walk(rt, l, q), m.want(key, since, until, start)
				if !slices.Equal(got, want) {
					rt.Fatalf("lookup %+v: got %v, want %v", q, got, want)
				}
			}
		}
	})
}

// removeKeyTables removes every key table of the log in dir.
func removeKeyTables(t keyTB, dir string) int {
	t.Helper()
	names, _ := filepath.Glob(filepath.Join(dir, indexDirName, "*"+keysFileSuffix))
	for _, n := range names {
		noErr(t, os.Remove(n))
	}
	return len(names)
}

// fillKeyed appends n records, record i holding key "k<i%distinct>", at
// store time i.
// closedKeyedLog writes 200 records of 7 keys into a new log with key tables
// and closes it; it returns the log's config and what it holds.
func closedKeyedLog(t *testing.T) (Config, *keyModel) {
	t.Helper()
	now := new(int64)
	cfg := keyConfig(t.TempDir(), now)
	l := openLog(t, cfg)
	m := fillKeyed(t, l, now, 200, 7)
	must(t, l.Close())
	return cfg, m
}

func fillKeyed(t testing.TB, l *Log, now *int64, n, distinct int) *keyModel {
	t.Helper()
	var m keyModel
	for i := range n {
		m.appendKeyed(t, l, now, int64(i), []string{fmt.Sprintf("k%d", i%distinct)}, 200)
	}
	return &m
}

// checkLookups checks a walk of every key of fillKeyed against the model.
func checkLookups(t testing.TB, l *Log, m *keyModel, distinct int, start int64) {
	t.Helper()
	for d := range distinct {
		key := fmt.Sprintf("k%d", d)
		if got, want := walk(t, l, LookupQuery{Key: []byte(key), Limit: 3}), m.want(key, 0, 0, start); !slices.Equal(got, want) {
			t.Fatalf("lookup %s: got %v, want %v", key, got, want)
		}
	}
}

// A reopened log finds records through the key tables its chunks got,
// reading no record.
func TestKeyTablesSurviveReopen(t *testing.T) {
	cfg, m := closedKeyedLog(t)
	cfg.FS = vfs.NewErrorFS(vfs.Default)
	l, reads := openCountingReads(t, cfg)
	defer l.Close()
	st := l.IndexStats()
	if st.Chunks < 5 || st.KeyTables != st.Chunks || st.KeyRefs != 0 {
		t.Fatalf("after a clean close: %+v, want a key table per chunk and no ref in memory", st)
	}
	before := reads.Load()
	checkLookups(t, l, m, 7, 0)
	if n := reads.Load() - before; n != 0 {
		t.Fatalf("lookups read %d bytes of segments, want none", n)
	}
	// A key no record holds: the bloom filters answer (one false positive
	// allowed, which reads a page).
	var meta int64
	l.mu.RLock()
	for _, c := range l.chunks {
		meta += c.keys.Load().metaLen()
	}
	l.mu.RUnlock()
	res, err := l.Lookup(LookupQuery{Key: []byte("nobody"), Limit: 1})
	if err != nil || len(res.Offsets) != 0 || res.ScannedBytes > meta+keyPagePairs*keyPairSize {
		t.Fatalf("lookup of an absent key: %+v, %v; want nothing, reading about %d bytes", res, err, meta)
	}
}

// A slave, whose log is its master's bytes copied with AppendRaw, finds
// the same records by key, before and after its chunks are written.
func TestLookupAfterAppendRaw(t *testing.T) {
	var now int64
	master := openLog(t, keyConfig(t.TempDir(), &now))
	defer master.Close()
	m := fillKeyed(t, master, &now, 120, 4)
	slave := openLog(t, keyConfig(t.TempDir(), &now))
	defer slave.Close()
	raw := rawFrom(t, master, 0)
	for off := 0; off < len(raw); {
		// A few whole records at a time (at most 900 bytes, or one).
		b := raw[off:]
		k := 0
		for k < len(b) {
			rl, err := recordLen(b[k:], maxRecordSize)
			must(t, err)
			if k > 0 && k+rl > 900 {
				break
			}
			k += rl
		}
		if _, err := slave.AppendRaw(int64(off), b[:k], false); err != nil {
			t.Fatal(err)
		}
		off += k
	}
	checkLookups(t, slave, m, 4, 0)
	must(t, slave.Flush())
	waitIndexed(t, slave)
	checkLookups(t, slave, m, 4, 0)
}

// A missing key table and one that does not check out fail neither Open
// nor a lookup: the lookup scans their chunks, and the indexer writes them
// again after Open.
func TestMissingOrBadKeyTableIsScannedAndRebuilt(t *testing.T) {
	cfg, m := closedKeyedLog(t)
	names, _ := filepath.Glob(filepath.Join(cfg.Dir, indexDirName, "*"+keysFileSuffix))
	slices.Sort(names)
	must(t, os.Remove(names[1]))
	// A bad page (past the header and bloom filter, so Open takes it):
	// the first lookup that reads it finds out.
	b, err := os.ReadFile(names[2])
	must(t, err)
	b[len(b)-5] ^= 0xff
	must(t, os.WriteFile(names[2], b, 0o644))
	// A bad header: Open drops it.
	b, err = os.ReadFile(names[3])
	must(t, err)
	b[9] ^= 0xff
	must(t, os.WriteFile(names[3], b, 0o644))

	l := openLog(t, cfg)
	defer l.Close()
	checkLookups(t, l, m, 7, 0)
	testwait.For(t, 10*time.Second, "the key tables to be rebuilt", func() bool {
		st := l.IndexStats()
		return st.KeyTables == st.Chunks
	})
	for _, n := range names[1:4] {
		if _, err := readKeyTableFile(t, n, l); err != nil {
			t.Fatalf("%s after the rebuild: %v", n, err)
		}
	}
	checkLookups(t, l, m, 7, 0)
}

// readKeyTableFile reads the key table at name of l's chunk and all of its
// pages, checking each.
func readKeyTableFile(t testing.TB, name string, l *Log) (*keyTable, error) {
	t.Helper()
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, c := range l.chunks {
		if keyTableName(l.cfg.Dir, c.from) != name {
			continue
		}
		kt, err := readKeyTable(l.fs, name, c.from, c.to, c.last)
		if err != nil {
			return nil, err
		}
		defer kt.f.close()
		_, fences, err := kt.readMeta(new([]byte))
		for i := range fences.len() {
			if err == nil {
				_, err = kt.readPage(int64(i), fences.at(i))
			}
		}
		return kt, err
	}
	return nil, errors.New("no chunk of that name")
}

// Retention removes the key tables of the chunks it removes and the refs
// of the records it deletes, and a lookup returns no deleted record;
// truncation removes the key tables and refs past the cut.
func TestKeyTablesFollowRetentionAndTruncation(t *testing.T) {
	dir := t.TempDir()
	var now int64
	cfg := keyConfig(dir, &now)
	l := openLog(t, cfg)
	defer l.Close()
	m := fillKeyed(t, l, &now, 300, 5)
	must(t, l.Flush())
	waitIndexed(t, l)
	before := l.IndexStats()
	start, err := l.DeleteBefore(l.EndOffset() / 2)
	must(t, err)
	after := l.IndexStats()
	tables, _ := filepath.Glob(filepath.Join(dir, indexDirName, "*"+keysFileSuffix))
	if after.Chunks >= before.Chunks || len(tables) != after.Chunks || after.KeyTables != after.Chunks {
		t.Fatalf("after retention to %d: %+v (before %+v), %d key table files", start, after, before, len(tables))
	}
	checkLookups(t, l, m, 5, start)

	// Retention past every chunk drops refs of the tail too.
	m2 := fillKeyed(t, l, &now, 30, 5)
	m.recs = append(m.recs, m2.recs...)
	must(t, l.Flush())
	start, err = l.DeleteBefore(l.EndOffset())
	must(t, err)
	l.mu.RLock()
	for i := range l.keys.n {
		if r := l.keys.at(i); r.at < start {
			t.Errorf("retention to %d kept the ref of the record at %d", start, r.at)
		}
	}
	l.mu.RUnlock()
	checkLookups(t, l, m, 5, start)

	// Truncation: into a chunk, and into the tail.
	m3 := fillKeyed(t, l, &now, 100, 5)
	m.recs = append(m.recs, m3.recs...)
	must(t, l.Flush())
	waitIndexed(t, l)
	for _, back := range []int{90, 3} {
		cut := len(m.recs) - back
		at := m.recs[cut].at
		if _, err := l.Truncate(at, filepath.Join(t.TempDir(), SideFileName(at, 1))); err != nil {
			t.Fatal(err)
		}
		m.recs = m.recs[:cut]
		tables, _ := filepath.Glob(filepath.Join(dir, indexDirName, "*"+keysFileSuffix))
		if st := l.IndexStats(); len(tables) != st.Chunks {
			t.Fatalf("after truncating at %d: %d key tables for %d chunks", at, len(tables), st.Chunks)
		}
		checkLookups(t, l, m, 5, start)
	}
}

// A power loss at any point, a key table write included, loses nothing a
// lookup should find: every record acknowledged as synced is found by its
// key after recovery (and the key tables recovery writes hold it).
func TestPowerLossLosesNoKeyRef(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		mem := vfs.NewMemFS()
		var now int64
		cfg := keyConfig("/data", &now)
		cfg.FS = mem
		cfg.Flush = FlushSync
		cfg.IndexChunkBytes = 1 << 10
		l, err := Open(cfg)
		if err != nil {
			rt.Fatal(err)
		}
		mem.CutPowerAt(int64(rapid.IntRange(1, 150).Draw(rt, "cut at")), vfs.CrashOptions{})
		var m keyModel
		for i := range 60 {
			now = int64(i)
			ks := []string{fmt.Sprintf("k%d", i%4)}
			pos, err := l.Append([]Entry{{Topic: "kx", Payload: keyedPayload(ks, 150)}}, false)
			if err != nil {
				break
			}
			m.recs = append(m.recs, keyRec{at: pos[0].LogOffset, time: now, keys: ks})
		}
		crash(l)
		after := mem.PowerCut()
		if after == nil {
			mem.CancelPowerCut()
			after = mem.CrashClone(vfs.CrashOptions{})
		}
		cfg.FS = after
		if l, err = Open(cfg); err != nil {
			rt.Fatal(err)
		}
		defer l.Close()
		for k := range 4 {
			key := fmt.Sprintf("k%d", k)
			got := walk(rt, l, LookupQuery{Key: []byte(key), Limit: 5})
			for _, at := range m.want(key, 0, 0, 0) {
				if !slices.Contains(got, at) {
					rt.Fatalf("lookup %s after the power loss: %v, lacks %d", key, got, at)
				}
			}
		}
		noErr(rt, l.Flush())
		waitIndexed(t, l)
		if st := l.IndexStats(); st.KeyTables != st.Chunks {
			rt.Fatalf("after recovery: %+v", st)
		}
	})
}

// A key held by many records has its pairs over many pages of a key
// table: a walk in small pages finds them all, newest first, through the
// tables and after a reopen.
func TestLookupAcrossKeyTablePages(t *testing.T) {
	dir := t.TempDir()
	var now int64
	cfg := keyConfig(dir, &now)
	cfg.IndexChunkBytes = 256 << 10
	cfg.SegmentSize = 0
	l := openLog(t, cfg)
	var m keyModel
	for i := range 6000 {
		m.appendKeyed(t, l, &now, int64(i), []string{"hot", fmt.Sprintf("k%d", i%3)}, 60)
	}
	check := func() {
		for _, key := range []string{"hot", "k1"} {
			for _, limit := range []int{7, 1000} {
				q := LookupQuery{Key: []byte(key), Limit: limit, Since: 100, Until: 5900}
				if got, want := walk(t, l, q), m.want(key, 100, 5900, 0); !slices.Equal(got, want) {
					t.Fatalf("lookup %+v: got %d offsets, want %d", q, len(got), len(want))
				}
			}
		}
	}
	check()
	must(t, l.Close())
	l = openLog(t, cfg)
	defer l.Close()
	if st := l.IndexStats(); st.Chunks < 2 || st.KeyTables != st.Chunks {
		t.Fatalf("%+v: want key tables for two chunks or more", st)
	}
	check()
}

// Lookups run alongside appends, chunk writes and retention (under the
// race detector): every offset a lookup returns is a record holding the
// key, unless retention deleted it since.
func TestLookupWhileWriting(t *testing.T) {
	var now int64 // the writer's: lookups do not use store times here
	cfg := keyConfig(t.TempDir(), &now)
	cfg.Now = nil
	l := openLog(t, cfg)
	defer l.Close()
	done := make(chan struct{})
	errs := make(chan error, 1)
	go func() {
		defer close(errs)
		for {
			select {
			case <-done:
				return
			default:
			}
			res, err := l.Lookup(LookupQuery{Key: []byte("k1"), Limit: 1000})
			if err != nil {
				errs <- err
				return
			}
			for _, at := range res.Offsets {
				raw, err := l.ReadRaw(at, 1)
				if errors.Is(err, ErrOutOfRange) {
					continue // deleted since
				}
				if err != nil || !bytes.HasPrefix(raw[recordHeaderSize+recordFixedSize+2:], []byte("Kk1#")) {
					errs <- fmt.Errorf("lookup gave %d: %q, %v", at, raw, err)
					return
				}
			}
		}
	}()
	var m keyModel
	for i := range 400 {
		m.appendKeyed(t, l, &now, 0, []string{fmt.Sprintf("k%d", i%3)}, 100)
		if i%100 == 99 {
			must(t, l.Flush())
			_, err := l.DeleteBefore(l.EndOffset() / 3)
			must(t, err)
		}
	}
	close(done)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// TestSortRefs: the radix sort orders refs by hash, then log offset, as a
// comparison sort does, with many equal hashes.
func TestSortRefs(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 300).Draw(t, "n")
		refs := make([]keyRef, n)
		for i := range refs {
			refs[i] = keyRef{hash: rapid.SampledFrom([]uint64{0, 1, 1 << 8, 1 << 40, 1<<63 + 5, ^uint64(0)}).Draw(t, "h") ^ uint64(rapid.IntRange(0, 3).Draw(t, "x")),
				at: int64(i) * 10, time: int64(i)}
		}
		want := slices.Clone(refs)
		slices.SortStableFunc(want, func(a, b keyRef) int { return cmp.Compare(a.hash, b.hash) })
		if got := sortRefs(refs); !slices.Equal(got, want) {
			t.Fatalf("sortRefs:\n got %v\nwant %v", got, want)
		}
	})
}

// TestKeyTail: the blocked tail holds what a slice would across blocks,
// through appends and drops at any offset.
func TestKeyTail(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var tail keyTail
		var model []keyRef
		next := int64(0)
		for range rapid.IntRange(1, 20).Draw(t, "steps") {
			if rapid.Bool().Draw(t, "add") {
				n := rapid.IntRange(0, 3*keyTailBlock).Draw(t, "n")
				refs := make([]keyRef, n)
				for i := range refs {
					refs[i] = keyRef{hash: uint64(next * 7), at: next, time: next}
					next++
				}
				tail.add(refs)
				model = append(model, refs...)
			} else {
				off := rapid.Int64Range(0, next+1).Draw(t, "off")
				tail.dropBelow(off)
				i := 0
				for i < len(model) && model[i].at < off {
					i++
				}
				model = model[i:]
			}
			if tail.n != len(model) {
				t.Fatalf("%d refs held, the model %d", tail.n, len(model))
			}
			for i, r := range model {
				if tail.at(i) != r {
					t.Fatalf("ref %d is %+v, the model's %+v", i, tail.at(i), r)
				}
			}
			if off := rapid.Int64Range(0, next+1).Draw(t, "below"); len(tail.below(off)) != sort.Search(len(model), func(i int) bool { return model[i].at >= off }) {
				t.Fatalf("below(%d) holds %d", off, len(tail.below(off)))
			}
		}
	})
}
