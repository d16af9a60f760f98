package protocol

import (
	"encoding/binary"
	"fmt"
)

// Limits and constants of the frame format.
const (
	// Magic starts every frame after its length.
	Magic uint16 = 0xFE77
	// Version is the frame version this package writes and accepts.
	Version uint8 = 1
	// FixedHeaderSize is the size of a frame without its header and body.
	FixedHeaderSize = 18
	// MaxFrameSize caps a whole frame, length field included (16 MiB).
	MaxFrameSize = 16 << 20
	// MaxMessageSize caps one message body (4 MiB).
	MaxMessageSize = 4 << 20
	// MaxHeaderSize caps a frame's header (it has a u16 length).
	MaxHeaderSize = 1<<16 - 1
)

// Flags of a frame.
const (
	// FlagResponse marks a response; requests have it clear.
	FlagResponse uint8 = 1 << 0
	// FlagOneway marks a request that gets no response.
	FlagOneway uint8 = 1 << 1

	knownFlags = FlagResponse | FlagOneway
)

// Frame is one decoded frame. Header and Body alias the buffer the frame was
// decoded from.
type Frame struct {
	Flags  uint8
	Code   Code
	Status Status
	Opaque uint32
	Header []byte
	Body   []byte
}

// IsResponse reports whether the frame is a response.
func (f *Frame) IsResponse() bool { return f.Flags&FlagResponse != 0 }

// IsOneway reports whether the frame is a request that wants no response.
func (f *Frame) IsOneway() bool { return f.Flags&FlagOneway != 0 }

// Size is the encoded size of the frame.
func (f *Frame) Size() int { return FixedHeaderSize + len(f.Header) + len(f.Body) }

// AppendFrame appends the encoding of f to dst. It fails if the header or the
// whole frame is over its cap; dst is then returned unchanged.
func AppendFrame(dst []byte, f *Frame) ([]byte, error) {
	dst, err := AppendFrameHead(dst, f)
	if err != nil {
		return dst, err
	}
	return append(dst, f.Body...), nil
}

// AppendFrameHead appends the encoding of f without its body (which
// follows it on the wire: the length counts it), for a writer that sends
// the body from where it is. It fails as AppendFrame does.
func AppendFrameHead(dst []byte, f *Frame) ([]byte, error) {
	if len(f.Header) > MaxHeaderSize {
		return dst, fmt.Errorf("%w: header of %d bytes over the cap %d", ErrFrameTooLarge, len(f.Header), MaxHeaderSize)
	}
	size := f.Size()
	if size > MaxFrameSize {
		return dst, fmt.Errorf("%w: %d bytes over the cap %d", ErrFrameTooLarge, size, MaxFrameSize)
	}
	dst = appendU32(dst, uint32(size))
	dst = appendU16(dst, Magic)
	dst = appendU8(dst, Version)
	dst = appendU8(dst, f.Flags)
	dst = appendU16(dst, uint16(f.Code))
	dst = appendU16(dst, uint16(f.Status))
	dst = appendU32(dst, f.Opaque)
	dst = appendU16(dst, uint16(len(f.Header)))
	return append(dst, f.Header...), nil
}

// FrameLength validates the first 4 bytes of a frame (its total length) and
// returns it. A reader calls it before reading the rest, so it never
// allocates for a length over MaxFrameSize.
func FrameLength(prefix []byte) (int, error) {
	if len(prefix) < 4 {
		return 0, fmt.Errorf("%w: frame length: truncated", ErrMalformed)
	}
	n := binary.BigEndian.Uint32(prefix)
	if n > MaxFrameSize {
		return 0, fmt.Errorf("%w: frame of %d bytes over the cap %d", ErrFrameTooLarge, n, MaxFrameSize)
	}
	if n < FixedHeaderSize {
		return 0, fmt.Errorf("%w: frame length %d under the fixed header size %d", ErrMalformed, n, FixedHeaderSize)
	}
	return int(n), nil
}

// DecodeFrame decodes exactly one whole frame from b. The returned frame's
// Header and Body alias b.
func DecodeFrame(b []byte) (Frame, error) {
	var f Frame
	n, err := FrameLength(b)
	if err != nil {
		return f, err
	}
	if n != len(b) {
		return f, fmt.Errorf("%w: frame length %d but %d bytes given", ErrMalformed, n, len(b))
	}
	r := reader{b: b[4:]}
	if m := r.u16("magic"); m != Magic {
		return f, fmt.Errorf("%w: bad magic %#04x", ErrMalformed, m)
	}
	if v := r.u8("version"); v != Version {
		return f, fmt.Errorf("%w: unsupported version %d", ErrMalformed, v)
	}
	f.Flags = r.u8("flags")
	if f.Flags&^knownFlags != 0 {
		return f, fmt.Errorf("%w: unknown flags %#02x", ErrMalformed, f.Flags)
	}
	if f.Flags&FlagResponse != 0 && f.Flags&FlagOneway != 0 {
		return f, fmt.Errorf("%w: a response cannot be oneway", ErrMalformed)
	}
	f.Code = Code(r.u16("code"))
	f.Status = Status(r.u16("status"))
	f.Opaque = r.u32("opaque")
	f.Header = r.span(int(r.u16("header length")), "header")
	if r.err != nil {
		return Frame{}, r.err
	}
	f.Body = r.b
	return f, nil
}
