package transport

import (
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/ferrymq/ferrymq/protocol"
)

// Errors of the transport.
var (
	// ErrConnLost fails every call pending on a connection that broke.
	ErrConnLost = errors.New("transport: connection lost")
	// ErrClosed is returned by a closed Client or Server.
	ErrClosed = errors.New("transport: closed")
	// ErrBadFrame marks a peer that sent something that is not a valid frame;
	// its connection is closed.
	ErrBadFrame = errors.New("transport: bad frame from peer")
)

// errUntrustedFrame marks a frame over the cap a Gate set for a connection
// it does not trust yet (Admission.Limits).
var errUntrustedFrame = errors.New("frame over the cap of a connection that is not trusted")

// growth is how a frame's buffer is allocated (readFrame).
type growth int

const (
	// readAtOnce allocates the declared length at once: for a peer that
	// is trusted (the server a client dialed; a connection its Gate's
	// server trusts).
	readAtOnce growth = iota
	// growBig reads a frame over growAbove as its bytes arrive.
	growBig
	// growAll reads every frame over growStart as its bytes arrive.
	growAll
)

// readFrame reads one whole frame of at most limit bytes (its declared
// length is checked before anything is allocated). Its buffer is freshly
// allocated (the frame is handed to another goroutine): at once for the
// declared length, or as the bytes arrive (from growStart, growing), as g
// says, so that a peer that declares a large frame and sends little makes
// the server hold little.
func readFrame(r io.Reader, limit int, g growth) (protocol.Frame, error) {
	var lenBuf [4]byte
	if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
		return protocol.Frame{}, err
	}
	return readFrameAfter(r, lenBuf, limit, g)
}

// growStart is the first buffer of a frame read as its bytes arrive;
// each next one is growFactor times larger (at most the frame), once the
// one before is full: the server holds at most growFactor times what the
// peer sent, and a large frame costs a few copies (a 4 MiB one, 4).
const (
	growStart  = 16 << 10
	growFactor = 4
)

// growAbove is the largest frame read into a buffer of its declared length
// at once from a peer that is not trusted (growBig): a larger one is read as
// its bytes arrive (which costs a few copies: a 4 MiB frame takes about
// twice as long). It is
// at least the SDK's default batch (MaxBatchBytes, 1 MiB), so that ordinary
// SEND batches are read as before, in one allocation.
const growAbove = 1<<20 + 64<<10

// readFrameAfter is readFrame once the frame's length prefix was read.
func readFrameAfter(r io.Reader, lenBuf [4]byte, limit int, g growth) (protocol.Frame, error) {
	f, _, err := readFrameInto(r, lenBuf, limit, g, false)
	return f, err
}

// Frames of poolMin to poolMax bytes read at once may be read into a
// recycled buffer (see Request.Release): frameBufs[i] holds buffers of
// poolMin<<i bytes. A SEND batch is such a frame; allocating it afresh
// costs clearing it, and the garbage collector and the scavenger handling
// every batch's bytes once more.
const (
	poolMin     = 32 << 10
	poolClasses = 9 // up to 8 MiB: a slave's HA answers (4 MiB and their header) too
	poolMax     = poolMin << (poolClasses - 1)
)

var frameBufs [poolClasses]sync.Pool // of *[]byte

// poolClass is the class of the smallest pooled buffer holding n bytes.
func poolClass(n int) int {
	c := 0
	for poolMin<<c < n {
		c++
	}
	return c
}

// frameBuf returns a buffer of n bytes (poolMin <= n <= poolMax) from the
// pool, or a new one of its class's size. Its bytes are not cleared.
func frameBuf(n int) []byte {
	c := poolClass(n)
	if p, ok := frameBufs[c].Get().(*[]byte); ok {
		return (*p)[:n]
	}
	return make([]byte, n, poolMin<<c)
}

// putFrameBuf gives a buffer that frameBuf returned back to the pool.
func putFrameBuf(b []byte) {
	c := poolClass(cap(b))
	if cap(b) != poolMin<<c {
		return // not frameBuf's
	}
	b = b[:0]
	frameBufs[c].Put(&b)
}

// readFrameInto is readFrameAfter; with pool, a frame read at once whose
// size a pool class holds is read into a pooled buffer, which it returns
// (nil when the frame's buffer is not pooled): the caller may give it back
// (putFrameBuf) once nothing uses the frame.
func readFrameInto(r io.Reader, lenBuf [4]byte, limit int, g growth, pool bool) (protocol.Frame, []byte, error) {
	n, err := protocol.FrameLength(lenBuf[:])
	if err != nil {
		return protocol.Frame{}, nil, fmt.Errorf("%w: %w", ErrBadFrame, err)
	}
	if n > limit {
		return protocol.Frame{}, nil, fmt.Errorf("%w: %w: %d bytes declared, the cap is %d", ErrBadFrame, errUntrustedFrame, n, limit)
	}
	var buf, pooled []byte
	if n <= growStart || g == readAtOnce || (g == growBig && n <= growAbove) {
		if pool && n >= poolMin && n <= poolMax {
			buf = frameBuf(n)
			pooled = buf
		} else {
			buf = make([]byte, n)
		}
		copy(buf, lenBuf[:])
		_, err = io.ReadFull(r, buf[4:])
	} else {
		buf = make([]byte, growStart)
		copy(buf, lenBuf[:])
		got := 4
		for got < n && err == nil {
			if got == len(buf) {
				// make, not append: a large make clears its memory in
				// preemptible pieces, growslice in one (stalling the GC).
				nb := make([]byte, min(n, growFactor*len(buf)))
				copy(nb, buf[:got])
				buf = nb
			}
			var m int
			m, err = io.ReadFull(r, buf[got:])
			got += m
		}
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return protocol.Frame{}, nil, fmt.Errorf("%w: closed mid-frame: %w", ErrBadFrame, err)
	}
	f, err := protocol.DecodeFrame(buf)
	if err != nil {
		return protocol.Frame{}, nil, fmt.Errorf("%w: %w", ErrBadFrame, err)
	}
	return f, pooled, nil
}
