package transport

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/protocol"
)

// A connection's goroutines: its reader (readLoop: framing, the frame caps,
// the limits before trust) and its writer (writeLoop).

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
	// authenticated (see ServerConfig).
	tlsState *tls.ConnectionState
	trusted  atomic.Bool
	// unauthHeld: the connection counts in stats.unauth (RequireAuth, until
	// it authenticates or closes); accepted, when it was accepted.
	unauthHeld atomic.Bool
	accepted   time.Time
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
		if pending {
			pending, first = false, protocol.Frame{}
		} else {
			if c.s.cfg.RequireAuth && !c.trusted.Load() && !c.preAuthDeadline() {
				<-c.sem
				return
			}
			var err error
			if f, err = c.readFrame(br); err != nil {
				<-c.sem
				c.readFailed(err)
				return
			}
		}
		if f.IsResponse() {
			<-c.sem
			c.readFailed(fmt.Errorf("%w: a response (opaque %d) sent to a server", ErrBadFrame, f.Opaque))
			return
		}
		rt, known := c.s.handlers[f.Code]
		if known && !c.s.cfg.RequireAuth && !c.trusted.Load() {
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
		c.s.inflight.Add(1)
		if c.s.cfg.RequireAuth && !preAuth(f.Code) && !c.trusted.Load() && !c.certVerified() {
			req.ReplyError(errAuthFirst)
			if f.IsOneway() {
				req.finish()
			}
			continue
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
// authentication when its length arrives (a handler may have
// authenticated the connection while the reader waited for it).
func (c *serverConn) readFrame(br *bufio.Reader) (protocol.Frame, error) {
	var lenBuf [4]byte
	if _, err := io.ReadFull(br, lenBuf[:]); err != nil {
		return protocol.Frame{}, err
	}
	limit, g := c.frameCap()
	return readFrameAfter(br, lenBuf, limit, g)
}

// frameCap is the most a connection may declare for its next frame, and
// how that frame's buffer grows as its bytes arrive: at once once the
// connection authenticated with RequireAuth; with growBig (a frame over
// growAbove grows) when it is trusted without RequireAuth (one request of
// a registered code makes it so: it may be anyone); else with growAll.
func (c *serverConn) frameCap() (limit int, g growth) {
	switch {
	case c.trusted.Load() && c.s.cfg.RequireAuth:
		return protocol.MaxFrameSize, readAtOnce
	case c.trusted.Load():
		return protocol.MaxFrameSize, growBig
	case c.s.cfg.RequireAuth && !c.certVerified():
		return c.s.cfg.MaxUnauthFrame, growAll
	}
	return protocol.MaxFrameSize, growAll
}

// preAuthTimeouts bounds, in HandshakeTimeouts from its acceptance, how
// long a connection may stay unauthenticated (RequireAuth), requests or
// not: a client sends IDENTIFY and AUTH at once; this leaves room for
// retries, and bounds how long a stranger holds a connection (20 s by
// default).
const preAuthTimeouts = 4

// certVerified reports whether the connection's TLS handshake verified a
// client certificate. With RequireAuth that does not authenticate it (the
// certificate's name may be no principal), but its requests reach their
// handlers, whose authorization check authenticates it.
func (c *serverConn) certVerified() bool {
	return c.tlsState != nil && len(c.tlsState.VerifiedChains) > 0
}

// preAuthDeadline gives an unauthenticated connection (RequireAuth)
// HandshakeTimeout to send its next request, and no more than
// preAuthTimeouts of them since it was accepted. It returns false if the
// server is closing and the reader must stop.
func (c *serverConn) preAuthDeadline() bool {
	ht := c.s.cfg.HandshakeTimeout
	d := time.Now().Add(ht)
	if last := c.accepted.Add(preAuthTimeouts * ht); last.Before(d) {
		d = last
	}
	_ = c.raw.SetReadDeadline(d)
	if c.trusted.Load() {
		// authenticate may have cleared the deadline before this set it.
		_ = c.raw.SetReadDeadline(time.Time{})
	}
	select {
	case <-c.s.stop:
		return false // Close's deadline may have been replaced
	default:
		return true
	}
}

// authenticate marks the connection authenticated: it leaves the count of
// unauthenticated connections and loses its pre-auth read deadline.
func (c *serverConn) authenticate() {
	if c.trusted.Load() || !c.trusted.CompareAndSwap(false, true) {
		return
	}
	if !c.s.cfg.RequireAuth {
		return
	}
	c.releaseUnauth()
	_ = c.raw.SetReadDeadline(time.Time{})
	select {
	case <-c.s.stop:
		_ = c.raw.SetReadDeadline(time.Unix(1, 0)) // Close's, which this may have cleared
	default:
	}
}

// releaseUnauth takes the connection out of the count of unauthenticated
// connections, once.
func (c *serverConn) releaseUnauth() {
	if c.unauthHeld.CompareAndSwap(true, false) {
		c.s.stats.unauth.Add(-1)
	}
}

// unauthFailed closes a connection that did not authenticate in time or
// within maxPreAuthRequests (RequireAuth).
func (c *serverConn) unauthFailed(why string) {
	c.s.stats.unauthClosed.Add(1)
	remote := c.raw.RemoteAddr().String()
	c.s.limited.warn("unauth", fmt.Sprintf("closing connection from %s: %s", remote, why), "remote", remote)
	c.w.close(ErrConnLost)
	_ = c.raw.Close() // not the TLS connection's Close, which may wait to say goodbye
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
	var ne net.Error
	if c.s.cfg.RequireAuth && !c.trusted.Load() && errors.As(err, &ne) && ne.Timeout() {
		c.unauthFailed(fmt.Sprintf("it did not authenticate in time (a request every %v, authenticated within %v)",
			c.s.cfg.HandshakeTimeout, preAuthTimeouts*c.s.cfg.HandshakeTimeout))
		return
	}
	if errors.Is(err, ErrBadFrame) {
		if errors.Is(err, errUnauthFrame) {
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
