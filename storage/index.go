package storage

import (
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

// indexRaw indexes the records of a raw append placed at log offset at;
// l.mu is held.
func (l *Log) indexRaw(raw []byte, at int64) {
	for len(raw) > 0 {
		n, _ := recordLen(raw, maxRecordSize)
		rec, _ := decodeRecord(raw[:n]) // validated by placeRaw
		l.indexAdd(queueKey{rec.Topic, rec.Queue}, rec.QueueOffset, at, int32(n))
		at += int64(n)
		raw = raw[n:]
	}
}

// indexAdd records one record; l.mu is held (or the log is not yet shared).
func (l *Log) indexAdd(k queueKey, queueOffset, logOffset int64, size int32) {
	qi := l.index[k]
	if qi == nil {
		qi = &queueIndex{first: queueOffset, base: queueOffset}
		l.index[k] = qi
	}
	qi.pos = append(qi.pos, logOffset)
	qi.size = append(qi.size, size)
	l.lastAt = logOffset
}

// loc is where one record to read is.
type loc struct {
	pos   int64
	size  int
	chunk *indexChunk // the chunk that said where the record is; nil: the tail
}

// planRead lists the records of a queue to read from offset on, up to
// maxBytes (but at least one). The tail is read under l.mu; parts are read
// from their chunk files after l.mu is dropped, holding a reference to each
// chunk. It returns ok false if the queue has nothing at offset.
func (l *Log) planRead(k queueKey, offset int64, maxBytes int) (locs []loc, gen uint64, err error) {
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return nil, 0, ErrClosed
	}
	qi := l.index[k]
	if qi == nil || offset >= qi.next() {
		l.mu.RUnlock()
		return nil, 0, nil
	}
	if offset < qi.first {
		l.mu.RUnlock()
		return nil, 0, fmt.Errorf("%w: queue offset %d before the queue's first %d", ErrOutOfRange, offset, qi.first)
	}
	gen = l.gen.Load()
	total := 0
	addTail := func(base int64, pos []int64, size []int32, from int64) {
		for i := int(from - base); i < len(pos); i++ {
			n := int(size[i])
			if len(locs) > 0 && total+n > maxBytes {
				return
			}
			locs = append(locs, loc{pos[i], n, nil})
			total += n
		}
	}
	if offset >= qi.base {
		addTail(qi.base, qi.pos, qi.size, offset)
		l.mu.RUnlock()
		return locs, gen, nil
	}
	// Older records: copy what is needed and read the chunks unlocked.
	j := qi.partFor(offset)
	parts := slices.Clone(qi.parts[j:])
	for _, p := range parts {
		p.c.acquire()
	}
	base, pos, size := qi.base, qi.pos, qi.size
	l.mu.RUnlock()
	defer func() {
		for _, p := range parts {
			p.c.release()
		}
	}()
	qo := offset
	for _, p := range parts {
		for i := qo - p.firstQO; i < p.count; {
			n := min(p.count-i, indexEntriesPage)
			es, err := p.readEntries(i, n)
			if err != nil {
				return nil, 0, err
			}
			for _, e := range es {
				if len(locs) > 0 && total+int(e.size) > maxBytes {
					return locs, gen, nil
				}
				locs = append(locs, loc{e.pos, int(e.size), p.c})
				total += int(e.size)
			}
			i += n
		}
		qo = p.firstQO + p.count
	}
	addTail(base, pos, size, base)
	return locs, gen, nil
}
