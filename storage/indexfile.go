package storage

import (
	"container/list"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ferrymq/ferrymq/storage/vfs"
)

// Index chunk files: see "Index" in the package doc for the format and the
// rules; this file encodes and decodes them.

const (
	indexDirName     = "index"
	indexMagic       = "FYIX"
	indexVersion     = 2
	indexHeaderSize  = 80
	indexEntrySize   = 16 // log offset u64, record size u32, fingerprint u32
	indexFileSuffix  = ".idx"
	indexNameDigits  = 20
	snapshotVersion  = 1
	indexEntriesPage = 256  // entries a read first reads at a time from a chunk file
	maxIndexPage     = 4096 // entries a long scan reads at a time from a chunk file
)

// indexChunk is one index chunk file: where the records of the log range
// [from, to) are, queue by queue. Immutable once written; its file is
// opened on first use, closed when it has been the least recently read of
// more than maxOpenChunks open ones (and opened again when read), and
// closed for good when the chunk is dropped (truncation or retention) and
// no reader holds it.
type indexChunk struct {
	from, to int64
	name     string
	fs       vfs.FS
	entries  int64 // file offset of the first entry
	snapAt   int64 // file offset of the producer snapshot
	snapLen  int64
	snapCRC  uint32
	last     chunkLast

	mu      sync.Mutex
	f       vfs.File
	closed  bool
	refs    atomic.Int32
	removed atomic.Bool

	files *openChunks   // nil: not counted (a chunk not in a log)
	elem  *list.Element // in files.lru while its file is open; files.mu

	// keys is the chunk's key table (nil: none), replaced when the indexer
	// rebuilds it; keysTried (idxMu) says the indexer tried since Open.
	keys      atomic.Pointer[keyTable]
	keysTried bool
}

// maxOpenChunks bounds the chunk files a log keeps open.
const maxOpenChunks = 64

// openChunks keeps the open chunk files of a log, most recently read
// first, and closes the least recently read beyond maxOpenChunks.
type openChunks struct {
	mu  sync.Mutex
	lru list.List
}

// touch records a read of c, whose file is open, and returns the chunk
// whose file to close, if any.
func (o *openChunks) touch(c *indexChunk) *indexChunk {
	o.mu.Lock()
	defer o.mu.Unlock()
	if c.removed.Load() { // closed with its last reader, not here
		if c.elem != nil {
			o.lru.Remove(c.elem)
			c.elem = nil
		}
		return nil
	}
	if c.elem != nil {
		o.lru.MoveToFront(c.elem)
	} else {
		c.elem = o.lru.PushFront(c)
	}
	if o.lru.Len() <= maxOpenChunks {
		return nil
	}
	for e := o.lru.Back(); e != nil && e != c.elem; e = e.Prev() {
		v := e.Value.(*indexChunk)
		if v.removed.Load() {
			continue // its readers must still read the unlinked file
		}
		o.lru.Remove(e)
		v.elem = nil
		return v
	}
	return nil
}

// forget drops c from the list (its file is closed).
func (o *openChunks) forget(c *indexChunk) {
	o.mu.Lock()
	if c.elem != nil {
		o.lru.Remove(c.elem)
		c.elem = nil
	}
	o.mu.Unlock()
}

// closeFile closes c's file until it is read again.
func (c *indexChunk) closeFile() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.f != nil {
		_ = c.f.Close()
		c.f = nil
	}
}

func (c *indexChunk) acquire() *indexChunk { c.refs.Add(1); return c }

func (c *indexChunk) release() {
	if c.refs.Add(-1) == 0 && c.removed.Load() {
		c.close()
	}
}

func (c *indexChunk) close() {
	c.mu.Lock()
	c.closed = true
	if c.f != nil {
		_ = c.f.Close()
		c.f = nil
	}
	c.mu.Unlock()
	if c.files != nil {
		c.files.forget(c)
	}
}

// drop marks the chunk gone (its file removed, and its key table's); the
// last holder of each closes it.
func (c *indexChunk) drop() {
	if kt := c.keys.Load(); kt != nil {
		kt.f.drop()
	}
	c.removed.Store(true)
	if c.refs.Load() == 0 {
		c.close()
	}
}

// readAt reads from the chunk file, opening it on first use. The caller
// holds a reference (or the chunk is not yet shared).
func (c *indexChunk) readAt(b []byte, off int64) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return fmt.Errorf("storage: index %s: %w", c.name, ErrClosed)
	}
	if c.f == nil {
		f, err := c.fs.OpenRW(c.name)
		if err != nil {
			c.mu.Unlock()
			return fmt.Errorf("storage: open index %s: %w", c.name, err)
		}
		c.f = f
	}
	// The read holds c.mu, so that no one closes the file under it.
	n, err := c.f.ReadAt(b, off)
	c.mu.Unlock()
	if c.files != nil {
		if v := c.files.touch(c); v != nil {
			v.closeFile()
		}
	}
	if n < len(b) {
		return fmt.Errorf("storage: read index %s at %d: %w", c.name, off, err)
	}
	return nil
}

// indexEntry is where one record of a queue is, as the index says.
type indexEntry struct {
	pos  int64
	size int32
}

// readEntries reads n entries of part p from its i-th on.
func (p *indexPart) readEntries(i, n int64) ([]indexEntry, error) {
	b := make([]byte, n*indexEntrySize)
	if err := p.c.readAt(b, p.at+i*indexEntrySize); err != nil {
		return nil, err
	}
	out := make([]indexEntry, n)
	for j := range out {
		e := b[j*indexEntrySize:]
		out[j] = indexEntry{pos: int64(binary.BigEndian.Uint64(e)), size: int32(binary.BigEndian.Uint32(e[8:]))}
	}
	return out, nil
}

func indexChunkName(dir string, from int64) string {
	return filepath.Join(dir, indexDirName, fmt.Sprintf("%0*d%s", indexNameDigits, from, indexFileSuffix))
}

// parseIndexChunkName returns the log offset an index chunk file name
// starts at.
func parseIndexChunkName(name string) (int64, bool) { return parseChunkFileName(name, indexFileSuffix) }

// parseChunkFileName returns the log offset the name of a file of the
// index directory with this suffix starts at.
func parseChunkFileName(name, suffix string) (int64, bool) {
	s, ok := strings.CutSuffix(name, suffix)
	if !ok || len(s) != indexNameDigits {
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil && v >= 0
}

// chunkQueue is one queue of a chunk being written: its entries in the
// chunk, in queue-offset order.
type chunkQueue struct {
	k       queueKey
	firstQO int64
	pos     []int64
	size    []int32
	fp      []uint32
}

// chunkLast identifies the last record of a chunk's range, so that opening
// can check in O(1) that the log still holds it.
type chunkLast struct {
	at  int64
	crc uint32
}

// encodeIndexChunk lays out an index chunk file.
func encodeIndexChunk(from, to int64, last chunkLast, queues []chunkQueue, snap []byte) []byte {
	sort.Slice(queues, func(i, j int) bool {
		if queues[i].k.topic != queues[j].k.topic {
			return queues[i].k.topic < queues[j].k.topic
		}
		return queues[i].k.queue < queues[j].k.queue
	})
	var dir []byte
	var n int64
	for _, q := range queues {
		dir = binary.BigEndian.AppendUint16(dir, uint16(len(q.k.topic)))
		dir = append(dir, q.k.topic...)
		dir = binary.BigEndian.AppendUint32(dir, q.k.queue)
		dir = binary.BigEndian.AppendUint64(dir, uint64(q.firstQO))
		dir = binary.BigEndian.AppendUint64(dir, uint64(len(q.pos)))
		n += int64(len(q.pos))
	}
	b := make([]byte, indexHeaderSize, indexHeaderSize+len(dir)+int(n)*indexEntrySize+len(snap))
	copy(b, indexMagic)
	binary.BigEndian.PutUint16(b[4:], indexVersion)
	binary.BigEndian.PutUint64(b[8:], uint64(from))
	binary.BigEndian.PutUint64(b[16:], uint64(to))
	binary.BigEndian.PutUint64(b[24:], uint64(last.at))
	binary.BigEndian.PutUint32(b[32:], last.crc)
	binary.BigEndian.PutUint32(b[36:], uint32(len(queues)))
	binary.BigEndian.PutUint64(b[40:], uint64(n))
	binary.BigEndian.PutUint32(b[48:], uint32(len(dir)))
	binary.BigEndian.PutUint32(b[52:], uint32(len(snap)))
	b = append(b, dir...)
	entriesAt := len(b)
	for _, q := range queues {
		for i, p := range q.pos {
			b = binary.BigEndian.AppendUint64(b, uint64(p))
			b = binary.BigEndian.AppendUint32(b, uint32(q.size[i]))
			b = binary.BigEndian.AppendUint32(b, q.fp[i])
		}
	}
	binary.BigEndian.PutUint32(b[60:], crc32.Checksum(b[entriesAt:], castagnoli))
	binary.BigEndian.PutUint32(b[64:], crc32.Checksum(snap, castagnoli))
	b = append(b, snap...)
	hc := crc32.Update(crc32.Checksum(b[:56], castagnoli), castagnoli, b[indexHeaderSize:entriesAt])
	binary.BigEndian.PutUint32(b[56:], hc)
	return b
}

// chunkDirEntry is one queue of a chunk's directory.
type chunkDirEntry struct {
	k       queueKey
	firstQO int64
	count   int64
	at      int64 // file offset of its first entry
}

// openedChunk is what opening reads of a chunk file: its header and
// directory (not its entries, nor its producer snapshot).
type openedChunk struct {
	c   *indexChunk
	dir []chunkDirEntry
}

// errBadChunk marks an index chunk file whose contents do not check out
// (as opposed to one that could not be read): Open drops such a chunk and
// rebuilds what it held from the log.
var errBadChunk = errors.New("storage: bad index chunk")

// readIndexChunk reads and checks the header and directory of an index
// chunk file. A file that does not check out is an errBadChunk; one that
// cannot be read, another error.
func readIndexChunk(fs vfs.FS, name string) (*openedChunk, error) {
	f, err := fs.OpenRW(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, err
	}
	var h [indexHeaderSize]byte
	if size < indexHeaderSize {
		return nil, fmt.Errorf("%w: %d bytes, shorter than a header", errBadChunk, size)
	}
	if _, err := f.ReadAt(h[:], 0); err != nil {
		return nil, err
	}
	if string(h[:4]) != indexMagic || binary.BigEndian.Uint16(h[4:]) != indexVersion {
		return nil, fmt.Errorf("%w: not an index chunk of this version", errBadChunk)
	}
	from, to := int64(binary.BigEndian.Uint64(h[8:])), int64(binary.BigEndian.Uint64(h[16:]))
	nq, n := int64(binary.BigEndian.Uint32(h[36:])), int64(binary.BigEndian.Uint64(h[40:]))
	dirLen, snapLen := int64(binary.BigEndian.Uint32(h[48:])), int64(binary.BigEndian.Uint32(h[52:]))
	if n < 0 || n > size/indexEntrySize || indexHeaderSize+dirLen+n*indexEntrySize+snapLen != size {
		return nil, fmt.Errorf("%w: %d bytes, but its header accounts for %d", errBadChunk, size, indexHeaderSize+dirLen+n*indexEntrySize+snapLen)
	}
	dir := make([]byte, dirLen)
	if _, err := f.ReadAt(dir, indexHeaderSize); err != nil {
		return nil, err
	}
	if crc32.Update(crc32.Checksum(h[:56], castagnoli), castagnoli, dir) != binary.BigEndian.Uint32(h[56:]) {
		return nil, fmt.Errorf("%w: header or directory does not check out", errBadChunk)
	}
	entries := indexHeaderSize + dirLen
	oc := &openedChunk{
		c: &indexChunk{
			from: from, to: to, name: name, fs: fs,
			entries: entries,
			snapAt:  entries + n*indexEntrySize, snapLen: snapLen,
			snapCRC: binary.BigEndian.Uint32(h[64:]),
			last:    chunkLast{at: int64(binary.BigEndian.Uint64(h[24:])), crc: binary.BigEndian.Uint32(h[32:])},
		},
	}
	at, total := entries, int64(0)
	p := dir
	for range nq {
		if len(p) < 2 {
			return nil, fmt.Errorf("%w: short directory", errBadChunk)
		}
		tl := int(binary.BigEndian.Uint16(p))
		if len(p) < 2+tl+20 {
			return nil, fmt.Errorf("%w: short directory", errBadChunk)
		}
		e := chunkDirEntry{
			k:       queueKey{topic: string(p[2 : 2+tl]), queue: binary.BigEndian.Uint32(p[2+tl:])},
			firstQO: int64(binary.BigEndian.Uint64(p[6+tl:])),
			count:   int64(binary.BigEndian.Uint64(p[14+tl:])),
			at:      at,
		}
		if e.count <= 0 || e.count > n-total || e.firstQO < 0 {
			return nil, fmt.Errorf("%w: directory does not add up", errBadChunk)
		}
		total += e.count
		at += e.count * indexEntrySize
		oc.dir = append(oc.dir, e)
		p = p[22+tl:]
	}
	if len(p) != 0 || total != n || from < 0 || to <= from {
		return nil, fmt.Errorf("%w: directory does not add up", errBadChunk)
	}
	return oc, nil
}

// readSnapshot reads the chunk's producer snapshot (the deduplication
// state as of its end) into t.
func (c *indexChunk) readSnapshot(t *producerTable) error {
	b := make([]byte, c.snapLen)
	if err := c.readAt(b, c.snapAt); err != nil {
		return err
	}
	if crc32.Checksum(b, castagnoli) != c.snapCRC {
		return fmt.Errorf("%w: producer snapshot does not check out", errBadChunk)
	}
	if err := t.decodeSnapshot(b); err != nil {
		return fmt.Errorf("%w: %w", errBadChunk, err)
	}
	return nil
}

// encodeSnapshot writes the deduplication state. It runs on the writer
// goroutine between groups (or where no writer runs).
func (t *producerTable) encodeSnapshot() []byte {
	b := []byte{snapshotVersion}
	b = binary.BigEndian.AppendUint64(b, uint64(t.lastSweep))
	swept := byte(0)
	if t.swept {
		swept = 1
	}
	b = append(b, swept)
	b = binary.BigEndian.AppendUint32(b, uint32(len(t.queues)))
	for k, ids := range t.queues {
		b = binary.BigEndian.AppendUint16(b, uint16(len(k.topic)))
		b = append(b, k.topic...)
		b = binary.BigEndian.AppendUint32(b, k.queue)
		b = binary.BigEndian.AppendUint32(b, uint32(len(ids)))
		for id, st := range ids {
			b = binary.BigEndian.AppendUint64(b, id)
			b = binary.BigEndian.AppendUint64(b, uint64(st.lastSeen))
			b = binary.BigEndian.AppendUint16(b, st.epoch)
			b = append(b, st.n, st.head)
			for _, r := range st.runs {
				b = binary.BigEndian.AppendUint64(b, uint64(r.firstSeq))
				b = binary.BigEndian.AppendUint64(b, uint64(r.lastSeq))
				b = binary.BigEndian.AppendUint64(b, uint64(r.firstQO))
			}
		}
	}
	return b
}

const snapshotPairSize = 8 + 8 + 2 + 1 + 1 + producerRuns*24

// decodeSnapshot replaces t's state with a snapshot's.
func (t *producerTable) decodeSnapshot(b []byte) error {
	bad := errors.New("producer snapshot does not add up")
	if len(b) < 14 || b[0] != snapshotVersion {
		return bad
	}
	queues := make(map[queueKey]map[uint64]*producerState)
	tracked := 0
	lastSweep, swept := int64(binary.BigEndian.Uint64(b[1:])), b[9] == 1
	nq := binary.BigEndian.Uint32(b[10:])
	p := b[14:]
	for range nq {
		if len(p) < 2 {
			return bad
		}
		tl := int(binary.BigEndian.Uint16(p))
		if len(p) < 2+tl+8 {
			return bad
		}
		k := queueKey{topic: string(p[2 : 2+tl]), queue: binary.BigEndian.Uint32(p[2+tl:])}
		n := int(binary.BigEndian.Uint32(p[6+tl:]))
		p = p[10+tl:]
		if n <= 0 || len(p) < n*snapshotPairSize {
			return bad
		}
		ids := make(map[uint64]*producerState, n)
		for range n {
			st := &producerState{
				lastSeen: int64(binary.BigEndian.Uint64(p[8:])),
				epoch:    binary.BigEndian.Uint16(p[16:]),
				n:        p[18],
				head:     p[19],
			}
			if st.n == 0 || st.n > producerRuns || st.head >= producerRuns {
				return bad
			}
			for i := range st.runs {
				r := p[20+i*24:]
				st.runs[i] = seqRun{
					firstSeq: int64(binary.BigEndian.Uint64(r)),
					lastSeq:  int64(binary.BigEndian.Uint64(r[8:])),
					firstQO:  int64(binary.BigEndian.Uint64(r[16:])),
				}
			}
			ids[binary.BigEndian.Uint64(p)] = st
			p = p[snapshotPairSize:]
		}
		tracked += len(ids)
		queues[k] = ids
	}
	if len(p) != 0 {
		return bad
	}
	t.queues, t.tracked = queues, tracked
	t.lastSweep, t.swept = lastSweep, swept
	t.trackedPub.Store(int64(tracked))
	return nil
}

// forgetBefore makes a state loaded from a snapshot what replaying only
// the records the log still holds would give, so that the state stays a
// function of the log's records (see "Idempotent appends"): runs whose
// records all precede their queue's first offset (deleted by retention)
// are dropped, a run that straddles it starts at it, and a pair left with
// no run is forgotten. Runs are consecutive sequences at consecutive queue
// offsets, so a run cut at a queue offset is the run the replay of its
// remaining records builds, and the replay keeps the same last runs.
func (t *producerTable) forgetBefore(first func(queueKey) int64) {
	for k, ids := range t.queues {
		f := first(k)
		for id, st := range ids {
			var kept []seqRun
			for i := int(st.n) - 1; i >= 0; i-- { // oldest first
				r := st.runs[(int(st.head)-i+producerRuns)%producerRuns]
				last := r.firstQO + r.lastSeq - r.firstSeq
				if last < f {
					continue
				}
				if r.firstQO < f {
					r.firstSeq += f - r.firstQO
					r.firstQO = f
				}
				kept = append(kept, r)
			}
			if len(kept) == 0 {
				delete(ids, id)
				t.tracked--
				continue
			}
			if len(kept) == int(st.n) && kept[0] == st.runs[(int(st.head)-int(st.n)+1+producerRuns)%producerRuns] {
				continue
			}
			st.runs = [producerRuns]seqRun{}
			copy(st.runs[:], kept)
			st.n, st.head = uint8(len(kept)), uint8(len(kept)-1)
		}
		if len(ids) == 0 {
			delete(t.queues, k)
		}
	}
	t.trackedPub.Store(int64(t.tracked))
}
