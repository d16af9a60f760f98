package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/protocol"
)

// writer coalesces frames from many goroutines into few writes: callers
// append encoded frames to buf under mu, and one goroutine (run) swaps the
// buffer out and writes it whole.
//
// Its two users bound it differently. A client's callers wait (up to their
// context) while max bytes or more wait to be written: the caller is the one
// slowed down. A server never makes a replier wait: it bounds the buffer by
// admission instead (admit, called by the connection's reader, reserves the
// bytes of a request's reply before the request is handed to a handler, and
// put releases the reservation as it appends the reply).
//
// A socket write that makes no progress for timeout fails the writer (the
// peer stopped reading); nothing then waits on that peer any more.
//
// Both may skip the writer goroutine when it is idle. A client's caller
// writes its request itself (inline, a blocking write bounded by timeout:
// the caller is the one slowed down). A server's worker writes the replies
// its handler made (flush) with one non-blocking write, which never waits on
// the peer: what the socket does not take at once is left to run, which
// writes it before anything else.
type writer struct {
	max     int
	timeout time.Duration // a write making no progress this long fails with ErrWriteTimeout; 0: never
	wake    chan struct{} // capacity 1: "buf has data or the writer is closing"
	done    chan struct{} // closed by close
	written atomic.Int64  // bytes written to the socket
	rests   atomic.Int64  // flush rests run wrote (read by tests)

	// inline, when set, lets enqueue write a frame itself, from the caller's
	// goroutine, when no write is in progress: a lone request then leaves
	// without waking the writer goroutine (one thread wake-up less per call).
	// wmu serializes writes to the socket between callers and run.
	inline net.Conn
	// raw, when set (a server's plaintext socket), lets flush write without
	// waiting.
	raw *socket
	// tls is set on a TLS connection: a TLS write that times out breaks the
	// connection for good (crypto/tls), so write hands it at most tlsChunk
	// bytes per call, each with a fresh deadline, and a timeout fails it at
	// once; and a large inline body is written after its head rather than
	// with writev (which a TLS connection does not have).
	tls bool
	wmu sync.Mutex
	// rest is the tail of a batch that flush began and the socket did not
	// take (guarded by wmu): run writes it first, so no frame is cut by
	// another.
	rest []byte
	// deadline is the socket's write deadline (guarded by wmu); write moves
	// it only when less than timeout is left, so a stream of quick writes
	// does not reset a timer each.
	deadline time.Time

	// restGuards are the guards of the frames in rest (guarded by wmu),
	// their spans rebased to rest: checked already, not yet sent.
	restGuards []guarded

	mu  sync.Mutex
	buf []byte
	// guards are the guarded frames in buf, in order (server only);
	// gspare is an empty slice for the next buf's (like spare).
	guards, gspare []guarded
	// given are the bodies that follow their heads in buf without having
	// been copied into it (putGiven), in order; givenBytes is their total
	// size; gvspare is an empty slice for the next buf's.
	given, gvspare []givenBody
	givenBytes     int
	// iov is the scratch list of pieces run hands one writev (under wmu).
	iov net.Buffers
	// spare is the buffer that buf is swapped with when a batch is taken.
	spare []byte
	// writing is the size of the batch run is writing (swapped out of buf,
	// not yet on the socket); unsent, the bytes of a flush not yet on the
	// socket (rest, or the batch flush is writing); reserved is what
	// admitted requests reserved for their replies (server only).
	writing, unsent, reserved int
	// space, when a goroutine waits for room, is closed (and cleared) by the
	// next change that may make room: a write, a reply, a release, close.
	space chan struct{}
	// admitWaiting counts readers inside admit waiting for room (0 or 1 per
	// writer); read by tests.
	admitWaiting int
	// closed: no more frames are taken; run writes what is buffered, then exits.
	closed bool
	err    error // why it closed; returned to later callers
	failed bool  // closed because a write failed (err is that failure)
}

// A Guard vets a reply at the last moment before it leaves. The writer
// calls Check with the reply's body just before it writes the piece of the
// connection's output that holds the reply's first byte (a piece is at
// most checkPiece bytes, so the check precedes that byte by one write of at
// most that size, unless the peer's socket is full); Check may rewrite the
// body in place, keeping its length (say, to turn an acknowledgement into a
// refusal that no longer holds). Check may be called again for a reply of
// which no byte has left yet (a flush's unsent rest is checked again before
// the writer goroutine writes it), so it must decide afresh each time. The
// writer calls Sent once the reply's last byte was handed to the socket.
// Both run on the goroutine that writes (a worker or the connection's
// writer), so they must be quick and never block; neither is called for a
// reply dropped with its connection, and Sent not for one whose write failed.
type Guard interface {
	Check(body []byte)
	Sent()
}

// guarded is a guarded frame in a write buffer: it starts at buf[start],
// its body is buf[off:end]. In a flush's rest, start is negative for a
// frame whose first bytes were written already.
type guarded struct {
	start, off, end int
	g               Guard
}

// givenBody is a reply's body the writer sends from the handler's own
// buffer: it goes right after the first at bytes of its batch, and release
// (if not nil) is called once it was handed to the socket.
type givenBody struct {
	at      int
	body    []byte
	release func()
}

// checkPiece is the most the writer goroutine writes in one piece of a
// batch with guarded replies: the replies whose first byte lies in a piece
// are checked just before it is written.
const checkPiece = 64 << 10

// check calls Check on every guard of the batch out whose frame has not
// begun to leave, in order.
func check(out []byte, gs []guarded) {
	for _, x := range gs {
		if x.start >= 0 {
			x.g.Check(out[x.off:x.end])
		}
	}
}

// sentUpTo calls Sent on the guards whose frames lie within the first n
// bytes of their batch, and returns the others rebased to the batch's
// unsent rest (reusing gs).
func sentUpTo(gs []guarded, n int) []guarded {
	rest := gs[:0]
	for _, x := range gs {
		if x.end <= n {
			x.g.Sent()
			continue
		}
		rest = append(rest, guarded{start: x.start - n, off: x.off - n, end: x.end - n, g: x.g})
	}
	clear(gs[len(rest):])
	return rest
}

// writeChecked writes out whole, as write does, with its guarded frames
// gs: in pieces of at most checkPiece bytes when it has any, each frame
// checked just before the piece holding its first byte, and marked sent
// after the piece holding its last. It returns gs emptied, for reuse.
func (w *writer) writeChecked(conn net.Conn, out []byte, gs []guarded) ([]guarded, error) {
	if len(gs) == 0 {
		return gs, w.write(conn, out)
	}
	done := 0
	for len(out) > done {
		end := min(len(out), done+checkPiece)
		k := 0
		for k < len(gs) && gs[k].start < end-done {
			k++
		}
		check(out[done:], gs[:k])
		if err := w.write(conn, out[done:end]); err != nil {
			return gs, err
		}
		gs = sentUpTo(gs, end-done)
		done = end
	}
	return gs, nil
}

// writeGiven is writeChecked for a batch with given bodies gv: each is
// written right after the first gv[i].at bytes of out. Without guards (or
// TLS) the whole batch goes in one writev; otherwise piece by piece, each
// guarded frame checked before its piece (a guarded frame never straddles
// a given body: its body is in out). Each body's release is called once it
// was written. It returns gs emptied, for reuse.
func (w *writer) writeGiven(conn net.Conn, out []byte, gs []guarded, gv []givenBody) ([]guarded, error) {
	if len(gs) == 0 && !w.tls {
		iov, prev := w.iov[:0], 0
		for _, g := range gv {
			iov = append(iov, out[prev:g.at], g.body)
			prev = g.at
		}
		if prev < len(out) {
			iov = append(iov, out[prev:])
		}
		w.iov = iov
		err := w.writev(conn, iov) // consumes a copy of the slice: w.iov keeps the array
		clear(w.iov)
		if err != nil {
			return gs, err
		}
	} else {
		prev, i := 0, 0
		for _, g := range gv {
			j := i
			for j < len(gs) && gs[j].start < g.at {
				gs[j].start -= prev
				gs[j].off -= prev
				gs[j].end -= prev
				j++
			}
			if _, err := w.writeChecked(conn, out[prev:g.at], gs[i:j]); err != nil {
				return gs[:0], err
			}
			if err := w.write(conn, g.body); err != nil {
				return gs[:0], err
			}
			prev, i = g.at, j
		}
		for j := i; j < len(gs); j++ {
			gs[j].start -= prev
			gs[j].off -= prev
			gs[j].end -= prev
		}
		if _, err := w.writeChecked(conn, out[prev:], gs[i:]); err != nil {
			return gs[:0], err
		}
		gs = gs[:0]
	}
	for _, g := range gv {
		if g.release != nil {
			g.release()
		}
	}
	return gs, nil
}

func newWriter(max int, timeout time.Duration) *writer {
	return &writer{max: max, timeout: timeout, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

var framePool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// signal wakes the goroutines waiting for room; mu is held.
func (w *writer) signal() {
	if w.space != nil {
		close(w.space)
		w.space = nil
	}
}

// spaceChan returns the channel the next change closes; mu is held.
func (w *writer) spaceChan() chan struct{} {
	if w.space == nil {
		w.space = make(chan struct{})
	}
	return w.space
}

func (w *writer) kick() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// enqueue appends f to the buffer for a client: it waits while max bytes or
// more are buffered, until ctx is done (ctx nil: until deadline). It fails
// if f is over the frame cap or the writer is closed.
func (w *writer) enqueue(ctx context.Context, deadline time.Time, f *protocol.Frame) error {
	if w.inline != nil && w.wmu.TryLock() {
		if len(w.rest) == 0 {
			return w.writeInline(f)
		}
		w.wmu.Unlock()
	}
	w.mu.Lock()
	for len(w.buf) >= w.max && !w.closed {
		if ctx == nil {
			// Made only when there is a wait to bound.
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(context.Background(), deadline)
			defer cancel()
		}
		ch := w.spaceChan()
		w.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		w.mu.Lock()
	}
	if w.closed {
		err := w.err
		w.mu.Unlock()
		return err
	}
	var err error
	w.buf, err = protocol.AppendFrame(w.buf, f)
	w.mu.Unlock()
	if err != nil {
		return err
	}
	w.kick()
	return nil
}

// admit reserves n bytes for the reply of a request the server's reader is
// about to hand to a handler. It waits while the buffered bytes (including
// the batch being written) plus those already reserved plus n exceed max;
// when nothing is buffered or reserved it admits whatever n is, so a reply
// larger than max cannot wait forever. It returns the writer's error once
// it is closed, and errStopped once stop is closed.
func (w *writer) admit(n int, stop <-chan struct{}) error {
	w.mu.Lock()
	for {
		if w.closed {
			err := w.err
			w.mu.Unlock()
			return err
		}
		used := len(w.buf) + w.givenBytes + w.writing + w.unsent + w.reserved
		if used == 0 || used+n <= w.max {
			w.reserved += n
			w.mu.Unlock()
			return nil
		}
		ch := w.spaceChan()
		w.admitWaiting++
		w.mu.Unlock()
		var stopped bool
		select {
		case <-ch:
		case <-stop:
			stopped = true
		}
		w.mu.Lock()
		w.admitWaiting--
		if stopped {
			w.mu.Unlock()
			return errStopped
		}
	}
}

// put appends f for a server: it never waits. On success, or when the writer
// is closed, it releases release bytes of reservation (made by admit); when f
// cannot be encoded (protocol.ErrFrameTooLarge) it changes nothing, so the
// caller can put another frame with the same release. It does not wake the
// writer goroutine: the caller kicks it, or flushes.
//
// g, if not nil, guards the frame's body (see Guard).
func (w *writer) put(f *protocol.Frame, release int, g Guard) error {
	w.mu.Lock()
	if w.closed {
		w.reserved -= release
		err := w.err
		w.mu.Unlock()
		return err
	}
	start := len(w.buf)
	buf, err := protocol.AppendFrame(w.buf, f)
	if err != nil {
		w.mu.Unlock()
		return err
	}
	w.buf = buf
	if g != nil {
		if w.guards == nil {
			w.guards, w.gspare = w.gspare, nil
		}
		w.guards = append(w.guards, guarded{start: start, off: len(buf) - len(f.Body), end: len(buf), g: g})
	}
	w.reserved -= release
	w.signal()
	w.mu.Unlock()
	return nil
}

// putGiven is put for a frame whose body is not copied: its head goes into
// the buffer and its body is written from where it is, after the head.
// On success the writer owns the body until it calls release (if not nil),
// once the body was handed to the socket; a body dropped with a failed
// connection is left to the garbage collector, release never called. On
// failure nothing was taken: the caller keeps the body. Guards are not
// taken: the body is sent as the handler made it.
func (w *writer) putGiven(f *protocol.Frame, release int, done func()) error {
	w.mu.Lock()
	if w.closed {
		w.reserved -= release
		err := w.err
		w.mu.Unlock()
		return err
	}
	buf, err := protocol.AppendFrameHead(w.buf, f)
	if err != nil {
		w.mu.Unlock()
		return err
	}
	w.buf = buf
	if w.given == nil {
		w.given, w.gvspare = w.gvspare, nil
	}
	w.given = append(w.given, givenBody{at: len(buf), body: f.Body, release: done})
	w.givenBytes += len(f.Body)
	w.reserved -= release
	w.signal()
	w.mu.Unlock()
	return nil
}

// maxFlush is the most a flush writes from a replier's goroutine; a larger
// buffer goes to the writer goroutine (a worker should not spend the time
// of a large copy into the socket).
const maxFlush = 64 << 10

// flush writes what is buffered from the calling goroutine (a server's
// worker, after its handler replied) when no write is in progress, with one
// non-blocking write: it never waits on the peer. What the socket does not
// take, and everything when a write is in progress (or the buffer is over
// maxFlush), is left to the writer goroutine, which it wakes.
func (w *writer) flush() {
	if w.raw == nil || !w.wmu.TryLock() {
		w.kick()
		return
	}
	w.mu.Lock()
	if w.closed || w.writing > 0 || w.unsent > 0 || len(w.buf) == 0 || len(w.buf) > maxFlush || len(w.given) > 0 {
		w.mu.Unlock()
		w.wmu.Unlock()
		w.kick()
		return
	}
	out, gs := w.buf, w.guards
	w.buf, w.spare, w.guards = w.spare[:0], nil, nil
	w.unsent = len(out)
	w.mu.Unlock()
	check(out, gs) // one write that never waits: the checks precede it by microseconds
	n, err := w.raw.tryWrite(out)
	w.written.Add(int64(n))
	gs = sentUpTo(gs, n)
	if err != nil {
		w.wmu.Unlock()
		w.fail(err) // run returns err, so the connection's owner learns of it
		return
	}
	if n < len(out) {
		w.rest, w.restGuards = out[n:], gs
	}
	w.mu.Lock()
	w.unsent = len(out) - n
	if n == len(out) && w.spare == nil {
		w.spare = out[:0]
	}
	if n == len(out) && w.gspare == nil {
		w.gspare = gs
	}
	w.signal()
	w.mu.Unlock()
	w.wmu.Unlock()
	if n < len(out) {
		w.kick()
	}
}

// unreserve releases a reservation whose reply was never put.
func (w *writer) unreserve(n int) {
	if n == 0 {
		return
	}
	w.mu.Lock()
	w.reserved -= n
	w.signal()
	w.mu.Unlock()
}

// writeInline writes f from the caller's goroutine; wmu is held.
func (w *writer) writeInline(f *protocol.Frame) error {
	defer w.wmu.Unlock()
	w.mu.Lock()
	closed, cerr := w.closed, w.err
	w.mu.Unlock()
	if closed {
		return cerr
	}
	bp := framePool.Get().(*[]byte)
	var b []byte
	var err error
	if len(f.Body) >= inlineCopyMax && w.tls {
		// No copy of a large body over TLS either: the head, then the body.
		b, err = protocol.AppendFrameHead((*bp)[:0], f)
		if err == nil {
			if err = w.write(w.inline, b); err == nil {
				err = w.write(w.inline, f.Body)
			}
		}
	} else if len(f.Body) >= inlineCopyMax {
		// A large body goes from where it is, after its head, in one
		// writev: no copy of it, and no pooled buffer grown to its size.
		b, err = protocol.AppendFrameHead((*bp)[:0], f)
		if err == nil {
			err = w.writev(w.inline, net.Buffers{b, f.Body})
		}
	} else {
		b, err = protocol.AppendFrame((*bp)[:0], f)
		if err == nil {
			err = w.write(w.inline, b)
		}
	}
	if cap(b) <= 64<<10 {
		*bp = b[:0]
		framePool.Put(bp)
	}
	if err != nil {
		if errors.Is(err, protocol.ErrFrameTooLarge) {
			return err // nothing was written
		}
		w.fail(err) // run returns err, so the connection's owner learns of it
		return err
	}
	return nil
}

// inlineCopyMax is the body size from which an inline write sends the body
// from where it is (writev) rather than copying it after the frame's head.
const inlineCopyMax = 16 << 10

// writev is write for a frame in pieces: it writes them whole, consuming
// bufs, with write's deadlines.
func (w *writer) writev(conn net.Conn, bufs net.Buffers) error {
	for {
		if w.timeout > 0 {
			if now := time.Now(); w.deadline.Sub(now) < w.timeout {
				w.deadline = now.Add(w.timeout + w.timeout/8)
				_ = conn.SetWriteDeadline(w.deadline)
			}
		}
		n, err := bufs.WriteTo(conn)
		w.written.Add(n)
		if err == nil {
			return nil
		}
		if w.timeout <= 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		if n == 0 {
			return fmt.Errorf("%w: nothing written for %v", ErrWriteTimeout, w.timeout)
		}
	}
}

// errStopped: admit gave up because the server is closing.
var errStopped = errors.New("transport: server closing")

// ErrWriteTimeout marks a connection closed because its peer read nothing
// for the write timeout (ServerConfig.WriteTimeout, ClientConfig.WriteTimeout).
var ErrWriteTimeout = errors.New("transport: peer stopped reading")

// write writes b whole to conn; wmu is held. Each attempt starts with at
// least timeout (at most 9/8 of it) before the socket's deadline; an attempt
// that ends at its deadline having written something made progress, and the
// rest gets a fresh deadline. So write fails with ErrWriteTimeout only after
// the peer took no byte for at least timeout (and at most 2.25 times that
// after the last byte it took); a slow peer that keeps reading is not cut.
func (w *writer) write(conn net.Conn, b []byte) error {
	if w.tls {
		return w.writeTLS(conn, b)
	}
	if w.timeout <= 0 {
		n, err := conn.Write(b)
		w.written.Add(int64(n))
		return err
	}
	for {
		if now := time.Now(); w.deadline.Sub(now) < w.timeout {
			w.deadline = now.Add(w.timeout + w.timeout/8)
			_ = conn.SetWriteDeadline(w.deadline)
		}
		n, err := conn.Write(b)
		w.written.Add(int64(n))
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		if n == 0 {
			return fmt.Errorf("%w: nothing written for %v (%d bytes unsent)", ErrWriteTimeout, w.timeout, len(b))
		}
		b = b[n:]
	}
}

// tlsChunk is the most writeTLS hands a TLS connection in one call.
const tlsChunk = 64 << 10

// writeTLS is write for a TLS connection: a TLS write that times out leaves
// the connection unusable, so the bytes go in chunks of tlsChunk, each
// started with at least timeout before the deadline, and the first timeout
// fails the connection. A peer is thus cut when it took less than tlsChunk
// bytes in timeout.
func (w *writer) writeTLS(conn net.Conn, b []byte) error {
	for len(b) > 0 {
		chunk := b[:min(len(b), tlsChunk)]
		if w.timeout > 0 {
			if now := time.Now(); w.deadline.Sub(now) < w.timeout {
				w.deadline = now.Add(w.timeout + w.timeout/8)
				_ = conn.SetWriteDeadline(w.deadline)
			}
		}
		n, err := conn.Write(chunk)
		w.written.Add(int64(n))
		if err != nil {
			if w.timeout > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
				return fmt.Errorf("%w: less than %d bytes taken in %v (%d bytes unsent)", ErrWriteTimeout, tlsChunk, w.timeout, len(b)-n)
			}
			return err
		}
		b = b[n:]
	}
	return nil
}

// close stops taking frames; run flushes what is buffered and returns.
func (w *writer) close(err error) { w.shut(err, false) }

// fail closes the writer after a failed write: what is buffered is dropped.
func (w *writer) fail(err error) { w.shut(err, true) }

func (w *writer) shut(err error, failed bool) {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		w.err = err
		w.failed = failed
		close(w.done)
	}
	w.signal()
	w.mu.Unlock()
	w.kick()
}

// run writes buffered frames to conn until the writer is closed and drained,
// or a write fails. It returns the write error, its own or an inline one.
func (w *writer) run(conn net.Conn) error {
	for range w.wake {
		for {
			w.mu.Lock()
			if w.closed && w.failed {
				w.buf, w.guards, w.given = nil, nil, nil // nothing more can be written after a failed write
				w.givenBytes, w.unsent = 0, 0
			}
			out, gs, gv := w.buf, w.guards, w.given
			closed, failed, cerr := w.closed, w.failed, w.err
			w.writing = len(out) + w.givenBytes
			if len(out) > 0 {
				w.buf, w.spare, w.guards = w.spare[:0], nil, nil
				w.given, w.givenBytes = nil, 0
			}
			unsent := w.unsent
			w.signal() // the previous batch is written, buf is empty
			w.mu.Unlock()
			if len(out) == 0 && unsent == 0 {
				if closed {
					if failed {
						return cerr
					}
					return nil
				}
				break
			}
			w.wmu.Lock()
			var err error
			if rest := w.rest; len(rest) > 0 {
				// The tail of a flush goes first: the socket holds its start.
				// Its frames not begun are checked again: the socket may
				// have kept them waiting since the flush checked them.
				rg := w.restGuards
				w.rest, w.restGuards = nil, nil
				w.rests.Add(1)
				_, err = w.writeChecked(conn, rest, rg)
				w.mu.Lock()
				w.unsent -= len(rest)
				w.mu.Unlock()
			}
			if err == nil && len(out) > 0 {
				if len(gv) == 0 {
					gs, err = w.writeChecked(conn, out, gs)
				} else {
					gs, err = w.writeGiven(conn, out, gs, gv)
				}
			}
			w.wmu.Unlock()
			if err != nil {
				w.fail(err)
				return err
			}
			if len(out) > 0 && cap(out) <= 4*w.max { // drop a buffer grown by one huge burst
				w.mu.Lock()
				if w.spare == nil {
					w.spare = out[:0]
				}
				if w.gspare == nil && gs != nil {
					w.gspare = gs
				}
				if w.gvspare == nil && gv != nil {
					clear(gv)
					w.gvspare = gv[:0]
				}
				w.mu.Unlock()
			}
		}
	}
	return nil
}
