package transport

import (
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync/atomic"

	"github.com/ferrymq/ferrymq/protocol"
)

// Request is one request read from a connection.
type Request struct {
	protocol.Frame
	conn     *serverConn
	h        Handler
	reserved int  // bytes of the connection's MaxWriteBuffer reserved for the reply
	ordered  bool // its code was registered with HandleOrdered
	answered atomic.Bool
	// phase is phaseHandling while a worker runs the handler, and
	// phaseReplied once it answered meanwhile: that answer waits in the
	// buffer for the worker, which writes it when the handler returns (itself
	// if the connection's writer is idle), instead of waking the writer
	// goroutine. An answer made at any other time wakes the writer.
	phase atomic.Int32
	// buf is the frame's pooled buffer (nil: not pooled, or released).
	buf []byte
}

// Release tells the server that the handler is done with the request's
// Body and with everything sliced from it, for good: its buffer may then
// hold a later frame. Only the handler of a code marked Releases may
// call it (see Server.Releases), at most once, from any goroutine; the request may still be
// answered after. A request never released leaves its buffer to the
// garbage collector.
func (r *Request) Release() {
	if b := r.buf; b != nil {
		r.buf = nil
		r.Body, r.Header = nil, nil
		putFrameBuf(b)
	}
}

// Request phases (Request.phase).
const (
	phaseIdle int32 = iota
	phaseHandling
	phaseReplied
)

// RemoteAddr is the address of the peer that sent the request.
func (r *Request) RemoteAddr() net.Addr { return r.conn.raw.RemoteAddr() }

// TLS is the state of the request's TLS connection (its peer's verified
// certificate chains among it), or nil on a plaintext port.
func (r *Request) TLS() *tls.ConnectionState { return r.conn.tlsState }

// Authenticated reports whether the request's connection is trusted (see
// ServerConfig.Gate).
func (r *Request) Authenticated() bool { return r.conn.trusted.Load() }

// Peer is what a handler stored for the request's connection with SetPeer
// (the authorization layer keeps who the peer is there), or nil.
func (r *Request) Peer() any {
	if p := r.conn.peer.Load(); p != nil {
		return *p
	}
	return nil
}

// SetPeer stores v for the request's connection: every later request of
// the connection sees it with Peer.
func (r *Request) SetPeer(v any) { r.conn.peer.Store(&v) }

// Admission is the Gate's admission of the request's connection (what its
// Open returned), or nil without a Gate: the gate's own state for the
// connection, which a handler may hand back to the gate (package auth's
// AUTH handling does).
func (r *Request) Admission() Admission { return r.conn.adm }

// Authenticate marks the request's connection trusted (the authorization
// layer calls it once a peer proved who it is): its Gate is told
// (Admission.Trusted) and asked nothing more about it; its next frames may
// be as large as any, and are read at once.
func (r *Request) Authenticate() { r.conn.trust() }

// CompareAndSwapPeer stores v for the request's connection, like SetPeer,
// if what is stored is old (nil: nothing yet), and reports whether it did.
// old must be comparable (a pointer, say).
func (r *Request) CompareAndSwapPeer(old, v any) bool {
	for {
		p := r.conn.peer.Load()
		var cur any
		if p != nil {
			cur = *p
		}
		if cur != old {
			return false
		}
		if r.conn.peer.CompareAndSwap(p, &v) {
			return true
		}
	}
}

// Reply answers the request with OK and body. Only the first answer counts;
// later ones return an error. A oneway request is never answered.
//
// Reply never blocks: it queues the response for the connection's writer
// goroutine (its bytes were reserved when the request was admitted), so it
// may be called from goroutines that must not wait on a peer, like the
// commit log's. It returns an error when the connection is gone (the peer
// left, stopped reading for WriteTimeout, or sent a bad frame): the answer is
// then dropped.
func (r *Request) Reply(body []byte) error {
	return r.reply(protocol.StatusOK, body)
}

// ReplyError answers the request with err's status (protocol.StatusOf) and
// its text as the body, without the status's own "ferrymq: STATUS:" prefix
// (the client puts it back once, from the frame's status). Like Reply, it
// never blocks.
func (r *Request) ReplyError(err error) {
	text := err.Error()
	var pe *protocol.Error
	if errors.As(err, &pe) {
		text = strings.Replace(text, pe.Error(), pe.Message, 1)
	}
	_ = r.reply(protocol.StatusOf(err), []byte(text))
}

// ReplyStatus answers the request with status and body. Like Reply, it never
// blocks.
func (r *Request) ReplyStatus(status protocol.Status, body []byte) error {
	return r.reply(status, body)
}

// ReplyGuarded is Reply with a guard on the answer's body: the goroutine
// that writes the answer calls g.Check just before it writes the piece of
// output holding the answer's first byte, and g.Sent after its last (see
// Guard). Like Reply, it never blocks.
func (r *Request) ReplyGuarded(body []byte, g Guard) error {
	return r.replyGuarded(protocol.StatusOK, body, g)
}

// ReplyGiven is Reply for a body the handler gives to the connection
// instead of lending it: the connection's writer sends it from where it
// is, without copying it, and calls release (if not nil) once the body was
// handed to the socket; the handler must not touch the body until then.
// A body dropped with a failed connection is left to the garbage collector
// and release is not called. A body under givenMin is copied, as Reply
// does, and release called before ReplyGiven returns; so is one whose
// answer cannot be buffered (an error is returned then). Like Reply, it
// never blocks.
func (r *Request) ReplyGiven(body []byte, release func()) error {
	if len(body) < givenMin || r.IsOneway() {
		err := r.reply(protocol.StatusOK, body)
		if release != nil {
			release()
		}
		return err
	}
	if !r.answered.CompareAndSwap(false, true) {
		return errors.New("transport: request answered twice")
	}
	defer r.release()
	resp := protocol.Frame{Flags: protocol.FlagResponse, Code: r.Code, Status: protocol.StatusOK, Opaque: r.Opaque, Body: body}
	err := r.conn.w.putGiven(&resp, r.reserved, release)
	if err != nil {
		if release != nil {
			release()
		}
		if !errors.Is(err, protocol.ErrFrameTooLarge) {
			return err
		}
		msg := []byte(err.Error())
		resp = protocol.Frame{Flags: protocol.FlagResponse, Code: r.Code, Status: protocol.StatusMessageTooLarge, Opaque: r.Opaque, Body: msg}
		if err = r.conn.w.put(&resp, r.reserved, nil); err != nil {
			if errors.Is(err, protocol.ErrFrameTooLarge) {
				r.conn.w.unreserve(r.reserved)
			}
			return err
		}
	}
	if !r.phase.CompareAndSwap(phaseHandling, phaseReplied) {
		r.conn.w.kick()
	}
	return nil
}

// givenMin is the body size from which ReplyGiven sends a body from where
// it is. A smaller answer is copied: then its handler's worker can write
// it at once (flush, up to maxFlush bytes), where a given body waits for
// the writer goroutine to wake; a slave's fetch answers under HIGH traffic
// are mostly that small, and handing them over cost HIGH 8% of its rate.
const givenMin = maxFlush

func (r *Request) reply(status protocol.Status, body []byte) error {
	return r.replyGuarded(status, body, nil)
}

func (r *Request) replyGuarded(status protocol.Status, body []byte, g Guard) error {
	if r.IsOneway() {
		return nil
	}
	if !r.answered.CompareAndSwap(false, true) {
		return errors.New("transport: request answered twice")
	}
	defer r.release()
	resp := protocol.Frame{Flags: protocol.FlagResponse, Code: r.Code, Status: status, Opaque: r.Opaque, Body: body}
	err := r.conn.w.put(&resp, r.reserved, g)
	if errors.Is(err, protocol.ErrFrameTooLarge) {
		msg := []byte(err.Error())
		resp = protocol.Frame{Flags: protocol.FlagResponse, Code: r.Code, Status: protocol.StatusMessageTooLarge, Opaque: r.Opaque, Body: msg}
		if err = r.conn.w.put(&resp, r.reserved, nil); errors.Is(err, protocol.ErrFrameTooLarge) {
			r.conn.w.unreserve(r.reserved)
		}
	}
	// Buffered first, then handed over: either the handler is still
	// running and its worker will write the answer when it returns, or the
	// writer goroutine is woken here.
	if err == nil && !r.phase.CompareAndSwap(phaseHandling, phaseReplied) {
		r.conn.w.kick()
	}
	return err
}

// finish releases a oneway request once its handler returned, or a request
// dropped unanswered.
func (r *Request) finish() {
	if r.answered.CompareAndSwap(false, true) {
		r.conn.w.unreserve(r.reserved)
		r.release()
	}
}

func (r *Request) release() {
	<-r.conn.sem
	r.conn.s.inflight.Add(-1)
}
