package storage

import (
	"errors"
	"fmt"
	"slices"
	"sort"
)

// LookupQuery asks for the records that may hold Key (one of the keys
// Config.LookupKeys gives for a record's payload) within a window of store
// times, newest first, a page at a time.
type LookupQuery struct {
	Key          []byte
	Since, Until int64 // store-time window in unix ms, [Since, Until) (Until 0: no upper bound); chunks outside it are not read
	Before       int64 // cursor: only records below this log offset (0: from the log's end)
	Limit        int   // most offsets returned (at least 1)
	MaxBytes     int64 // most bytes of key tables and scanned records read before answering with a cursor (0: no limit)
}

// LookupResult is one page of a lookup.
type LookupResult struct {
	Offsets      []int64 // log offsets of records whose key hash matches, newest first (the caller reads and checks each)
	Next         int64   // cursor for the next call's Before; 0 when the window is searched to its start
	ScannedBytes int64
}

// keyCollector gathers the key refs of records through Config.LookupKeys,
// with one closure for all of them.
type keyCollector struct {
	refs  []keyRef
	at, t int64
	add   func(key []byte)
}

// collectKeys appends to kc the refs of the keys of the record at log
// offset at, stored at time t, with this payload.
func (l *Log) collectKeys(kc *keyCollector, payload []byte, at, t int64) {
	if l.cfg.LookupKeys == nil {
		return
	}
	if kc.add == nil {
		kc.add = func(key []byte) { kc.refs = append(kc.refs, keyRef{keyHash(key), kc.at, kc.t}) }
	}
	kc.at, kc.t = at, t
	l.cfg.LookupKeys(payload, kc.add)
}

// lookupView is what a lookup takes under l.mu and reads after dropping
// it: the tail's refs (a slice never changed below its length) and the
// chunks, each key table held by a reference (release drops them).
type lookupView struct {
	start, end int64
	gen        uint64
	tail       keyTail
	tailFrom   int64 // where the tail's refs start
	chunks     []lookupChunk
}

type lookupChunk struct {
	from, to int64
	kt       *keyTable // nil: none that checks out; its records are scanned
}

func (l *Log) takeLookupView() (lookupView, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return lookupView{}, ErrClosed
	}
	v := lookupView{start: l.segments[0].base, end: l.end.Load(), gen: l.gen.Load(), tail: l.keys}
	v.tailFrom = v.start
	for _, c := range l.chunks {
		lc := lookupChunk{from: c.from, to: c.to}
		if kt := c.keys.Load(); kt != nil && !kt.bad.Load() {
			lc.kt = kt
			kt.f.acquire()
		}
		v.chunks = append(v.chunks, lc)
		v.tailFrom = max(v.tailFrom, c.to)
	}
	return v, nil
}

func (v *lookupView) release() {
	for _, c := range v.chunks {
		if c.kt != nil {
			c.kt.f.release()
		}
	}
}

// Lookup returns the log offsets of the records that may hold q.Key in
// q's window below q.Before, newest first: the records since the last
// index chunk from memory, then chunk by chunk backwards, each through its
// key table (its bloom filter, then the pages of its pairs that may hold
// the key), or by reading its records if it has no key table that checks
// out. A chunk whose keyed records' store times miss the window is not
// read. It stops after q.Limit offsets (Next is then the last one: the
// next page starts below it), once q.MaxBytes have been read (Next is
// where to go on), or at the log's start (Next 0). Records deleted by
// retention are not returned. A hash can collide: the caller reads each
// record and checks its key. A lookup that races with Truncate may fail
// with ErrReadTruncated.
func (l *Log) Lookup(q LookupQuery) (LookupResult, error) {
	var res LookupResult
	if l.cfg.LookupKeys == nil {
		return res, nil
	}
	v, err := l.takeLookupView()
	if err != nil {
		return res, err
	}
	defer v.release()
	h, want := keyHash(q.Key), max(q.Limit, 1)
	before := q.Before
	if before <= 0 || before > v.end {
		before = v.end
	}
	keep := func(r keyRef) bool {
		return r.at >= v.start && r.at < before && r.time >= q.Since && (q.Until == 0 || r.time < q.Until)
	}
	res.Offsets = tailFind(v.tail, h, before, want, keep)
	before = min(before, v.tailFrom)
	for i := len(v.chunks) - 1; i >= 0 && len(res.Offsets) < want && before > v.start; i-- {
		c := v.chunks[i]
		if c.from >= before {
			continue
		}
		if c.kt != nil && (c.kt.maxT < q.Since || q.Until != 0 && c.kt.minT >= q.Until) {
			before = c.from
			continue
		}
		if q.MaxBytes > 0 && res.ScannedBytes > 0 && res.ScannedBytes+c.cost(before, v.start) > q.MaxBytes {
			res.Next = before
			return res, l.lookupDone(v)
		}
		offs, read, err := l.findInChunk(c, h, before, v.start, want-len(res.Offsets), keep)
		res.ScannedBytes += read
		if err != nil {
			return LookupResult{}, err
		}
		res.Offsets = append(res.Offsets, offs...)
		before = c.from
	}
	if len(res.Offsets) == want {
		res.Next = res.Offsets[want-1]
	}
	return res, l.lookupDone(v)
}

// lookupDone fails a lookup that raced with a truncation, whose offsets
// may name records since replaced.
func (l *Log) lookupDone(v lookupView) error {
	if l.gen.Load() != v.gen {
		return ErrReadTruncated
	}
	return nil
}

// cost is about what looking in the chunk below before costs: its key
// table's bloom filter and fences, or its records.
func (c lookupChunk) cost(before, start int64) int64 {
	if c.kt != nil {
		return c.kt.metaLen()
	}
	return min(c.to, before) - max(c.from, start)
}

// tailFind is keyTable.find for the refs in memory (in log order).
func tailFind(tail keyTail, h uint64, before int64, want int, keep func(keyRef) bool) []int64 {
	var out []int64
	for i := tail.search(before) - 1; i >= 0 && len(out) < want; i-- {
		if r := tail.at(i); r.hash == h && keep(r) {
			out = appendOffset(out, r.at)
		}
	}
	return out
}

// findInChunk finds the offsets of hash h in chunk c below before, newest
// first, through its key table, or by scanning its records if it has none
// or it does not check out (then the indexer rebuilds it).
func (l *Log) findInChunk(c lookupChunk, h uint64, before, start int64, want int, keep func(keyRef) bool) ([]int64, int64, error) {
	var spent int64
	if c.kt != nil {
		offs, read, err := c.kt.find(h, before, want, keep)
		if err == nil {
			return offs, read, nil
		}
		spent = read
		if !c.kt.bad.Swap(true) {
			l.log.Warn("a key table cannot be used; its chunk is scanned until the table is rebuilt", "file", c.kt.f.name, "error", err)
			l.wakeIndexer()
		}
	}
	var found []int64
	read, err := l.scanKeys(max(c.from, start), min(c.to, before), func(r keyRef) {
		if r.hash == h && keep(r) && (len(found) == 0 || found[len(found)-1] != r.at) {
			found = append(found, r.at)
		}
	})
	slices.Reverse(found)
	return found[:min(len(found), want)], spent + read, err
}

// scanReadBytes is how much of the log a scan for keys reads at a time.
const scanReadBytes = 1 << 20

// scanKeys reads the records in the log range [from, to) (record
// boundaries) and calls each with every key ref of them. It returns the
// bytes read. Records deleted meanwhile by retention end the scan early.
func (l *Log) scanKeys(from, to int64, each func(keyRef)) (int64, error) {
	var kc keyCollector
	var buf []byte
	at := from
	for at < to {
		var err error
		buf, err = l.ReadRawTo(buf[:0], at, scanReadBytes)
		if errors.Is(err, ErrOutOfRange) {
			break
		}
		if err != nil {
			return at - from, err
		}
		if len(buf) == 0 {
			break
		}
		for b := buf; len(b) > 0 && at < to; {
			n, _ := recordLen(b, maxRecordSize) // ReadRawTo returns whole records
			rec, _, err := decodeRecordView(b[:n])
			if err != nil {
				return at - from, &CorruptError{Offset: at, Reason: err.Error()}
			}
			kc.refs = kc.refs[:0]
			l.collectKeys(&kc, rec.Payload, at, rec.StoreTime)
			for _, r := range kc.refs {
				each(r)
			}
			at += int64(n)
			b = b[n:]
		}
	}
	return at - from, nil
}

// writeKeyTable writes the key table of the chunk [from, to) ending on
// last, with refs, and reads its header back.
func (l *Log) writeKeyTable(from, to int64, last chunkLast, refs []keyRef) (*keyTable, error) {
	name := keyTableName(l.cfg.Dir, from)
	if err := l.writeFileAtomic(name, encodeKeyTable(from, to, last, refs)); err != nil {
		return nil, err
	}
	kt, err := readKeyTable(l.fs, name, from, to, last)
	if err != nil {
		return nil, fmt.Errorf("storage: key table %s reads back wrong: %w", name, err)
	}
	kt.f.files = &l.openChunks
	return kt, nil
}

// rebuildKeyTable writes the key table of the newest chunk that has none
// that checks out (and was not tried since Open), from its records. It
// reports whether it tried one: the indexer calls it again, one chunk per
// turn, so that chunk writes and Close wait for one chunk at most.
func (l *Log) rebuildKeyTable() bool {
	if l.cfg.LookupKeys == nil {
		return false
	}
	l.idxMu.Lock() // the chunk is neither written nor removed meanwhile
	defer l.idxMu.Unlock()
	l.mu.RLock()
	var c *indexChunk
	for i := len(l.chunks) - 1; i >= 0 && c == nil; i-- {
		if kt := l.chunks[i].keys.Load(); !l.chunks[i].keysTried && (kt == nil || kt.bad.Load()) {
			c = l.chunks[i]
		}
	}
	start := l.segments[0].base
	l.mu.RUnlock()
	if c == nil {
		return false
	}
	c.keysTried = true
	var refs []keyRef
	_, err := l.scanKeys(max(c.from, start), c.to, func(r keyRef) { refs = append(refs, r) })
	var kt *keyTable
	if err == nil {
		kt, err = l.writeKeyTable(c.from, c.to, c.last, refs)
	}
	if err != nil {
		l.log.Warn("rebuilding a key table failed; lookups scan its chunk", "from", c.from, "error", err)
		return true
	}
	if old := c.keys.Swap(kt); old != nil {
		old.f.drop()
	}
	return true
}

// keyTailBlock is how many refs a block of the tail holds.
const keyTailBlock = 4096

// keyTail holds the key refs of the records past the last index chunk, in
// log order, in fixed blocks: appending never moves a ref (a lookup's copy
// of the tail reads its first n while the writer appends past them), and
// dropping refs at a chunk cut or retention only moves the front.
type keyTail struct {
	blocks []*[keyTailBlock]keyRef
	skip   int // refs of blocks[0] dropped
	n      int // refs held
}

func (t *keyTail) at(i int) keyRef {
	j := t.skip + i
	return t.blocks[j/keyTailBlock][j%keyTailBlock]
}

// add appends refs.
func (t *keyTail) add(refs []keyRef) {
	for _, r := range refs {
		j := t.skip + t.n
		if j == len(t.blocks)*keyTailBlock {
			t.blocks = append(t.blocks, new([keyTailBlock]keyRef))
		}
		t.blocks[j/keyTailBlock][j%keyTailBlock] = r
		t.n++
	}
}

// search returns the index of the first ref at or past log offset off.
func (t *keyTail) search(off int64) int {
	return sort.Search(t.n, func(i int) bool { return t.at(i).at >= off })
}

// dropBelow drops the refs of records below log offset off.
func (t *keyTail) dropBelow(off int64) {
	k := t.search(off)
	t.skip, t.n = t.skip+k, t.n-k
	if full := t.skip / keyTailBlock; full > 0 {
		t.blocks = t.blocks[full:]
		t.skip -= full * keyTailBlock
	}
}

// below returns a copy of the refs of records below log offset off.
func (t *keyTail) below(off int64) []keyRef {
	out := make([]keyRef, t.search(off))
	for i := range out {
		out[i] = t.at(i)
	}
	return out
}
