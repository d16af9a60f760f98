package storage

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
)

// RecordInfo is one record of a record file (a segment, or a side file that
// Truncate wrote), as ReadRecordFile gives it.
type RecordInfo struct {
	Offset      int64 // the record's log offset
	Size        int   // the record's size in the file, header included
	Topic       string
	Queue       uint32
	QueueOffset int64
	StoreTime   int64  // unix milliseconds
	Payload     []byte // the stored message; fresh for each record
	Recovered   bool   // appended again after a failover (Entry.Recovered)
}

// RecordFileBase returns the log offset of the first record of a record
// file, from its name: a segment ("00000000000000001234.log") or a side file
// named by SideFileName ("00000000000000001234-epoch-7.log") starts with it,
// as 20 decimal digits. ok is false for a name that does not.
func RecordFileBase(path string) (base int64, ok bool) {
	name := filepath.Base(path)
	if len(name) < 24 || (name[20] != '.' && name[20] != '-') || filepath.Ext(name) != ".log" {
		return 0, false
	}
	base, err := strconv.ParseInt(name[:20], 10, 64)
	if err != nil || base < 0 {
		return 0, false
	}
	return base, true
}

// ReadRecordFile calls fn for every record of the record file at path, in
// order, with its log offset taken from the file's name (RecordFileBase),
// or counted from 0 when the name holds none. Every record is checked
// (length, CRC, version): the first bad one, or bytes after the last whole
// record, end the read with a *CorruptError naming its offset; an error
// from fn ends it with that error. It reads the operating system's files,
// not a vfs.FS.
func ReadRecordFile(path string, fn func(RecordInfo) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("storage: %w", err)
	}
	defer f.Close()
	base, _ := RecordFileBase(path)
	return ReadRecords(f, path, base, fn)
}

// ReadRecords is ReadRecordFile on a stream whose first record is at log
// offset base; name names the stream in errors.
func ReadRecords(r io.Reader, name string, base int64, fn func(RecordInfo) error) error {
	br := bufio.NewReaderSize(r, 1<<20)
	at := base
	var hdr [recordHeaderSize]byte
	for {
		n, err := io.ReadFull(br, hdr[:])
		if err == io.EOF {
			return nil
		}
		corrupt := func(reason string) error {
			return &CorruptError{Offset: at, Segment: name, Reason: reason}
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return corrupt(fmt.Sprintf("%d stray bytes at the end", n))
		}
		if err != nil {
			return fmt.Errorf("storage: read %s: %w", name, err)
		}
		size, lerr := recordLen(hdr[:], maxRecordSize)
		if lerr != nil {
			return corrupt(lerr.Error())
		}
		b := make([]byte, size)
		copy(b, hdr[:])
		if _, err := io.ReadFull(br, b[recordHeaderSize:]); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
				return corrupt(fmt.Sprintf("record of %d bytes runs past the end of the file", size))
			}
			return fmt.Errorf("storage: read %s: %w", name, err)
		}
		rec, derr := decodeRecord(b)
		if derr != nil {
			return corrupt(derr.Error())
		}
		if err := fn(RecordInfo{Offset: at, Size: size, Topic: rec.Topic, Queue: rec.Queue, QueueOffset: rec.QueueOffset,
			Recovered: rec.Flags&flagRecovered != 0,
			StoreTime: rec.StoreTime, Payload: rec.Payload}); err != nil {
			return err
		}
		at += int64(size)
	}
}

// EncodeRecord encodes a record as the log holds it: what ReadRecords gave
// as ri, byte for byte (its Offset and Size aside).
func EncodeRecord(ri RecordInfo) []byte {
	var flags byte
	if ri.Recovered {
		flags = flagRecovered
	}
	return appendRecord(nil, flags, ri.Topic, ri.Queue, ri.QueueOffset, ri.StoreTime, ri.Payload)
}
