package transport

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/protocol"
)

// ErrTLSMismatch marks a HandshakeError whose cause is the two ends' TLS
// settings, known from the handshake itself: a certificate the other end
// does not trust (a wrong CA, an expired certificate, a name it does not
// have), no client certificate where one is required, or TLS against a
// plaintext port. Trying again gives the same answer until a setting
// changes: callers that retry lost connections should stop at it.
var ErrTLSMismatch = errors.New("transport: TLS settings do not match the server's")

// HandshakeError is a failed TLS handshake with a server, or a server's
// refusal of this client's certificate that arrived with the first answer
// (TLS 1.3 checks a client's certificate after the client's side of the
// handshake is done). It matches ErrConnLost, like a failed dial, and, when
// Mismatch, ErrTLSMismatch: a caller that retries lost connections asks
// errors.Is(err, ErrTLSMismatch) first.
type HandshakeError struct {
	Addr  string // the server's address
	Cause string // the likely cause in words, "" when none is known
	Err   error  // what crypto/tls or the socket said
	// Mismatch: the cause is the TLS settings (ErrTLSMismatch), not a
	// closed or silent connection, which may be passing.
	Mismatch bool
}

func (e *HandshakeError) Error() string {
	if e.Cause == "" {
		return fmt.Sprintf("transport: tls handshake with %s: %v", e.Addr, e.Err)
	}
	return fmt.Sprintf("transport: tls handshake with %s: %s: %v", e.Addr, e.Cause, e.Err)
}

// Unwrap makes the error match ErrConnLost, ErrTLSMismatch when Mismatch,
// and whatever Err matches.
func (e *HandshakeError) Unwrap() []error {
	if e.Mismatch {
		return []error{ErrConnLost, ErrTLSMismatch, e.Err}
	}
	return []error{ErrConnLost, e.Err}
}

// clientHandshakeError is the HandshakeError of a client's failed handshake
// with addr.
func clientHandshakeError(addr string, err error) *HandshakeError {
	return &HandshakeError{Addr: addr, Cause: clientTLSCause(err), Err: err, Mismatch: tlsMismatch(err)}
}

// tlsMismatch reports whether a client's failed handshake failed for the
// two ends' TLS settings: the certificates were judged (by either end), or
// the server answered in something that is not TLS.
func tlsMismatch(err error) bool {
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(err, new(x509.UnknownAuthorityError)), errors.As(err, &invalid), errors.As(err, new(x509.HostnameError)),
		errors.As(err, new(tls.RecordHeaderError)), errors.As(err, new(*tls.CertificateVerificationError)):
		return true
	}
	return remoteAlertCause(err) != ""
}

// clientTLSCause names the likely cause of a client's failed handshake.
func clientTLSCause(err error) string {
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(err, new(x509.UnknownAuthorityError)):
		return "the server's certificate is not signed by a CA this client trusts (wrong CA, -tls-ca?)"
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return "the server's certificate has expired or is not yet valid"
	case errors.As(err, new(x509.HostnameError)):
		return "the server's certificate does not name the address dialed (its IP and DNS names)"
	case errors.As(err, new(tls.RecordHeaderError)):
		return "the server did not answer in TLS: the server is not TLS on this port"
	}
	if cause := remoteAlertCause(err); cause != "" {
		return cause
	}
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		return "the server closed the connection during the handshake (the server is not TLS on this port, or it refused this client)"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, errHandshakeTimeout):
		return "no answer to the handshake in time (the server is not TLS on this port?)"
	}
	return ""
}

var errHandshakeTimeout = errors.New("handshake timed out")

// remoteAlertCause names the cause of an alert a server sent about this
// client's certificate. crypto/tls keeps its alert type unexported; its
// text is stable ("remote error: tls: ...").
func remoteAlertCause(err error) string {
	msg := err.Error()
	if !strings.Contains(msg, "remote error: tls: ") {
		return ""
	}
	switch {
	case strings.Contains(msg, "unknown certificate authority"):
		return "the server does not trust this client's certificate (signed by another CA: wrong -tls-cert, or the server's -tls-ca?)"
	case strings.Contains(msg, "expired certificate"):
		return "the server refused this client's certificate as expired or not yet valid"
	case strings.Contains(msg, "certificate required"):
		return "the server requires a client certificate (-tls-cert and -tls-key)"
	case strings.Contains(msg, "bad certificate"):
		return "the server refused this client's certificate"
	}
	return ""
}

// serverTLSCause names the likely cause of a failed handshake on a server.
func serverTLSCause(err error) string {
	var invalid x509.CertificateInvalidError
	msg := err.Error()
	switch {
	case errors.As(err, new(x509.UnknownAuthorityError)):
		return "its certificate is not signed by this server's CA (-tls-ca)"
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return "its certificate has expired or is not yet valid"
	case strings.Contains(msg, "didn't provide a certificate"):
		return "it presented no certificate, and this server requires one"
	case strings.Contains(msg, "remote error: tls: unknown certificate authority"),
		strings.Contains(msg, "remote error: tls: bad certificate"):
		return "it does not trust this server's certificate (its CA is another one?)"
	case strings.Contains(msg, "remote error: tls: expired certificate"):
		return "it refused this server's certificate as expired or not yet valid"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		return "it closed the connection during the handshake (it may not trust this server's certificate)"
	}
	return "the handshake failed"
}

// tlsRecordHandshake is the first byte of a TLS client's first record.
const tlsRecordHandshake = 0x16

// looksLikeTLS reports whether the first bytes a plaintext server read are
// a TLS record header (a handshake record of version 3.x) rather than a
// frame's length: such a length would be over 350 MiB, never a frame.
func looksLikeTLS(b []byte) bool {
	return len(b) >= 3 && b[0] == tlsRecordHandshake && b[1] == 3 && b[2] <= 4
}

// prefixConn is a connection whose first bytes were already read.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// serverTLS is the server's copy of cfg: client certificates are required
// when it has ClientCAs, and nothing older than TLS 1.2 is accepted.
func serverTLS(cfg *tls.Config) *tls.Config {
	if cfg == nil {
		return nil
	}
	c := cfg.Clone()
	if c.ClientCAs != nil {
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	if c.MinVersion < tls.VersionTLS12 {
		c.MinVersion = tls.VersionTLS12
	}
	return c
}

// clientTLS is a client's copy of cfg for addr: the server name to verify
// defaults to addr's host, and nothing older than TLS 1.2 is accepted.
func clientTLS(cfg *tls.Config, addr string) *tls.Config {
	if cfg == nil {
		return nil
	}
	c := cfg.Clone()
	if c.ServerName == "" {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			c.ServerName = host
		}
	}
	if c.MinVersion < tls.VersionTLS12 {
		c.MinVersion = tls.VersionTLS12
	}
	return c
}

// logEvery is how often a Server logs one kind of refused connection: at
// most one line per kind in that time, the next one counting those not
// logged, so a flood of strangers does not flood the log.
const logEvery = 10 * time.Second

// limitedLog logs warnings at most once per kind per logEvery.
type limitedLog struct {
	log hclog.Logger

	mu   sync.Mutex
	last map[string]time.Time
	skip map[string]int
}

func (l *limitedLog) warn(kind, msg string, args ...any) {
	l.mu.Lock()
	now := time.Now()
	if t, ok := l.last[kind]; ok && now.Sub(t) < logEvery {
		l.skip[kind]++
		l.mu.Unlock()
		return
	}
	if l.last == nil {
		l.last, l.skip = map[string]time.Time{}, map[string]int{}
	}
	l.last[kind] = now
	skipped := l.skip[kind]
	l.skip[kind] = 0
	l.mu.Unlock()
	if skipped > 0 {
		args = append(args, "not_logged_since_last", skipped)
	}
	l.log.Warn(msg, args...)
}

// open runs a new connection's first steps under the handshake deadline:
// the TLS handshake (or, on a TLS port, the refusal of a plaintext peer;
// on a plaintext port, of a TLS one), then the reading of its first frame.
// It returns that frame, or false once it has closed the connection.
func (c *serverConn) open() (protocol.Frame, bool) {
	s := c.s
	raw := c.raw
	handshakeDeadline := time.Now().Add(s.cfg.HandshakeTimeout)
	_ = raw.SetDeadline(handshakeDeadline)
	var conn net.Conn = raw
	// A plaintext connection's first frame is read through a small buffer
	// (the main loop's is larger), so that what the peer sent with it is
	// read too, and a bad peer's connection closes cleanly rather than with
	// a reset for unread bytes.
	var r io.Reader = conn
	var br *bufio.Reader
	if s.tls == nil {
		br = bufio.NewReaderSize(raw, 4<<10)
		r = br
	} else {
		var first [1]byte
		if _, err := io.ReadFull(raw, first[:]); err != nil {
			c.openFailed(err, false)
			return protocol.Frame{}, false
		}
		if first[0] != tlsRecordHandshake {
			c.plaintextOnTLS(first[0])
			return protocol.Frame{}, false
		}
		tc := tls.Server(&prefixConn{Conn: raw, prefix: first[:]}, s.tls)
		if err := tc.Handshake(); err != nil {
			c.openFailed(err, true)
			return protocol.Frame{}, false
		}
		st := tc.ConnectionState()
		c.tlsState = &st
		if len(st.VerifiedChains) > 0 && c.adm == nil {
			// With a Gate the authorization layer decides, once it knows
			// whether the certificate names a principal.
			c.trusted.Store(true)
		}
		conn, r = tc, tc
	}
	gateCap := 0
	if c.adm != nil {
		d, maxFrame := c.adm.Limits(time.Now(), c.tlsState)
		if !d.IsZero() && d.Before(handshakeDeadline) {
			_ = raw.SetDeadline(d)
		}
		gateCap = frameCapOf(maxFrame)
	}
	var lenBuf [4]byte
	if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
		c.openFailed(err, false)
		return protocol.Frame{}, false
	}
	if s.tls == nil && looksLikeTLS(lenBuf[:]) {
		c.tlsOnPlaintext(br, lenBuf)
		return protocol.Frame{}, false
	}
	limit, g := c.frameCap(gateCap)
	f, err := readFrameAfter(r, lenBuf, limit, g)
	if err != nil {
		c.openFailed(err, false)
		return protocol.Frame{}, false
	}
	if f.IsResponse() {
		c.openFailed(fmt.Errorf("%w: a response (opaque %d) sent to a server", ErrBadFrame, f.Opaque), false)
		return protocol.Frame{}, false
	}
	// Past the handshake: no deadline any more (an untrusted connection
	// gets its Gate's before each frame, see untrustedLimits). Close may have set its
	// own (to stop this reader) before this cleared it; it closed stop
	// before, so the check below sees it.
	_ = raw.SetDeadline(time.Time{})
	select {
	case <-s.stop:
		c.abort()
		return protocol.Frame{}, false
	default:
	}
	if br != nil && br.Buffered() > 0 {
		rest, _ := br.Peek(br.Buffered())
		conn = &prefixConn{Conn: raw, prefix: bytes.Clone(rest)}
	}
	c.nc = conn
	return f, true
}

// openFailed closes a connection that failed before its first request,
// saying why when it is worth saying; inHandshake: in the TLS handshake.
func (c *serverConn) openFailed(err error, inHandshake bool) {
	s := c.s
	var ne net.Error
	if inHandshake && !(errors.As(err, &ne) && ne.Timeout()) && !c.dropped.Load() {
		c.linger() // the peer reads the alert that says why
	}
	c.abort()
	select {
	case <-s.stop:
		return // closing: not the peer's doing
	default:
	}
	if c.dropped.Load() {
		return // its gate dropped it
	}
	remote := c.raw.RemoteAddr().String()
	switch {
	case errors.Is(err, errUntrustedFrame):
		s.stats.oversize.Add(1)
		s.limited.warn("oversize", fmt.Sprintf("closing connection from %s: it declared a frame larger than its gate lets a connection send before it is trusted", remote),
			"remote", remote, "error", err)
	case errors.As(err, &ne) && ne.Timeout():
		s.stats.handshakeTimeouts.Add(1)
		s.limited.warn("timeout", fmt.Sprintf("closing connection from %s: no handshake and first request within %v", remote, s.cfg.HandshakeTimeout),
			"remote", remote, "handshake_timeout", s.cfg.HandshakeTimeout)
	case errors.Is(err, ErrBadFrame):
		s.limited.warn("badframe", "closing connection after a bad frame", "remote", remote, "error", err)
	case inHandshake:
		s.stats.handshakeFailures.Add(1)
		s.limited.warn("handshake", fmt.Sprintf("tls handshake with client %s failed: %s", remote, serverTLSCause(err)),
			"remote", remote, "error", err)
	case errors.Is(err, io.EOF):
		// A peer that connected and left (a port check): nothing to say.
	default:
		s.log.Debug("connection failed before its first request", "remote", remote, "error", err)
	}
}

// linger ends the server's side of a connection it refuses and reads
// (and drops) what the peer still sends, until it closes its side or the
// handshake deadline passes: closing with unread bytes would reset the
// connection, and the peer could lose the answer or alert that says why.
func (c *serverConn) linger() {
	if hc, ok := c.raw.(interface{ CloseWrite() error }); ok {
		_ = hc.CloseWrite()
	}
	_, _ = io.CopyN(io.Discard, c.raw, 64<<10)
}

// abort closes a connection that never got past open.
func (c *serverConn) abort() {
	_ = c.raw.Close()
	c.w.close(ErrConnLost)
	c.s.forget(c)
}

// plaintextOnTLS refuses a peer that spoke plaintext to a TLS port: if what
// it sent is a request (a ferrymq client without TLS), it is answered
// NOT_AUTHORIZED with a message that says so; then the connection is closed.
func (c *serverConn) plaintextOnTLS(first byte) {
	s := c.s
	remote := c.raw.RemoteAddr().String()
	s.stats.handshakeFailures.Add(1)
	s.limited.warn("plaintext", fmt.Sprintf("client %s spoke plaintext to a TLS port", remote), "remote", remote)
	defer c.abort()
	br := bufio.NewReaderSize(c.raw, 4<<10) // reads what came with it too (see open)
	lenBuf := [4]byte{first}
	if _, err := io.ReadFull(br, lenBuf[1:]); err != nil {
		return
	}
	f, err := readFrameAfter(br, lenBuf, refusalMaxFrame, growBig)
	if err != nil || f.IsResponse() || f.IsOneway() {
		return
	}
	msg := fmt.Sprintf("%s requires TLS: this client connected without it (give it the cluster's CA, -tls-ca)", c.raw.LocalAddr())
	resp := protocol.Frame{Flags: protocol.FlagResponse, Code: f.Code, Status: protocol.StatusNotAuthorized, Opaque: f.Opaque, Body: []byte(msg)}
	if b, err := protocol.AppendFrame(nil, &resp); err == nil {
		if _, err := c.raw.Write(b); err == nil {
			c.linger()
		}
	}
}

// maxTLSRecord bounds the TLS record a plaintext server reads (and drops)
// before answering a TLS client: 16 KiB of data plus the most a record may
// add.
const maxTLSRecord = 16<<10 + 2048

// tlsOnPlaintext refuses a peer that started a TLS handshake on a plaintext
// port: it reads the client's first record, then answers with a plaintext
// frame, which the client's TLS takes for what it is (a record that is not
// TLS: "the server is not TLS"), and closes.
func (c *serverConn) tlsOnPlaintext(br *bufio.Reader, lenBuf [4]byte) {
	s := c.s
	remote := c.raw.RemoteAddr().String()
	s.stats.handshakeFailures.Add(1)
	s.limited.warn("tls", fmt.Sprintf("client %s spoke TLS to a plaintext port", remote), "remote", remote)
	defer c.abort()
	var last [1]byte
	if _, err := io.ReadFull(br, last[:]); err != nil {
		return
	}
	if n := int(lenBuf[3])<<8 | int(last[0]); n <= maxTLSRecord {
		if _, err := io.CopyN(io.Discard, br, int64(n)); err != nil {
			return
		}
	}
	msg := fmt.Sprintf("%s does not speak TLS", c.raw.LocalAddr())
	resp := protocol.Frame{Flags: protocol.FlagResponse, Status: protocol.StatusNotAuthorized, Body: []byte(msg)}
	if b, err := protocol.AppendFrame(nil, &resp); err == nil {
		if _, err := c.raw.Write(b); err == nil {
			c.linger()
		}
	}
}
