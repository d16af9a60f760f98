package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrMalformed marks every decoding failure: truncated input, a length that
// points past the end, an unknown enum value, trailing bytes.
var ErrMalformed = errors.New("protocol: malformed")

func appendU8(dst []byte, v uint8) []byte   { return append(dst, v) }
func appendU16(dst []byte, v uint16) []byte { return binary.BigEndian.AppendUint16(dst, v) }
func appendU32(dst []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(dst, v) }
func appendU64(dst []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(dst, v) }
func appendI64(dst []byte, v int64) []byte  { return appendU64(dst, uint64(v)) }

// appendStr16 appends a string with a u16 length prefix. Callers validate the
// length first (see checkStr16).
func appendStr16(dst []byte, s string) []byte {
	dst = appendU16(dst, uint16(len(s)))
	return append(dst, s...)
}

func appendBytes32(dst []byte, b []byte) []byte {
	dst = appendU32(dst, uint32(len(b)))
	return append(dst, b...)
}

// reader decodes primitives from a byte slice with a sticky error: after the
// first failure every read returns zero values and err keeps the first cause,
// so callers check once at the end (like franz-go's kbin.Reader).
type reader struct {
	b   []byte
	err error
	// lastTopic lets consecutive messages of one topic share its string
	// (a batch is usually one topic): one allocation per batch, not per message.
	lastTopic string
	// tags are the tags met so far (up to maxTags), shared the same way:
	// a batch holds a few.
	tags []string
	// skipID makes message check a message id's span without copying it
	// into a string (the caller fills the ids in, one allocation per batch).
	skipID bool
}

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrMalformed, what)
	}
	r.b = nil
}

func (r *reader) need(n int, what string) bool {
	if r.err != nil {
		return false
	}
	if n < 0 || len(r.b) < n {
		r.fail(what + ": truncated")
		return false
	}
	return true
}

// zeros is what fixed returns after a failure: a read of any fixed-size
// value is then zero.
var zeros [8]byte

// fixed returns the next n bytes (n from 1 to 8), or n zero bytes once the
// reader has failed. A read that succeeds calls nothing else: the reads of
// fixed-size values are the decoders' hot path.
func (r *reader) fixed(n int, what string) []byte {
	if r.err != nil || len(r.b) < n {
		r.need(n, what) // fails the reader, if it has not failed yet
		return zeros[:n]
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// maxTags is how many distinct tags a reader keeps to share their strings.
const maxTags = 8

// tag returns t as a string, one the reader made before when it can.
func (r *reader) tag(t []byte) string {
	for _, s := range r.tags {
		if s == string(t) {
			return s
		}
	}
	s := string(t)
	if len(r.tags) < maxTags {
		r.tags = append(r.tags, s)
	}
	return s
}

func (r *reader) u8(what string) uint8   { return r.fixed(1, what)[0] }
func (r *reader) u16(what string) uint16 { return binary.BigEndian.Uint16(r.fixed(2, what)) }
func (r *reader) u32(what string) uint32 { return binary.BigEndian.Uint32(r.fixed(4, what)) }
func (r *reader) u64(what string) uint64 { return binary.BigEndian.Uint64(r.fixed(8, what)) }
func (r *reader) i64(what string) int64  { return int64(r.u64(what)) }

// span returns the next n bytes without copying.
func (r *reader) span(n int, what string) []byte {
	if !r.need(n, what) {
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) str16(what string) string {
	n := int(r.u16(what))
	return string(r.span(n, what))
}

func (r *reader) bytes32(what string, max int) []byte {
	n := r.u32(what)
	if r.err == nil && uint64(n) > uint64(max) {
		r.fail(fmt.Sprintf("%s: length %d over the cap %d", what, n, max))
		return nil
	}
	return r.span(int(n), what)
}

// count reads a u32 element count and checks that at least count*minSize
// bytes remain, so a hostile count can never cause a large allocation.
func (r *reader) count(what string, minSize int) int {
	n := r.u32(what)
	if r.err != nil {
		return 0
	}
	if uint64(n)*uint64(minSize) > uint64(len(r.b)) || uint64(n) > math.MaxInt32 {
		r.fail(fmt.Sprintf("%s: count %d does not fit in %d bytes", what, n, len(r.b)))
		return 0
	}
	return int(n)
}

// done reports the sticky error, or an error if bytes are left over.
func (r *reader) done(what string) error {
	if r.err != nil {
		return r.err
	}
	if len(r.b) != 0 {
		return fmt.Errorf("%w: %s: %d trailing bytes", ErrMalformed, what, len(r.b))
	}
	return nil
}
