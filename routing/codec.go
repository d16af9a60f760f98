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
//	bases     only when a queue moved (QueueRoute.Base > 0): u32 count (at
//	          least 1), then per moved queue, in list order: its index in
//	          the list u32, its base i64 (> 0). A route with no moved queue
//	          ends after the queues, as before bases existed.

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
	moved := 0
	for _, q := range r.Queues {
		if q.Base > 0 {
			moved++
		}
	}
	if moved > 0 {
		dst = binary.BigEndian.AppendUint32(dst, uint32(moved))
		for i, q := range r.Queues {
			if q.Base > 0 {
				dst = binary.BigEndian.AppendUint32(dst, uint32(i))
				dst = binary.BigEndian.AppendUint64(dst, uint64(q.Base))
			}
		}
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
		d.bases(r.Queues)
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", ErrMalformedRoute, len(d.b))
	}
	if d.err != nil {
		return Route{}, d.err
	}
	return r, nil
}

// bases decodes the bases section into qs; the encoding is canonical: at
// least one entry, indexes ascending, bases above 0.
func (d *decoder) bases(qs []QueueRoute) {
	n := d.u32()
	if d.err != nil {
		return
	}
	if n == 0 || uint64(n)*12 > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: %d bases in %d bytes", ErrMalformedRoute, n, len(d.b))
		return
	}
	next := 0
	for range n {
		i, base := int(d.u32()), int64(d.u64())
		if d.err != nil {
			return
		}
		if i < next || i >= len(qs) || base <= 0 {
			d.err = fmt.Errorf("%w: base %d for queue index %d", ErrMalformedRoute, base, i)
			return
		}
		qs[i].Base = base
		next = i + 1
	}
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
