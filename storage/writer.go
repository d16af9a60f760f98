package storage

import (
	"errors"
	"fmt"
	"runtime"
)

// writer takes every queued append and writes it as one group, until Close.
// It writes only while it holds the writer token (Log.writing): an appender
// that found the log idle may be writing its own group inline, and wakes the
// writer when it gives the token back with appends queued.
func (l *Log) writer() {
	defer close(l.writerDone)
	var batch []*appendReq
	for range l.wake {
		l.qmu.Lock()
		if l.writing || (len(l.queue) == 0 && !l.closing) {
			l.qmu.Unlock()
			continue
		}
		l.writing = true
		l.qmu.Unlock()
		for {
			// Woken, the writer has appends queued behind a group that was
			// being written, so appenders contend: let those already
			// runnable (those the last group's completions woke, too) join
			// the next group, as one larger write costs far less than
			// several small ones.
			runtime.Gosched()
			l.qmu.Lock()
			batch, l.queue = l.queue, batch[:0]
			if len(batch) == 0 {
				l.writing = false
				closing := l.closing
				l.qmu.Unlock()
				if closing {
					return
				}
				break
			}
			l.qmu.Unlock()
			l.writeBatch(batch)
			clear(batch)
		}
	}
}

// writeBatch writes the appends taken from the queue, in order: each run of
// appends between two truncations (or queue bases) as one group, each
// truncation and base on its own.
func (l *Log) writeBatch(batch []*appendReq) {
	for len(batch) > 0 {
		i := 0
		for i < len(batch) && batch[i].trunc == nil && batch[i].run == nil && batch[i].base == nil {
			i++
		}
		if i > 0 {
			l.writeGroup(batch[:i])
		}
		if i < len(batch) {
			r := batch[i]
			if r.run != nil {
				r.run()
			} else if r.base != nil {
				r.err = l.setQueueBase(r.base)
			} else {
				r.trunc.res, r.err = l.truncate(r.trunc.offset, r.trunc.sideFile)
			}
			r.done(nil, r.err)
			i++
		}
		batch = batch[i:]
	}
}

// chunk is a run of bytes written to one segment in a group.
type chunk struct {
	seg   *segment // nil: a new segment starting at base
	base  int64
	start int64 // offset in the segment where buf goes
	buf   []byte
}

// writeGroup writes a group of appends. The group is all or nothing on disk:
// if a write fails, every touched segment is cut back and new segments are
// removed, and every append of the group fails.
func (l *Log) writeGroup(batch []*appendReq) {
	if l.broken != nil {
		for _, r := range batch {
			r.done(nil, l.broken)
		}
		return
	}
	now := l.cfg.Now().UnixMilli()
	// Placement reads the segments and the indexes, which only this goroutine
	// grows but DeleteBefore may trim: hold the read lock until it is done.
	l.mu.RLock()
	active := l.segments[len(l.segments)-1]
	pos := l.end.Load()
	chunks := []chunk{{seg: active, base: active.base, start: active.size, buf: l.buf[:0]}}
	next := make(map[queueKey]int64) // tentative next queue offsets in this group
	nextOffset := func(k queueKey) int64 {
		if n, ok := next[k]; ok {
			return n
		}
		if qi := l.index[k]; qi != nil {
			return qi.next()
		}
		return 0
	}
	// place makes room for a record of n bytes, rolling to a new segment if
	// the current one would pass SegmentSize (a record never spans two).
	place := func(n int) *chunk {
		c := &chunks[len(chunks)-1]
		if used := c.start + int64(len(c.buf)); used > 0 && used+int64(n) > l.cfg.SegmentSize {
			chunks = append(chunks, chunk{base: pos})
			c = &chunks[len(chunks)-1]
		}
		return c
	}
	var ok []*appendReq
	var dups, refused int64
	l.prod.begin()
	for _, r := range batch {
		if r.raw != nil {
			if err := l.placeRaw(r, &pos, nextOffset, next, place); err != nil {
				r.err = err
				continue
			}
			ok = append(ok, r)
			continue
		}
		r.positions = make([]Position, len(r.entries))
		for i, e := range r.entries {
			k := queueKey{e.Topic, e.Queue}
			var ids map[uint64]*producerState
			var st *producerState
			applyStamp := e.Producer.ID != 0
			if e.Recovered {
				var skip bool
				if skip, applyStamp = l.checkRecovered(k, e, now); skip {
					r.positions[i] = Position{QueueOffset: -1, LogOffset: -1, End: -1, Duplicate: true}
					dups++
					continue
				}
				if applyStamp {
					ids, st = l.prod.find(k, e.Producer.ID)
				}
			} else if len(e.Requires) > 0 && !l.prod.holds(e.Requires, now) {
				r.positions[i] = Position{QueueOffset: -1, LogOffset: -1, End: -1, Err: ErrMissingRecords}
				continue
			} else if e.Producer.ID != 0 {
				// Checked in append order: the state holds every entry
				// placed before this one, in this group too.
				ids, st = l.prod.find(k, e.Producer.ID)
				switch v, qo, err := l.prod.check(st, e.Producer, now); v {
				case duplicate:
					r.positions[i] = l.original(k, qo, chunks)
					dups++
					continue
				case refuse:
					r.positions[i] = Position{QueueOffset: -1, LogOffset: -1, End: -1, Err: err}
					refused++
					continue
				}
			}
			qo := nextOffset(k)
			size := recordSize(len(e.Topic), len(e.Payload))
			c := place(size)
			var flags byte
			if e.Recovered {
				flags = flagRecovered
			}
			c.buf = appendRecord(c.buf, flags, e.Topic, e.Queue, qo, now, e.Payload)
			r.positions[i] = Position{QueueOffset: qo, LogOffset: pos, End: pos + int64(size)}
			next[k] = qo + 1
			pos += int64(size)
			if applyStamp {
				l.prod.applyTo(ids, st, k, e.Producer, qo, now)
			}
			if l.watches != nil {
				l.noteWatched(k, e.Payload)
			}
		}
		l.prod.note(now)
		r.end = pos
		ok = append(ok, r)
	}
	l.mu.RUnlock()
	if cap(chunks[0].buf) <= 64<<20 {
		l.buf = chunks[0].buf[:0] // keep the scratch buffer unless a burst made it huge
	}

	if err := l.writeChunks(chunks); err != nil {
		for _, r := range ok {
			r.err = err
		}
		ok = nil
		l.prod.rollback()
	} else {
		l.prod.commit()
		l.prod.duplicates.Add(dups)
		l.prod.refused.Add(refused)
	}
	if len(ok) > 0 {
		l.publish(chunks, ok, now)
	}
	for _, r := range batch {
		if r.err != nil {
			r.done(nil, r.err)
		}
	}
	l.complete(ok)
}

// placeRaw checks a raw append record by record and places its bytes.
func (l *Log) placeRaw(r *appendReq, pos *int64, nextOffset func(queueKey) int64, next map[queueKey]int64, place func(int) *chunk) error {
	if r.rawOffset != *pos {
		return fmt.Errorf("%w: data starts at %d but the log ends at %d", ErrOffsetMismatch, r.rawOffset, *pos)
	}
	// Validate everything before placing anything, so a bad record leaves no trace.
	local := make(map[queueKey]int64)
	var sizes []int
	type stamped struct {
		k         queueKey
		ps        ProducerStamp
		qo, time  int64
		recovered bool
	}
	var stamps []stamped
	var topic string
	for b := r.raw; len(b) > 0; {
		n, err := recordLen(b, maxRecordSize)
		if err == nil && n > len(b) {
			err = errors.New("truncated record")
		}
		if err != nil {
			return fmt.Errorf("%w: raw record at %d: %w", ErrCorrupt, *pos+int64(len(r.raw)-len(b)), err)
		}
		rec, tb, err := decodeRecordView(b[:n])
		if err != nil {
			return fmt.Errorf("%w: raw record at %d: %w", ErrCorrupt, *pos+int64(len(r.raw)-len(b)), err)
		}
		topic = sameTopic(topic, tb)
		rec.Topic = topic
		k := queueKey{topic, rec.Queue}
		want, seen := local[k]
		if !seen {
			want = nextOffset(k)
			if _, placed := next[k]; l.rawStartsQueue(k, rec.QueueOffset, want, placed) {
				want = rec.QueueOffset // the master set a base (queuebase.go)
			}
		}
		if rec.QueueOffset != want {
			return fmt.Errorf("%w: record at %d has queue offset %d for %s/%d, want %d",
				ErrOffsetMismatch, *pos+int64(len(r.raw)-len(b)), rec.QueueOffset, rec.Topic, rec.Queue, want)
		}
		local[k] = want + 1
		sizes = append(sizes, n)
		if l.prod.stamp != nil {
			if ps, ok := l.prod.stamp(rec.Payload); ok && ps.ID != 0 {
				stamps = append(stamps, stamped{k, ps, rec.QueueOffset, rec.StoreTime, rec.Flags&flagRecovered != 0})
			}
		}
		b = b[n:]
	}
	for _, s := range stamps {
		if s.recovered {
			// As the master did: only where the state takes it as next.
			_, st := l.prod.find(s.k, s.ps.ID)
			if v, _, _ := l.prod.check(st, s.ps, s.time); v != accept {
				continue
			}
		}
		l.prod.apply(s.k, s.ps, s.qo, s.time)
	}
	from := 0
	for _, n := range sizes {
		c := place(n)
		c.buf = append(c.buf, r.raw[from:from+n]...)
		from += n
		*pos += int64(n)
	}
	for k, v := range local {
		next[k] = v
	}
	r.end = *pos
	return nil
}

// writeChunks writes a group's chunks, creating new segments as needed. On
// failure it undoes everything it did: it removes the segments it created
// and cuts the active one back. If that fails too, the files no longer match
// the log in memory, and the log is broken until it is reopened.
func (l *Log) writeChunks(chunks []chunk) error {
	var created []*segment
	wroteActive := false
	undo := func(cause error) error {
		var errs []error
		for _, s := range created {
			if err := l.discard(s); err != nil {
				errs = append(errs, err)
			}
		}
		if first := chunks[0]; wroteActive {
			if err := first.seg.f.Truncate(first.start); err != nil {
				errs = append(errs, fmt.Errorf("truncate %s: %w", first.seg.name, err))
			}
		}
		l.pt.use(chunks[0].seg, chunks[0].start)
		if len(errs) > 0 {
			l.broken = fmt.Errorf("%w: undoing a failed write: %w (write: %w)", ErrBroken, errors.Join(errs...), cause)
			l.publishBroken()
			l.log.Error("log broken", "error", l.broken)
			return l.broken
		}
		return cause
	}
	for i := range chunks {
		c := &chunks[i]
		if c.seg == nil {
			if err := l.pt.roll(chunks[i-1].seg, chunks[i-1].start+int64(len(chunks[i-1].buf))); err != nil {
				return undo(err)
			}
			s, err := l.createSegment(c.base)
			if s != nil {
				created = append(created, s)
			}
			if err != nil {
				return undo(err)
			}
			c.seg = s
		}
		if len(c.buf) == 0 {
			continue
		}
		wroteActive = wroteActive || i == 0
		l.pt.beforeWrite(c.seg, c.start+int64(len(c.buf)))
		if _, err := c.seg.f.WriteAt(c.buf, c.start); err != nil {
			l.log.Warn("commit log write failed", "segment", c.seg.name, "bytes", len(c.buf), "error", err)
			return undo(fmt.Errorf("storage: write %s: %w", c.seg.name, err))
		}
	}
	if last := chunks[len(chunks)-1]; len(created) > 0 {
		l.pt.use(last.seg, last.start+int64(len(last.buf)))
	}
	return nil
}

// publish makes a written group visible to readers: the new segments,
// the index entries, the key refs and the end offset. now is the store
// time of the group's entries.
func (l *Log) publish(chunks []chunk, ok []*appendReq, now int64) {
	// The fingerprints and key refs are computed before l.mu is taken:
	// readers wait for none of it.
	fps := l.fpBuf[:0]
	l.kc.refs = l.kc.refs[:0]
	for _, r := range ok {
		if r.raw != nil {
			fps = l.rawFingerprints(fps, r.raw, r.rawOffset)
			continue
		}
		for i, e := range r.entries {
			if p := r.positions[i]; !p.Duplicate && p.Err == nil {
				fps = append(fps, l.fingerprint(e.Payload))
				l.collectKeys(&l.kc, e.Payload, p.LogOffset, now)
			}
		}
	}
	l.fpBuf = fps
	l.mu.Lock()
	for i := range chunks {
		c := &chunks[i]
		if c.seg != l.segments[len(l.segments)-1] {
			l.segments = append(l.segments, c.seg)
		}
		c.seg.size = c.start + int64(len(c.buf))
	}
	for _, r := range ok {
		if r.raw != nil {
			fps = fps[l.indexRaw(r.raw, r.rawOffset, fps):]
			continue
		}
		for i, e := range r.entries {
			p := r.positions[i]
			if p.Duplicate || p.Err != nil {
				continue // not written
			}
			l.indexAdd(queueKey{e.Topic, e.Queue}, p.QueueOffset, p.LogOffset, int32(p.End-p.LogOffset), fps[0])
			fps = fps[1:]
		}
	}
	l.keys.add(l.kc.refs)
	l.end.Store(ok[len(ok)-1].end) // appends are placed in order: the last ends the group
	last, due := l.cutDue(false)
	l.mu.Unlock()
	if due {
		l.cut(last) // the snapshot is taken without l.mu: readers go on meanwhile
	}
}

// them.
func (l *Log) complete(ok []*appendReq) {
	var wait bool
	for _, r := range ok {
		if l.cfg.Flush == FlushSync || r.flush {
			wait = true
			break
		}
	}
	if !wait {
		for _, r := range ok {
			r.done(r.positions, nil)
		}
		return
	}
	l.fmu.Lock()
	var now []*appendReq
	for _, r := range ok {
		if l.cfg.Flush == FlushSync || r.flush {
			l.waiters = append(l.waiters, flushWaiter{end: r.end, req: r})
		} else {
			now = append(now, r)
		}
	}
	l.fmu.Unlock()
	select {
	case l.flushWake <- struct{}{}:
	default:
	}
	for _, r := range now {
		r.done(r.positions, nil)
	}
}

// original is the answer to a duplicate of the entry stored in queue k at
// queue offset qo (-1: older than the state remembers). The record is in the
// index, or placed earlier in this group (in chunks), or deleted by
// retention (then only its queue offset is known). l.mu is read-held.
func (l *Log) original(k queueKey, qo int64, chunks []chunk) Position {
	p := Position{QueueOffset: qo, LogOffset: -1, End: -1, Duplicate: true}
	if qo < 0 {
		return p
	}
	if qi := l.index[k]; qi != nil && qo < qi.next() {
		if qo >= qi.first {
			if e, err := qi.entryAt(qo); err == nil {
				p.LogOffset, p.End = e.pos, e.pos+int64(e.size)
			}
		}
		return p
	}
	for _, c := range chunks {
		at := c.base + c.start
		for b := c.buf; len(b) > 0; {
			n, err := recordLen(b, maxRecordSize)
			if err != nil || n > len(b) {
				break
			}
			if rec, err := decodeRecord(b[:n]); err == nil && rec.QueueOffset == qo && rec.Queue == k.queue && rec.Topic == k.topic {
				p.LogOffset, p.End = at, at+int64(n)
				return p
			}
			at += int64(n)
			b = b[n:]
		}
	}
	return p
}
