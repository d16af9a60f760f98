package transport

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/ferrymq/ferrymq/protocol"
)

// A Gate decides what a connection may do before the server trusts it
// (ServerConfig.Gate): whether it is let in at all, how long it may take
// over each frame and how large a frame it may declare, and which of its
// requests reach their handlers. It keeps its own state per connection (an
// Admission), so it can count and cap connections, and it is told when a
// connection becomes trusted (a handler called Request.Authenticate) and
// when it closes. The transport knows no request code: which requests a
// stranger may make, and when it has proved who it is, are the gate's and
// the handlers' to say (package auth's Gate is the servers' one).
//
// Open runs on the server's acceptor goroutine, once for each connection
// accepted under MaxConns, before its TLS handshake. It returns the
// connection's admission, or an error to refuse the connection: it is then
// closed (on a plaintext port, after its first request is answered BUSY
// with the error's text), counted in ServerStats.Refused and warned about
// (rate-limited) with the error. Open must be quick and never block: it
// holds up the accepting of every connection.
//
// drop closes the connection, from any goroutine, at any time until it is
// closed (later, it does nothing): the gate may evict a connection to make
// room for another, or close one that misbehaved. Nothing more is read
// from it or handed to its handlers; what was already answered is still
// written (within WriteTimeout), then it closes. It never blocks. It is
// counted in ServerStats.Dropped.
type Gate interface {
	Open(remote net.Addr, now time.Time, drop func(why error)) (Admission, error)
}

// Admission is a gate's state for one connection, from its acceptance to
// its close.
//
// Limits is called by the connection's reader before it reads each frame
// while the connection is not trusted (the first one included, once its
// TLS handshake is done; tls is the handshake's state, nil on a plaintext
// port). It returns the time by which that frame must have arrived whole
// (the zero time: no deadline; the first frame is also bound by
// HandshakeTimeout), past which the connection is closed (counted in
// ServerStats.UntrustedTimeouts), and the most the frame may declare
// (at most protocol.MaxFrameSize; 0 or less is that), over which the
// connection is closed (counted in ServerStats.Oversize). Whatever the
// cap, a frame of an untrusted connection is read as its bytes arrive, so
// a peer that declares much and sends little makes the server hold little.
//
// Admit is called by the reader for each request of a connection that is
// not trusted, before its handler: nil lets it through; an error is the
// request's answer (Request.ReplyError), and its handler does not run (a
// oneway request is dropped). Admit must not keep f.Body.
//
// Trusted is called once, when a handler trusts the connection
// (Request.Authenticate). From then on the server asks nothing more about
// it: no deadline, frames of any size up to protocol.MaxFrameSize, every
// request to its handler.
//
// Closed is called once, when the connection closes for whatever reason
// (never for a connection Open refused), or when the server closes, before
// it waits for the requests already read to be answered (a gate that holds
// answers back gives them then). A handler may still trust a connection
// being closed, so Trusted may come after Closed.
//
// Limits and Admit run on the connection's reader, one at a time; Trusted
// and Closed may run on any goroutine, at the same time as them. None may
// block.
//
// Admission is an alias of an interface literal, not a named type, so that
// a gate's package need not import transport: a type whose Open returns an
// identical literal (auth.Admission) implements Gate.
type Admission = interface {
	Limits(now time.Time, tls *tls.ConnectionState) (deadline time.Time, maxFrame int)
	Admit(f protocol.Frame, tls *tls.ConnectionState) error
	Trusted()
	Closed()
}

// errUntrustedTimeout is why a connection that was not trusted by the
// deadline its gate set is closed.
var errUntrustedTimeout = errors.New("it was not trusted by its gate's deadline (it did not authenticate in time)")

// untrustedLimits applies the gate's limits to the connection's next frame
// (its read deadline) and returns its cap. It returns false if the server
// is closing and the reader must stop.
func (c *serverConn) untrustedLimits() (maxFrame int, ok bool) {
	d, maxFrame := c.adm.Limits(time.Now(), c.tlsState)
	_ = c.raw.SetReadDeadline(d)
	if c.trusted.Load() {
		// trust may have cleared the deadline before this set it.
		_ = c.raw.SetReadDeadline(time.Time{})
	}
	select {
	case <-c.s.stop:
		return 0, false // Close's deadline may have been replaced
	default:
		return frameCapOf(maxFrame), true
	}
}

// frameCapOf is a gate's frame cap as the reader applies it.
func frameCapOf(maxFrame int) int {
	if maxFrame <= 0 || maxFrame > protocol.MaxFrameSize {
		return protocol.MaxFrameSize
	}
	return maxFrame
}

// trust marks the connection trusted: without a gate, that only changes
// how its frames are read; with one, the gate is told, and the connection
// loses its read deadline.
func (c *serverConn) trust() {
	if c.trusted.Load() || !c.trusted.CompareAndSwap(false, true) {
		return
	}
	if c.adm == nil {
		return
	}
	c.adm.Trusted()
	_ = c.raw.SetReadDeadline(time.Time{})
	select {
	case <-c.s.stop:
		_ = c.raw.SetReadDeadline(time.Unix(1, 0)) // Close's, which this may have cleared
	default:
	}
}

// drop closes the connection at its gate's or its owner's request (see
// Gate.Open, Server.DropConns): the writer writes what is queued, then
// closes the socket; the reader reads nothing more (the socket's reading
// side is shut, which wakes it; a reader still in open fails and closes
// the socket itself).
func (c *serverConn) drop(why error) {
	if !c.dropped.CompareAndSwap(false, true) {
		return
	}
	c.s.stats.dropped.Add(1)
	c.w.close(why)
	if rc, ok := c.raw.(interface{ CloseRead() error }); !ok || rc.CloseRead() != nil {
		_ = c.raw.Close()
	}
}

// closeAdmission tells the connection's gate that it closed, once.
func (c *serverConn) closeAdmission() {
	if c.adm != nil && c.admOpen.CompareAndSwap(true, false) {
		c.adm.Closed()
	}
}

// untrustedExpired closes a connection that its gate's deadline found
// untrusted.
func (c *serverConn) untrustedExpired() {
	c.s.stats.untrustedTimeouts.Add(1)
	remote := c.raw.RemoteAddr().String()
	c.s.limited.warn("untrusted", fmt.Sprintf("closing connection from %s: %v", remote, errUntrustedTimeout), "remote", remote)
	c.w.close(ErrConnLost)
	_ = c.raw.Close() // not the TLS connection's Close, which may wait to say goodbye
}
