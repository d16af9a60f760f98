package auth

import (
	"crypto/tls"
	"fmt"
	"sync/atomic"

	"github.com/ferrymq/ferrymq/protocol"
)

// Conn is what a server knows of the connection a request came on
// (transport.Request is one): a slot for its Session, its TLS state, and
// the transport's mark that it authenticated.
type Conn interface {
	Peer() any
	SetPeer(any)
	// CompareAndSwapPeer stores v if the slot holds old (nil: nothing),
	// and reports whether it did.
	CompareAndSwapPeer(old, v any) bool
	TLS() *tls.ConnectionState
	Authenticate()
}

// Session is one connection's identity: the hash of the token it
// presented with AUTH, or else the name its verified TLS client
// certificate carries (its Subject CN), which is a registry principal's
// name. The principal is looked up again whenever the server's table
// changes (a revocation takes effect on the connection's next request),
// and only then: the last lookup is kept with the table it was made in.
type Session struct {
	hash TokenHash // zero: known by certificate
	cert string
	last atomic.Pointer[resolved]
}

type resolved struct {
	table *Table
	p     Principal
	err   error
}

// Errors of a connection that is no principal.
var (
	errTokenUnknown = &protocol.Error{Status: protocol.StatusNotAuthorized, Message: "token not recognised"}
	errAuthFirst    = &protocol.Error{Status: protocol.StatusNotAuthorized,
		Message: "authenticate first: send AUTH with a token, or connect with a TLS client certificate"}
)

// principal resolves s in t.
func (s *Session) principal(t *Table) (Principal, error) {
	if r := s.last.Load(); r != nil && r.table == t {
		return r.p, r.err
	}
	r := &resolved{table: t}
	var ok bool
	if s.hash.IsZero() {
		if r.p, ok = t.Lookup(s.cert); !ok {
			r.err = &protocol.Error{Status: protocol.StatusNotAuthorized,
				Message: fmt.Sprintf("the TLS client certificate's name %q is not a principal (ferryctl acl add %s; or present a token)", s.cert, s.cert)}
		}
	} else if r.p, ok = t.AuthenticateHash(s.hash); !ok {
		r.err = errTokenUnknown
	}
	s.last.Store(r)
	return r.p, r.err
}

// Login serves AUTH: token is the request's body. A token t recognises
// becomes the connection's identity (replacing any before it) and the
// connection is authenticated; the answer names the principal. One it does
// not recognise is NOT_AUTHORIZED "token not recognised", and leaves the
// connection as it was.
func Login(c Conn, t *Table, token []byte) (protocol.AuthReply, error) {
	h := HashToken(string(token))
	p, ok := t.AuthenticateHash(h)
	if !ok {
		return protocol.AuthReply{}, errTokenUnknown
	}
	s := &Session{hash: h}
	s.last.Store(&resolved{table: t, p: p})
	c.SetPeer(s)
	c.Authenticate()
	return protocol.AuthReply{Principal: p.Name, Permissions: Strings(p.Permissions)}, nil
}

// Resolve returns the principal of the connection c in the table t: the
// one its AUTH token names, or else the one its verified TLS client
// certificate names. A connection that is neither is NOT_AUTHORIZED
// "authenticate first"; one whose token or certificate name t does not
// know (any more), NOT_AUTHORIZED saying so. A certificate that names a
// principal authenticates the connection (c.Authenticate): the transport
// does not take a verified certificate alone for that. A session stored
// by a concurrent Login is never replaced by the certificate's. While t is
// the table of the connection's last request, Resolve reads no lock and
// allocates nothing.
func Resolve(c Conn, t *Table) (Principal, error) {
	s, _ := c.Peer().(*Session)
	if s == nil {
		st := c.TLS()
		if st == nil || len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
			return Principal{}, errAuthFirst
		}
		s = &Session{cert: st.VerifiedChains[0][0].Subject.CommonName}
		if !c.CompareAndSwapPeer(nil, s) {
			// A Login stored its session meanwhile: it wins.
			if s, _ = c.Peer().(*Session); s == nil {
				return Principal{}, errAuthFirst
			}
		}
	}
	p, err := s.principal(t)
	if err == nil && s.hash.IsZero() {
		c.Authenticate() // cheap once done
	}
	return p, err
}

// Check is Resolve, then Authorize of the request code with target.
func Check(c Conn, t *Table, code protocol.Code, target Target) error {
	p, err := Resolve(c, t)
	if err != nil {
		return err
	}
	return Authorize(p, code, target)
}
