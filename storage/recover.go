package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

const (
	checkpointName  = "checkpoint"
	checkpointMagic = "FYCP"
	checkpointSize  = 16
)

// readCheckpoint returns the flushed offset the checkpoint records, or 0 if
// there is none, or it is short or does not check out (a crash while it was
// first written or rewritten: it is never synced). A checkpoint that cannot
// be read is an error: taking it for 0 would let recovery take corruption
// in durable records for a torn tail and cut them.
func (l *Log) readCheckpoint() (int64, error) {
	name := filepath.Join(l.cfg.Dir, checkpointName)
	f, err := l.fs.OpenRW(name)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("storage: open checkpoint: %w", err)
	}
	defer f.Close()
	var b [checkpointSize]byte
	if n, err := f.ReadAt(b[:], 0); n < checkpointSize {
		if errors.Is(err, io.EOF) {
			l.log.Warn("ignoring a short checkpoint")
			return 0, nil
		}
		return 0, fmt.Errorf("storage: read checkpoint %s: %w", name, err)
	}
	if string(b[12:]) != checkpointMagic || crc32.Checksum(b[:8], castagnoli) != binary.BigEndian.Uint32(b[8:]) {
		l.log.Warn("ignoring a checkpoint that does not check out")
		return 0, nil
	}
	return int64(binary.BigEndian.Uint64(b[:8])), nil
}

// writeCheckpoint records that the log is synced up to off. It is called by
// the flusher after a sync, and is not synced itself.
func (l *Log) writeCheckpoint(off int64) {
	if l.checkpoint == nil {
		return
	}
	if err := l.putCheckpoint(off); err != nil {
		l.log.Warn("checkpoint write failed", "error", err)
	}
}

// putCheckpoint writes the checkpoint (without syncing it).
func (l *Log) putCheckpoint(off int64) error {
	var b [checkpointSize]byte
	binary.BigEndian.PutUint64(b[:], uint64(off))
	binary.BigEndian.PutUint32(b[8:], crc32.Checksum(b[:8], castagnoli))
	copy(b[12:], checkpointMagic)
	_, err := l.checkpoint.WriteAt(b[:], 0)
	return err
}

func (l *Log) openCheckpointFile() error {
	name := filepath.Join(l.cfg.Dir, checkpointName)
	f, err := l.fs.OpenRW(name)
	if errors.Is(err, os.ErrNotExist) {
		f, err = l.fs.Create(name) // made durable by finishRecovery's SyncDir
	}
	if err != nil {
		return fmt.Errorf("storage: open checkpoint: %w", err)
	}
	l.checkpoint = f
	return nil
}

// recover opens the segments, checks every record, truncates a torn tail
// and rebuilds the indexes. See the package doc for the rules.
func (l *Log) recover() error {
	names, err := l.fs.List(l.cfg.Dir)
	if err != nil {
		return fmt.Errorf("storage: list %s: %w", l.cfg.Dir, err)
	}
	var bases []int64
	for _, n := range names {
		if !strings.HasSuffix(n, ".log") {
			continue
		}
		base, err := strconv.ParseInt(strings.TrimSuffix(n, ".log"), 10, 64)
		if err != nil || len(n) != 24 {
			return fmt.Errorf("storage: unexpected file %s in %s", n, l.cfg.Dir)
		}
		bases = append(bases, base)
	}
	checkpoint, err := l.readCheckpoint()
	if err != nil {
		return err
	}
	for _, base := range bases {
		f, err := l.fs.OpenRW(l.segmentPath(base))
		if err != nil {
			return fmt.Errorf("storage: open segment: %w", err)
		}
		size, err := f.Size()
		if err != nil {
			_ = f.Close()
			return fmt.Errorf("storage: size of %s: %w", l.segmentPath(base), err)
		}
		l.segments = append(l.segments, &segment{base: base, name: l.segmentPath(base), f: f, size: size})
	}

	// The index chunks cover the log up to end: records before it are
	// neither read nor checked again.
	end, err := l.loadChunks(checkpoint)
	if err != nil {
		return err
	}
	l.cutFrom = end
	l.scanLimit = checkpoint
	defer func() { l.scanLimit = -1 }()
	for i := 0; i < len(l.segments); i++ {
		s := l.segments[i]
		if s.base+s.size <= end && i < len(l.segments)-1 {
			continue // wholly indexed (loadChunks checked that the segments follow each other)
		}
		from := max(end-s.base, 0)
		if from == 0 && s.base != end {
			if end >= checkpoint {
				// A segment that does not continue the log after the durable
				// part: a tail left by a crash during a roll.
				return l.truncateTail(i, 0, end, checkpoint, fmt.Sprintf("segment %s does not start at %d", s.name, end))
			}
			return &CorruptError{Offset: end, Segment: s.name, Reason: fmt.Sprintf("segment starts at %d, want %d", s.base, end)}
		}
		good, reason, err := l.scanSegment(s, from)
		if err != nil {
			return err
		}
		end = s.base + good
		if reason != "" {
			if end < checkpoint {
				return &CorruptError{Offset: end, Segment: s.name, Reason: reason}
			}
			return l.truncateTail(i, good, end, checkpoint, reason)
		}
	}
	if end < checkpoint {
		return &CorruptError{Offset: end, Segment: l.lastSegmentName(), Reason: fmt.Sprintf("log ends at %d, before its checkpoint %d", end, checkpoint)}
	}
	return l.finishRecovery(end, checkpoint)
}

// restoreQueueFloors gives every queue whose records were all deleted by
// retention its next offset back. Queues with records take their offsets
// from the records.
func (l *Log) restoreQueueFloors() error {
	floors, err := l.readQueues()
	if err != nil {
		return err
	}
	for k, first := range floors {
		if l.index[k] == nil {
			l.index[k] = &queueIndex{first: first, base: first}
		}
	}
	return nil
}

// setQueueFirsts makes each queue's first offset that of its first record
// at or past start, the log's first byte: index chunks may list records
// that retention deleted.
func (l *Log) setQueueFirsts(start int64) error {
	for k, qi := range l.index {
		if len(qi.parts) == 0 || qi.parts[0].c.from >= start {
			continue
		}
		first, err := qi.offsetAt(start)
		if err != nil {
			return fmt.Errorf("storage: index of %s/%d: %w", k.topic, k.queue, err)
		}
		qi.first = max(qi.first, first)
	}
	return nil
}

func (l *Log) lastSegmentName() string {
	if len(l.segments) == 0 {
		return l.cfg.Dir
	}
	return l.segments[len(l.segments)-1].name
}

// truncateTail cuts segment i at good bytes and removes every later segment.
func (l *Log) truncateTail(i int, good, end, checkpoint int64, reason string) error {
	s := l.segments[i]
	var lost int64
	for _, t := range l.segments[i:] {
		lost += t.size
	}
	lost -= good
	if zeros, _ := zerosFrom(s, good); zeros && i == len(l.segments)-1 {
		l.log.Info("cutting the pre-touched zeros after the log's end", "segment", s.name, "offset", end, "bytes", lost)
	} else {
		l.log.Warn("truncating a torn tail", "segment", s.name, "offset", end, "checkpoint", checkpoint, "bytes", lost, "reason", reason)
	}
	if good == 0 && i > 0 {
		i-- // drop the whole segment
	} else {
		if err := s.f.Truncate(good); err != nil {
			return fmt.Errorf("storage: truncate %s: %w", s.name, err)
		}
		s.size = good
	}
	for _, t := range l.segments[i+1:] {
		_ = t.f.Close()
		if err := l.fs.Remove(t.name); err != nil {
			return fmt.Errorf("storage: remove %s: %w", t.name, err)
		}
	}
	l.segments = l.segments[:i+1]
	if err := l.fs.SyncDir(l.cfg.Dir); err != nil {
		return fmt.Errorf("storage: sync dir: %w", err)
	}
	return l.finishRecovery(end, checkpoint)
}

func (l *Log) finishRecovery(end, checkpoint int64) error {
	if err := l.restoreQueueFloors(); err != nil {
		return err
	}
	if len(l.segments) > 0 {
		if err := l.setQueueFirsts(l.segments[0].base); err != nil {
			return err
		}
	}
	if len(l.segments) == 0 {
		s, err := l.createSegment(0)
		if err != nil {
			if s != nil {
				_ = l.discard(s)
			}
			return err
		}
		l.segments = append(l.segments, s)
	}
	// What a crashed process left in the page cache is made durable now
	// (the checkpoint vouches for what is before it).
	for i, s := range l.segments {
		if s.base+s.size <= checkpoint && i < len(l.segments)-1 {
			continue
		}
		if err := s.f.Sync(); err != nil {
			return fmt.Errorf("storage: sync %s: %w", s.name, err)
		}
	}
	if err := l.openCheckpointFile(); err != nil {
		return err
	}
	// And so are the directory's entries: a segment that a killed process
	// created but never synced the name of would be the one new appends
	// go to, and a power loss would take it, acknowledged records and
	// all. So would a checkpoint just created (a lost one counts as 0, and
	// recovery would take corruption in synced records for a torn tail).
	if err := l.fs.SyncDir(l.cfg.Dir); err != nil {
		return fmt.Errorf("storage: sync dir %s: %w", l.cfg.Dir, err)
	}
	l.prod.trackedPub.Store(int64(l.prod.tracked))
	l.end.Store(end)
	l.flushed.Store(end)
	l.writeCheckpoint(end)
	return nil
}

// scanSegment checks s record by record from segment offset from (a
// record boundary) and indexes every good record, cutting index chunks as
// it goes. It returns the length of the good prefix and, if a bad record
// or stray bytes follow it, why.
func (l *Log) scanSegment(s *segment, from int64) (good int64, reason string, err error) {
	const chunkSize = 4 << 20
	var buf []byte
	bufAt := int64(0) // segment offset of buf[0]
	// fill makes buf hold [at, at+n) if the segment has it.
	fill := func(at int64, n int) (bool, error) {
		if at >= bufAt && at+int64(n) <= bufAt+int64(len(buf)) {
			return true, nil
		}
		if at+int64(n) > s.size {
			return false, nil
		}
		want := max(n, chunkSize)
		if rest := s.size - at; int64(want) > rest {
			want = int(rest)
		}
		if cap(buf) < want {
			buf = make([]byte, want)
		}
		buf = buf[:want]
		if got, err := s.f.ReadAt(buf, at); got < want {
			// The segment had these bytes when it was opened: a short
			// read is an error, not a torn tail.
			if err == nil || errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return false, fmt.Errorf("storage: read %s at %d: %w", s.name, at, err)
		}
		bufAt = at
		return true, nil
	}
	at := from
	for at < s.size {
		ok, err := fill(at, recordHeaderSize)
		if err != nil {
			return at, "", err
		}
		if !ok {
			return at, fmt.Sprintf("%d stray bytes at the end", s.size-at), nil
		}
		n, lerr := recordLen(buf[at-bufAt:], maxRecordSize)
		if lerr != nil {
			return at, lerr.Error(), nil
		}
		ok, err = fill(at, n)
		if err != nil {
			return at, "", err
		}
		if !ok {
			return at, fmt.Sprintf("record of %d bytes runs past the end of the segment", n), nil
		}
		rec, derr := decodeRecord(buf[at-bufAt : at-bufAt+int64(n)])
		if derr != nil {
			return at, derr.Error(), nil
		}
		k := queueKey{rec.Topic, rec.Queue}
		if qi := l.index[k]; qi != nil && rec.QueueOffset != qi.next() {
			return at, fmt.Sprintf("queue offset %d of %s/%d does not follow %d", rec.QueueOffset, rec.Topic, rec.Queue, qi.next()-1), nil
		}
		l.indexAdd(k, rec.QueueOffset, s.base+at, int32(n), l.fingerprint(rec.Payload))
		l.kc.refs = l.kc.refs[:0]
		l.collectKeys(&l.kc, rec.Payload, s.base+at, rec.StoreTime)
		l.keys.add(l.kc.refs)
		if rec.Flags&flagRecovered != 0 {
			l.prod.replayRecovered(k, rec.Payload, rec.QueueOffset, rec.StoreTime)
		} else {
			l.prod.replay(k, rec.Payload, rec.QueueOffset, rec.StoreTime)
		}
		l.scanned++
		if end := s.base + at + int64(n); end-l.cutFrom >= l.cfg.IndexChunkBytes {
			crc := binary.BigEndian.Uint32(buf[at-bufAt+4:])
			c := indexCut{from: l.cutFrom, to: end, last: chunkLast{at: s.base + at, crc: crc}, snap: l.prod.encodeSnapshot()}
			l.addCut(c)
			if end <= l.scanLimit {
				// Synced records: the chunk is written now, and its entries
				// and snapshot leave memory (a log read whole, at its first
				// Open with an index, would otherwise hold them all).
				if err := l.writeChunk(c); err != nil {
					l.log.Warn("index chunk write failed during recovery; its entries stay in memory", "from", c.from, "to", c.to, "error", err)
				}
			}
		}
		at += int64(n)
	}
	return at, "", nil
}
