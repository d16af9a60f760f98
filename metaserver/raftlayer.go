package metaserver

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Raft's port trusts no one it has not authenticated, and it authenticates
// metaservers only: what brokers and clients hold (the cluster token, a
// certificate of the cluster's CA) opens nothing on it. With
// Config.RaftSecret (required when authorization or TLS is on), every raft
// connection first passes the raft-secret handshake of raftsecret.go,
// which proves on both ends that the other holds a key derived from the
// metaservers' own secret. With Config.TLSServer and TLSClient as well,
// raft's stream layer speaks mutual TLS and the handshake runs inside it:
// a node accepts a raft connection only once its TLS handshake verified
// the peer's certificate against TLSServer.ClientCAs and the peer proved
// the secret, and dials its peers with TLSClient, presenting its own
// certificate (the CA also signs brokers' and clients' certificates, so
// the certificate alone proves nothing of a metaserver). Neither:
// plaintext raft, as hashicorp's TCP transport (the port must then be
// firewalled).
//
// A stranger (no certificate, one from another CA, an expired one,
// plaintext, a wrong or no secret) never reaches raft's decoder: its
// connection is closed after a failed handshake, within
// raftFirstBytesTimeout if it sends nothing and raftHandshakeTimeout in
// all, and at most raftMaxHandshakes handshakes run at once (a connection
// over it evicts the oldest), so strangers on the raft port hold little
// memory and time, and cannot keep a member's new connection out by
// holding sockets open. handshakeListener does this for both kinds of
// handshake.

const (
	// raftHandshakeTimeout bounds a raft connection's handshakes (TLS and
	// the raft secret's together).
	raftHandshakeTimeout = 5 * time.Second
	// raftFirstBytesTimeout bounds the wait for the peer's first bytes (its
	// TLS ClientHello, or its answer to the raft secret's challenge): a
	// member sends them within a round trip.
	raftFirstBytesTimeout = 500 * time.Millisecond
	// raftMaxHandshakes caps the raft handshakes in progress at once; one
	// accepted over it evicts the oldest.
	raftMaxHandshakes = 64
)

// dialFunc connects to a raft peer and runs the dialer's side of the
// layer's handshakes within timeout.
type dialFunc func(addr string, timeout time.Duration) (net.Conn, error)

// handshakeFunc runs the listener's side of a connection's handshakes on
// raw (whose deadline the listener has set) and returns the connection to
// hand to raft, or an error saying why the peer gets nothing.
type handshakeFunc func(raw net.Conn) (net.Conn, error)

// newRaftStream binds raft's stream layer on cfg.RaftAddr: over TLS when
// the config has TLS, behind the raft-secret handshake when it has a raft
// secret, plaintext with neither (Validate allows that only with TLS and
// authorization off).
func newRaftStream(cfg Config, log hclog.Logger) (*streamLayer, error) {
	if cfg.TLSServer == nil && cfg.RaftSecret == "" {
		return newStreamLayer(cfg.RaftAddr)
	}
	var serve handshakeFunc
	dial := plainDial
	what := "tls"
	if cfg.TLSServer != nil {
		serve, dial = tlsServe(raftServerTLS(cfg.TLSServer)), tlsDialer(cfg.TLSClient)
	}
	if cfg.RaftSecret != "" {
		keys := raftKeys{raftSecretKey(cfg.RaftSecret)}
		var oldKey func(string)
		switch {
		case cfg.raftClusterKeyOnly:
			keys = raftKeys{clusterTokenKey(cfg.ClusterToken)}
		case cfg.RaftAcceptClusterKey:
			keys = append(keys, clusterTokenKey(cfg.ClusterToken))
			oldKey = oldKeyWarner(log)
			log.Warn("raft: also accepting peers by the cluster token's key (-raft-accept-cluster-key): a broker's token opens this node's raft port until every metaserver has -raft-secret-file and this flag is gone")
		}
		serve, dial = secretServe(serve, keys, cfg.ID, oldKey), secretDialer(dial, keys)
		what = "raft-secret"
		if cfg.TLSServer != nil {
			what = "tls and raft-secret"
		}
	}
	timeout, max := cfg.raftHandshakeTimeout, cfg.raftMaxHandshakes
	if timeout == 0 {
		timeout = raftHandshakeTimeout
	}
	if max == 0 {
		max = raftMaxHandshakes
	}
	ln, err := net.Listen("tcp", cfg.RaftAddr)
	if err != nil {
		return nil, err
	}
	hl := newHandshakeListener(ln, what, serve, timeout, raftFirstBytesTimeout, max, log)
	return &streamLayer{ln: hl, conns: map[*trackedConn]struct{}{}, dial: dial}, nil
}

// oldKeyWarner logs, at most once a minute, a peer that proved the
// cluster token's key rather than the raft secret's: a metaserver not yet
// moved to -raft-secret-file (or anyone holding the cluster token).
func oldKeyWarner(log hclog.Logger) func(remote string) {
	var last atomic.Int64
	return func(remote string) {
		now := time.Now().UnixNano()
		if prev := last.Load(); now-prev < int64(time.Minute) || !last.CompareAndSwap(prev, now) {
			return
		}
		log.Warn("raft: a peer proved the cluster token's key, not the raft secret's (-raft-accept-cluster-key is on)", "remote", remote)
	}
}

func plainDial(addr string, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", addr, timeout)
}

// tlsServe is the listener's TLS handshake with cfg.
func tlsServe(cfg *tls.Config) handshakeFunc {
	return func(raw net.Conn) (net.Conn, error) {
		tc := tls.Server(raw, cfg)
		if err := tc.Handshake(); err != nil {
			return nil, err
		}
		return &tlsConn{Conn: tc, raw: raw}, nil
	}
}

// raftServerTLS is the raft listener's copy of cfg: peers must present a
// certificate signed by its ClientCAs (Validate requires them).
func raftServerTLS(cfg *tls.Config) *tls.Config {
	c := cfg.Clone()
	c.ClientAuth = tls.RequireAndVerifyClientCert
	if c.MinVersion < tls.VersionTLS12 {
		c.MinVersion = tls.VersionTLS12
	}
	return c
}

// tlsDialer dials a raft peer over TLS with cfg (the peer's certificate is
// verified for the host of its raft address unless cfg names a server).
func tlsDialer(cfg *tls.Config) dialFunc {
	return func(addr string, timeout time.Duration) (net.Conn, error) {
		c := cfg.Clone()
		if c.ServerName == "" {
			if host, _, err := net.SplitHostPort(addr); err == nil {
				c.ServerName = host
			}
		}
		if c.MinVersion < tls.VersionTLS12 {
			c.MinVersion = tls.VersionTLS12
		}
		raw, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return nil, err
		}
		tc := tls.Client(raw, c)
		_ = raw.SetDeadline(time.Now().Add(timeout))
		if err := tc.Handshake(); err != nil {
			_ = raw.Close()
			return nil, fmt.Errorf("metaserver: raft tls handshake with %s: %w", addr, err)
		}
		_ = raw.SetDeadline(time.Time{})
		return &tlsConn{Conn: tc, raw: raw}, nil
	}
}

// tlsConn is a TLS connection whose Close closes the socket at once
// (tls.Conn's Close first sends an alert, which may wait on the peer).
type tlsConn struct {
	*tls.Conn
	raw net.Conn
}

func (c *tlsConn) Close() error { return c.raw.Close() }

// handshakeListener accepts TCP connections and hands out only those whose
// handshake (TLS, the raft secret's, or both: a handshakeFunc) completed
// within timeout, the peer's first bytes within firstBytes of the accept.
// Handshakes run on their own goroutines, at most max at once: a
// connection accepted with max in their handshake evicts (closes) the
// oldest of them. Members finish theirs in milliseconds, so the oldest is
// a stranger's idle socket, and a stranger cannot hold the slots against a
// member's new dial (an election, a restarted node) by holding sockets
// open: it would have to dial max connections within a member's handshake.
type handshakeListener struct {
	ln         net.Listener
	what       string // the handshake, for the log
	handshake  handshakeFunc
	timeout    time.Duration
	firstBytes time.Duration
	max        int
	log        hclog.Logger

	ready chan net.Conn
	done  chan struct{}
	wg    sync.WaitGroup

	mu      sync.Mutex
	pending map[net.Conn]uint64 // sockets in their handshake, by order of accept
	seq     uint64
	closed  bool

	evicted, failed atomic.Int64 // evicted for a newer one; failed handshakes (timeouts included)
	peak            atomic.Int64 // the most handshakes in progress at once
	lastWarn        atomic.Int64 // unix nanos of the last failure logged
}

func newHandshakeListener(ln net.Listener, what string, handshake handshakeFunc, timeout, firstBytes time.Duration, max int, log hclog.Logger) *handshakeListener {
	l := &handshakeListener{ln: ln, what: what, handshake: handshake, timeout: timeout, firstBytes: min(firstBytes, timeout), max: max, log: log,
		ready: make(chan net.Conn), done: make(chan struct{}), pending: map[net.Conn]uint64{}}
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

func (l *handshakeListener) acceptLoop() {
	defer l.wg.Done()
	for {
		raw, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			l.log.Error("raft listener: accept failed", "error", err)
			return
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = raw.Close()
			continue
		}
		var victim net.Conn
		if len(l.pending) >= l.max {
			victim = l.oldestLocked()
			delete(l.pending, victim)
		}
		l.seq++
		l.pending[raw] = l.seq
		if n := int64(len(l.pending)); n > l.peak.Load() {
			l.peak.Store(n)
		}
		l.wg.Add(1)
		l.mu.Unlock()
		if victim != nil {
			// Its goroutine finds it gone from pending and counts nothing.
			_ = victim.Close()
			l.evicted.Add(1)
			l.warn("raft port: too many handshakes in progress: closing the oldest", "remote", victim.RemoteAddr().String(), "max", l.max)
		}
		go l.serve(raw)
	}
}

// oldestLocked is the socket longest in its handshake (l.mu held, pending
// not empty). A scan: pending holds at most max.
func (l *handshakeListener) oldestLocked() net.Conn {
	var oldest net.Conn
	var at uint64
	for c, seq := range l.pending {
		if oldest == nil || seq < at {
			oldest, at = c, seq
		}
	}
	return oldest
}

func (l *handshakeListener) serve(raw net.Conn) {
	defer l.wg.Done()
	start := time.Now()
	_ = raw.SetDeadline(start.Add(l.timeout))
	_ = raw.SetReadDeadline(start.Add(l.firstBytes))
	c, err := l.handshake(&firstBytesConn{Conn: raw, deadline: start.Add(l.timeout)})
	l.mu.Lock()
	_, mine := l.pending[raw] // not: evicted, or the listener closed
	delete(l.pending, raw)
	l.mu.Unlock()
	if err != nil || !mine {
		_ = raw.Close()
		if err != nil && mine {
			l.failed.Add(1)
			l.warn("raft port: "+l.what+" handshake failed; the peer gets nothing", "remote", raw.RemoteAddr().String(), "error", err)
		}
		return
	}
	_ = raw.SetDeadline(time.Time{})
	select {
	case l.ready <- c:
	case <-l.done:
		_ = raw.Close()
	}
}

// firstBytesConn is a socket in its handshake whose read deadline, short
// until the peer's first bytes (a TLS ClientHello, the raft secret's
// answer), becomes the handshake's once they arrive. Reads of one
// connection do not run at once (TLS serializes them; raft reads from one
// goroutine).
type firstBytesConn struct {
	net.Conn
	deadline time.Time // the whole handshake's
	got      bool
}

func (c *firstBytesConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.got {
		c.got = true
		_ = c.Conn.SetReadDeadline(c.deadline)
	}
	return n, err
}

// warn logs at most one failure per logEvery (a flood of strangers does
// not flood the log; the counters count them all).
func (l *handshakeListener) warn(msg string, args ...any) {
	const logEvery = int64(10 * time.Second)
	now := time.Now().UnixNano()
	last := l.lastWarn.Load()
	if now-last < logEvery || !l.lastWarn.CompareAndSwap(last, now) {
		return
	}
	l.log.Warn(msg, args...)
}

// Accept returns the next connection whose handshake completed.
func (l *handshakeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting, closes the connections in their handshake and
// waits for its goroutines.
func (l *handshakeListener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	for raw := range l.pending {
		_ = raw.Close()
	}
	clear(l.pending) // their goroutines count no failure
	l.mu.Unlock()
	err := l.ln.Close()
	l.wg.Wait()
	return err
}

func (l *handshakeListener) Addr() net.Addr { return l.ln.Addr() }
