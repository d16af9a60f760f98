package protocol

import "fmt"

// HAFetchRequest is a slave asking its master for raw commit-log bytes. The
// offset is the slave's log end: it asks for what follows and, by asking,
// acknowledges everything before it.
//
//	offset       i64
//	max bytes    u32
//	wait millis  u32: how long the master may hold the request when it has
//	             nothing new (a long poll)
//	epoch        u32: the group epoch the slave knows
//	broker id    u16 length + bytes: the slave's broker id; the master
//	             serves, and counts acknowledgements from, only the broker
//	             the registry names as its slave in the current epoch
type HAFetchRequest struct {
	Offset     int64
	MaxBytes   uint32
	WaitMillis uint32
	Epoch      uint32
	BrokerID   string
}

// AppendHAFetchRequest appends f's encoding.
func AppendHAFetchRequest(dst []byte, f *HAFetchRequest) []byte {
	dst = appendI64(dst, f.Offset)
	dst = appendU32(dst, f.MaxBytes)
	dst = appendU32(dst, f.WaitMillis)
	dst = appendU32(dst, f.Epoch)
	return appendStr16(dst, clip16(f.BrokerID))
}

// DecodeHAFetchRequest decodes an HA_FETCH request body.
func DecodeHAFetchRequest(b []byte) (HAFetchRequest, error) {
	var f HAFetchRequest
	r := reader{b: b}
	f.Offset = r.i64("offset")
	f.MaxBytes = r.u32("max bytes")
	f.WaitMillis = r.u32("wait millis")
	f.Epoch = r.u32("epoch")
	f.BrokerID = r.str16("broker id")
	if err := r.done("ha fetch request"); err != nil {
		return HAFetchRequest{}, err
	}
	if f.Offset < 0 {
		return HAFetchRequest{}, fmt.Errorf("%w: negative offset %d", ErrMalformed, f.Offset)
	}
	return f, nil
}

// HAFetchResponse carries raw log bytes (whole records) starting at the
// requested offset, the master's log end and its epoch.
//
//	master end  i64
//	epoch       u32: the epoch the master serves
//	records     the rest of the body
type HAFetchResponse struct {
	MasterEnd int64
	Epoch     uint32
	Records   []byte // aliases the decoded buffer
}

// HAFetchResponseHeaderSize is the size of an HA_FETCH answer before its records.
const HAFetchResponseHeaderSize = 12

// AppendHAFetchResponseHeader appends the part before the records.
func AppendHAFetchResponseHeader(dst []byte, masterEnd int64, epoch uint32) []byte {
	dst = appendI64(dst, masterEnd)
	return appendU32(dst, epoch)
}

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
