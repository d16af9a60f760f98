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
// returns the new start offset. A reader that raced with the deletion
// still reads the removed segment: its file is closed when the last
// reference to it is dropped.
func (l *Log) DeleteBefore(offset int64) (int64, error) {
	l.retainMu.Lock()
	defer l.retainMu.Unlock()

	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return 0, ErrClosed
	}
	n := 0
	for n < len(l.segments)-1 && l.segments[n+1].base <= offset {
		n++
	}
	if n == 0 {
		start := l.segments[0].base
		l.mu.RUnlock()
		return start, nil
	}
	newStart := l.segments[n].base
	floors := make(map[queueKey]int64, len(l.index))
	for k, qi := range l.index {
		floors[k] = qi.base + int64(sort.Search(len(qi.pos), func(i int) bool { return qi.pos[i] >= newStart }))
	}
	l.mu.RUnlock()

	if err := l.writeQueues(floors); err != nil {
		return 0, err
	}

	l.mu.Lock()
	removed := slices.Clone(l.segments[:n])
	l.segments = slices.Clone(l.segments[n:])
	for _, qi := range l.index {
		k := sort.Search(len(qi.pos), func(i int) bool { return qi.pos[i] >= newStart })
		if k > 0 {
			qi.base += int64(k)
			qi.pos = slices.Clone(qi.pos[k:])
			qi.size = slices.Clone(qi.size[k:])
		}
	}
	l.mu.Unlock()

	var errs []error
	for _, s := range removed {
		if err := l.fs.Remove(s.name); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("storage: remove %s: %w", s.name, err))
		}
		s.removed.Store(true)
		if s.refs.Load() == 0 {
			s.close() // else the last reader closes it
		}
	}
	if err := l.fs.SyncDir(l.cfg.Dir); err != nil {
		errs = append(errs, fmt.Errorf("storage: sync dir: %w", err))
	}
	l.log.Info("deleted old segments", "segments", len(removed), "start", newStart)
	return newStart, errors.Join(errs...)
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

	tmp := filepath.Join(l.cfg.Dir, queuesName+".tmp")
	_ = l.fs.Remove(tmp)
	f, err := l.fs.Create(tmp)
	if err != nil {
		return fmt.Errorf("storage: write queue offsets: %w", err)
	}
	_, err = f.WriteAt(b, 0)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = l.fs.Rename(tmp, filepath.Join(l.cfg.Dir, queuesName))
	}
	if err == nil {
		err = l.fs.SyncDir(l.cfg.Dir)
	}
	if err != nil {
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
