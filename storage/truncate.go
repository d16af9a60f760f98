package storage

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/ferrymq/ferrymq/storage/vfs"
)

// Errors of Truncate and of reads that race with it.
var (
	// ErrNotBoundary is returned by Truncate for an offset inside the log
	// where no record starts.
	ErrNotBoundary = errors.New("storage: offset is not a record boundary")
	// ErrReadTruncated is returned by Read and ReadRaw when the log was
	// truncated while they read: the bytes they planned to read may since
	// hold other records. Reading again gives the truncated log's records.
	ErrReadTruncated = errors.New("storage: the log was truncated during the read")
)

// TruncateResult says what Truncate cut: the records in [From, To), of
// which there were Records, now kept in SideFile. When nothing was cut,
// Records is 0, From and To are the log's end and SideFile is "".
type TruncateResult struct {
	From, To int64
	Records  int
	SideFile string
}

// truncateReq is a Truncate waiting for the writer.
type truncateReq struct {
	offset   int64
	sideFile string
	res      TruncateResult
}

// SideFileName is the name Truncate's side file should have (in a directory
// of its caller's choice, such as "truncated" inside the log directory): the
// log offset of its first record, as 20 decimal digits, the epoch that made
// the cut, and ".log", e.g. "00000000000000001234-epoch-7.log".
// ReadRecordFile takes its records' log offsets from that prefix.
func SideFileName(from int64, epoch uint32) string {
	return fmt.Sprintf("%020d-epoch-%d.log", from, epoch)
}

// Truncate cuts the log back to offset: it removes every record at or past
// offset, and the log goes on from offset, as if those records had never
// been appended. A slave that was a master before a failover uses it to cut
// the records its new master does not have, before copying from it.
//
// An offset at or past EndOffset is a no-op (zero Records, no side file).
// Otherwise offset must be the start of a record at or after StartOffset:
// an offset before StartOffset (or negative) is ErrOutOfRange, and one
// inside a record is ErrNotBoundary; nothing changes.
//
// First, the records in [offset, end) are written, byte for byte as the
// segments hold them (the same record format), to sideFile: the parent
// directory is created, the bytes go to sideFile+".tmp", which is synced
// and renamed to sideFile, and the directory is synced. sideFile must not
// be in the log's own directory (a subdirectory is fine); name it with
// SideFileName so that ReadRecordFile knows the log offsets. If this (or
// any check before it) fails, nothing is cut and the log goes on as before.
//
// Then the log is cut: the checkpoint is moved back to offset and synced,
// the segment holding offset is truncated there and synced, and the
// segments after it are removed, the last first; the end offset, the
// flushed offset, the per-queue indexes (with the queues' next offsets) and
// the producer deduplication state become what Open would find in the cut
// log (the state is rebuilt by replaying the records before offset). A crash
// at any point leaves a log that Open recovers either unchanged or cut at
// offset, never anything else, with everything before offset intact. A
// failure once the cut has begun breaks the log (ErrBroken, matched by the
// error returned): appends are refused until it is reopened, and Open then
// recovers it, unchanged or cut.
//
// Truncate runs on the writer, between groups: appends queued before it
// are written first, and the ones queued after it go on from offset. The
// caller must nevertheless have stopped issuing Append, AppendAsync and
// AppendRaw before calling it and wait for it to return, since what those
// appends would mean across the cut is the caller's to decide. Reads
// (Read, ReadRaw, QueueRange and the others) may run meanwhile: they see
// the log before or after the cut, or fail with ErrReadTruncated if the cut
// happened under them. It also waits for a DeleteBefore in progress and
// holds later ones off until it is done.
func (l *Log) Truncate(offset int64, sideFile string) (TruncateResult, error) {
	ch := make(chan error, 1)
	tr := &truncateReq{offset: offset, sideFile: sideFile}
	l.enqueue(&appendReq{trunc: tr, done: func(_ []Position, err error) { ch <- err }})
	err := <-ch
	return tr.res, err
}

// truncate does Truncate on the writer goroutine.
func (l *Log) truncate(offset int64, sideFile string) (TruncateResult, error) {
	l.retainMu.Lock()
	defer l.retainMu.Unlock()
	l.idxMu.Lock() // no index chunk is written meanwhile
	defer l.idxMu.Unlock()
	end := l.end.Load()
	if offset >= end {
		return TruncateResult{From: end, To: end}, nil
	}
	if l.broken != nil {
		return TruncateResult{}, l.broken
	}
	if sideFile == "" {
		return TruncateResult{}, errors.New("storage: truncate: no side file named")
	}
	if abs, err := filepath.Abs(filepath.Dir(sideFile)); err == nil {
		if dir, err := filepath.Abs(l.cfg.Dir); err == nil && abs == dir {
			return TruncateResult{}, fmt.Errorf("storage: truncate: the side file %s must not be in the log directory", sideFile)
		}
	}

	// Check the offset and find the segments, under the read lock; only
	// this goroutine changes them now that DeleteBefore is held off.
	l.mu.RLock()
	start := l.segments[0].base
	if offset < start || offset < 0 {
		l.mu.RUnlock()
		return TruncateResult{}, fmt.Errorf("%w: truncate at log offset %d, before the log's start %d", ErrOutOfRange, offset, start)
	}
	si := sort.Search(len(l.segments), func(i int) bool { return l.segments[i].base > offset }) - 1
	segs := slices.Clone(l.segments)
	l.mu.RUnlock()

	// Everything written is made durable first: the checkpoint will say
	// so, and the records before offset must survive a crash.
	l.syncOnce()
	if l.flushed.Load() < end {
		return TruncateResult{}, errors.New("storage: truncate: the sync before it failed")
	}

	if err := l.rewriteQueues(start); err != nil {
		return TruncateResult{}, fmt.Errorf("storage: truncate: %w", err)
	}

	// The state the cut log will have, as recovery would build it.
	cut, err := l.rescan(segs[:si+1], offset)
	if err != nil {
		if errors.Is(err, ErrNotBoundary) {
			err = fmt.Errorf("%w: truncate at log offset %d (the log holds [%d, %d))", ErrNotBoundary, offset, start, end)
		}
		return TruncateResult{}, err
	}

	res := TruncateResult{From: offset, To: end, SideFile: sideFile}
	if res.Records, err = l.writeSideFile(sideFile, segs[si:], offset, end); err != nil {
		return TruncateResult{}, err
	}

	// Index chunks past the cut describe records about to be cut: they go
	// first, for good (a failure here leaves the log as it was).
	l.mu.RLock()
	doomedChunks := slices.Clone(l.chunks[len(cut.chunks):])
	l.mu.RUnlock()
	if err := l.removeChunks(doomedChunks); err != nil {
		return TruncateResult{}, fmt.Errorf("storage: truncate: %w", err)
	}

	// The pre-touched zeros go too, and touching starts again on whatever
	// segment is active when Truncate returns.
	last := segs[len(segs)-1]
	defer func() { l.pt.use(l.segments[len(l.segments)-1], l.segments[len(l.segments)-1].size) }()
	if err := l.pt.cut(last, last.size); err != nil {
		return TruncateResult{}, fmt.Errorf("storage: truncate: %w", err)
	}

	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	// A checkpoint past the cut would make Open take the cut log for one
	// missing durable records: it goes back first, durably.
	err = l.putCheckpoint(offset)
	if err == nil {
		err = l.checkpoint.Sync()
	}
	if err != nil {
		_ = l.putCheckpoint(l.flushed.Load()) // best effort: it was only lowered
		return TruncateResult{}, fmt.Errorf("storage: truncate: write the checkpoint: %w", err)
	}

	// The point of no return: a crash from here on leaves the log
	// unchanged (the segment holding offset not yet cut) or cut at offset
	// (recovery removes segments that do not continue the log past the
	// checkpoint). A failure breaks the log until it is reopened.
	//
	// The file is cut under the write lock, with gen moved: a read planned
	// before fails with ErrReadTruncated once it sees gen, and one planned
	// after sees the cut log.
	s := segs[si]
	keep := offset - s.base
	l.mu.Lock()
	l.gen.Add(1)
	if err := s.f.Truncate(keep); err != nil {
		l.mu.Unlock()
		return TruncateResult{}, l.breakBy(fmt.Errorf("truncate %s at %d: %w", s.name, keep, err))
	}
	l.segments = slices.Clone(segs[:si+1])
	s.size = keep
	l.index = cut.index
	l.chunks = cut.chunks
	l.keys = cut.keys
	l.end.Store(offset)
	l.flushed.Store(offset)
	l.lastAt = cut.lastAt // under mu: LastRecord reads it there
	l.mu.Unlock()
	for _, c := range doomedChunks {
		c.drop()
	}
	l.prod.replace(cut.prod)
	l.cutMu.Lock()
	l.cutFrom = cut.end
	for len(l.cuts) > 0 && l.cuts[len(l.cuts)-1].to > offset {
		l.cuts = l.cuts[:len(l.cuts)-1]
	}
	if len(l.cuts) > 0 {
		l.cutFrom = l.cuts[len(l.cuts)-1].to
	}
	l.cutMu.Unlock()
	// Flushes waiting for bytes that are now cut were covered by the first
	// sync: they are done.
	l.fmu.Lock()
	waiters := l.waiters
	l.waiters = nil
	l.fmu.Unlock()
	for _, w := range waiters {
		w.req.done(w.req.positions, nil)
	}
	if err := s.f.Sync(); err != nil {
		return res, l.breakBy(fmt.Errorf("sync %s: %w", s.name, err))
	}

	var errs []error
	doomed := segs[si+1:]
	for i := len(doomed) - 1; i >= 0; i-- {
		d := doomed[i]
		if err := l.fs.Remove(d.name); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", d.name, err))
		}
		d.removed.Store(true)
		if d.refs.Load() == 0 {
			d.close() // else the last reader closes it
		}
	}
	if len(doomed) > 0 {
		if err := l.fs.SyncDir(l.cfg.Dir); err != nil {
			errs = append(errs, fmt.Errorf("sync dir %s: %w", l.cfg.Dir, err))
		}
	}
	if len(errs) > 0 {
		// Segments left past the end would come back at the next Open, or
		// clash with the segments new appends create: reopen first.
		return res, l.breakBy(errors.Join(errs...))
	}
	l.log.Info("truncated the log", "from", offset, "to", end, "records", res.Records, "side_file", sideFile)
	return res, nil
}

// rewriteQueues rewrites the queue offsets file, if there is one, for the
// log's start. A deletion that did not finish (a removal that failed, or
// that a power loss undid) leaves a file with the queues' offsets for a
// later start than the log has: harmless while the records between are
// there (a queue's offsets come from its records), but a queue whose every
// record a truncation then cuts would come back with an offset past them,
// and no longer follow its master's log.
func (l *Log) rewriteQueues(start int64) error {
	old, err := l.readQueues()
	if err != nil || old == nil {
		return err
	}
	l.mu.RLock()
	floors, err := queueFloors(l.index, start)
	l.mu.RUnlock()
	if err != nil {
		return err
	}
	return l.writeQueues(floors)
}

// breakBy marks the log broken by a failed truncation and returns the error.
func (l *Log) breakBy(err error) error {
	l.broken = fmt.Errorf("%w: truncate: %w", ErrBroken, err)
	l.publishBroken()
	l.log.Error("log broken", "error", l.broken)
	return l.broken
}

// publishBroken makes l.broken visible to Broken.
func (l *Log) publishBroken() {
	err := l.broken
	l.brokenSeen.Store(&err)
}

// Broken returns the error that broke the log (a failed write or
// truncation that could not be undone: every later append fails with it
// until the log is reopened), or nil. Safe from any goroutine.
func (l *Log) Broken() error {
	if p := l.brokenSeen.Load(); p != nil {
		return *p
	}
	return nil
}

// cutState is the index and deduplication state of the log cut at an
// offset, as rescan builds it.
type cutState struct {
	index  map[queueKey]*queueIndex
	prod   *producerTable
	chunks []*indexChunk // the index chunks that end at or before the cut
	end    int64         // where the last of them ends (or the log's start)
	lastAt int64         // the last record before the cut
	keys   keyTail       // the key refs of the records after end
}

// rescan builds the indexes and the producer state of the log cut at
// offset, the way recovery does: from the index chunks that end at or
// before offset, then from the records of segs (the segments up to the one
// holding offset) after the last of them. It changes nothing. An offset
// inside a record is ErrNotBoundary. Runs on the writer with idxMu held.
func (l *Log) rescan(segs []*segment, offset int64) (*cutState, error) {
	tmp := &Log{cfg: l.cfg, fs: l.fs, log: l.log, index: make(map[queueKey]*queueIndex), lastAt: -1}
	tmp.cfg.IndexChunkBytes = math.MaxInt64 // no cuts: the indexer cuts again after
	tmp.prod.init(l.cfg)
	cut := &cutState{end: segs[0].base}
	firsts := map[queueKey]int64{}
	l.mu.RLock()
	n := 0
	for n < len(l.chunks) && l.chunks[n].to <= offset {
		n++
	}
	cut.chunks = slices.Clone(l.chunks[:n])
	for k, qi := range l.index {
		firsts[k] = qi.first
		p := 0
		for p < len(qi.parts) && qi.parts[p].c.to <= offset {
			p++
		}
		if p > 0 {
			last := qi.parts[p-1]
			tmp.index[k] = &queueIndex{first: qi.first, parts: slices.Clone(qi.parts[:p]), base: last.firstQO + last.count}
		}
	}
	l.mu.RUnlock()
	if n > 0 {
		c := cut.chunks[n-1]
		cut.end, tmp.lastAt = c.to, c.last.at
		if err := c.readSnapshot(&tmp.prod); err != nil {
			return nil, fmt.Errorf("storage: truncate: the producer snapshot of %s: %w", c.name, err)
		}
		tmp.prod.forgetBefore(func(k queueKey) int64 { return tmp.firstAt(k, segs[0].base) })
	}
	for _, s := range segs {
		shadow := &segment{base: s.base, name: s.name, f: s.f, size: min(s.size, offset-s.base)}
		from := max(cut.end-s.base, 0)
		if from >= shadow.size {
			continue
		}
		good, reason, err := tmp.scanSegment(shadow, from)
		if err != nil {
			return nil, fmt.Errorf("storage: truncate: %w", err)
		}
		if reason != "" {
			if good < s.size && recordValidAt(s, good) {
				return nil, ErrNotBoundary // the record there runs past offset
			}
			return nil, fmt.Errorf("storage: truncate: %w", &CorruptError{Offset: s.base + good, Segment: s.name, Reason: reason})
		}
	}
	if err := tmp.restoreQueueFloors(); err != nil {
		return nil, fmt.Errorf("storage: truncate: %w", err)
	}
	for k, qi := range tmp.index {
		if f, ok := firsts[k]; ok {
			qi.first = min(max(f, qi.lowest()), qi.next())
		}
	}
	cut.index, cut.prod, cut.lastAt, cut.keys = tmp.index, &tmp.prod, tmp.lastAt, tmp.keys
	return cut, nil
}

// recordValidAt reports whether a whole, valid record starts at segment
// offset at.
func recordValidAt(s *segment, at int64) bool {
	var h [recordHeaderSize]byte
	if _, err := s.f.ReadAt(h[:], at); err != nil {
		return false
	}
	n, err := recordLen(h[:], maxRecordSize)
	if err != nil || at+int64(n) > s.size {
		return false
	}
	b := make([]byte, n)
	if _, err := s.f.ReadAt(b, at); err != nil {
		return false
	}
	_, err = decodeRecord(b)
	return err == nil
}

// replace takes the state of o (built by a replay) in place of its own; the
// counters since Open stay.
func (t *producerTable) replace(o *producerTable) {
	t.queues = o.queues
	t.tracked = o.tracked
	t.lastSweep, t.swept = o.lastSweep, o.swept
	t.trackedPub.Store(int64(t.tracked))
}

// writeSideFile copies the records in [from, end) of segs (the first holds
// from) to path, checking each, and returns how many there were. The file
// appears under its name only whole and synced.
func (l *Log) writeSideFile(path string, segs []*segment, from, end int64) (int, error) {
	if err := vfs.MkdirAllDurable(l.fs, filepath.Dir(path)); err != nil {
		return 0, fmt.Errorf("storage: truncate: write the side file %s: %w", path, err)
	}
	var records int
	err := l.writeFileAtomicFunc(path, func(f vfs.File) (err error) {
		records, err = copyRecords(f, segs, from, end)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("storage: truncate: write the side file %s: %w", path, err)
	}
	return records, nil
}

// writerAt is where copyRecords writes.
type writerAt interface {
	WriteAt(b []byte, off int64) (int, error)
}

// copyRecords copies the records in [from, end) of segs to w from offset 0,
// checking each record, a chunk at a time.
func copyRecords(w writerAt, segs []*segment, from, end int64) (int, error) {
	const chunkSize = 4 << 20
	var buf []byte
	records := 0
	out := int64(0)
	for _, s := range segs {
		pos := max(from, s.base) - s.base        // segment offset of the next record
		stop := min(end, s.base+s.size) - s.base // segment offset where the copy stops
		for pos < stop {
			n := int(min(chunkSize, stop-pos))
			if cap(buf) < n {
				buf = make([]byte, n)
			}
			b := buf[:n]
			if _, err := s.f.ReadAt(b, pos); err != nil {
				return 0, fmt.Errorf("read %s at %d: %w", s.name, pos, err)
			}
			good := 0
			for good < len(b) {
				rl, err := recordLen(b[good:], maxRecordSize)
				if err != nil && len(b)-good >= recordHeaderSize {
					return 0, &CorruptError{Offset: s.base + pos + int64(good), Segment: s.name, Reason: err.Error()}
				}
				if err != nil || good+rl > len(b) {
					break
				}
				if _, err := decodeRecord(b[good : good+rl]); err != nil {
					return 0, &CorruptError{Offset: s.base + pos + int64(good), Segment: s.name, Reason: err.Error()}
				}
				good += rl
				records++
			}
			if good == 0 { // a record larger than the chunk: read it whole
				rl, err := recordLen(b, maxRecordSize)
				if err == nil && pos+int64(rl) > stop {
					err = errors.New("record runs past the end")
				}
				if err != nil {
					return 0, &CorruptError{Offset: s.base + pos, Segment: s.name, Reason: err.Error()}
				}
				buf = make([]byte, rl)
				b = buf
				if _, err := s.f.ReadAt(b, pos); err != nil {
					return 0, fmt.Errorf("read %s at %d: %w", s.name, pos, err)
				}
				if _, err := decodeRecord(b); err != nil {
					return 0, &CorruptError{Offset: s.base + pos, Segment: s.name, Reason: err.Error()}
				}
				good = rl
				records++
			}
			if _, err := w.WriteAt(b[:good], out); err != nil {
				return 0, err
			}
			out += int64(good)
			pos += int64(good)
		}
	}
	return records, nil
}
