package storage

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
)

// queueKey names one queue.
type queueKey struct {
	topic string
	queue uint32
}

// queueIndex maps the queue offsets of one queue to their records: the
// older ones through index chunk files (parts), the newest in memory (the
// tail). parts cover [parts[0].firstQO, base) without gaps; the tail covers
// [base, next()). Offsets before first are gone (retention) even where a
// part still lists them.
//
// The slices are only ever replaced or appended to, never changed in place
// below their length, so a reader may keep a copy of a slice header and
// read it after dropping Log.mu.
type queueIndex struct {
	first int64       // oldest readable queue offset
	parts []indexPart // on disk, in order
	base  int64       // queue offset of pos[0]
	pos   []int64     // log offsets
	size  []int32     // record sizes
	fp    []uint32    // fingerprints (Config.Fingerprint)
}

// indexPart is the run of one queue's entries in one index chunk.
type indexPart struct {
	c       *indexChunk
	firstQO int64
	count   int64
	at      int64 // file offset of its first entry
}

func (q *queueIndex) next() int64 { return q.base + int64(len(q.pos)) }

// lowest is the lowest queue offset the index lists, readable or not.
func (q *queueIndex) lowest() int64 {
	if len(q.parts) > 0 {
		return q.parts[0].firstQO
	}
	return q.base
}

// partFor returns the index of the part holding queue offset qo (which is
// below base and at or past lowest).
func (q *queueIndex) partFor(qo int64) int {
	return sort.Search(len(q.parts), func(i int) bool { return q.parts[i].firstQO+q.parts[i].count > qo })
}

// entryAt returns where the record at queue offset qo is, reading an index
// chunk if qo is not in the tail. l.mu is held (read or write): a chunk the
// index refers to is open for reading.
func (q *queueIndex) entryAt(qo int64) (indexEntry, error) {
	if qo >= q.base {
		i := qo - q.base
		return indexEntry{pos: q.pos[i], size: q.size[i]}, nil
	}
	p := &q.parts[q.partFor(qo)]
	e, err := p.readEntries(qo-p.firstQO, 1)
	if err != nil {
		return indexEntry{}, err
	}
	return e[0], nil
}

// offsetAt returns the queue offset of the queue's first record at or past
// log offset logOffset, or next() if it has none. Parts are searched by
// reading their chunk files: l.mu is held.
func (q *queueIndex) offsetAt(logOffset int64) (int64, error) {
	if len(q.pos) > 0 && q.pos[0] < logOffset || len(q.parts) == 0 {
		return q.base + int64(sort.Search(len(q.pos), func(i int) bool { return q.pos[i] >= logOffset })), nil
	}
	j := sort.Search(len(q.parts), func(i int) bool { return q.parts[i].c.to > logOffset })
	if j == len(q.parts) {
		return q.base, nil
	}
	p := &q.parts[j]
	if p.c.from >= logOffset {
		return p.firstQO, nil
	}
	// Binary search in the part, a read per probe.
	lo, hi := int64(0), p.count // answer in [lo, hi]
	for lo < hi {
		mid := lo + (hi-lo)/2
		e, err := p.readEntries(mid, 1)
		if err != nil {
			return 0, err
		}
		if e[0].pos >= logOffset {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return p.firstQO + lo, nil
}

// fingerprint is Config.Fingerprint of a record's payload (0 without it).
func (l *Log) fingerprint(payload []byte) uint32 {
	if l.cfg.Fingerprint == nil {
		return 0
	}
	return l.cfg.Fingerprint(payload)
}

// indexRaw indexes the records of a raw append placed at log offset at,
// whose fingerprints are fps, one per record; l.mu is held. It returns
// how many it indexed.
func (l *Log) indexRaw(raw []byte, at int64, fps []uint32) int {
	i := 0
	var topic string
	for len(raw) > 0 {
		n, _ := recordLen(raw, maxRecordSize)
		rec, tb := parseRecordView(raw[:n]) // validated by placeRaw
		topic = sameTopic(topic, tb)
		l.indexAdd(queueKey{topic, rec.Queue}, rec.QueueOffset, at, int32(n), fps[i])
		at += int64(n)
		raw = raw[n:]
		i++
	}
	return i
}

// sameTopic is topic as a string: prev when they are equal (a raw append's
// records mostly share a few topics), else a new one.
func sameTopic(prev string, topic []byte) string {
	if prev == string(topic) { // compared without a conversion
		return prev
	}
	return string(topic)
}

// rawFingerprints appends the fingerprints of the records of a raw append
// (validated by placeRaw) at log offset at to fps, and their key refs to
// the writer's collector.
func (l *Log) rawFingerprints(fps []uint32, raw []byte, at int64) []uint32 {
	for len(raw) > 0 {
		n, _ := recordLen(raw, maxRecordSize)
		rec, _ := parseRecordView(raw[:n])
		fps = append(fps, l.fingerprint(rec.Payload))
		l.collectKeys(&l.kc, rec.Payload, at, rec.StoreTime)
		at += int64(n)
		raw = raw[n:]
	}
	return fps
}

// indexAdd records one record; l.mu is held (or the log is not yet shared).
func (l *Log) indexAdd(k queueKey, queueOffset, logOffset int64, size int32, fp uint32) {
	qi := l.index[k]
	if qi == nil {
		qi = &queueIndex{first: queueOffset, base: queueOffset}
		l.index[k] = qi
	}
	qi.pos = append(qi.pos, logOffset)
	qi.size = append(qi.size, size)
	qi.fp = append(qi.fp, fp)
	l.lastAt = logOffset
}

// loc is where one record to read is.
type loc struct {
	qo    int64 // its queue offset
	pos   int64
	size  int
	fp    uint32
	chunk *indexChunk // the chunk that said where the record is; nil: the tail
}

// maxSkipScan bounds the index entries one ReadMatching looks at, so that
// a read whose filter matches nothing costs a bounded time; it answers
// where it stopped, and the caller reads on from there.
const maxSkipScan = 1 << 18

// plan is a read being planned: the records it reads so far and what
// bounds it.
type plan struct {
	locs     []loc
	total    int // bytes of the records in locs
	maxBytes int
	want     func(fp uint32) bool // nil: every entry
}

// add adds the record at queue offset qo, unless it is not the first and
// does not fit in maxBytes: then it reports false, and the plan is done.
func (p *plan) add(qo, pos int64, size int32, fp uint32, c *indexChunk) bool {
	n := int(size)
	if len(p.locs) > 0 && p.total+n > p.maxBytes {
		return false
	}
	p.locs = append(p.locs, loc{qo, pos, n, fp, c})
	p.total += n
	return true
}

// indexView is a queue's index as a reader takes it under l.mu and reads
// it after dropping the lock: the parts from the one holding the read's
// first offset on, each chunk held by a reference (release drops them), and
// the tail's slice headers (never changed below their length).
type indexView struct {
	parts []indexPart
	base  int64
	pos   []int64
	size  []int32
	fp    []uint32
}

// view takes the index of the queue from queue offset from on; l.mu is
// held.
func (q *queueIndex) view(from int64) indexView {
	v := indexView{base: q.base, pos: q.pos, size: q.size, fp: q.fp}
	if from < q.base {
		v.parts = slices.Clone(q.parts[q.partFor(from):])
		for _, p := range v.parts {
			p.c.acquire()
		}
	}
	return v
}

func (v *indexView) release() {
	for _, p := range v.parts {
		p.c.release()
	}
}

// scan walks the entries of v from queue offset from on, at most maxScan of
// them, stopping before the first whose log offset is at or past stopAt
// (if stopAt >= 0). It calls page with runs of consecutive entries: either
// raw, a page of a chunk file as it lists them (indexEntrySize bytes each,
// through chunk c), or tail, the tail's slices; first is the queue offset
// of the run's first entry. page returns how many of the run's entries it
// took; fewer than the run holds ends the scan. scan returns the queue
// offset after the last entry taken.
//
// Chunk pages start at indexEntriesPage entries and double, up to
// maxIndexPage, as the scan goes on: a read of a few records reads little
// of the file, and one that skips many entries takes them with few reads.
func (v *indexView) scan(from int64, maxScan int, stopAt int64,
	page func(first int64, raw []byte, c *indexChunk, pos []int64, size []int32, fp []uint32) int) (int64, error) {
	qo := from
	left := int64(maxScan)
	var buf []byte
	pageLen := int64(indexEntriesPage)
	for pi := range v.parts {
		p := &v.parts[pi]
		if qo >= p.firstQO+p.count {
			continue
		}
		whole := stopAt < 0 || p.c.to <= stopAt // no entry of the part reaches stopAt
		for i := qo - p.firstQO; i < p.count; {
			n := min(p.count-i, pageLen, left)
			if n <= 0 {
				return qo, nil
			}
			if int64(len(buf)) < n*indexEntrySize {
				buf = make([]byte, pageLen*indexEntrySize)
			}
			pageLen = min(2*pageLen, maxIndexPage)
			b := buf[:n*indexEntrySize]
			if err := p.c.readAt(b, p.at+i*indexEntrySize); err != nil {
				return qo, err
			}
			stop := false
			if !whole {
				for j := range n {
					if int64(binary.BigEndian.Uint64(b[j*indexEntrySize:])) >= stopAt {
						n, stop = j, true
						break
					}
				}
			}
			took := int64(page(qo, b[:n*indexEntrySize], p.c, nil, nil, nil))
			qo += took
			left -= took
			if took < n || stop {
				return qo, nil
			}
			i += n
		}
	}
	i := int(qo - v.base)
	end := len(v.pos)
	if stopAt >= 0 {
		end = i + sort.Search(end-i, func(j int) bool { return v.pos[i+j] >= stopAt })
	}
	if int64(end-i) > left {
		end = i + int(left)
	}
	if end <= i {
		return qo, nil
	}
	return qo + int64(page(qo, nil, nil, v.pos[i:end], v.size[i:end], v.fp[i:end])), nil
}

// planRead lists the records of a queue to read from offset on, up to
// maxBytes (but at least one), skipping the entries want rejects, looking
// at at most maxScan entries and at none at or past log offset stopAt (if
// stopAt >= 0). next is the queue offset after the last entry it looked
// at and took (listed or skipped). The index is taken under l.mu, and read
// (chunk files included) after l.mu is dropped, holding a reference to
// each chunk.
func (l *Log) planRead(k queueKey, offset int64, maxBytes int, stopAt int64, want func(uint32) bool, maxScan int) (locs []loc, next int64, gen uint64, err error) {
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return nil, offset, 0, ErrClosed
	}
	qi := l.index[k]
	if qi == nil || offset >= qi.next() {
		l.mu.RUnlock()
		return nil, offset, 0, nil
	}
	if offset < qi.first {
		l.mu.RUnlock()
		return nil, offset, 0, fmt.Errorf("%w: queue offset %d before the queue's first %d", ErrOutOfRange, offset, qi.first)
	}
	gen = l.gen.Load()
	v := qi.view(offset)
	l.mu.RUnlock()
	defer v.release()

	pl := plan{maxBytes: maxBytes, want: want}
	next, err = v.scan(offset, maxScan, stopAt, pl.page)
	if err != nil {
		return nil, offset, 0, err
	}
	return pl.locs, next, gen, nil
}

// page takes a run of entries (see indexView.scan) into the plan.
func (p *plan) page(first int64, raw []byte, c *indexChunk, pos []int64, size []int32, fp []uint32) int {
	want := p.want
	if raw != nil {
		n := len(raw) / indexEntrySize
		for j := range n {
			e := raw[j*indexEntrySize : (j+1)*indexEntrySize]
			f := binary.BigEndian.Uint32(e[12:])
			if want != nil && !want(f) {
				continue
			}
			if !p.add(first+int64(j), int64(binary.BigEndian.Uint64(e)), int32(binary.BigEndian.Uint32(e[8:])), f, c) {
				return j
			}
		}
		return n
	}
	for j, f := range fp {
		if want != nil && !want(f) {
			continue
		}
		if !p.add(first+int64(j), pos[j], size[j], f, nil) {
			return j
		}
	}
	return len(fp)
}

// CountMatching counts the entries of a queue in the queue offsets [from,
// to) whose fingerprint (Config.Fingerprint) want accepts (nil: all), by
// the index alone, such as a consumer group's lag in the messages its
// filter lets through. Offsets before the queue's first (deleted by
// retention) and at or past its next are not counted. It looks at most at
// maxScan entries (when want is not nil): scannedTo is the queue offset it
// reached, to (or the queue's next offset) if it counted them all. An
// index chunk that cannot be read is an error.
func (l *Log) CountMatching(topic string, queue uint32, from, to int64, want func(uint32) bool, maxScan int) (n int64, scannedTo int64, err error) {
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return 0, from, ErrClosed
	}
	qi := l.index[queueKey{topic, queue}]
	if qi == nil {
		l.mu.RUnlock()
		return 0, from, nil
	}
	from = max(from, qi.first)
	to = min(to, qi.next())
	if from >= to {
		l.mu.RUnlock()
		return 0, max(from, to), nil
	}
	if want == nil {
		l.mu.RUnlock()
		return to - from, to, nil
	}
	v := qi.view(from)
	l.mu.RUnlock()
	defer v.release()
	scannedTo, err = v.scan(from, int(min(int64(maxScan), to-from)), -1,
		func(_ int64, raw []byte, _ *indexChunk, _ []int64, _ []int32, fp []uint32) int {
			if raw != nil {
				for j := 12; j < len(raw); j += indexEntrySize {
					if want(binary.BigEndian.Uint32(raw[j:])) {
						n++
					}
				}
				return len(raw) / indexEntrySize
			}
			for _, f := range fp {
				if want(f) {
					n++
				}
			}
			return len(fp)
		})
	if err != nil {
		return 0, from, err
	}
	return n, scannedTo, nil
}
