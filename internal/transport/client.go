package transport

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/protocol"
)

// ClientConfig tunes a Client. The zero value of a field means its default.
type ClientConfig struct {
	// DialTimeout bounds connecting. Default 3 s.
	DialTimeout time.Duration
	// CallTimeout is the deadline of a call whose context has none. Default 10 s.
	CallTimeout time.Duration
	// MaxWriteBuffer is how many bytes of requests may wait to be written
	// (besides the batch being written) before callers wait for room; a
	// caller waits at most until its context is done. Default 4 MiB.
	MaxWriteBuffer int
	// WriteTimeout fails the connection when the server read nothing of
	// what the client had to write for that long (at most 2.25 times that
	// after the last byte it read): every pending call fails with ErrConnLost
	// and the next call dials again. It bounds how long a caller writing a
	// request itself can be held by the socket. Default 10 s.
	WriteTimeout time.Duration
	// TLS, when set, makes the client speak TLS with it: it verifies the
	// server's certificate (for the address's host unless ServerName is
	// set) and presents its own, if it has one. nil is plaintext. The
	// handshake is part of the dial, bounded by DialTimeout; a failed one
	// returns a *HandshakeError naming the likely cause.
	TLS *tls.Config
	// Login, when set, runs first thing on every connection (after the TLS
	// handshake), within DialTimeout: a call waits for it before its own
	// request goes. It makes its requests with call, whose error answers
	// name the code and the address ("transport: AUTH to ADDR: ferrymq:
	// NOT_AUTHORIZED: token not recognised"). An error it returns fails
	// the call (a lost connection with ErrConnLost), and every call on that
	// connection; the next call dials again. auth.TokenLogin presents a
	// token with AUTH.
	Login Login
}

func (c ClientConfig) withDefaults() ClientConfig {
	if c.DialTimeout <= 0 {
		c.DialTimeout = 3 * time.Second
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = 10 * time.Second
	}
	if c.MaxWriteBuffer <= 0 {
		c.MaxWriteBuffer = 4 << 20
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 10 * time.Second
	}
	return c
}

// A Login runs first on each connection a Client dials (ClientConfig.Login):
// it proves who the client is with call, a Call on that connection.
type Login interface {
	Login(ctx context.Context, call func(ctx context.Context, code protocol.Code, body []byte) (protocol.Frame, error)) error
}

// Client is a connection to one address carrying many concurrent calls. It
// dials on first use and again after the connection is lost. It is safe for
// concurrent use.
type Client struct {
	addr   string
	cfg    ClientConfig
	tls    *tls.Config // nil: plaintext
	opaque atomic.Uint32

	mu     sync.Mutex // guards conn and closed; held while dialing
	conn   *clientConn
	closed bool
}

// NewClient returns a client for addr. It does not dial until the first call.
func NewClient(addr string, cfg ClientConfig) *Client {
	return &Client{addr: addr, cfg: cfg.withDefaults(), tls: clientTLS(cfg.TLS, addr)}
}

// Addr is the address the client talks to.
func (c *Client) Addr() string { return c.addr }

type result struct {
	frame protocol.Frame
	err   error
}

// clientConn is one live connection and its pending calls.
type clientConn struct {
	nc   net.Conn // raw, or the TLS connection over it
	raw  net.Conn
	tls  bool
	w    *writer
	done chan struct{} // closed when both goroutines have exited

	mu      sync.Mutex
	pending map[uint32]chan result
	err     error // set once the connection is dead
}

// Call sends a request and waits for its response, until ctx is done or,
// without a deadline, for CallTimeout (the wait for room in the write buffer
// included). A response whose status is not OK returns the frame and a
// *protocol.Error naming the status (its body, the error text, is the
// message). A lost connection returns ErrConnLost; a
// passed deadline returns an error matching both protocol.ErrTimeout and
// context.DeadlineExceeded.
func (c *Client) Call(ctx context.Context, code protocol.Code, body []byte) (protocol.Frame, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.CallTimeout)
		defer cancel()
	}
	cc, err := c.connect(ctx)
	if err != nil {
		return protocol.Frame{}, err
	}
	return c.callOn(ctx, cc, code, body)
}

// callOn is Call on the connection cc.
func (c *Client) callOn(ctx context.Context, cc *clientConn, code protocol.Code, body []byte) (protocol.Frame, error) {
	opaque := c.opaque.Add(1)
	ch := make(chan result, 1)
	if err := cc.register(opaque, ch); err != nil {
		return protocol.Frame{}, err
	}
	req := protocol.Frame{Code: code, Opaque: opaque, Body: body}
	if err := cc.w.enqueue(ctx, &req); err != nil {
		cc.unregister(opaque)
		if ctx.Err() != nil {
			return protocol.Frame{}, c.ctxErr(ctx, code)
		}
		if cerr := cc.failure(); cerr != nil && !errors.Is(cerr, ErrClosed) {
			// The reader saw why the connection died (a TLS alert, say)
			// before this write failed for it: that is the news.
			return protocol.Frame{}, c.wrap(code, cerr)
		}
		return protocol.Frame{}, c.wrap(code, writeErr(err))
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return protocol.Frame{}, c.wrap(code, r.err)
		}
		if r.frame.Status != protocol.StatusOK {
			return r.frame, protocol.ErrorForStatus(r.frame.Status, string(r.frame.Body))
		}
		return r.frame, nil
	case <-ctx.Done():
		cc.unregister(opaque)
		return protocol.Frame{}, c.ctxErr(ctx, code)
	}
}

// ctxErr is the error of a call whose context ended first.
func (c *Client) ctxErr(ctx context.Context, code protocol.Code) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("transport: %v to %s: %w: %w", code, c.addr, protocol.ErrTimeout, ctx.Err())
	}
	return c.wrap(code, ctx.Err())
}

// Send sends a oneway request: it returns once the request is queued for
// writing (waiting for room at most until ctx is done), and no response
// comes back.
func (c *Client) Send(ctx context.Context, code protocol.Code, body []byte) error {
	cc, err := c.connect(ctx)
	if err != nil {
		return err
	}
	req := protocol.Frame{Flags: protocol.FlagOneway, Code: code, Opaque: c.opaque.Add(1), Body: body}
	if err := cc.w.enqueue(ctx, &req); err != nil {
		return c.wrap(code, writeErr(err))
	}
	return nil
}

// writeErr is the error of a request that could not be queued or written:
// a failed write (ErrWriteTimeout included) means the connection is lost.
func writeErr(err error) error {
	if errors.Is(err, ErrConnLost) || errors.Is(err, ErrClosed) || errors.Is(err, protocol.ErrFrameTooLarge) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrConnLost, err)
}

func (c *Client) wrap(code protocol.Code, err error) error {
	return fmt.Errorf("transport: %v to %s: %w", code, c.addr, err)
}

// connect returns the live connection, dialing if there is none.
func (c *Client) connect(ctx context.Context) (*clientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if c.conn != nil {
		return c.conn, nil
	}
	d := net.Dialer{Timeout: c.cfg.DialTimeout}
	nc, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return nil, &dialError{addr: c.addr, err: err}
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	raw := nc
	if c.tls != nil {
		tc := tls.Client(raw, c.tls)
		hctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			_ = raw.Close()
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				err = errHandshakeTimeout
			}
			return nil, clientHandshakeError(c.addr, err)
		}
		nc = tc
	}
	w := newWriter(c.cfg.MaxWriteBuffer, c.cfg.WriteTimeout)
	w.inline = nc
	w.tls = c.tls != nil
	cc := &clientConn{
		nc:      nc,
		raw:     raw,
		tls:     c.tls != nil,
		w:       w,
		done:    make(chan struct{}),
		pending: make(map[uint32]chan result),
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := cc.w.run(nc); err != nil {
			c.fail(cc, err)
		}
	}()
	go func() {
		defer wg.Done()
		c.fail(cc, cc.readLoop(c.addr))
	}()
	go func() {
		wg.Wait()
		close(cc.done)
	}()
	if c.cfg.Login != nil {
		if err := c.login(ctx, cc); err != nil {
			// Not yet c.conn: kill it without the detach, which takes c.mu.
			cc.kill(err)
			return nil, err
		}
	}
	c.conn = cc
	return cc, nil
}

// login runs the client's Login on the new connection cc (within
// DialTimeout). An error answer to its call names the code and address;
// a lost connection stays ErrConnLost as it is.
func (c *Client) login(ctx context.Context, cc *clientConn) error {
	lctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()
	return c.cfg.Login.Login(lctx, func(ctx context.Context, code protocol.Code, body []byte) (protocol.Frame, error) {
		f, err := c.callOn(ctx, cc, code, body)
		var pe *protocol.Error
		if errors.As(err, &pe) && !errors.Is(err, ErrConnLost) {
			err = &LoginError{err: c.wrap(code, err)}
		}
		return f, err
	})
}

// A LoginError is a server's refusal of the client's Login (a token it
// does not know, say): the connection was made but not trusted. Another
// server of the same cluster may answer otherwise (one that has not yet
// applied a new principal, against one that has).
type LoginError struct{ err error }

func (e *LoginError) Error() string { return e.err.Error() }
func (e *LoginError) Unwrap() error { return e.err }

// readLoop delivers responses to their calls until the connection breaks.
func (cc *clientConn) readLoop(addr string) error {
	br := bufio.NewReaderSize(cc.nc, 64<<10)
	for first := true; ; first = false {
		f, err := readFrame(br, protocol.MaxFrameSize, readAtOnce)
		if err != nil {
			if cause := remoteAlertCause(err); first && cc.tls && cause != "" {
				// TLS 1.3: the server refused this client's certificate
				// after the client's side of the handshake was done.
				return &HandshakeError{Addr: addr, Cause: cause, Err: err, Mismatch: true}
			}
			return err
		}
		if !f.IsResponse() {
			return fmt.Errorf("%w: a request (code %v) sent to a client", ErrBadFrame, f.Code)
		}
		cc.mu.Lock()
		ch, ok := cc.pending[f.Opaque]
		delete(cc.pending, f.Opaque)
		cc.mu.Unlock()
		if ok {
			ch <- result{frame: f} // buffered; never blocks
		}
		// A response to a call that already timed out is dropped.
	}
}

// fail kills cc: it closes the socket, stops the writer, fails every pending
// call, and detaches cc from the client so the next call dials again.
func (c *Client) fail(cc *clientConn, cause error) {
	if !cc.kill(cause) {
		return
	}
	c.mu.Lock()
	if c.conn == cc {
		c.conn = nil
	}
	c.mu.Unlock()
}

// kill closes cc's socket, stops its writer and fails its pending calls
// with cause; it reports whether cc was alive.
func (cc *clientConn) kill(cause error) bool {
	cc.mu.Lock()
	if cc.err != nil {
		cc.mu.Unlock()
		return false
	}
	if errors.Is(cause, ErrClosed) {
		cc.err = ErrClosed
	} else if errors.Is(cause, ErrConnLost) {
		cc.err = cause
	} else {
		cc.err = fmt.Errorf("%w: %w", ErrConnLost, cause)
	}
	pending := cc.pending
	cc.pending = nil
	cc.mu.Unlock()

	cc.w.close(cc.err)
	_ = cc.raw.Close() // not the TLS connection's Close, which may wait to say goodbye
	for _, ch := range pending {
		ch <- result{err: cc.err}
	}
	return true
}

func (cc *clientConn) register(opaque uint32, ch chan result) error {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.err != nil {
		return cc.err
	}
	cc.pending[opaque] = ch
	return nil
}

// failure is why the connection died, or nil while it lives.
func (cc *clientConn) failure() error {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.err
}

func (cc *clientConn) unregister(opaque uint32) {
	cc.mu.Lock()
	delete(cc.pending, opaque)
	cc.mu.Unlock()
}

// Close fails every pending call with ErrClosed, closes the connection and
// waits for its goroutines. Calls after Close return ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	cc := c.conn
	c.mu.Unlock()
	if cc != nil {
		c.fail(cc, ErrClosed)
		<-cc.done
	}
	return nil
}

// dialError is a dial that failed: it is ErrConnLost (the call may be tried
// again, elsewhere) and says so without ErrConnLost's own "transport: ",
// which its text begins with already.
type dialError struct {
	addr string
	err  error
}

func (e *dialError) Error() string {
	return "transport: dial " + e.addr + ": " + strings.TrimPrefix(ErrConnLost.Error(), "transport: ") + ": " + e.err.Error()
}

func (e *dialError) Unwrap() []error { return []error{ErrConnLost, e.err} }
