package auth

import (
	"cmp"
	"container/list"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/protocol"
)

// GateConfig tunes a Gate. The zero value of a field means its default.
type GateConfig struct {
	// MaxUnauthConns caps the connections open at once that have not
	// authenticated (those in their TLS handshake included), so that
	// strangers cannot take the room that authenticated clients need. At
	// the cap, a new connection evicts the oldest of them (it is closed).
	// A connection leaves this count when it authenticates. Default 256.
	MaxUnauthConns int
	// MaxUnauthPerSource caps those of them from one source (an IPv4
	// address, an IPv6 /64), so that one host cannot take them all: one
	// more from it is refused (answered BUSY on a plaintext port). It also
	// caps the failed AUTHs of one source whose answers are held back
	// (see FailureDelay). Default max(4, MaxUnauthConns/8), at most
	// MaxUnauthConns.
	MaxUnauthPerSource int
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

	// MaxAuthFailures closes a connection once this many of its AUTHs
	// failed (its last answer says so). Default 5.
	MaxAuthFailures int
	// FailureDelay holds back the answer to a failed AUTH, doubled for
	// each failure before it of the same connection or source (within
	// FailureMemory), up to MaxFailureDelay. Until then the connection's
	// next AUTHs are not checked: they fail too. Defaults 250 ms and 2 s
	// (under a client's default DialTimeout of 3 s, within which its
	// login must be answered, so a client with a wrong token is told so).
	FailureDelay, MaxFailureDelay time.Duration
	// FailureMemory is how long a source's failures count after its last
	// one. Default 1 minute.
	FailureMemory time.Duration
	// WarnInterval: failed AUTHs are logged at most once per source per
	// interval, with their count. Default 1 minute.
	WarnInterval time.Duration
	// Clock times the held-back answers. Default the real clock.
	Clock clockwork.Clock
	// Logger receives the WARN of failed AUTHs. Default: a null logger.
	Logger hclog.Logger
}

func (c GateConfig) withDefaults() GateConfig {
	c.MaxUnauthConns = cmp.Or(max(c.MaxUnauthConns, 0), 256)
	c.MaxUnauthPerSource = min(cmp.Or(max(c.MaxUnauthPerSource, 0), max(4, c.MaxUnauthConns/8)), c.MaxUnauthConns)
	c.MaxUnauthFrame = cmp.Or(max(c.MaxUnauthFrame, 0), 64<<10)
	c.RequestTimeout = cmp.Or(max(c.RequestTimeout, 0), 5*time.Second)
	c.AuthTimeout = cmp.Or(max(c.AuthTimeout, 0), 20*time.Second)
	c.MaxAuthFailures = cmp.Or(max(c.MaxAuthFailures, 0), 5)
	c.FailureDelay = cmp.Or(max(c.FailureDelay, 0), 250*time.Millisecond)
	c.MaxFailureDelay = max(cmp.Or(max(c.MaxFailureDelay, 0), 2*time.Second), c.FailureDelay)
	c.FailureMemory = cmp.Or(max(c.FailureMemory, 0), time.Minute)
	c.WarnInterval = cmp.Or(max(c.WarnInterval, 0), time.Minute)
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
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
// Admission is fair: one source holds at most MaxUnauthPerSource of the
// MaxUnauthConns slots, and at the cap a new connection evicts the oldest
// that has not authenticated, so a host that floods the port cannot keep
// others' new clients out. AUTH failures cost the guesser: AUTH served
// with BeginLogin and AnswerLogin answers a wrong token late (FailureDelay,
// growing per connection and per source), checks no token of a connection
// waiting for such an answer, closes a connection after MaxAuthFailures,
// counts every failure (AuthFailures) and warns once per source per
// WarnInterval.
//
// Each connection's Admission is the gate's state for it; the gate is
// told when it authenticates and when it closes. The gate reads no clock
// for admission (the server gives it the time); its held-back answers are
// timed by GateConfig.Clock.
type Gate struct {
	cfg GateConfig
	// unauth is the connections open and not authenticated (silent's
	// length, readable without the lock).
	unauth            atomic.Int64
	failures, evicted atomic.Int64

	mu sync.Mutex
	// silent holds the connections that have not authenticated, oldest
	// first; perSource counts them by source.
	silent    list.List
	perSource map[string]int
	// sources are the sources with recent failed AUTHs.
	sources map[string]*source
}

// source is what a Gate remembers of the failed AUTHs of one source.
type source struct {
	failures int       // within FailureMemory of the last
	last     time.Time // the last failure
	held     int       // failures whose answers are held back
	warned   time.Time // the last WARN
	unwarned int       // failures since then
}

// maxSources bounds the sources a Gate remembers failures of; past it,
// those it forgot share one record.
const maxSources = 10000

// NewGate returns a gate with cfg.
func NewGate(cfg GateConfig) *Gate {
	return &Gate{cfg: cfg.withDefaults(), perSource: map[string]int{}, sources: map[string]*source{}}
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

// AuthFailures returns how many AUTHs failed (answered NOT_AUTHORIZED
// after their backoff), since the gate was made.
func (g *Gate) AuthFailures() int64 { return g.failures.Load() }

// Evicted returns how many connections that had not authenticated were
// closed to make room for a new one.
func (g *Gate) Evicted() int64 { return g.evicted.Load() }

// Why connections are closed.
var (
	errEvicted = errors.New("evicted: the most connections that have not authenticated were open, and it was the oldest of them")
	// ErrRevoked is why a server closes the connections of a principal
	// that was removed or whose token was replaced (Revoked).
	ErrRevoked         = errors.New("its principal was removed or its token replaced")
	errTooManyFailures = errors.New("too many of its AUTHs failed")
)

// Open admits a connection from remote accepted at now, unless
// MaxUnauthPerSource connections from its source that have not
// authenticated are open. At MaxUnauthConns it evicts the oldest such
// connection with its drop.
func (g *Gate) Open(remote net.Addr, now time.Time, drop func(why error)) (Admission, error) {
	key := sourceOf(remote)
	if drop == nil {
		drop = func(error) {}
	}
	g.mu.Lock()
	if n := g.perSource[key]; n >= g.cfg.MaxUnauthPerSource {
		g.mu.Unlock()
		return nil, fmt.Errorf("%d connections from %s that have not authenticated are open, its share (MaxUnauthPerSource) of the %d (MaxUnauthConns)",
			n, key, g.cfg.MaxUnauthConns)
	}
	var evict *admission
	if g.silent.Len() >= g.cfg.MaxUnauthConns {
		evict = g.silent.Front().Value.(*admission)
		g.releaseLocked(evict)
	}
	a := &admission{g: g, key: key, authBy: now.Add(g.cfg.AuthTimeout), drop: drop}
	a.elem = g.silent.PushBack(a)
	g.perSource[key]++
	g.unauth.Add(1)
	g.mu.Unlock()
	if evict != nil {
		g.evicted.Add(1)
		evict.drop(errEvicted)
	}
	return a, nil
}

// releaseLocked takes a out of the connections that have not
// authenticated, if it is among them.
func (g *Gate) releaseLocked(a *admission) {
	if a.elem == nil {
		return
	}
	g.silent.Remove(a.elem)
	a.elem = nil
	if g.perSource[a.key]--; g.perSource[a.key] <= 0 {
		delete(g.perSource, a.key)
	}
	g.unauth.Add(-1)
}

// sourceOf is the source a connection from remote counts against: its IPv4
// address, or its IPv6 address's /64 (a host is given a /64).
func sourceOf(remote net.Addr) string {
	var ip net.IP
	switch a := remote.(type) {
	case *net.TCPAddr:
		ip = a.IP
	case nil:
		return ""
	default:
		host, _, err := net.SplitHostPort(a.String())
		if err != nil {
			return a.String()
		}
		if ip = net.ParseIP(host); ip == nil {
			return host
		}
	}
	if v4 := ip.To4(); v4 != nil {
		return v4.String()
	}
	return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// admission is one connection's state at a Gate. Its fields below drop
// are guarded by the gate's mu.
type admission struct {
	g      *Gate
	key    string    // its source
	authBy time.Time // when it must have authenticated
	drop   func(why error)

	elem     *list.Element // in g.silent; nil once it authenticated or closed
	closed   bool
	failures int  // its failed AUTHs
	checking bool // an AUTH's token is being checked
	// answerAt is when the answer to its last failed AUTH is due; held,
	// those not yet given.
	answerAt time.Time
	held     []*heldAnswer
}

// heldAnswer is a failed AUTH's answer, held back until its timer fires.
type heldAnswer struct {
	r     LoginRequest
	err   error
	timer clockwork.Timer
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
func (a *admission) Trusted() {
	a.g.mu.Lock()
	a.g.releaseLocked(a)
	a.g.mu.Unlock()
}

// Closed takes the connection out of the count, if it is still in it, and
// gives the answers held back for it now.
func (a *admission) Closed() {
	g := a.g
	g.mu.Lock()
	g.releaseLocked(a)
	a.closed = true
	held := a.takeHeldLocked()
	g.mu.Unlock()
	for _, h := range held {
		h.r.ReplyError(h.err)
	}
}

// takeHeldLocked stops the timers of the answers held back for a and
// returns them, to be given at once.
func (a *admission) takeHeldLocked() []*heldAnswer {
	held := a.held
	a.held = nil
	for _, h := range held {
		h.timer.Stop()
		a.g.unholdLocked(a.key)
	}
	return held
}

// certVerified reports whether a TLS handshake verified the peer's client
// certificate (st nil: plaintext).
func certVerified(st *tls.ConnectionState) bool {
	return st != nil && len(st.VerifiedChains) > 0
}
