package auth

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/protocol"
)

// GateConfig tunes a Gate. The zero value of a field means its default.
type GateConfig struct {
	// MaxUnauthConns caps the connections open at once that have not
	// authenticated (those in their TLS handshake included), so that
	// strangers cannot take the room that authenticated clients need; one
	// over it is refused (answered BUSY on a plaintext port). A connection
	// leaves this count when it authenticates. Default 256.
	MaxUnauthConns int
	// MaxUnauthFrame bounds what a connection that has not authenticated
	// may declare for one frame: one declaring more is closed, unless its
	// TLS client certificate was verified (a producer's first SEND batch:
	// its frames are read as their bytes arrive). Default 64 KiB.
	MaxUnauthFrame int
	// RequestTimeout bounds how long a connection that has not
	// authenticated may go without a request (the first one within the
	// transport's handshake deadline). Default 5 s.
	RequestTimeout time.Duration
	// AuthTimeout bounds how long a connection may stay unauthenticated
	// after it was accepted, requests or not: a client sends IDENTIFY and
	// AUTH at once; this leaves room for retries, and bounds how long a
	// stranger holds a connection. Default 20 s.
	AuthTimeout time.Duration
}

func (c GateConfig) withDefaults() GateConfig {
	c.MaxUnauthConns = cmp.Or(max(c.MaxUnauthConns, 0), 256)
	c.MaxUnauthFrame = cmp.Or(max(c.MaxUnauthFrame, 0), 64<<10)
	c.RequestTimeout = cmp.Or(max(c.RequestTimeout, 0), 5*time.Second)
	c.AuthTimeout = cmp.Or(max(c.AuthTimeout, 0), 20*time.Second)
	return c
}

// Gate is a server's admission before authentication (it implements
// transport.Gate): a connection that has not authenticated, by AUTH or by
// a TLS client certificate that names a principal (Login, Resolve), may
// make only AUTH and IDENTIFY, which changes nothing; any other request is
// answered NOT_AUTHORIZED "authenticate first" without reaching its
// handler. A connection whose TLS client certificate was verified is let
// through to the handlers, whose Resolve authenticates it if the
// certificate names a principal. Until it authenticates, a connection is
// held to the caps and deadlines of GateConfig.
//
// Each connection's Admission is the gate's state for it; the gate is
// told when it authenticates and when it closes. The gate reads no clock:
// the server gives it the time.
type Gate struct {
	cfg GateConfig
	// unauth is the connections open and not authenticated.
	unauth atomic.Int64
}

// NewGate returns a gate with cfg.
func NewGate(cfg GateConfig) *Gate {
	return &Gate{cfg: cfg.withDefaults()}
}

// Admission is a gate's state for one connection: the same type as
// transport.Admission (an alias of the same interface literal), which
// this package need not import. See transport.Gate for the contract.
type Admission = interface {
	Limits(now time.Time, tls *tls.ConnectionState) (deadline time.Time, maxFrame int)
	Admit(f protocol.Frame, tls *tls.ConnectionState) error
	Trusted()
	Closed()
}

// Unauthenticated returns how many connections are open and have not
// authenticated.
func (g *Gate) Unauthenticated() int64 { return g.unauth.Load() }

// Open admits a connection accepted at now, unless MaxUnauthConns
// connections that have not authenticated are open.
func (g *Gate) Open(_ net.Addr, now time.Time) (Admission, error) {
	if g.unauth.Add(1) > int64(g.cfg.MaxUnauthConns) {
		g.unauth.Add(-1)
		return nil, fmt.Errorf("%d connections that have not authenticated are open, the cap (MaxUnauthConns)", g.cfg.MaxUnauthConns)
	}
	a := &admission{g: g, authBy: now.Add(g.cfg.AuthTimeout)}
	a.counted.Store(true)
	return a, nil
}

// admission is one connection's state at a Gate.
type admission struct {
	g      *Gate
	authBy time.Time // when it must have authenticated
	// counted: it counts in g.unauth (until it authenticates or closes).
	counted atomic.Bool
}

// Limits gives the connection RequestTimeout for its next request, and no
// more than AuthTimeout since it was accepted; its frames are capped at
// MaxUnauthFrame unless its TLS client certificate was verified.
func (a *admission) Limits(now time.Time, st *tls.ConnectionState) (time.Time, int) {
	d := now.Add(a.g.cfg.RequestTimeout)
	if a.authBy.Before(d) {
		d = a.authBy
	}
	if certVerified(st) {
		return d, protocol.MaxFrameSize
	}
	return d, a.g.cfg.MaxUnauthFrame
}

// Admit lets AUTH and IDENTIFY through, and every request of a connection
// whose TLS client certificate was verified (its handler's authorization
// check tells whether it names a principal); anything else is
// "authenticate first".
func (a *admission) Admit(f protocol.Frame, st *tls.ConnectionState) error {
	if f.Code == protocol.CodeAuth || f.Code == protocol.CodeIdentify || certVerified(st) {
		return nil
	}
	return errAuthFirst
}

// Trusted takes the connection out of the count: it authenticated.
func (a *admission) Trusted() { a.release() }

// Closed takes the connection out of the count, if it is still in it.
func (a *admission) Closed() { a.release() }

func (a *admission) release() {
	if a.counted.CompareAndSwap(true, false) {
		a.g.unauth.Add(-1)
	}
}

// certVerified reports whether a TLS handshake verified the peer's client
// certificate (st nil: plaintext).
func certVerified(st *tls.ConnectionState) bool {
	return st != nil && len(st.VerifiedChains) > 0
}
