package storage

import (
	"encoding/binary"
	"fmt"
)

// LastRecord returns where the log's last record starts and the CRC its
// header holds; ok is false when the log holds no record. A slave sends
// them with its first fetch from its master, which checks that its own log
// has the same record ending at the same offset (RecordAt): the slave's
// log is then a prefix of the master's, not a log that left it.
func (l *Log) LastRecord() (at int64, crc uint32, ok bool, err error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return 0, 0, false, ErrClosed
	}
	end := l.end.Load()
	if l.lastAt < 0 || l.lastAt >= end {
		return 0, 0, false, nil
	}
	last, err := l.lastRecord(end)
	if err != nil {
		return 0, 0, false, fmt.Errorf("storage: the last record: %w", err)
	}
	return last.at, last.crc, true, nil
}

// RecordAt reads the header of the record that starts at log offset at and
// returns where the record ends and its CRC. An offset that is not a
// record boundary gives whatever its bytes say (a caller compares them with
// what it expects); one outside the log gives ErrOutOfRange.
func (l *Log) RecordAt(at int64) (end int64, crc uint32, err error) {
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return 0, 0, ErrClosed
	}
	logEnd, gen := l.end.Load(), l.gen.Load()
	if at < 0 || at > logEnd-recordHeaderSize { // not at+size: it overflows near MaxInt64
		l.mu.RUnlock()
		return 0, 0, fmt.Errorf("%w: a record at log offset %d, log ends at %d", ErrOutOfRange, at, logEnd)
	}
	seg, segEnd, ok := l.segmentFor(at)
	if ok {
		seg.acquire()
		defer seg.release()
	}
	l.mu.RUnlock()
	if !ok || at > segEnd-recordHeaderSize {
		return 0, 0, fmt.Errorf("%w: no record header at log offset %d", ErrOutOfRange, at)
	}
	var h [recordHeaderSize]byte
	if _, err := seg.f.ReadAt(h[:], at-seg.base); err != nil {
		return 0, 0, fmt.Errorf("storage: read %s at %d: %w", seg.name, at-seg.base, err)
	}
	if l.gen.Load() != gen {
		return 0, 0, ErrReadTruncated
	}
	return at + recordHeaderSize + int64(binary.BigEndian.Uint32(h[:4])), binary.BigEndian.Uint32(h[4:8]), nil
}

// ReadRecordAt reads the whole record that starts at log offset at, checks
// it (length, CRC, format) and returns it with a fresh payload. An offset
// that is not a record boundary gives a *CorruptError (or whatever record
// its bytes happen to frame: a caller checks what it reads is what it
// expects); one outside the log gives ErrOutOfRange.
func (l *Log) ReadRecordAt(at int64) (RecordInfo, error) {
	end, _, err := l.RecordAt(at)
	if err != nil {
		return RecordInfo{}, err
	}
	if end <= at || end-at > maxRecordSize {
		return RecordInfo{}, &CorruptError{Offset: at, Reason: fmt.Sprintf("no record of a sane size starts here (it would end at %d)", end)}
	}
	raw, err := l.ReadRaw(at, int(end-at))
	if err != nil {
		return RecordInfo{}, err
	}
	if int64(len(raw)) < end-at {
		return RecordInfo{}, &CorruptError{Offset: at, Reason: fmt.Sprintf("read %d bytes of a record of %d", len(raw), end-at)}
	}
	return DecodeRecord(raw[:end-at], at)
}

// DecodeRecord checks (length, CRC, format) and decodes the record that
// raw holds whole, as ReadRaw returns them, at log offset at. Its Payload
// is raw's bytes.
func DecodeRecord(raw []byte, at int64) (RecordInfo, error) {
	rec, err := decodeRecord(raw)
	if err != nil {
		return RecordInfo{}, &CorruptError{Offset: at, Reason: err.Error()}
	}
	return RecordInfo{Offset: at, Size: len(raw), Topic: rec.Topic, Queue: rec.Queue, QueueOffset: rec.QueueOffset,
		StoreTime: rec.StoreTime, Payload: rec.Payload, Recovered: rec.Flags&flagRecovered != 0}, nil
}

// RecordSize is the size in the log of the record an Entry of topic with a
// payload of payload bytes becomes.
func RecordSize(topic string, payload int) int { return recordSize(len(topic), payload) }
