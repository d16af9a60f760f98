package protocol

import "fmt"

// HA replication is pulled by the slave and acknowledged separately from
// the pulls, so the slave's append of one answer overlaps the transfer of
// the next (DESIGN.md, "HA sync"):
//
//   - HA_FETCH asks for the log bytes from Offset, the slave's received
//     end: where its last answer ended, appended or not yet; or, when it
//     Follows another fetch, from where the master's answer to that one
//     ends, so the slave keeps two in flight. The slave sends one as soon
//     as an answer has arrived, while it still appends that answer. It also
//     carries Acked, the slave's appended end.
//   - HA_ACK (oneway) carries the slave's appended end, sent right after
//     each append.
//
// The master counts as acknowledged (and releases HIGH messages up to) only
// an Acked value: never a fetch's Offset, which names bytes the slave may
// have received but not yet appended.

// HAFetchRequest is a slave asking its master for raw commit-log bytes.
//
//	offset       i64: where the answer starts: the slave's received end
//	             (its log end plus what it received and has not appended yet)
//	acked        i64: the slave's appended end (its log end when it sent the
//	             fetch), at most offset; the master counts it as acknowledged
//	max bytes    u32
//	wait millis  u32: how long the master may hold the request when it has
//	             nothing new (a long poll)
//	epoch        u32: the group epoch the slave knows
//	broker id    u16 length + bytes: the slave's broker id; the master
//	             serves, and counts acknowledgements from, only the broker
//	             the registry names as its slave in the current epoch
//	[check       i64 log offset where the slave's last record starts, then
//	             u32 its CRC: present only when Check is set; the master
//	             answers LOG_DIVERGED unless its own record at CheckAt has
//	             that CRC and ends at Offset. A slave sends it with the
//	             first fetch of every stream, so it copies only onto a log
//	             that is a prefix of the master's.]
//	[sequence    u32 the fetch's number in the slave's stream, then u32
//	             after and u8 flags (bit 0: Follows): present only when
//	             Sequenced is set. The answer to a sequenced fetch carries
//	             its start offset (HAFetchResponse.Start). A fetch that
//	             Follows asks for the bytes from where the master's answer
//	             to the slave's fetch numbered After ends (its Offset is
//	             then only the slave's received end when it sent it): so
//	             the slave keeps a second fetch waiting at the master while
//	             the answer to the first is on its way.]
type HAFetchRequest struct {
	Offset     int64
	Acked      int64
	MaxBytes   uint32
	WaitMillis uint32
	Epoch      uint32
	BrokerID   string
	// Check asks the master to check that the slave's last record, which
	// starts at CheckAt and has CheckCRC, is its own record there.
	Check    bool
	CheckAt  int64
	CheckCRC uint32
	// Sequenced numbers the fetch (Seq) and asks for the answer's start
	// offset; Follows asks from the end of the answer to fetch After.
	Sequenced bool
	Seq       uint32
	After     uint32
	Follows   bool
}

const (
	haCheckLen    = 12 // check offset i64, check CRC u32
	haSequenceLen = 9  // sequence u32, after u32, flags u8
	haFollows     = 1  // flags bit 0
)

// AppendHAFetchRequest appends f's encoding.
func AppendHAFetchRequest(dst []byte, f *HAFetchRequest) []byte {
	dst = appendI64(dst, f.Offset)
	dst = appendI64(dst, f.Acked)
	dst = appendU32(dst, f.MaxBytes)
	dst = appendU32(dst, f.WaitMillis)
	dst = appendU32(dst, f.Epoch)
	dst = appendStr16(dst, clip16(f.BrokerID))
	if f.Check {
		dst = appendI64(dst, f.CheckAt)
		dst = appendU32(dst, f.CheckCRC)
	}
	if f.Sequenced {
		dst = appendU32(dst, f.Seq)
		dst = appendU32(dst, f.After)
		var flags byte
		if f.Follows {
			flags |= haFollows
		}
		dst = append(dst, flags)
	}
	return dst
}

// DecodeHAFetchRequest decodes an HA_FETCH request body.
func DecodeHAFetchRequest(b []byte) (HAFetchRequest, error) {
	var f HAFetchRequest
	r := reader{b: b}
	f.Offset = r.i64("offset")
	f.Acked = r.i64("acked")
	f.MaxBytes = r.u32("max bytes")
	f.WaitMillis = r.u32("wait millis")
	f.Epoch = r.u32("epoch")
	f.BrokerID = r.str16("broker id")
	// The optional parts are told apart by their lengths.
	if r.err == nil && (len(r.b) == haCheckLen || len(r.b) == haCheckLen+haSequenceLen) {
		f.Check = true
		f.CheckAt = r.i64("check offset")
		f.CheckCRC = r.u32("check crc")
	}
	if r.err == nil && len(r.b) == haSequenceLen {
		f.Sequenced = true
		f.Seq = r.u32("sequence")
		f.After = r.u32("after")
		flags := r.u8("flags")
		f.Follows = flags&haFollows != 0
		if flags&^haFollows != 0 {
			return HAFetchRequest{}, fmt.Errorf("%w: unknown fetch flags %#02x", ErrMalformed, flags)
		}
	}
	if err := r.done("ha fetch request"); err != nil {
		return HAFetchRequest{}, err
	}
	if f.CheckAt < 0 {
		return HAFetchRequest{}, fmt.Errorf("%w: negative check offset %d", ErrMalformed, f.CheckAt)
	}
	if f.Offset < 0 || f.Acked < 0 {
		return HAFetchRequest{}, fmt.Errorf("%w: negative offset %d or acked %d", ErrMalformed, f.Offset, f.Acked)
	}
	if f.Acked > f.Offset {
		return HAFetchRequest{}, fmt.Errorf("%w: acked %d past the fetch offset %d", ErrMalformed, f.Acked, f.Offset)
	}
	if f.Check && f.Follows {
		return HAFetchRequest{}, fmt.Errorf("%w: a fetch that follows another checks no record", ErrMalformed)
	}
	return f, nil
}

// HAAck is a slave telling its master how far it has appended the master's
// log: the body of a oneway HA_ACK, sent after each append.
//
//	acked      i64: the slave's appended end
//	epoch      u32: the group epoch the slave follows
//	broker id  u16 length + bytes: the slave's broker id (checked as a
//	           fetch's is)
type HAAck struct {
	Acked    int64
	Epoch    uint32
	BrokerID string
}

// AppendHAAck appends a's encoding.
func AppendHAAck(dst []byte, a *HAAck) []byte {
	dst = appendI64(dst, a.Acked)
	dst = appendU32(dst, a.Epoch)
	return appendStr16(dst, clip16(a.BrokerID))
}

// DecodeHAAck decodes an HA_ACK body.
func DecodeHAAck(b []byte) (HAAck, error) {
	var a HAAck
	r := reader{b: b}
	a.Acked = r.i64("acked")
	a.Epoch = r.u32("epoch")
	a.BrokerID = r.str16("broker id")
	if err := r.done("ha ack"); err != nil {
		return HAAck{}, err
	}
	if a.Acked < 0 {
		return HAAck{}, fmt.Errorf("%w: negative acked offset %d", ErrMalformed, a.Acked)
	}
	return a, nil
}

// HAFetchResponse carries raw log bytes (whole records) starting at the
// requested offset, the master's log end and its epoch.
//
//	master end  i64
//	epoch       u32: the epoch the master serves
//	records     the rest of the body
//
// The answer to a sequenced fetch has its start offset after the epoch:
//
//	start       i64: the log offset its records start at
type HAFetchResponse struct {
	MasterEnd int64
	Epoch     uint32
	Start     int64  // only in the answer to a sequenced fetch
	Records   []byte // aliases the decoded buffer
}

// HAFetchResponseHeaderSize is the size of an HA_FETCH answer before its records.
const HAFetchResponseHeaderSize = 12

// AppendHAFetchResponseHeader appends the part before the records.
func AppendHAFetchResponseHeader(dst []byte, masterEnd int64, epoch uint32) []byte {
	dst = appendI64(dst, masterEnd)
	return appendU32(dst, epoch)
}

// HAFetchResponseStartSize is the size of the start offset that follows
// the header in the answer to a sequenced fetch.
const HAFetchResponseStartSize = 8

// AppendHAFetchResponseStart appends the start offset of the answer to a
// sequenced fetch, after its header.
func AppendHAFetchResponseStart(dst []byte, start int64) []byte { return appendI64(dst, start) }

// DecodeHAFetchResponse decodes an HA_FETCH response body.
func DecodeHAFetchResponse(b []byte) (HAFetchResponse, error) {
	r := reader{b: b}
	end := r.i64("master end")
	epoch := r.u32("epoch")
	if r.err != nil {
		return HAFetchResponse{}, r.err
	}
	return HAFetchResponse{MasterEnd: end, Epoch: epoch, Records: r.b}, nil
}

// DecodeHAFetchResponseSequenced decodes the answer to a sequenced fetch.
func DecodeHAFetchResponseSequenced(b []byte) (HAFetchResponse, error) {
	r := reader{b: b}
	end := r.i64("master end")
	epoch := r.u32("epoch")
	start := r.i64("start")
	if r.err != nil {
		return HAFetchResponse{}, r.err
	}
	if start < 0 {
		return HAFetchResponse{}, fmt.Errorf("%w: negative start offset %d", ErrMalformed, start)
	}
	return HAFetchResponse{MasterEnd: end, Epoch: epoch, Start: start, Records: r.b}, nil
}
