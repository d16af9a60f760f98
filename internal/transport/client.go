package transport

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
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
	// PooledAnswers reads answers of 32 KiB to 8 MiB into recycled
	// buffers, all of them on the reader goroutine (no call reads its own
	// answer). A call made with CallPooled gets its answer's release, and
	// gives the buffer back with it once done with the answer; other calls
	// leave theirs to the garbage collector, as without it. It saves a
	// caller of large answers (a slave's HA fetches) clearing a fresh
	// buffer per answer, and the collector and the scavenger its bytes.
	PooledAnswers bool
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
	frame   protocol.Frame
	buf     []byte // the frame's recycled buffer (PooledAnswers), or nil
	err     error
	givenUp bool // err is a Handle's GiveUp cause
}

// clientConn is one live connection and its pending calls.
//
// Its answers are read by whoever holds the read token (see readToken): the
// reader goroutine, or, on a plaintext connection, a lone call reading its
// own answer.
type clientConn struct {
	nc   net.Conn // raw, or the TLS connection over it
	raw  net.Conn
	tls  bool
	w    *writer
	rd   *bufio.Reader // read by the token's holder only
	done chan struct{} // closed when both goroutines have exited
	dead chan struct{} // closed by kill
	// wake tells the reader goroutine (capacity 1) that the token was
	// given up while calls were pending.
	wake chan struct{}

	mu      sync.Mutex
	pending map[uint32]chan result
	// owed counts the answers the server owes: requests sent whose answers
	// were not read yet, those of calls that gave up included. While it is
	// not 0 someone reads the socket (the token's holder, or the reader
	// goroutine woken for it): the server's writes, and so its reads of
	// our requests, never wait for an answer nobody reads.
	owed   int
	err    error // set once the connection is dead
	holder readToken
	// holderOp is the opaque of the call holding the token: its
	// cancellation sets the socket's read deadline only while it holds it.
	holderOp uint32
	// freed is when a call last gave the token up with nothing pending.
	freed time.Time
	// ownReads counts the answers calls read themselves (tests read it).
	ownReads atomic.Int64
	pooled   bool // ClientConfig.PooledAnswers
}

// readToken says who reads a clientConn's socket. A call that is alone on
// its connection reads its answer itself: it saves handing the answer over
// from the reader goroutine (a thread wake-up and a goroutine switch each
// way on a 2-core machine, a third of a lone call's cost). Answers to other
// calls that the holder reads on the way it hands to their callers, as the
// reader goroutine would. Whoever gives the token up while calls are
// pending wakes the reader goroutine to take it; and the reader goroutine
// also takes it when the connection has been idle for idleWatch, so that a
// connection the server closes is noticed while no call is made.
type readToken uint8

const (
	tokenFree   readToken = iota
	tokenReader           // the reader goroutine
	tokenCaller           // a lone call
)

// idleWatch is how long a connection's socket may go unread while nothing
// is pending before the reader goroutine reads it again (it notices a
// closed connection then). A caller making calls one at a time more often
// than that keeps the token to the callers; the reader goroutine's timer
// wakes once per idleWatch meanwhile. (A variable: tests set it to an hour
// to show that nothing else waits for it.)
var idleWatch = 50 * time.Millisecond

// readBufSize is the client's read buffer: a frame up to this size a lone
// call reads itself (it peeks the whole frame before taking any of it, so
// that its deadline passing leaves the stream whole); a larger one it
// leaves to the reader goroutine.
const readBufSize = 64 << 10

// Call sends a request and waits for its response, until ctx is done or,
// without a deadline, for CallTimeout (the wait for room in the write buffer
// included). A response whose status is not OK returns the frame and a
// *protocol.Error naming the status (its body, the error text, is the
// message). A lost connection returns ErrConnLost; a
// passed deadline returns an error matching both protocol.ErrTimeout and
// context.DeadlineExceeded.
func (c *Client) Call(ctx context.Context, code protocol.Code, body []byte) (protocol.Frame, error) {
	f, _, err := c.callCtx(ctx, code, body)
	return f, err
}

// callCtx is Call that also returns the answer's recycled buffer, if it
// has one (see callOnBuf).
func (c *Client) callCtx(ctx context.Context, code protocol.Code, body []byte) (protocol.Frame, []byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.CallTimeout)
		defer cancel()
	}
	cc, err := c.connect(ctx)
	if err != nil {
		return protocol.Frame{}, nil, err
	}
	return c.callOnBuf(until{ctx: ctx}, cc, code, body)
}

// CallPooled is Call whose answer may be in a recycled buffer (see
// ClientConfig.PooledAnswers): release gives it back, after which
// nothing sliced from the answer may be used. release is never nil, and
// calling it is optional (a buffer not given back is the collector's).
func (c *Client) CallPooled(ctx context.Context, code protocol.Code, body []byte) (f protocol.Frame, release func(), err error) {
	f, buf, err := c.callCtx(ctx, code, body)
	if buf == nil {
		return f, noRelease, err
	}
	return f, func() { putFrameBuf(buf) }, err
}

func noRelease() {}

// CallUntil is Call with a deadline instead of a context, and h, when not
// nil, to give the call up from another goroutine (Handle.GiveUp). It
// costs no context: a caller that makes many calls (the producer's SEND
// batches) saves their allocations and timers.
func (c *Client) CallUntil(deadline time.Time, h *Handle, code protocol.Code, body []byte) (protocol.Frame, error) {
	c.mu.Lock()
	cc := c.conn
	c.mu.Unlock()
	if cc == nil {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		var err error
		if cc, err = c.connect(ctx); err != nil {
			return protocol.Frame{}, err
		}
	}
	return c.callOn(until{deadline: deadline, h: h}, cc, code, body)
}

// A Handle gives up a call made with CallUntil: the call returns at once
// with an error wrapping GiveUp's cause, and an answer that comes later is
// dropped. The zero value is ready to use; a Handle serves one call. A
// call waiting for room in the write buffer is given up at its deadline.
type Handle struct {
	mu     sync.Mutex
	cause  error
	cc     *clientConn // the connection of the call in flight
	opaque uint32
}

// GiveUp gives the call up with cause (the first cause stays).
func (h *Handle) GiveUp(cause error) {
	h.mu.Lock()
	if h.cause != nil {
		h.mu.Unlock()
		return
	}
	h.cause = cause
	cc, opaque := h.cc, h.opaque
	h.mu.Unlock()
	if cc != nil {
		cc.giveUp(opaque, cause)
	}
}

// Cause is the cause GiveUp gave, or nil.
func (h *Handle) Cause() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cause
}

// attach tells h which call it gives up; it reports false when GiveUp came
// first.
func (h *Handle) attach(cc *clientConn, opaque uint32) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cc, h.opaque = cc, opaque
	return h.cause == nil
}

// until is how long a call waits: until ctx is done, or (ctx nil) until
// deadline or h's GiveUp.
type until struct {
	ctx      context.Context
	deadline time.Time
	h        *Handle
}

// Deadline is the call's deadline, if it has one.
func (u until) Deadline() (time.Time, bool) {
	if u.ctx != nil {
		return u.ctx.Deadline()
	}
	return u.deadline, true
}

// errGivenUp marks a call given up with Handle.GiveUp; its cause follows.
var errGivenUp = errors.New("call given up")

// callOn is Call on the connection cc.
func (c *Client) callOn(u until, cc *clientConn, code protocol.Code, body []byte) (protocol.Frame, error) {
	f, _, err := c.callOnBuf(u, cc, code, body)
	return f, err
}

// callOnBuf is callOn that also returns the answer's recycled buffer, if
// it has one (nil on an error but a status's).
func (c *Client) callOnBuf(u until, cc *clientConn, code protocol.Code, body []byte) (protocol.Frame, []byte, error) {
	opaque := c.opaque.Add(1)
	ch := make(chan result, 1)
	if err := cc.register(opaque, ch); err != nil {
		return protocol.Frame{}, nil, err
	}
	if u.h != nil && !u.h.attach(cc, opaque) {
		cc.withdraw(opaque)
		return protocol.Frame{}, nil, c.givenUpErr(code, u.h.Cause())
	}
	req := protocol.Frame{Code: code, Opaque: opaque, Body: body}
	if err := cc.w.enqueue(u.ctx, u.deadline, &req); err != nil {
		cc.withdraw(opaque)
		if u.ctx != nil && u.ctx.Err() != nil {
			return protocol.Frame{}, nil, c.ctxErr(u.ctx, code)
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return protocol.Frame{}, nil, c.timeoutErr(code)
		}
		if cerr := cc.failure(); cerr != nil && !errors.Is(cerr, ErrClosed) {
			// The reader saw why the connection died (a TLS alert, say)
			// before this write failed for it: that is the news.
			return protocol.Frame{}, nil, c.wrap(code, cerr)
		}
		return protocol.Frame{}, nil, c.wrap(code, writeErr(err))
	}
	if cc.takeToken(opaque) {
		f, err, ok := c.readOwn(u, cc, code, opaque)
		if ok {
			if err != nil {
				return protocol.Frame{}, nil, err
			}
			f, err = answer(f)
			return f, nil, err
		}
		// A frame too large to peek: the reader goroutine reads on.
	}
	var done <-chan struct{}
	var timeout <-chan time.Time
	if u.ctx != nil {
		done = u.ctx.Done()
	} else {
		t := time.NewTimer(time.Until(u.deadline))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case r := <-ch:
		if r.err != nil {
			if r.givenUp {
				return protocol.Frame{}, nil, c.givenUpErr(code, r.err)
			}
			return protocol.Frame{}, nil, c.wrap(code, r.err)
		}
		f, err := answer(r.frame)
		return f, r.buf, err
	case <-done:
		cc.unregister(opaque)
		return protocol.Frame{}, nil, c.ctxErr(u.ctx, code)
	case <-timeout:
		cc.unregister(opaque)
		return protocol.Frame{}, nil, c.timeoutErr(code)
	}
}

// answer is a call's outcome once its answer came: an answer whose status
// is not OK is an error too.
func answer(f protocol.Frame) (protocol.Frame, error) {
	if f.Status != protocol.StatusOK {
		return f, protocol.ErrorForStatus(f.Status, string(f.Body))
	}
	return f, nil
}

// readOwn reads the socket for the call opaque, which holds cc's read
// token, until its answer comes (handing the others it reads to their
// callers), its wait ends or the connection fails; it then gives the
// token up. ok false: the next frame is too large to peek, the token went
// to the reader goroutine, and the call waits for its answer as usual.
func (c *Client) readOwn(u until, cc *clientConn, code protocol.Code, opaque uint32) (f protocol.Frame, err error, ok bool) {
	if d, has := u.Deadline(); has {
		_ = cc.nc.SetReadDeadline(d)
	}
	if u.ctx != nil && u.ctx.Done() != nil {
		stop := context.AfterFunc(u.ctx, func() { cc.interrupt(opaque) })
		defer stop()
	}
	for {
		fr, rerr := cc.peekFrame()
		switch {
		case rerr == nil:
			if fr.Opaque == opaque {
				cc.ownReads.Add(1)
				cc.mu.Lock()
				delete(cc.pending, opaque)
				cc.paid()
				cc.releaseToken()
				cc.mu.Unlock()
				return fr, nil, true
			}
			cc.deliver(fr)
			continue
		case errors.Is(rerr, errPeekTooLarge):
			cc.mu.Lock()
			cc.releaseToken()
			cc.mu.Unlock()
			return protocol.Frame{}, nil, false
		case errors.Is(rerr, os.ErrDeadlineExceeded) && cc.failure() == nil:
			// The call's deadline passed, its context was cancelled or it
			// was given up (the frame being peeked, if any, is left whole).
			cc.mu.Lock()
			delete(cc.pending, opaque)
			cc.releaseToken()
			cc.mu.Unlock()
			switch {
			case u.h != nil && u.h.Cause() != nil:
				return protocol.Frame{}, c.givenUpErr(code, u.h.Cause()), true
			case u.ctx != nil:
				<-u.ctx.Done() // at its deadline: at most a tick away
				return protocol.Frame{}, c.ctxErr(u.ctx, code), true
			}
			return protocol.Frame{}, c.timeoutErr(code), true
		}
		c.fail(cc, rerr)
		cc.mu.Lock()
		cc.releaseToken()
		cc.mu.Unlock()
		return protocol.Frame{}, c.wrap(code, cc.failure()), true
	}
}

// interrupt ends the socket read of the call opaque if it holds the read
// token: its read deadline passes now.
func (cc *clientConn) interrupt(opaque uint32) {
	cc.mu.Lock()
	if cc.holder == tokenCaller && cc.holderOp == opaque {
		_ = cc.nc.SetReadDeadline(time.Unix(1, 0)) // now, whatever the clock says
	}
	cc.mu.Unlock()
}

// giveUp ends the call opaque with cause, whether it waits for its answer
// or reads it itself.
func (cc *clientConn) giveUp(opaque uint32, cause error) {
	cc.mu.Lock()
	if ch, ok := cc.pending[opaque]; ok && (cc.holder != tokenCaller || cc.holderOp != opaque) {
		delete(cc.pending, opaque)
		ch <- result{err: cause, givenUp: true} // buffered; never blocks
	}
	cc.mu.Unlock()
	cc.interrupt(opaque)
}

// givenUpErr is the error of a call given up with cause.
func (c *Client) givenUpErr(code protocol.Code, cause error) error {
	return fmt.Errorf("transport: %v to %s: %w: %w", code, c.addr, errGivenUp, cause)
}

// timeoutErr is the error of a call made with CallUntil whose deadline
// passed.
func (c *Client) timeoutErr(code protocol.Code) error {
	return fmt.Errorf("transport: %v to %s: %w: %w", code, c.addr, protocol.ErrTimeout, context.DeadlineExceeded)
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
	if err := cc.w.enqueue(ctx, time.Time{}, &req); err != nil {
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
		rd:      bufio.NewReaderSize(nc, readBufSize),
		done:    make(chan struct{}),
		dead:    make(chan struct{}),
		wake:    make(chan struct{}, 1),
		pending: make(map[uint32]chan result),
		pooled:  c.cfg.PooledAnswers,
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
		f, err := c.callOn(until{ctx: ctx}, cc, code, body)
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

// readLoop reads answers and hands them to their calls whenever it holds
// the read token, until the connection breaks or is killed. On a TLS or a
// PooledAnswers connection it holds the token for good (see takeToken).
func (cc *clientConn) readLoop(addr string) error {
	if cc.tls || cc.pooled {
		return cc.readHeld(addr, true)
	}
	idle := time.NewTimer(idleWatch)
	defer idle.Stop()
	for {
		select {
		case <-cc.wake:
		case <-idle.C:
		case <-cc.dead:
			return ErrClosed // kill ran: its cause is the connection's
		}
		cc.mu.Lock()
		if cc.err != nil {
			cc.mu.Unlock()
			return ErrClosed
		}
		if cc.holder != tokenFree {
			cc.mu.Unlock()
			idle.Reset(idleWatch)
			continue
		}
		if cc.owed == 0 {
			if since := time.Since(cc.freed); since < idleWatch {
				cc.mu.Unlock()
				idle.Reset(idleWatch - since)
				continue
			}
		}
		cc.holder = tokenReader
		cc.mu.Unlock()
		if err := cc.readHeld(addr, false); err != nil {
			return err
		}
		idle.Reset(idleWatch)
	}
}

// readHeld reads frames, the read token held, and hands them to their
// calls; unless forever, it gives the token up when no call is pending.
func (cc *clientConn) readHeld(addr string, forever bool) error {
	for first := true; ; first = false {
		f, buf, err := cc.readAnswer()
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
		cc.paid()
		done := !forever && cc.owed == 0
		if done {
			cc.holder = tokenFree
			cc.freed = time.Now()
		}
		cc.mu.Unlock()
		if ok {
			ch <- result{frame: f, buf: buf} // buffered; never blocks
		} else if buf != nil {
			putFrameBuf(buf)
		}
		// A response to a call that already timed out is dropped.
		if done {
			return nil
		}
	}
}

// readAnswer reads the next frame whole; with PooledAnswers, one that a
// pool class holds goes into a recycled buffer, returned with it.
func (cc *clientConn) readAnswer() (protocol.Frame, []byte, error) {
	var lenBuf [4]byte
	if _, err := io.ReadFull(cc.rd, lenBuf[:]); err != nil {
		return protocol.Frame{}, nil, err
	}
	return readFrameInto(cc.rd, lenBuf, protocol.MaxFrameSize, readAtOnce, cc.pooled)
}

// takeToken gives the read token to the call opaque, which just sent its
// request, if the token is free and no other call is pending; if it is free
// and others are, it wakes the reader goroutine to read for them all.
func (cc *clientConn) takeToken(opaque uint32) bool {
	if cc.tls || cc.pooled {
		// A TLS record is not peeked; a PooledAnswers connection carries
		// answers mostly larger than the read buffer (HA fetches), which a
		// lone call would peek only to hand them to the reader goroutine.
		return false
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.holder != tokenFree || cc.err != nil {
		return false
	}
	if _, waiting := cc.pending[opaque]; !waiting {
		return false // answered already
	}
	if cc.owed != 1 {
		cc.kickReader()
		return false
	}
	cc.holder = tokenCaller
	cc.holderOp = opaque
	return true
}

// releaseToken gives up a call's read token (mu held): it clears the read
// deadline the call set, and wakes the reader goroutine if calls are
// pending.
func (cc *clientConn) releaseToken() {
	_ = cc.nc.SetReadDeadline(time.Time{})
	cc.holder = tokenFree
	if cc.owed > 0 {
		cc.kickReader()
	} else {
		cc.freed = time.Now()
	}
}

func (cc *clientConn) kickReader() {
	select {
	case cc.wake <- struct{}{}:
	default:
	}
}

// errPeekTooLarge is peekFrame's: the next frame does not fit the buffer.
var errPeekTooLarge = errors.New("frame larger than the read buffer")

// peekFrame reads the next frame whole, or nothing: it takes its bytes
// from the read buffer only once the whole frame is there, so an error
// (the caller's deadline passing, say) leaves the stream as it was.
func (cc *clientConn) peekFrame() (protocol.Frame, error) {
	head, err := cc.rd.Peek(4)
	if err != nil {
		return protocol.Frame{}, err
	}
	n, err := protocol.FrameLength(head)
	if err != nil {
		return protocol.Frame{}, fmt.Errorf("%w: %w", ErrBadFrame, err)
	}
	if n > cc.rd.Size() {
		return protocol.Frame{}, errPeekTooLarge
	}
	b, err := cc.rd.Peek(n)
	if err != nil {
		return protocol.Frame{}, err
	}
	buf := make([]byte, n)
	copy(buf, b)
	_, _ = cc.rd.Discard(n)
	f, err := protocol.DecodeFrame(buf)
	if err != nil {
		return protocol.Frame{}, fmt.Errorf("%w: %w", ErrBadFrame, err)
	}
	if !f.IsResponse() {
		return protocol.Frame{}, fmt.Errorf("%w: a request (code %v) sent to a client", ErrBadFrame, f.Code)
	}
	return f, nil
}

// deliver hands an answer to its call (dropped if the call is gone).
func (cc *clientConn) deliver(f protocol.Frame) {
	cc.mu.Lock()
	ch, ok := cc.pending[f.Opaque]
	delete(cc.pending, f.Opaque)
	cc.paid()
	cc.mu.Unlock()
	if ok {
		ch <- result{frame: f} // buffered; never blocks
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
	close(cc.dead)
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
	cc.owed++
	return nil
}

// withdraw forgets the call opaque whose request was not sent.
func (cc *clientConn) withdraw(opaque uint32) {
	cc.mu.Lock()
	if _, ok := cc.pending[opaque]; ok {
		delete(cc.pending, opaque)
		cc.owed--
	}
	cc.mu.Unlock()
}

// paid counts an answer read (mu held).
func (cc *clientConn) paid() { cc.owed = max(cc.owed-1, 0) }

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
