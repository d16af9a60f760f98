package transport

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/protocol"
)

// Handler serves one request. It must answer it exactly once with
// req.Reply or req.ReplyError (unless the request is oneway), either before
// returning or later from any goroutine. It must not keep req.Body after
// answering. Answering never blocks.
type Handler func(req *Request)

// ReplySize estimates, from a request's body, how many bytes the body of its
// reply may take. The server reserves that much (plus the frame header) of
// the connection's MaxWriteBuffer when it admits the request, and releases
// it when the reply is queued; so the estimate should be an upper bound of
// every answer the handler may give, errors included, for MaxWriteBuffer to
// bound what a connection queues. It runs on the connection's reader
// goroutine with a body that has not been validated: it must be cheap and
// must not trust the body (a result over protocol.MaxFrameSize is taken as
// that, a negative one as 0; a panic, as DefaultReplySize).
type ReplySize func(body []byte) int

// DefaultReplySize is the reply estimate of a code registered with Handle:
// room for a short answer or an error text.
const DefaultReplySize = 256

// ServerConfig tunes a Server. The zero value of a field means its default.
type ServerConfig struct {
	// Workers is the number of goroutines running handlers. Default 4 x GOMAXPROCS.
	Workers int
	// QueueSize bounds requests read but not yet picked up by a worker; a
	// connection's reader waits when it is full. Default 1024.
	QueueSize int
	// MaxInflightPerConn bounds requests read from one connection and not yet
	// answered; the reader stops reading that connection until one is
	// answered. Default 4096.
	MaxInflightPerConn int
	// MaxWriteBuffer bounds the bytes of responses one connection may have
	// queued: those buffered or being written plus those reserved (see
	// ReplySize) by requests read and not yet answered. The connection's
	// reader admits a request only while its reservation fits (and always
	// when nothing is queued or reserved, so one reply larger than the bound
	// still goes); repliers never wait. Default 4 MiB.
	MaxWriteBuffer int
	// WriteTimeout closes a connection whose peer read nothing of what the
	// server had to write for that long (at most 2.25 times that after the
	// last byte it read). Its unanswered requests' replies are then dropped: Reply
	// returns an error. It also bounds how long Close waits for a peer to read
	// the last answers. Default 10 s.
	WriteTimeout time.Duration
	// ShutdownGrace bounds how long Close waits for requests already read to
	// be answered. Default 5 s.
	ShutdownGrace time.Duration
	// Logger receives connection errors. Default: a null logger.
	Logger hclog.Logger

	// TLS, when set, makes every connection speak TLS with it; nil is
	// plaintext. A config with ClientCAs requires every client to present a
	// certificate signed by them (its ClientAuth becomes
	// tls.RequireAndVerifyClientCert). Versions before TLS 1.2 are refused.
	TLS *tls.Config

	// Limits before trust. Without RequireAuth a connection is
	// authenticated once its TLS handshake verified a client certificate,
	// or once it sent a request of a registered code; with RequireAuth,
	// only once a handler called Request.Authenticate (the authorization
	// layer, when the peer proved who it is, by token or by a certificate
	// that names a principal). Until then it holds little: see
	// MaxUnauthFrame and MaxUnauthConns. Whoever sent it, a frame that
	// declares more than about 1 MiB is read as its bytes arrive.

	// HandshakeTimeout bounds how long a new connection may take to
	// complete its TLS handshake and send its first whole request; past it
	// the connection is closed. With RequireAuth it also bounds the time an
	// unauthenticated connection may go without a request, and such a
	// connection must authenticate within preAuthTimeouts times it of its
	// acceptance: past either it is closed. Default 5 s.
	HandshakeTimeout time.Duration
	// MaxConns caps the connections open at once, those in their handshake
	// included; one over it is closed as soon as it is accepted (counted in
	// ServerStats.Refused). Default 10000.
	MaxConns int
	// MaxUnauthConns caps, with RequireAuth, the connections open at once
	// that have not authenticated (those in their handshake included), so
	// that strangers cannot take the room of MaxConns that authenticated
	// clients need; one over it is refused like one over MaxConns. A
	// connection leaves this count when it authenticates. Default
	// min(256, MaxConns/2), at least 1.
	MaxUnauthConns int
	// MaxUnauthFrame bounds what a connection that has not authenticated
	// makes the server hold for one frame. Without RequireAuth a frame
	// declared larger is read in growing pieces as its bytes arrive (the
	// server holds about what the peer sent, and the handshake deadline
	// bounds the first frame). With RequireAuth a frame declared larger is
	// refused: the connection is closed (unless its TLS client certificate
	// was verified: then it is read as its bytes arrive); one declared
	// smaller is read as its bytes arrive too. Default 64 KiB.
	MaxUnauthFrame int
	// RequireAuth keeps a connection unauthenticated until its TLS client
	// certificate was verified or a handler called Request.Authenticate;
	// without it, a connection's first request of a registered code
	// authenticates it. With it, an unauthenticated connection is served
	// only AUTH and IDENTIFY (protocol.CodeAuth, CodeIdentify): any other
	// request is answered NOT_AUTHORIZED "authenticate first", without
	// reaching a handler.
	RequireAuth bool
}

func (c ServerConfig) withDefaults() ServerConfig {
	if c.Workers <= 0 {
		c.Workers = 4 * runtime.GOMAXPROCS(0)
	}
	if c.QueueSize <= 0 {
		c.QueueSize = 1024
	}
	if c.MaxInflightPerConn <= 0 {
		c.MaxInflightPerConn = 4096
	}
	if c.MaxWriteBuffer <= 0 {
		c.MaxWriteBuffer = 4 << 20
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.ShutdownGrace <= 0 {
		c.ShutdownGrace = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 5 * time.Second
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 10000
	}
	if c.MaxUnauthFrame <= 0 {
		c.MaxUnauthFrame = 64 << 10
	}
	if c.MaxUnauthConns <= 0 {
		c.MaxUnauthConns = max(1, min(256, c.MaxConns/2))
	}
	return c
}

// ServerStats are a server's connection counters.
type ServerStats struct {
	// Conns is the connections open now, those in their handshake
	// included; PeakConns the most there were at once.
	Conns, PeakConns int64
	// Refused counts connections closed at once over MaxConns or
	// MaxUnauthConns.
	Refused int64
	// UnauthConns is the connections open now that have not authenticated
	// (RequireAuth; 0 without it), those in their handshake included.
	UnauthConns int64
	// UnauthClosed counts connections closed, after their first request,
	// for not authenticating in time (RequireAuth).
	UnauthClosed int64
	// HandshakeTimeouts counts connections closed for not completing their
	// handshake and first request within HandshakeTimeout.
	HandshakeTimeouts int64
	// HandshakeFailures counts failed TLS handshakes, plaintext peers on a
	// TLS port and TLS peers on a plaintext one.
	HandshakeFailures int64
	// Oversize counts connections closed for declaring a frame over
	// MaxUnauthFrame before they authenticated (RequireAuth).
	Oversize int64
}

type serverStats struct {
	conns, peak, refused, handshakeTimeouts, handshakeFailures, oversize atomic.Int64
	unauth, unauthClosed                                                 atomic.Int64
}

// notePeak raises peak to n if n is higher.
func (st *serverStats) notePeak(n int64) {
	for {
		p := st.peak.Load()
		if n <= p || st.peak.CompareAndSwap(p, n) {
			return
		}
	}
}

// Stats returns the server's connection counters.
func (s *Server) Stats() ServerStats {
	return ServerStats{
		Conns: s.stats.conns.Load(), PeakConns: s.stats.peak.Load(), Refused: s.stats.refused.Load(),
		HandshakeTimeouts: s.stats.handshakeTimeouts.Load(), HandshakeFailures: s.stats.handshakeFailures.Load(),
		Oversize: s.stats.oversize.Load(), UnauthConns: s.stats.unauth.Load(), UnauthClosed: s.stats.unauthClosed.Load(),
	}
}

// Server serves framed requests on one listener.
type Server struct {
	cfg      ServerConfig
	log      hclog.Logger
	limited  limitedLog
	tls      *tls.Config // nil: plaintext
	stats    serverStats
	handlers map[protocol.Code]route // written only before Serve
	tasks    chan *Request
	stop     chan struct{} // closed by Close: readers stop, workers drain and exit
	inflight atomic.Int64  // requests read and not yet answered, all connections

	// tasksMu guards sending to tasks from a worker (the hand-off of an
	// ordered request, never waiting) against Close closing it; readers need
	// not take it, as Close closes tasks after they all returned.
	tasksMu     sync.RWMutex
	tasksClosed bool

	// Close waits for these in order: the acceptor and the readers (no new
	// requests), then the workers (every queued request handled), then the
	// writers (every answer flushed).
	readWG, workWG, writeWG sync.WaitGroup

	mu      sync.Mutex
	ln      net.Listener
	conns   map[*serverConn]struct{}
	serving bool
	closed  bool

	// busy holds a token per over-cap connection being answered BUSY
	// (refuseBusy); busyConns are those connections (guarded by mu).
	busy      chan struct{}
	busyConns map[net.Conn]struct{}
}

// NewServer returns a server with no handlers.
func NewServer(cfg ServerConfig) *Server {
	cfg = cfg.withDefaults()
	return &Server{
		cfg:      cfg,
		log:      cfg.Logger,
		limited:  limitedLog{log: cfg.Logger},
		tls:      serverTLS(cfg.TLS),
		handlers: make(map[protocol.Code]route),
		tasks:    make(chan *Request, cfg.QueueSize),
		stop:     make(chan struct{}),
		conns:    make(map[*serverConn]struct{}),

		busy:      make(chan struct{}, maxBusyAnswers),
		busyConns: make(map[net.Conn]struct{}),
	}
}

// route is what is registered for a request code.
type route struct {
	h         Handler
	replySize ReplySize // nil: DefaultReplySize
	ordered   bool      // run one at a time per connection, in arrival order
	inline    bool      // ordered, and run on the reader when alone (HandleOrderedInline)
}

// Handle registers h for code, with replies estimated at DefaultReplySize
// bytes. It must be called before Serve or Listen.
func (s *Server) Handle(code protocol.Code, h Handler) {
	s.HandleWithReply(code, h, nil)
}

// HandleWithReply registers h for code, with replySize estimating each
// request's reply (nil: DefaultReplySize). It must be called before Serve or
// Listen.
func (s *Server) HandleWithReply(code protocol.Code, h Handler, replySize ReplySize) {
	s.register(code, route{h: h, replySize: replySize})
}

// HandleOrdered registers h for code like HandleWithReply, and has the
// requests of ordered codes run one at a time per connection, in the order
// the connection sent them: a connection's next ordered request starts only
// after the handler of the previous one returned (answered or not: a
// handler may still Reply later from any goroutine). All the ordered codes
// of a connection share that one sequence. Requests of other connections,
// and of codes registered with Handle or HandleWithReply, run in parallel
// with them on the worker pool as usual, in no set order relative to them.
//
// No worker waits for a request's turn: a request read while its
// connection's previous ordered one is with the workers is queued on the
// connection, and the worker that runs the previous one runs it next (or,
// after orderedBatch in a row, hands it back to the pool), so a slow handler
// holds one worker, whatever its connection queued behind it. It must be
// called before Serve or Listen.
func (s *Server) HandleOrdered(code protocol.Code, h Handler, replySize ReplySize) {
	s.register(code, route{h: h, replySize: replySize, ordered: true})
}

// HandleOrderedInline registers h for code like HandleOrdered, for a handler
// that is quick and never waits on anything but the local disk (the broker's
// SEND, which appends inline when the commit log is idle). A request of such
// a code that arrives alone, with no ordered request of its connection in
// flight and nothing more read from the connection, runs on the connection's
// reader goroutine itself, and its answer is written from there: a lone
// request then costs no goroutine wake-up on the server (the hand-off to a
// worker would cost a thread wake-up when the process is idle). The reader
// reads nothing more meanwhile, which holds back only its own peer, whose
// next ordered request would wait for this one anyway. Requests that arrive
// together, or behind one in flight, go to the workers as with
// HandleOrdered, so a busy connection keeps its reading and the workers'
// batching. It must be called before Serve or Listen.
func (s *Server) HandleOrderedInline(code protocol.Code, h Handler, replySize ReplySize) {
	s.register(code, route{h: h, replySize: replySize, ordered: true, inline: true})
}

func (s *Server) register(code protocol.Code, rt route) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.serving {
		panic("transport: Handle called after Serve")
	}
	s.handlers[code] = rt
}

// reservation is what admitting a request reserves of its connection's
// MaxWriteBuffer: nothing for a oneway request, else its reply's estimated
// frame size.
func (s *Server) reservation(f *protocol.Frame, rt route, known bool) (n int) {
	if f.IsOneway() {
		return 0
	}
	if !known || rt.replySize == nil {
		return protocol.FixedHeaderSize + DefaultReplySize
	}
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("reply size estimator panicked", "code", f.Code.String(), "panic", p)
			n = protocol.FixedHeaderSize + DefaultReplySize
		}
	}()
	return protocol.FixedHeaderSize + min(max(rt.replySize(f.Body), 0), protocol.MaxFrameSize)
}

// Listen listens on addr (e.g. "127.0.0.1:0") and serves in the background.
// It returns the address actually bound.
func (s *Server) Listen(addr string) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("transport: listen %s: %w", addr, err)
	}
	if err := s.Serve(ln); err != nil {
		_ = ln.Close()
		return nil, err
	}
	return ln.Addr(), nil
}

// Serve serves ln in the background until Close. A server serves one listener.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.serving {
		return errors.New("transport: server already serving")
	}
	s.serving = true
	s.ln = ln
	for range s.cfg.Workers {
		s.workWG.Add(1)
		go s.worker()
	}
	s.readWG.Add(1)
	go s.accept(ln)
	return nil
}

// Addr is the listener's address, or nil before Serve.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

func (s *Server) accept(ln net.Listener) {
	defer s.readWG.Done()
	for {
		nc, err := ln.Accept()
		if err != nil {
			select {
			case <-s.stop:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			s.log.Error("accept failed", "error", err)
			return
		}
		if n := s.stats.conns.Add(1); n > int64(s.cfg.MaxConns) {
			s.stats.conns.Add(-1)
			s.refuseOverCap(nc, "refused", "connections are open", "MaxConns", "max_conns", s.cfg.MaxConns)
			continue
		} else {
			s.stats.notePeak(n)
		}
		if s.cfg.RequireAuth {
			if n := s.stats.unauth.Add(1); n > int64(s.cfg.MaxUnauthConns) {
				s.stats.unauth.Add(-1)
				s.stats.conns.Add(-1)
				s.refuseOverCap(nc, "refused_unauth", "connections that have not authenticated are open", "MaxUnauthConns", "max_unauth_conns", s.cfg.MaxUnauthConns)
				continue
			}
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		c := &serverConn{
			s:        s,
			raw:      nc,
			accepted: time.Now(),
			w:        newWriter(s.cfg.MaxWriteBuffer, s.cfg.WriteTimeout),
			sem:      make(chan struct{}, s.cfg.MaxInflightPerConn),
		}
		c.unauthHeld.Store(s.cfg.RequireAuth)
		if s.tls == nil {
			c.w.raw = socketOf(nc)
		} else {
			c.w.tls = true
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = nc.Close()
			s.stats.conns.Add(-1)
			c.releaseUnauth()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.readWG.Add(1)
		go c.readLoop()
	}
}

// Over-cap connections answered BUSY (refuseBusy).
const (
	// maxBusyAnswers bounds how many are served at once; past it one is
	// closed unanswered, as it is on a TLS port (answering would take a
	// handshake).
	maxBusyAnswers = 64
	// busyWait bounds how long one is given to send its first request
	// (and the server's answer to be read), at most HandshakeTimeout.
	busyWait = time.Second
)

// refuseOverCap counts and warns (rate-limited, per kind) about a
// connection over one of the caps, and refuses it with refuseBusy.
func (s *Server) refuseOverCap(nc net.Conn, kind, what, field, logKey string, limit int) {
	s.stats.refused.Add(1)
	remote := nc.RemoteAddr().String()
	s.limited.warn(kind, fmt.Sprintf("refusing connection from %s: %d %s, the cap (%s)", remote, limit, what, field),
		"remote", remote, logKey, limit)
	s.refuseBusy(nc)
}

// refuseBusy ends a connection over MaxConns. On a plaintext port it reads
// the connection's first request (within busyWait) and answers it BUSY,
// saying the server is over its connection cap, so the client knows it
// met a live server that is full (and may retry, here or elsewhere), not
// something that hangs up on every client; then it closes. A oneway
// request, a frame too large for a connection that has not authenticated,
// or bytes that are not a frame are closed unanswered.
func (s *Server) refuseBusy(nc net.Conn) {
	if s.tls != nil {
		_ = nc.Close()
		return
	}
	select {
	case s.busy <- struct{}{}:
	default:
		_ = nc.Close()
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.busy
		_ = nc.Close()
		return
	}
	s.busyConns[nc] = struct{}{}
	s.mu.Unlock()
	s.readWG.Add(1) // the acceptor holds one: Close is not waiting yet
	go func() {
		defer s.readWG.Done()
		defer func() {
			s.mu.Lock()
			delete(s.busyConns, nc)
			s.mu.Unlock()
			_ = nc.Close()
			<-s.busy
		}()
		_ = nc.SetDeadline(time.Now().Add(min(s.cfg.HandshakeTimeout, busyWait)))
		f, err := readFrame(nc, s.cfg.MaxUnauthFrame, growBig)
		if err != nil || f.IsResponse() || f.IsOneway() {
			return
		}
		msg := fmt.Sprintf("%s is over its connection cap (%d connections open): try again later, or another server", nc.LocalAddr(), s.cfg.MaxConns)
		resp := protocol.Frame{Flags: protocol.FlagResponse, Code: f.Code, Status: protocol.StatusBusy, Opaque: f.Opaque, Body: []byte(msg)}
		b, err := protocol.AppendFrame(nil, &resp)
		if err != nil {
			return
		}
		if _, err := nc.Write(b); err != nil {
			return
		}
		// Drop what the client still sends until it closes: closing with
		// unread bytes would reset the connection, and the answer with it.
		if hc, ok := nc.(interface{ CloseWrite() error }); ok {
			_ = hc.CloseWrite()
		}
		_, _ = io.CopyN(io.Discard, nc, 64<<10)
	}()
}

// forget drops a connection that is gone from the server's set and count.
func (s *Server) forget(c *serverConn) {
	s.mu.Lock()
	_, ok := s.conns[c]
	delete(s.conns, c)
	s.mu.Unlock()
	if ok {
		s.stats.conns.Add(-1)
		c.releaseUnauth()
	}
}

// worker runs handlers until Close closes the task queue, after the readers
// stopped; so every request read is handled (a worker runs the requests
// queued behind an ordered one before it takes the next task).
func (s *Server) worker() {
	defer s.workWG.Done()
	for req := range s.tasks {
		if !req.ordered {
			if s.run(req) {
				req.conn.w.flush()
			}
			continue
		}
		s.runOrdered(req)
	}
}

// orderedBatch is how many ordered requests of one connection a worker runs
// in a row before it offers the next one to the pool, behind the tasks of
// other connections, so a connection that keeps its queue full does not keep
// a worker to itself while others wait.
const orderedBatch = 16

// runOrdered runs req, an ordered request, then those its connection queued
// behind it, one at a time, until the connection's queue is empty or the
// next one is handed back to the pool.
func (s *Server) runOrdered(req *Request) {
	c := req.conn
	for n := 1; ; n++ {
		replied := s.run(req)
		req = c.nextOrdered()
		if replied {
			// The last of a run writes its replies itself; with more to
			// run, the writer goroutine writes them meanwhile.
			if req == nil {
				c.w.flush()
			} else {
				c.w.kick()
			}
		}
		if req == nil {
			return
		}
		if n%orderedBatch == 0 && s.handOff(req) {
			return
		}
	}
}

// handOff queues req, the next ordered request of its connection, on the
// task queue if there is room and Close has not closed it; it never waits.
// The connection's sequence stays "running" in between: nothing of it runs
// until a worker takes req.
func (s *Server) handOff(req *Request) bool {
	s.tasksMu.RLock()
	defer s.tasksMu.RUnlock()
	if s.tasksClosed {
		return false
	}
	select {
	case s.tasks <- req:
		return true
	default:
		return false
	}
}

// run runs req's handler. It reports whether the handler answered before it
// returned: that answer is buffered and the writer goroutine not woken (see
// Request.phase), so the caller must flush or kick the connection's writer.
func (s *Server) run(req *Request) (replied bool) {
	req.phase.Store(phaseHandling)
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("handler panicked", "code", req.Code.String(), "panic", p)
			req.ReplyError(&protocol.Error{Status: protocol.StatusInternal, Message: fmt.Sprint("handler panicked: ", p)})
		}
		if req.IsOneway() {
			req.finish()
		}
		replied = req.phase.Swap(phaseIdle) == phaseReplied
	}()
	req.h(req)
	return false
}

// Close stops accepting and reading, waits up to ShutdownGrace for every
// request already read to be answered, flushes the answers, closes every
// connection and waits for every goroutine the server started.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.stop)
	if s.ln != nil {
		_ = s.ln.Close()
	}
	conns := make([]*serverConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	for nc := range s.busyConns {
		_ = nc.SetDeadline(time.Unix(1, 0))
	}
	s.mu.Unlock()

	// Stop the readers; requests already read stay queued for the workers.
	for _, c := range conns {
		_ = c.raw.SetReadDeadline(time.Unix(1, 0))
	}
	s.readWG.Wait()
	if s.serving {
		s.tasksMu.Lock()
		s.tasksClosed = true
		close(s.tasks)
		s.tasksMu.Unlock()
		s.workWG.Wait()
	}
	deadline := time.Now().Add(s.cfg.ShutdownGrace)
	for s.inflight.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	if n := s.inflight.Load(); n > 0 {
		s.log.Warn("closing with requests unanswered", "requests", n)
	}
	for _, c := range conns {
		c.w.close(ErrClosed) // the writer flushes, then exits and closes the socket
	}
	s.writeWG.Wait()
	return nil
}

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

// startOrdered tells whether req, an ordered request just read, may go to
// the workers now; if not, it is queued behind the one running.
func (c *serverConn) startOrdered(req *Request) bool {
	c.omu.Lock()
	defer c.omu.Unlock()
	if c.running {
		c.oq = append(c.oq, req)
		return false
	}
	c.running = true
	return true
}

// nextOrdered is called when the handler of the connection's running ordered
// request returned: it returns the next one, or nil (and the sequence
// stops running) if none is queued.
func (c *serverConn) nextOrdered() *Request {
	c.omu.Lock()
	defer c.omu.Unlock()
	if c.oh == len(c.oq) {
		c.running = false
		return nil
	}
	req := c.oq[c.oh]
	c.oq[c.oh] = nil
	c.oh++
	if c.oh == len(c.oq) {
		c.oq, c.oh = c.oq[:0], 0
	}
	return req
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

// runInline runs req, an ordered request of a HandleOrderedInline code that
// started its connection's ordered sequence with nothing more buffered, on
// the reader, and writes its answer from there if the writer is idle. The
// reader reads nothing meanwhile, so nothing can be queued behind req; should
// something be, it goes to the workers. It returns false if the server is
// closing and the reader must stop.
func (c *serverConn) runInline(req *Request) bool {
	replied := c.s.run(req)
	next := c.nextOrdered()
	if replied {
		c.w.flush()
	}
	if next == nil {
		return true
	}
	select {
	case c.s.tasks <- next:
		return true
	case <-c.s.stop:
		next.ReplyError(protocol.ErrShuttingDown)
		if next.IsOneway() {
			next.finish()
		}
		return false
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

// Authenticated reports whether the request's connection is authenticated
// (see ServerConfig.RequireAuth).
func (r *Request) Authenticated() bool { return r.conn.trusted.Load() }

// errAuthFirst answers a request that an unauthenticated connection may
// not make (RequireAuth).
var errAuthFirst = &protocol.Error{Status: protocol.StatusNotAuthorized,
	Message: "authenticate first: send AUTH with a token, or connect with a TLS client certificate"}

// preAuth reports whether a connection that has not authenticated may make
// a request of code (RequireAuth): AUTH, and IDENTIFY, which changes
// nothing.
func preAuth(code protocol.Code) bool {
	return code == protocol.CodeAuth || code == protocol.CodeIdentify
}

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

// Authenticate marks the request's connection authenticated: its next
// frames may be as large as any (the authorization layer calls it once a
// peer proved who it is).
func (r *Request) Authenticate() { r.conn.authenticate() }

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
