package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

const (
	recordHeaderSize = 8                     // length + CRC
	recordFixedSize  = 1 + 1 + 2 + 4 + 8 + 8 // content without topic and payload
	recordVersion    = 0xF1
	maxTopicLen      = 255
	// maxRecordSize is the largest record the format holds. Reads, recovery
	// and raw appends check lengths against it, not against
	// Config.MaxPayloadSize, which limits new appends only: a log written
	// under a larger cap, or copied from a master with one, stays readable.
	maxRecordSize = recordHeaderSize + recordFixedSize + maxTopicLen + MaxPayloadLimit
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors of the storage package.
var (
	// ErrCorrupt marks a record that fails its checks.
	ErrCorrupt = errors.New("storage: corrupt record")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("storage: log closed")
	// ErrBroken is returned after a failed write could not be undone; the log
	// must be reopened (which recovers it).
	ErrBroken = errors.New("storage: log broken by an unrecoverable write error")
	// ErrOffsetMismatch is returned by AppendRaw when the bytes do not start
	// at the log's end or do not continue its queues.
	ErrOffsetMismatch = errors.New("storage: raw append does not continue the log")
	// ErrOutOfRange is returned for a log offset past the end of the log or
	// before its first segment.
	ErrOutOfRange = errors.New("storage: offset out of range")
	// ErrInvalidEntry is returned for an entry the log cannot store (empty or
	// too long topic, payload over the cap).
	ErrInvalidEntry = errors.New("storage: invalid entry")
	// ErrMissingRecords refuses an entry whose Requires the deduplication
	// state does not hold.
	ErrMissingRecords = errors.New("storage: records an entry requires are not in the log")
)

// CorruptError reports corruption found in durable data, with its place.
type CorruptError struct {
	Offset  int64  // log offset of the bad record
	Segment string // file holding it
	Reason  string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("storage: corrupt record at log offset %d in %s: %s", e.Offset, e.Segment, e.Reason)
}

func (e *CorruptError) Unwrap() error { return ErrCorrupt }

// flagRecovered, in a record's flags byte, marks a record appended again
// after a failover cut it from the old master's log (Entry.Recovered).
const flagRecovered = 0x01

// record is a decoded record; Payload aliases the buffer it came from.
type record struct {
	Flags       byte
	Topic       string
	Queue       uint32
	QueueOffset int64
	StoreTime   int64
	Payload     []byte
}

func recordSize(topicLen, payloadLen int) int {
	return recordHeaderSize + recordFixedSize + topicLen + payloadLen
}

// appendRecord appends one encoded record to dst.
func appendRecord(dst []byte, flags byte, topic string, queue uint32, queueOffset, storeTime int64, payload []byte) []byte {
	start := len(dst)
	contentLen := recordFixedSize + len(topic) + len(payload)
	dst = binary.BigEndian.AppendUint32(dst, uint32(contentLen))
	dst = binary.BigEndian.AppendUint32(dst, 0) // CRC, filled below
	dst = append(dst, recordVersion, flags)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(topic)))
	dst = append(dst, topic...)
	dst = binary.BigEndian.AppendUint32(dst, queue)
	dst = binary.BigEndian.AppendUint64(dst, uint64(queueOffset))
	dst = binary.BigEndian.AppendUint64(dst, uint64(storeTime))
	dst = append(dst, payload...)
	crc := crc32.Checksum(dst[start+recordHeaderSize:], castagnoli)
	binary.BigEndian.PutUint32(dst[start+4:], crc)
	return dst
}

// recordLen reads a record's total size from its header, checking it
// against maxSize. It needs 8 bytes.
func recordLen(hdr []byte, maxSize int) (int, error) {
	if len(hdr) < recordHeaderSize {
		return 0, errors.New("truncated header")
	}
	l := binary.BigEndian.Uint32(hdr)
	if l < recordFixedSize {
		return 0, fmt.Errorf("content length %d under the minimum %d", l, recordFixedSize)
	}
	total := uint64(l) + recordHeaderSize
	if total > uint64(maxSize) {
		return 0, fmt.Errorf("record length %d over the cap %d", total, maxSize)
	}
	return int(total), nil
}

// decodeRecord checks and decodes one whole record (header included).
func decodeRecord(b []byte) (record, error) {
	r, topic, err := decodeRecordView(b)
	if err == nil {
		r.Topic = string(topic)
	}
	return r, err
}

// decodeRecordView is decodeRecord leaving the topic in b, returned apart
// (r.Topic is empty): a PULL's read compares it with the queue's topic
// without making a string of it for every record.
func decodeRecordView(b []byte) (r record, topic []byte, err error) {
	if len(b) < recordHeaderSize+recordFixedSize {
		return r, nil, errors.New("truncated record")
	}
	content := b[recordHeaderSize:]
	if int(binary.BigEndian.Uint32(b)) != len(content) {
		return r, nil, errors.New("length does not match")
	}
	if crc := crc32.Checksum(content, castagnoli); crc != binary.BigEndian.Uint32(b[4:]) {
		return r, nil, fmt.Errorf("CRC mismatch (stored %#08x, computed %#08x)", binary.BigEndian.Uint32(b[4:]), crc)
	}
	return decodeContent(content)
}

// parseRecordView is decodeRecordView for a record it already checked: it
// skips the CRC. A raw append's records are checked once as they are
// placed (placeRaw), then decoded twice more to be indexed: the CRC
// computed three times per record was a tenth of a slave's CPU.
func parseRecordView(b []byte) (record, []byte) {
	r, topic, _ := decodeContent(b[recordHeaderSize:])
	return r, topic
}

// decodeContent decodes a record's content (past its header).
func decodeContent(content []byte) (r record, topic []byte, err error) {
	if content[0] != recordVersion {
		return r, nil, fmt.Errorf("unknown record version %#02x", content[0])
	}
	tl := int(binary.BigEndian.Uint16(content[2:]))
	if tl == 0 || tl > maxTopicLen || 4+tl+4+8+8 > len(content) {
		return r, nil, fmt.Errorf("bad topic length %d", tl)
	}
	r.Flags = content[1]
	p := content[4:]
	topic = p[:tl]
	p = p[tl:]
	r.Queue = binary.BigEndian.Uint32(p)
	r.QueueOffset = int64(binary.BigEndian.Uint64(p[4:]))
	r.StoreTime = int64(binary.BigEndian.Uint64(p[12:]))
	r.Payload = p[20:]
	return r, topic, nil
}
