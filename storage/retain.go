package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
)

// Retention deletes whole segments from the start of the log. Queue offsets
// never go back: a queue whose every record was deleted keeps its next
// offset in the "queues" file, written (to a temporary file, synced,
// renamed) before any segment is removed. Recovery takes a queue's offsets
// from its records when it has any, and from that file when it has none, so
// a crash at any point of a deletion leaves consistent queues.
//
// The "queues" file: magic "FYQF", u32 count, then per queue: u16 topic
// length, topic, u32 queue, i64 first queue offset; then a CRC32C of all
// that.

const queuesName = "queues"

// StartOffset is the log offset of the oldest byte still held.
func (l *Log) StartOffset() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.segments[0].base
}

// DeleteBefore removes every whole segment that ends at or before offset
// (never the active one) and the index entries of their records. It
// returns the start offset after the deletion. A reader that raced with
// the deletion still reads the removed segment: its file is closed when the
// last reference to it is dropped.
//
// If a step fails, DeleteBefore returns the error and the start offset the
// log has: the queue offsets file is written before any segment goes, and
// segments are removed oldest first, stopping at the first that cannot be
// removed, so the log (on disk and in memory) still starts at a segment
// and reopens as it is. Calling DeleteBefore again finishes the job.
func (l *Log) DeleteBefore(offset int64) (int64, error) {
	l.retainMu.Lock()
	defer l.retainMu.Unlock()
	l.idxMu.Lock() // the index chunks change too
	defer l.idxMu.Unlock()

	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return 0, ErrClosed
	}
	start := l.segments[0].base
	n := 0
	for n < len(l.segments)-1 && l.segments[n+1].base <= offset {
		n++
	}
	if n == 0 {
		l.mu.RUnlock()
		return start, nil
	}
	// Only DeleteBefore (serialized by retainMu) drops segments, and the
	// writer only adds them at the end: these stay the first n.
	doomed := slices.Clone(l.segments[:n])
	floors, err := queueFloors(l.index, l.segments[n].base)
	l.mu.RUnlock()
	if err != nil {
		return start, err
	}

	if err := l.writeQueues(floors); err != nil {
		return start, err
	}
	var errs []error
	removed := 0
	for _, s := range doomed {
		if err := l.fs.Remove(s.name); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("storage: remove %s: %w", s.name, err))
			break // a later segment removed would leave a hole in the log
		}
		removed++
	}
	if removed == 0 {
		return start, errors.Join(errs...)
	}

	l.mu.Lock()
	l.segments = slices.Clone(l.segments[removed:])
	start = l.segments[0].base
	if removed < n { // the floors were for a later start
		if floors, err = queueFloors(l.index, start); err != nil {
			errs = append(errs, err)
			floors = nil
		}
	}
	c := 0
	for c < len(l.chunks) && l.chunks[c].to <= start {
		c++
	}
	gone := l.chunks[:c]
	l.chunks = slices.Clone(l.chunks[c:])
	l.keys.dropBelow(start)
	for k, qi := range l.index {
		p := 0
		for p < len(qi.parts) && qi.parts[p].c.to <= start {
			p++
		}
		if p > 0 {
			qi.parts = slices.Clone(qi.parts[p:])
		}
		if len(qi.parts) == 0 {
			i := sort.Search(len(qi.pos), func(i int) bool { return qi.pos[i] >= start })
			if i > 0 {
				qi.base += int64(i)
				qi.pos = slices.Clone(qi.pos[i:])
				qi.size = slices.Clone(qi.size[i:])
				qi.fp = slices.Clone(qi.fp[i:])
			}
			qi.first = max(qi.first, qi.base)
		}
		if f, ok := floors[k]; ok {
			qi.first = max(qi.first, f)
		}
		qi.first = max(qi.first, qi.lowest())
	}
	l.mu.Unlock()
	if err := l.removeChunks(gone); err != nil {
		errs = append(errs, err) // stale chunks before the start: the next Open removes them
	}
	for _, c := range gone {
		c.drop()
	}

	for _, s := range doomed[:removed] {
		s.removed.Store(true)
		if s.refs.Load() == 0 {
			s.close() // else the last reader closes it
		}
	}
	if err := l.fs.SyncDir(l.cfg.Dir); err != nil {
		errs = append(errs, fmt.Errorf("storage: sync dir: %w", err))
	}
	l.log.Info("deleted old segments", "segments", removed, "start", start)
	return start, errors.Join(errs...)
}

// queueFloors returns, for every queue, its first queue offset once the
// records before log offset start are gone. Higher floors than needed (if
// fewer segments end up removed) are harmless: recovery takes a queue's
// offsets from its records when it has any.
func queueFloors(index map[queueKey]*queueIndex, start int64) (map[queueKey]int64, error) {
	floors := make(map[queueKey]int64, len(index))
	for k, qi := range index {
		f, err := qi.offsetAt(start)
		if err != nil {
			return nil, fmt.Errorf("storage: index of %s/%d: %w", k.topic, k.queue, err)
		}
		floors[k] = max(f, qi.first)
	}
	return floors, nil
}

func (l *Log) writeQueues(floors map[queueKey]int64) error {
	keys := make([]queueKey, 0, len(floors))
	for k := range floors {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].topic != keys[j].topic {
			return keys[i].topic < keys[j].topic
		}
		return keys[i].queue < keys[j].queue
	})
	b := append([]byte("FYQF"), 0, 0, 0, 0)
	binary.BigEndian.PutUint32(b[4:], uint32(len(keys)))
	for _, k := range keys {
		b = binary.BigEndian.AppendUint16(b, uint16(len(k.topic)))
		b = append(b, k.topic...)
		b = binary.BigEndian.AppendUint32(b, k.queue)
		b = binary.BigEndian.AppendUint64(b, uint64(floors[k]))
	}
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))

	if err := l.writeFileAtomic(filepath.Join(l.cfg.Dir, queuesName), b); err != nil {
		return fmt.Errorf("storage: write queue offsets: %w", err)
	}
	return nil
}

// readQueues returns the first offsets recorded by the last deletion; none
// if no deletion ever happened.
func (l *Log) readQueues() (map[queueKey]int64, error) {
	f, err := l.fs.OpenRW(filepath.Join(l.cfg.Dir, queuesName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("storage: open queue offsets: %w", err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, err
	}
	b := make([]byte, size)
	if _, err := f.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("storage: read queue offsets: %w", err)
	}
	bad := &CorruptError{Offset: 0, Segment: filepath.Join(l.cfg.Dir, queuesName), Reason: "queue offsets file does not check out"}
	if len(b) < 12 || string(b[:4]) != "FYQF" || crc32.Checksum(b[:len(b)-4], castagnoli) != binary.BigEndian.Uint32(b[len(b)-4:]) {
		return nil, bad
	}
	n := binary.BigEndian.Uint32(b[4:])
	p := b[8 : len(b)-4]
	out := make(map[queueKey]int64, n)
	for range n {
		if len(p) < 2 {
			return nil, bad
		}
		tl := int(binary.BigEndian.Uint16(p))
		if len(p) < 2+tl+12 {
			return nil, bad
		}
		k := queueKey{topic: string(p[2 : 2+tl]), queue: binary.BigEndian.Uint32(p[2+tl:])}
		out[k] = int64(binary.BigEndian.Uint64(p[6+tl:]))
		p = p[14+tl:]
	}
	return out, nil
}
