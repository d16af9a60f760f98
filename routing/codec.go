package routing

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrMalformedRoute marks a route encoding that does not decode.
var ErrMalformedRoute = errors.New("routing: malformed route")

// Route lookups are the one control-plane answer producers ask for often, so
// a route has a compact binary encoding (big-endian):
//
//	topic     u16 length + bytes
//	version   u64
//	count     u32, then per queue:
//	  queue     u32
//	  flags     u8 (bit 0: writable)
//	  group     u16 length + bytes
//	  master    u16 length + bytes
//	  epoch     u32
//	  slave     u16 length + bytes

// AppendRoute appends r's encoding to dst.
func AppendRoute(dst []byte, r *Route) []byte {
	dst = appendStr(dst, r.Topic)
	dst = binary.BigEndian.AppendUint64(dst, r.Version)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(r.Queues)))
	for _, q := range r.Queues {
		dst = binary.BigEndian.AppendUint32(dst, q.Queue)
		var flags byte
		if q.Writable {
			flags = 1
		}
		dst = append(dst, flags)
		dst = appendStr(dst, q.Group)
		dst = appendStr(dst, q.Master)
		dst = binary.BigEndian.AppendUint32(dst, q.Epoch)
		dst = appendStr(dst, q.Slave)
	}
	return dst
}

func appendStr(dst []byte, s string) []byte {
	if len(s) > 1<<16-1 {
		s = s[:1<<16-1]
	}
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(s)))
	return append(dst, s...)
}

// DecodeRoute decodes a route encoded by AppendRoute.
func DecodeRoute(b []byte) (Route, error) {
	var r Route
	d := decoder{b: b}
	r.Topic = d.str()
	r.Version = d.u64()
	n := d.u32()
	const minQueue = 4 + 1 + 2 + 2 + 4 + 2
	if d.err == nil && uint64(n)*minQueue > uint64(len(d.b)) {
		return Route{}, fmt.Errorf("%w: %d queues in %d bytes", ErrMalformedRoute, n, len(d.b))
	}
	if n > 0 {
		r.Queues = make([]QueueRoute, n)
	}
	for i := range r.Queues {
		q := &r.Queues[i]
		q.Queue = d.u32()
		flags := d.u8()
		q.Writable = flags&1 != 0
		q.Group = d.str()
		q.Master = d.str()
		q.Epoch = d.u32()
		q.Slave = d.str()
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", ErrMalformedRoute, len(d.b))
	}
	if d.err != nil {
		return Route{}, d.err
	}
	return r, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b) < n {
		d.err = fmt.Errorf("%w: truncated", ErrMalformedRoute)
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u8() uint8 {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if v := d.take(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if v := d.take(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func (d *decoder) str() string {
	l := d.take(2)
	if l == nil {
		return ""
	}
	return string(d.take(int(binary.BigEndian.Uint16(l))))
}
