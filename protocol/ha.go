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
type HAFetchRequest struct {
	Offset     int64
	MaxBytes   uint32
	WaitMillis uint32
}

// AppendHAFetchRequest appends f's encoding.
func AppendHAFetchRequest(dst []byte, f *HAFetchRequest) []byte {
	dst = appendI64(dst, f.Offset)
	dst = appendU32(dst, f.MaxBytes)
	return appendU32(dst, f.WaitMillis)
}

// DecodeHAFetchRequest decodes an HA_FETCH request body.
func DecodeHAFetchRequest(b []byte) (HAFetchRequest, error) {
	var f HAFetchRequest
	r := reader{b: b}
	f.Offset = r.i64("offset")
	f.MaxBytes = r.u32("max bytes")
	f.WaitMillis = r.u32("wait millis")
	if err := r.done("ha fetch request"); err != nil {
		return HAFetchRequest{}, err
	}
	if f.Offset < 0 {
		return HAFetchRequest{}, fmt.Errorf("%w: negative offset %d", ErrMalformed, f.Offset)
	}
	return f, nil
}

// HAFetchResponse carries raw log bytes (whole records) starting at the
// requested offset, and the master's log end.
//
//	master end  i64
//	records     the rest of the body
type HAFetchResponse struct {
	MasterEnd int64
	Records   []byte // aliases the decoded buffer
}

// AppendHAFetchResponseHeader appends the part before the records.
func AppendHAFetchResponseHeader(dst []byte, masterEnd int64) []byte {
	return appendI64(dst, masterEnd)
}

// DecodeHAFetchResponse decodes an HA_FETCH response body.
func DecodeHAFetchResponse(b []byte) (HAFetchResponse, error) {
	r := reader{b: b}
	end := r.i64("master end")
	if r.err != nil {
		return HAFetchResponse{}, r.err
	}
	return HAFetchResponse{MasterEnd: end, Records: r.b}, nil
}
