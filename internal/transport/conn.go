package transport

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/ferrymq/ferrymq/protocol"
)

// A connection's goroutines: its reader (readLoop: framing, the frame caps,
// admission) and its writer (writeLoop).

// serverConn is one accepted connection.
type serverConn struct {
	s   *Server
	raw net.Conn // the accepted socket
	// nc is what requests are read from and answers written to: raw, or
	// the TLS connection over it. Set by open, before the writer starts.
	nc  net.Conn
	w   *writer
	sem chan struct{} // one slot per request read and not yet answered
	// tlsState is the TLS connection's state once its handshake is done
	// (nil on a plaintext port); trusted, whether the connection is
	// trusted (see ServerConfig.Gate).
	tlsState *tls.ConnectionState
	trusted  atomic.Bool
	// adm is the Gate's admission of the connection (nil without a Gate);
	// admOpen, whether it is yet to be told the connection closed.
	adm     Admission
	admOpen atomic.Bool
	// dropped: drop closed the connection.
	dropped atomic.Bool
	// peer is the connection's identity slot (Request.SetPeer): nil until
	// a handler sets it.
	peer atomic.Pointer[any]

	// The connection's ordered requests (HandleOrdered): while one is with
	// the workers (queued for or run by one), running is set and those read
	// after it wait in oq[oh:], in arrival order; the worker that finishes
	// one takes the next. Its length is bounded by MaxInflightPerConn.
	omu     sync.Mutex
	running bool
	oq      []*Request
	oh      int
}

// readLoop reads requests and hands them to the workers. It is the only
// goroutine of the connection that waits on its peer's behalf: before reading
// a request it waits for a slot of MaxInflightPerConn, and before handing it
// on, for room in MaxWriteBuffer for its reply (writer.admit). While it
// waits, the peer's requests stay unread: backpressure on that peer alone.
func (c *serverConn) readLoop() {
	defer c.s.readWG.Done()
	first, ok := c.open()
	if !ok {
		return
	}
	// The writer starts once the connection is past its handshake (Close
	// waits for the readers before it waits for the writers).
	c.s.writeWG.Add(1)
	go c.writeLoop()
	br := bufio.NewReaderSize(c.nc, 64<<10)
	pending := true
	for {
		select {
		case c.sem <- struct{}{}:
		case <-c.s.stop:
			return
		case <-c.w.done:
			return // the connection is being torn down; the read fails too
		}
		f := first
		var buf []byte // f's buffer when pooled
		if pending {
			pending, first = false, protocol.Frame{}
		} else {
			var err error
			if f, buf, err = c.readFrame(br); err != nil {
				<-c.sem
				c.readFailed(err) // nothing to say if it is errStopped
				return
			}
		}
		if f.IsResponse() {
			<-c.sem
			c.readFailed(fmt.Errorf("%w: a response (opaque %d) sent to a server", ErrBadFrame, f.Opaque))
			return
		}
		rt, known := c.s.handlers[f.Code]
		if known && c.adm == nil && !c.trusted.Load() {
			c.trusted.Store(true)
		}
		n := c.s.reservation(&f, rt, known)
		if err := c.w.admit(n, c.s.stop); err != nil {
			c.s.inflight.Add(1)
			req := &Request{Frame: f, conn: c}
			if errors.Is(err, errStopped) && !f.IsOneway() {
				req.ReplyError(protocol.ErrShuttingDown)
			} else {
				req.finish()
			}
			return
		}
		req := &Request{Frame: f, conn: c, h: rt.h, reserved: n, ordered: rt.ordered}
		if rt.releases {
			req.buf = buf
		}
		c.s.inflight.Add(1)
		if c.adm != nil && !c.trusted.Load() {
			if err := c.adm.Admit(f, c.tlsState); err != nil {
				req.ReplyError(err)
				if f.IsOneway() {
					req.finish()
				}
				continue
			}
		}
		if !known {
			req.ReplyError(&protocol.Error{Status: protocol.StatusUnknownCode,
				Message: fmt.Sprintf("no handler for request code %d", uint16(f.Code))})
			if f.IsOneway() {
				req.finish()
			}
			continue
		}
		if req.ordered && !c.startOrdered(req) {
			continue // the worker running the previous one runs it
		}
		if rt.inline && br.Buffered() == 0 {
			if !c.runInline(req) {
				return
			}
			continue
		}
		select {
		case c.s.tasks <- req:
		case <-c.s.stop:
			// Nothing is queued behind req: this reader queues the
			// connection's ordered requests, and it stops here.
			req.ReplyError(protocol.ErrShuttingDown)
			if f.IsOneway() {
				req.finish()
			}
			return
		}
	}
}

// readFrame reads the connection's next frame, within the cap of its
// trust when its length arrives (a handler may have trusted the
// connection while the reader waited for it). An untrusted connection's
// frame is read under its Gate's limits; errStopped: the server is closing.
// Its buffer, when pooled (else nil), may go back to the pool once the
// request is released (Request.Release).
func (c *serverConn) readFrame(br *bufio.Reader) (protocol.Frame, []byte, error) {
	gateCap := 0
	if c.adm != nil && !c.trusted.Load() {
		var ok bool
		if gateCap, ok = c.untrustedLimits(); !ok {
			return protocol.Frame{}, nil, errStopped
		}
	}
	var lenBuf [4]byte
	if _, err := io.ReadFull(br, lenBuf[:]); err != nil {
		return protocol.Frame{}, nil, err
	}
	limit, g := c.frameCap(gateCap)
	return readFrameInto(br, lenBuf, limit, g, c.releasing(br, lenBuf))
}

// releasing reports whether the frame whose length is lenBuf is of a code
// whose handler releases its requests (Server.Releases), peeking at its
// code (after the magic, version and flags) when its size may be pooled.
func (c *serverConn) releasing(br *bufio.Reader, lenBuf [4]byte) bool {
	n, err := protocol.FrameLength(lenBuf[:])
	if err != nil || n < poolMin || n > poolMax {
		return false
	}
	head, err := br.Peek(6)
	if err != nil {
		return false
	}
	return c.s.handlers[protocol.Code(binary.BigEndian.Uint16(head[4:6]))].releases
}

// frameCap is the most a connection may declare for its next frame, and
// how that frame's buffer grows as its bytes arrive: at once once a Gate's
// connection is trusted; with growBig (a frame over growAbove grows) when
// it is trusted without a Gate (one request of a registered code makes it
// so: it may be anyone); else with growAll, within gateCap if its Gate
// set one (the cap of untrustedLimits, read before the frame's length).
func (c *serverConn) frameCap(gateCap int) (limit int, g growth) {
	switch {
	case c.trusted.Load() && c.adm != nil:
		return protocol.MaxFrameSize, readAtOnce
	case c.trusted.Load():
		return protocol.MaxFrameSize, growBig
	case gateCap > 0:
		return gateCap, growAll
	}
	return protocol.MaxFrameSize, growAll
}

// readFailed ends a connection whose reading failed. A peer that went away
// or a server that is closing is normal; a bad frame is logged, and the
// connection is closed at once without waiting for its pending answers.
func (c *serverConn) readFailed(err error) {
	select {
	case <-c.s.stop:
		return // Close owns the shutdown of this connection
	default:
	}
	if c.dropped.Load() {
		c.w.close(ErrConnLost)
		return // drop said why; the writer closes the socket
	}
	var ne net.Error
	if c.adm != nil && !c.trusted.Load() && errors.As(err, &ne) && ne.Timeout() {
		c.untrustedExpired()
		return
	}
	if errors.Is(err, ErrBadFrame) {
		if errors.Is(err, errUntrustedFrame) {
			c.s.stats.oversize.Add(1)
		}
		c.s.limited.warn("badframe", "closing connection after a bad frame", "remote", c.raw.RemoteAddr().String(), "error", err)
		c.w.close(err)
		_ = c.raw.Close() // not the TLS connection's Close, which may wait to say goodbye
		return
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		c.s.log.Debug("connection read failed", "remote", c.raw.RemoteAddr().String(), "error", err)
	}
	// The peer closed its side: answers in flight have nowhere to go.
	c.w.close(ErrConnLost)
}

func (c *serverConn) writeLoop() {
	defer c.s.writeWG.Done()
	if err := c.w.run(c.nc); err != nil {
		remote := c.nc.RemoteAddr().String()
		if errors.Is(err, ErrWriteTimeout) {
			c.s.log.Warn(fmt.Sprintf("closing connection: peer %s did not read for %v; its unanswered requests' replies are dropped", remote, c.s.cfg.WriteTimeout),
				"remote", remote, "write_timeout", c.s.cfg.WriteTimeout, "unanswered", len(c.sem))
		} else {
			c.s.log.Debug("connection write failed", "remote", remote, "error", err)
		}
	}
	_ = c.raw.Close() // not the TLS connection's Close, which may wait to say goodbye
	c.s.forget(c)
}
