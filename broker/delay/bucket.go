package delay

import (
	"container/heap"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"path/filepath"
	"slices"

	"github.com/ferrymq/ferrymq/storage/vfs"
)

// An item is one fixed-size record of a bucket file (all integers
// big-endian): kind u8, 3 bytes 0, queue u32 (the index's number for the
// delay queue, see the checkpoint), size u32, dueAt i64, at i64 (the log
// offset of the record it comes from), ref i64 (the entry a resolution
// resolves, -1 for an entry), CRC32C of the first 36 bytes.
const itemSize = 40

const (
	itemEntry     = 1
	itemReleased  = 2
	itemCancelled = 3
	itemMoved     = 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type item struct {
	kind  uint8
	qid   uint32
	size  uint32
	dueAt int64
	at    int64
	ref   int64
}

func appendItem(dst []byte, it item) []byte {
	var b [itemSize]byte
	b[0] = it.kind
	binary.BigEndian.PutUint32(b[4:], it.qid)
	binary.BigEndian.PutUint32(b[8:], it.size)
	binary.BigEndian.PutUint64(b[12:], uint64(it.dueAt))
	binary.BigEndian.PutUint64(b[20:], uint64(it.at))
	binary.BigEndian.PutUint64(b[28:], uint64(it.ref))
	binary.BigEndian.PutUint32(b[36:], crc32.Checksum(b[:36], castagnoli))
	return append(dst, b[:]...)
}

func decodeItem(b []byte) (item, bool) {
	if crc32.Checksum(b[:36], castagnoli) != binary.BigEndian.Uint32(b[36:40]) || b[0] < itemEntry || b[0] > itemMoved {
		return item{}, false
	}
	return item{kind: b[0], qid: binary.BigEndian.Uint32(b[4:]), size: binary.BigEndian.Uint32(b[8:]),
		dueAt: int64(binary.BigEndian.Uint64(b[12:])), at: int64(binary.BigEndian.Uint64(b[20:])),
		ref: int64(binary.BigEndian.Uint64(b[28:]))}, true
}

// Hold says whether a pending entry is claimed.
const (
	holdNone    = 0
	holdClaimed = 1 // by Due, Claim or PendingBefore
	holdDone    = 2 // released done: its mark is on its way
)

// ent is one entry of a materialized bucket.
type ent struct {
	at, dueAt int64
	size      int32
	qid       uint32
	st        State
	hold      uint8
	hidx      int // in its bucket's heap, or -1
}

type entHeap []*ent

func (h entHeap) Len() int { return len(h) }
func (h entHeap) Less(i, j int) bool {
	if h[i].dueAt != h[j].dueAt {
		return h[i].dueAt < h[j].dueAt
	}
	return h[i].at < h[j].at
}
func (h entHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hidx = i
	h[j].hidx = j
}
func (h *entHeap) Push(v any) {
	e := v.(*ent)
	e.hidx = len(*h)
	*h = append(*h, e)
}
func (h *entHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.hidx = -1
	return e
}

// bstate is a bucket's detail in memory: every entry its file holds (with
// what became of it) and its pending, unclaimed entries in due order.
type bstate struct {
	ents  map[int64]*ent
	h     entHeap
	moved map[int64]int64 // a moved entry's old log offset -> its new one (nil: none)
}

// move records that the entry at from was appended again at to (or, for
// an origin, that its newest move is at to: the largest wins).
func (s *bstate) move(from, to int64) {
	if s.moved == nil {
		s.moved = map[int64]int64{}
	}
	s.moved[from] = max(s.moved[from], to)
}

func (s *bstate) remove(e *ent) {
	if e.hidx >= 0 {
		heap.Remove(&s.h, e.hidx)
	}
}

// store is one file of items: a bucket's own, or a far file.
type store struct {
	key     int64 // its key among the open files and its name: a bucket's id, -1-id for a far file
	items   int64 // items in its file, written or in buf
	written int64 // items written to the file
	buf     []byte
	dirty   bool // written since the last checkpoint
	dead    bool // removed
}

// group is the far file of farMs of due time: the items of its buckets
// that the index followed while they were more than farMs ahead (and not
// loaded) go there, so that records due far ahead, spread over many
// buckets, cost a sync of a few far files at a checkpoint rather than of a
// file per bucket. A bucket's items are those of its own file and those
// of its group's far file that fall in it.
//
// A group is split or not. Not split, no bucket of its span has a struct
// of its own: every item of its span is in its far file and its counts
// are those of its whole span (what the index knows of entries due more
// than farMs ahead costs a group, not a bucket each). Split (when its
// span comes within farMs, or a Config.Window, of now, or a lookup or a
// mark needs one of its buckets), its buckets have their structs and
// their counts, made from its far file, and its own counts are zero.
type group struct {
	store
	counts
	id    int64
	maxAt int64 // the largest log offset of its items
	split bool
	// fine counts, not split, the pending entries of each bucket of its
	// span (nil: none): Buckets answers from it for any width.
	fine []uint32
}

func farName(start int64) string { return fmt.Sprintf("far-%020d.dly", start) }

// qcount is a count of one queue's entries.
type qcount struct {
	qid uint32
	n   int64
}

// counts are the pending entries of a bucket, or of the span of a group
// that is not split.
type counts struct {
	pending  []qcount // pending entries per queue number (few: a slice, not a map)
	npending int64
	minAt    int64 // at or below the log offset of every pending entry
}

// bucket is one bucket of due time: its counts always, its file's item
// count, and its detail when materialized (st).
type bucket struct {
	store
	counts
	id     int64
	maxAt  int64 // the largest log offset of its items
	st     *bstate
	cached bool  // materialized for a lookup, outside the window
	used   int64 // when it was last looked up (a counter), for the cache
	inHeap bool  // in the index's heap of unloaded buckets
}

func (b *counts) addPending(qid uint32, d int64) {
	if d == 0 {
		return
	}
	b.npending += d
	for i := range b.pending {
		if b.pending[i].qid == qid {
			b.pending[i].n += d
			if b.pending[i].n == 0 {
				b.pending = slices.Delete(b.pending, i, i+1)
			}
			return
		}
	}
	b.pending = append(b.pending, qcount{qid, d})
}

type bucketHeap []*bucket

func (h bucketHeap) Len() int           { return len(h) }
func (h bucketHeap) Less(i, j int) bool { return h[i].id < h[j].id }
func (h bucketHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *bucketHeap) Push(v any)        { *h = append(*h, v.(*bucket)) }
func (h *bucketHeap) Pop() any {
	old := *h
	b := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return b
}

// bucketName is the file name of the bucket starting at start (unix
// milliseconds): 20 decimal digits and ".dly".
func bucketName(start int64) string { return fmt.Sprintf("%020d.dly", start) }

func (x *Index) path(s *store) string {
	if s.key >= 0 {
		return filepath.Join(x.cfg.Dir, bucketName(s.key*x.widthMs))
	}
	return filepath.Join(x.cfg.Dir, farName((-1-s.key)*x.farMs))
}

// file returns s's open file, creating it when it does not exist.
func (x *Index) file(s *store) (vfs.File, error) {
	x.fileUse++
	if of, ok := x.files[s.key]; ok {
		of.used = x.fileUse
		return of.f, nil
	}
	path := x.path(s)
	f, err := x.fs.OpenRW(path)
	if errors.Is(err, fs.ErrNotExist) {
		f, err = x.fs.Create(path)
	}
	if err != nil {
		return nil, fmt.Errorf("delay: open bucket file %s: %w", path, err)
	}
	if len(x.files) >= maxOpenFiles {
		var oldest int64
		var ou int64 = -1
		for id, of := range x.files {
			if ou < 0 || of.used < ou {
				oldest, ou = id, of.used
			}
		}
		if err := x.files[oldest].f.Close(); err != nil {
			x.logger.Warn("close bucket file", "error", err)
		}
		delete(x.files, oldest)
	}
	x.files[s.key] = &openFile{f: f, used: x.fileUse}
	return f, nil
}

const maxOpenFiles = 256

type openFile struct {
	f    vfs.File
	used int64
}

func (x *Index) closeFile(id int64) error {
	of, ok := x.files[id]
	if !ok {
		return nil
	}
	delete(x.files, id)
	return of.f.Close()
}

// buffer adds it to s's items waiting to be written.
func (x *Index) buffer(s *store, it item) {
	if len(s.buf) == 0 {
		x.touched = append(x.touched, s)
		s.buf, x.spareBuf = x.spareBuf, nil
	}
	x.bufBytes += itemSize
	s.buf = appendItem(s.buf, it)
	s.items++
}

// flushBuf writes s's buffered items to its file (page cache only).
func (x *Index) flushBuf(s *store) error {
	if len(s.buf) == 0 {
		return nil
	}
	f, err := x.file(s)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(s.buf, s.written*itemSize); err != nil {
		return fmt.Errorf("delay: write bucket file %s: %w", x.path(s), err)
	}
	s.written += int64(len(s.buf) / itemSize)
	// Not kept (the files are many: 8 MiB of small buffers with 1M
	// entries spread over 89 days), but the largest is kept for the next
	// store to buffer items: a busy one grows its buffer again otherwise.
	if cap(s.buf) > cap(x.spareBuf) {
		x.spareBuf = s.buf[:0]
	}
	s.buf = nil
	if !s.dirty {
		s.dirty = true
		x.dirty = append(x.dirty, s)
	}
	return nil
}

// readItems reads s's items (the first s.items of its file: what is past
// them is a torn or stale tail). gone says everything it holds is below
// the log's start: a file a crash left removed then reads as what is there.
func (x *Index) readItems(s *store, gone bool) ([]item, error) {
	if err := x.flushBuf(s); err != nil {
		return nil, err
	}
	if s.written == 0 {
		return nil, nil
	}
	f, err := x.file(s)
	if err != nil {
		return nil, err
	}
	raw := make([]byte, s.written*itemSize)
	n, err := f.ReadAt(raw, 0)
	if n < len(raw) && gone {
		// A checkpoint removed the file of a bucket wholly below the log's
		// start and crashed before the checkpoint that forgets it: what it
		// held is gone anyway.
		raw = raw[:n/itemSize*itemSize]
		s.written = int64(len(raw) / itemSize)
		s.items = s.written
	} else if n < len(raw) {
		if err == nil {
			err = fmt.Errorf("short read")
		}
		return nil, fmt.Errorf("delay: read bucket file %s (%d of %d bytes): %w", x.path(s), n, len(raw), err)
	}
	items := make([]item, 0, s.written)
	for off := 0; off < len(raw); off += itemSize {
		it, ok := decodeItem(raw[off : off+itemSize])
		if !ok {
			return nil, fmt.Errorf("%w: bucket file %s: a bad item at %d", ErrCorrupt, x.path(s), off)
		}
		items = append(items, it)
	}
	return items, nil
}

// loadState reads b's file into a fresh bstate: entries below the log's
// start are gone; an item that appears twice counts once; a claimed
// entry is the claim's own ent.
func (x *Index) loadState(b *bucket) (*bstate, error) {
	items, err := x.readItems(&b.store, b.npending == 0 && b.maxAt < x.start)
	if err != nil {
		return nil, err
	}
	if g := x.groups[x.groupID(b.id)]; g != nil && g.items > 0 {
		far, err := x.readItems(&g.store, g.maxAt < x.start)
		if err != nil {
			return nil, err
		}
		for _, it := range far {
			if x.bucketID(it.dueAt) == b.id {
				items = append(items, it)
			}
		}
	}
	st := &bstate{ents: make(map[int64]*ent, len(items))}
	for _, it := range items {
		if it.kind == itemEntry && it.ref >= 0 {
			st.move(it.ref, it.at) // a moved record, from its origin
		}
		if it.kind != itemEntry || it.at < x.start {
			continue
		}
		if _, dup := st.ents[it.at]; dup {
			continue
		}
		st.ents[it.at] = &ent{at: it.at, dueAt: it.dueAt, size: int32(it.size), qid: it.qid,
			st: State{Kind: StatePending}, hidx: -1}
	}
	for _, it := range items {
		if it.kind == itemEntry {
			continue
		}
		if it.kind == itemMoved {
			st.move(it.ref, it.at) // kept after its entry is gone: its handle finds the new one
		}
		e := st.ents[it.ref]
		if e == nil || e.st.Kind != StatePending || !names(it, e.qid, e.dueAt) {
			continue // a duplicate, its entry is gone, or it names another
		}
		e.st = resolution(it)
	}
	for at, e := range st.ents {
		if e.st.Kind != StatePending {
			continue
		}
		if c := x.claims[at]; c != nil {
			st.ents[at] = c
			continue
		}
		st.h = append(st.h, e)
	}
	for i, e := range st.h {
		e.hidx = i
	}
	heap.Init(&st.h)
	return st, nil
}

// names says whether the mark or move it is of the entry it names by log
// offset, whose queue number and due time are qid and dueAt (a record that
// names an offset it does not describe resolves nothing).
func names(it item, qid uint32, dueAt int64) bool { return it.qid == qid && it.dueAt == dueAt }

func resolution(it item) State {
	switch it.kind {
	case itemReleased:
		return State{Kind: StateReleased, MarkAt: it.at, ReleasedAt: it.at - int64(it.size)}
	case itemCancelled:
		return State{Kind: StateCancelled, MarkAt: it.at}
	default:
		return State{Kind: StateMoved, MovedTo: it.at}
	}
}

func heapInit(h *bucketHeap) { heap.Init(h) }
