package metaserver

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// streamLayer is raft's TCP stream layer that also closes the connections
// it accepted and dialed when it closes. raft's own TCP layer only closes
// its listener, which leaves the goroutines serving peers' connections
// running until the peers hang up; a node's Close must stop everything.
//
// A connection the layer closes itself (at drain or Close) is hung up: its
// reads end with io.EOF and its writes are dropped, so that raft's
// transport, which logs every other read or write error at ERROR, takes it
// for the peer's clean hang-up. A node's clean stop logs no error.
type streamLayer struct {
	ln net.Listener
	// dial connects to a peer; nil: plain TCP (raftlayer.go sets TLS's).
	dial func(addr string, timeout time.Duration) (net.Conn, error)

	mu       sync.Mutex
	conns    map[*trackedConn]struct{}
	draining bool // accepted connections are hung up, new ones at once
	closed   bool
}

var _ raft.StreamLayer = (*streamLayer)(nil)

func newStreamLayer(bind string) (*streamLayer, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	return &streamLayer{ln: ln, conns: map[*trackedConn]struct{}{}}, nil
}

func (s *streamLayer) track(c net.Conn, accepted bool) (net.Conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = c.Close()
		return nil, errors.New("metaserver: raft stream layer closed")
	}
	tc := &trackedConn{Conn: c, s: s, accepted: accepted}
	if accepted && s.draining {
		// Serve it as a connection the peer hung up at once.
		tc.hangUp()
		return tc, nil
	}
	s.conns[tc] = struct{}{}
	return tc, nil
}

func (s *streamLayer) Accept() (net.Conn, error) {
	c, err := s.ln.Accept()
	if err != nil {
		return nil, err
	}
	return s.track(c, true)
}

func (s *streamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	dial := s.dial
	if dial == nil {
		dial = func(addr string, timeout time.Duration) (net.Conn, error) {
			return net.DialTimeout("tcp", addr, timeout)
		}
	}
	c, err := dial(string(addr), timeout)
	if err != nil {
		return nil, err
	}
	return s.track(c, false)
}

func (s *streamLayer) Addr() net.Addr { return s.ln.Addr() }

// drain hangs up the connections peers opened to this node, and every one
// they open from now on, while raft still runs: the node's Close calls it
// before it shuts raft down, so that no peer's request is read and left
// waiting for a raft that no longer takes it (raft's transport fails such a
// request with an error at ERROR when it closes). The listener stays open
// until Close: raft's transport logs a failed accept at ERROR unless it is
// shut down itself.
func (s *streamLayer) drain() {
	s.mu.Lock()
	s.draining = true
	var hang []*trackedConn
	for c := range s.conns {
		if c.accepted {
			hang = append(hang, c)
			delete(s.conns, c)
		}
	}
	s.mu.Unlock()
	for _, c := range hang {
		c.hangUp()
	}
}

func (s *streamLayer) Close() error {
	s.mu.Lock()
	s.closed = true
	conns := s.conns
	s.conns = map[*trackedConn]struct{}{}
	s.mu.Unlock()
	err := s.ln.Close()
	for c := range conns {
		c.hangUp()
	}
	return err
}

type trackedConn struct {
	net.Conn
	s        *streamLayer
	accepted bool
	once     sync.Once
	hungUp   atomic.Bool
}

// hangUp closes the connection as the layer's own doing (drain or Close).
func (c *trackedConn) hangUp() {
	c.hungUp.Store(true)
	_ = c.Conn.Close()
}

func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && c.hungUp.Load() {
		return n, io.EOF
	}
	return n, err
}

func (c *trackedConn) Write(p []byte) (int, error) {
	if c.hungUp.Load() {
		return len(p), nil
	}
	n, err := c.Conn.Write(p)
	if err != nil && c.hungUp.Load() {
		return len(p), nil
	}
	return n, err
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}
