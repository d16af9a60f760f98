package transport

import (
	"net"
	"sync"

	"github.com/ferrymq/ferrymq/protocol"
)

// writer coalesces frames from many goroutines into few writes: callers
// append encoded frames to buf under mu, and one goroutine (run) swaps the
// buffer out and writes it whole. A caller blocks while more than max bytes
// wait, so a slow peer cannot grow memory without bound.
type writer struct {
	max  int
	wake chan struct{} // capacity 1: "buf has data or the writer is closing"

	// inline, when set, lets enqueue write a frame itself, from the caller's
	// goroutine, when no write is in progress: a lone request then leaves
	// without waking the writer goroutine (one thread wake-up less per call).
	// wmu serializes writes to the socket between callers and run.
	inline net.Conn
	wmu    sync.Mutex

	mu    sync.Mutex
	space *sync.Cond // signalled when buf is drained or the writer closes
	buf   []byte
	// closed: no more frames are taken; run writes what is buffered, then exits.
	closed bool
	err    error // why it closed; returned to later callers
}

func newWriter(max int) *writer {
	w := &writer{max: max, wake: make(chan struct{}, 1)}
	w.space = sync.NewCond(&w.mu)
	return w
}

var framePool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// enqueue appends f to the buffer. It fails if f is over the frame cap or
// the writer is closed.
func (w *writer) enqueue(f *protocol.Frame) error {
	if w.inline != nil && w.wmu.TryLock() {
		return w.writeInline(f)
	}
	w.mu.Lock()
	for len(w.buf) >= w.max && !w.closed {
		w.space.Wait()
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
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return nil
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
	b, err := protocol.AppendFrame((*bp)[:0], f)
	if err != nil {
		framePool.Put(bp)
		return err
	}
	_, err = w.inline.Write(b)
	if cap(b) <= 64<<10 {
		*bp = b[:0]
		framePool.Put(bp)
	}
	if err != nil {
		w.close(err)
		return err
	}
	return nil
}

// close stops taking frames; run flushes what is buffered and returns.
func (w *writer) close(err error) {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		w.err = err
	}
	w.space.Broadcast()
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run writes buffered frames to conn until the writer is closed and drained,
// or a write fails. It returns the write error, if any.
func (w *writer) run(conn net.Conn) error {
	var spare []byte
	for range w.wake {
		for {
			w.mu.Lock()
			out := w.buf
			closed := w.closed
			if len(out) > 0 {
				w.buf = spare[:0]
				w.space.Broadcast()
			}
			w.mu.Unlock()
			if len(out) == 0 {
				if closed {
					return nil
				}
				break
			}
			w.wmu.Lock()
			_, err := conn.Write(out)
			w.wmu.Unlock()
			if err != nil {
				w.close(err)
				return err
			}
			if cap(out) > 4*w.max {
				out = nil // drop a buffer grown by one huge burst
			}
			spare = out
		}
	}
	return nil
}
