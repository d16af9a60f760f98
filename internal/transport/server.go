package transport

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime"
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

	// HandshakeTimeout bounds how long a new connection may take to
	// complete its TLS handshake and send its first whole request; past it
	// the connection is closed. Default 5 s.
	HandshakeTimeout time.Duration
	// MaxConns caps the connections open at once, those in their handshake
	// included; one over it is closed as soon as it is accepted (counted in
	// ServerStats.Refused). Default 10000.
	MaxConns int

	// Gate, when set, decides what a connection may do until a handler
	// trusts it (Request.Authenticate): whether it is let in, the deadline
	// and size cap of each of its frames, and which of its requests reach
	// their handlers (see Gate). Its frames are read as their bytes arrive;
	// once trusted, at once. nil admits everything: a connection is then
	// trusted once its TLS handshake verified a client certificate or it
	// sent a request of a registered code, and until then (and for frames
	// over about 1 MiB after) its frames are read as their bytes arrive.
	Gate Gate
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
	return c
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
	releases  bool      // its handler releases its requests (Releases)
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

// Releases says that code's handler (registered already) calls
// Request.Release once it is done with a request's body: the frames of the
// code may then be read into recycled buffers. It must be called before
// Serve or Listen.
func (s *Server) Releases(code protocol.Code) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rt, ok := s.handlers[code]
	if s.serving || !ok {
		panic("transport: Releases called after Serve, or for a code with no handler")
	}
	rt.releases = true
	s.handlers[code] = rt
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
	// Every request is read and handled: a gate that holds answers back
	// gives them now (Admission.Closed).
	for _, c := range conns {
		c.closeAdmission()
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
