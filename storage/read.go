package storage

import (
	"fmt"
	"math"
	"slices"
)

// QueueRange returns a queue's oldest queue offset and its next one (the
// offset the next append will get). A queue never written has 0, 0.
func (l *Log) QueueRange(topic string, queue uint32) (first, next int64) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if qi := l.index[queueKey{topic, queue}]; qi != nil {
		return qi.first, qi.next()
	}
	return 0, 0
}

// QueueOffsetAt is a queue's next offset as of log offset logOffset: the
// queue offset its first record at or past logOffset has (or would have).
// A broker uses it to tell a reader where a failover's new epoch, which
// began at logOffset, took the queue up. It is never below the queue's
// first offset. An index chunk that cannot be read is an error.
func (l *Log) QueueOffsetAt(topic string, queue uint32, logOffset int64) (int64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	qi := l.index[queueKey{topic, queue}]
	if qi == nil {
		return 0, nil
	}
	qo, err := qi.offsetAt(logOffset)
	return max(qo, qi.first), err
}

// LogOffsetOf is the log offset of the record at queue offset qo, or the
// log's end when qo is at or past the queue's end (an offset below the
// queue's first is ErrOutOfRange). A reader that must stop at a queue
// offset passes it to ReadMatching as its stopAt.
func (l *Log) LogOffsetOf(topic string, queue uint32, qo int64) (int64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	qi := l.index[queueKey{topic, queue}]
	if qi == nil || qo >= qi.next() {
		return l.end.Load(), nil
	}
	if qo < qi.first {
		return 0, ErrOutOfRange
	}
	e, err := qi.entryAt(qo)
	return e.pos, err
}

// Queues calls fn for every queue the log holds, with its offset range.
func (l *Log) Queues(fn func(topic string, queue uint32, first, next int64)) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	for k, qi := range l.index {
		fn(k.topic, k.queue, qi.first, qi.next())
	}
}

type span struct {
	seg   *segment
	at    int64 // log offset
	n     int
	first int // index of its first entry in the result
	count int
}

// Read returns the entries of one queue from offset on, in order, as many
// as fit in maxBytes (of records), but at least one if there is one. An
// offset at or past the queue's end returns nothing; one before its start
// returns ErrOutOfRange. Payloads are fresh copies, CRC-checked, and each
// record is checked to be the one the index names. A read that races with
// Truncate may fail with ErrReadTruncated.
func (l *Log) Read(topic string, queue uint32, offset int64, maxBytes int) ([]StoredEntry, error) {
	var out []StoredEntry
	_, _, err := l.read(nil, topic, queue, offset, maxBytes, -1, nil, 0, func(dst []byte, e StoredEntry) []byte {
		out = append(out, e)
		return dst
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ReadAppend is Read for a reader that re-encodes each entry at once into
// one buffer, such as a PULL's answer: it reads the records into dst's
// spare room (growing dst if it must) and calls emit with dst so far and
// each entry in order; emit appends what it makes of the entry to dst and
// returns it. An entry's Payload lies in dst's spare room past the end
// emit was handed, and stays intact while emit appends a header of at most
// 32 bytes and then the payload (a stored record's header is longer): the
// records are rewritten into the answer in place, with no second copy.
// The Payload is gone after emit returns. On an error the returned dst
// holds what emit appended so far; the caller drops it.
func (l *Log) ReadAppend(dst []byte, topic string, queue uint32, offset int64, maxBytes int,
	emit func(dst []byte, e StoredEntry) []byte) ([]byte, error) {
	dst, _, err := l.ReadMatching(dst, topic, queue, offset, maxBytes, -1, nil, emit)
	return dst, err
}

// ReadMatching is ReadAppend that reads only the records whose fingerprint
// (Config.Fingerprint) want accepts (nil: all), such as those a consumer
// group's filter may let through. The others are skipped by the index
// alone: they are neither decoded nor checked, and read from a segment
// only in passing, when they lie in a small gap between two records read
// (see readGap). next is the queue offset after the last entry considered,
// emitted or skipped: where the next read starts, past skipped entries at
// the end too, so that a reader can tell that nothing matched up to there.
// stopAt is a log offset (-1: none): an entry at or past it is neither
// skipped nor emitted and ends the read, as at a slave's readable end. A
// read looks at most at maxSkipScan entries (when want is not nil), so
// that it costs a bounded time when nothing matches; next says where it
// stopped. At or past the queue's end (or at stopAt) it returns nothing
// and next = offset.
func (l *Log) ReadMatching(dst []byte, topic string, queue uint32, offset int64, maxBytes int, stopAt int64, want func(fp uint32) bool,
	emit func([]byte, StoredEntry) []byte) (out []byte, next int64, err error) {
	return l.read(dst, topic, queue, offset, maxBytes, stopAt, want, maxSkipScan, emit)
}

// read is ReadMatching looking at most at maxScan entries when want is not
// nil.
func (l *Log) read(dst []byte, topic string, queue uint32, offset int64, maxBytes int, stopAt int64, want func(uint32) bool, maxScan int,
	emit func(dst []byte, e StoredEntry) []byte) ([]byte, int64, error) {
	if want == nil {
		maxScan = math.MaxInt // nothing is skipped: maxBytes bounds the read
	}
	locs, next, gen, err := l.planRead(queueKey{topic, queue}, offset, maxBytes, stopAt, want, maxScan)
	if err != nil || len(locs) == 0 {
		return dst, next, err
	}
	dst, err = l.readLocs(dst, topic, queue, offset, maxBytes, locs, gen, emit)
	if err != nil {
		return dst, offset, err
	}
	return dst, next, nil
}

// readLocs reads the records planRead listed and emits them.
func (l *Log) readLocs(dst []byte, topic string, queue uint32, offset int64, maxBytes int, locs []loc, gen uint64,
	emit func(dst []byte, e StoredEntry) []byte) ([]byte, error) {
	// Runs of records in one segment at most readGap apart become one
	// read: a queue's records are rarely adjacent when producers send to
	// many queues, and a pread per record cost more than the bytes
	// between them (those read in gaps stay under maxBytes in all).
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return dst, ErrClosed
	}
	if l.gen.Load() != gen {
		l.mu.RUnlock()
		return dst, ErrReadTruncated
	}
	if qi := l.index[queueKey{topic, queue}]; qi != nil && offset < qi.first {
		l.mu.RUnlock()
		return dst, fmt.Errorf("%w: queue offset %d was deleted by retention meanwhile", ErrOutOfRange, offset)
	}
	var spans []span
	total, gaps := 0, 0
	for i, lc := range locs {
		seg, segEnd, ok := l.segmentFor(lc.pos)
		// An entry read from a chunk file may be damaged: it must name a
		// record inside the log, after the one before it.
		if !ok || lc.size < recordHeaderSize+recordFixedSize || lc.pos+int64(lc.size) > segEnd ||
			i > 0 && lc.pos <= locs[i-1].pos {
			for _, sp := range spans {
				sp.seg.release()
			}
			l.mu.RUnlock()
			reason := fmt.Sprintf("the index names a record of %d bytes at log offset %d for %s/%d offset %d, which the log does not hold",
				lc.size, lc.pos, topic, queue, lc.qo)
			if lc.chunk != nil {
				reason += fmt.Sprintf(" (the index chunk %s is damaged: deleting the index directory makes Open rebuild it)", lc.chunk.name)
			}
			return dst, &CorruptError{Offset: lc.pos, Segment: l.cfg.Dir, Reason: reason}
		}
		if last := len(spans) - 1; last >= 0 && spans[last].seg == seg && mergeable(spans[last].at+int64(spans[last].n), lc.pos, gaps, maxBytes) {
			gap := int(lc.pos - spans[last].at - int64(spans[last].n))
			gaps += gap
			total += gap
			spans[last].n += gap + lc.size
			spans[last].count++
		} else {
			spans = append(spans, span{seg: seg.acquire(), at: lc.pos, n: lc.size, first: i, count: 1})
		}
		total += lc.size
	}
	l.mu.RUnlock()
	defer func() {
		for _, sp := range spans {
			sp.seg.release()
		}
	}()

	// The records go into dst's spare room, where emit rewrites them in
	// place: each entry it appends ends before the record's end.
	dst = slices.Grow(dst, total)
	buf := dst[len(dst) : len(dst)+total]
	rest := buf
	for _, sp := range spans {
		if _, err := sp.seg.f.ReadAt(rest[:sp.n], sp.at-sp.seg.base); err != nil {
			if l.gen.Load() != gen {
				return dst, ErrReadTruncated
			}
			return dst, fmt.Errorf("storage: read %s at %d: %w", sp.seg.name, sp.at-sp.seg.base, err)
		}
		rest = rest[sp.n:]
	}
	if l.gen.Load() != gen {
		return dst, ErrReadTruncated
	}
	read := 0
	for _, sp := range spans {
		sb := buf[:sp.n]
		buf = buf[sp.n:]
		for range sp.count {
			at := locs[read].pos
			b := sb[at-sp.at:]
			// A bad record found through a chunk file may be a bad chunk.
			corrupt := func(reason string) error {
				if c := locs[read].chunk; c != nil {
					reason += fmt.Sprintf(" (found through the index chunk %s; if the log is sound here, the chunk is damaged: deleting the index directory makes Open rebuild it)", c.name)
				}
				return &CorruptError{Offset: at, Segment: sp.seg.name, Reason: reason}
			}
			n, err := recordLen(b, maxRecordSize)
			if err == nil && n > len(b) {
				err = fmt.Errorf("record of %d bytes past its span", n)
			}
			if err != nil {
				return dst, corrupt(err.Error())
			}
			rec, recTopic, err := decodeRecordView(b[:n])
			if err != nil {
				return dst, corrupt(err.Error())
			}
			if want := locs[read].qo; rec.QueueOffset != want || rec.Queue != queue || string(recTopic) != topic {
				return dst, corrupt(fmt.Sprintf("the index says %s/%d offset %d is here, the record is %s/%d offset %d",
					topic, queue, want, recTopic, rec.Queue, rec.QueueOffset))
			}
			dst = emit(dst, StoredEntry{QueueOffset: rec.QueueOffset, LogOffset: at, StoreTime: rec.StoreTime, Payload: rec.Payload,
				Recovered: rec.Flags&flagRecovered != 0, Fingerprint: locs[read].fp})
			read++
		}
	}
	return dst, nil
}

// readGap is the most bytes between two records of a queue that one read
// takes in passing.
const readGap = 4 << 10

// mergeable says whether a record at pos joins a read that ends at end,
// the reads' gaps so far being gaps bytes of a read of maxBytes.
func mergeable(end, pos int64, gaps, maxBytes int) bool {
	return pos == end || pos > end && pos-end <= readGap && gaps+int(pos-end) <= maxBytes
}

// ReadRaw returns whole records from log offset offset (which must be a
// record boundary, such as a slave's end offset), as many as fit in maxBytes
// but at least one, all from one segment. At the end of the log it returns
// nothing; past it, ErrOutOfRange. This is what a master streams to its slave.
// A read that races with Truncate may fail with ErrReadTruncated.
func (l *Log) ReadRaw(offset int64, maxBytes int) ([]byte, error) {
	return l.ReadRawTo(nil, offset, maxBytes)
}

// ReadRawTo is ReadRaw appending the records to dst (growing it if it must),
// so that a caller can read into a buffer it keeps. On an error it returns
// dst unchanged.
func (l *Log) ReadRawTo(dst []byte, offset int64, maxBytes int) ([]byte, error) {
	if offset == l.end.Load() {
		return dst, nil
	}
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return dst, ErrClosed
	}
	// The end and gen are read under the lock, where Truncate changes them
	// together with the segments.
	end, gen := l.end.Load(), l.gen.Load()
	if offset == end {
		l.mu.RUnlock()
		return dst, nil
	}
	if offset > end || offset < 0 {
		l.mu.RUnlock()
		return dst, fmt.Errorf("%w: log offset %d, log ends at %d", ErrOutOfRange, offset, end)
	}
	seg, segEnd, ok := l.segmentFor(offset)
	if ok {
		seg.acquire()
		defer seg.release()
	}
	l.mu.RUnlock()
	if !ok {
		return dst, fmt.Errorf("%w: log offset %d before the first segment", ErrOutOfRange, offset)
	}
	segEnd = min(segEnd, end)
	n := int(min(int64(max(maxBytes, recordHeaderSize)), segEnd-offset))
	at := len(dst)
	out := slices.Grow(dst, n)[:at+n]
	buf := out[at:]
	_, err := seg.f.ReadAt(buf, offset-seg.base)
	if l.gen.Load() != gen {
		return dst, ErrReadTruncated
	}
	if err != nil {
		return dst, fmt.Errorf("storage: read %s at %d: %w", seg.name, offset-seg.base, err)
	}
	// Keep whole records; if the first does not fit, read it whole.
	good := 0
	for good < len(buf) {
		rl, err := recordLen(buf[good:], maxRecordSize)
		if err != nil && len(buf)-good >= recordHeaderSize {
			return dst, &CorruptError{Offset: offset + int64(good), Segment: seg.name, Reason: err.Error()}
		}
		if err != nil || good+rl > len(buf) {
			if good == 0 && err == nil && offset+int64(rl) <= segEnd {
				out = slices.Grow(out[:at], rl)[:at+rl]
				_, err := seg.f.ReadAt(out[at:], offset-seg.base)
				if l.gen.Load() != gen {
					return dst, ErrReadTruncated
				}
				if err != nil {
					return dst, fmt.Errorf("storage: read %s at %d: %w", seg.name, offset-seg.base, err)
				}
				return out, nil
			}
			if good == 0 {
				return dst, &CorruptError{Offset: offset, Segment: seg.name, Reason: "not a record boundary"}
			}
			break
		}
		good += rl
	}
	return out[:at+good], nil
}
