package transport

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/protocol"
)

// Accepting connections, and the limits on them before they send anything:
// MaxConns, the Gate's Open, and the BUSY answer of a connection refused.

// ServerStats are a server's connection counters.
type ServerStats struct {
	// Conns is the connections open now, those in their handshake
	// included; PeakConns the most there were at once.
	Conns, PeakConns int64
	// Refused counts connections closed at once: over MaxConns, or
	// refused by the Gate.
	Refused int64
	// UntrustedTimeouts counts connections closed, after their first
	// request, for being untrusted at the deadline their Gate set.
	UntrustedTimeouts int64
	// HandshakeTimeouts counts connections closed for not completing their
	// handshake and first request within HandshakeTimeout.
	HandshakeTimeouts int64
	// HandshakeFailures counts failed TLS handshakes, plaintext peers on a
	// TLS port and TLS peers on a plaintext one.
	HandshakeFailures int64
	// Oversize counts connections closed for declaring a frame over the
	// cap their Gate set before they were trusted.
	Oversize int64
	// Dropped counts connections closed at their Gate's request (Open's
	// drop) or by DropConns.
	Dropped int64
}

type serverStats struct {
	conns, peak, refused, handshakeTimeouts, handshakeFailures, oversize atomic.Int64
	untrustedTimeouts, dropped                                           atomic.Int64
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
		Oversize: s.stats.oversize.Load(), UntrustedTimeouts: s.stats.untrustedTimeouts.Load(),
		Dropped: s.stats.dropped.Load(),
	}
}

// accept accepts connections until Close. One over MaxConns, or that the
// Gate refuses, is refused (refuseBusy); every other gets its reader.
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
			s.refuseOverCap(nc)
			continue
		} else {
			s.stats.notePeak(n)
		}
		c := &serverConn{
			s:   s,
			raw: nc,
			w:   newWriter(s.cfg.MaxWriteBuffer, s.cfg.WriteTimeout),
			sem: make(chan struct{}, s.cfg.MaxInflightPerConn),
		}
		if s.cfg.Gate != nil {
			adm, err := s.cfg.Gate.Open(nc.RemoteAddr(), time.Now(), c.drop)
			if err != nil {
				s.stats.conns.Add(-1)
				s.refuseByGate(nc, err)
				continue
			}
			c.adm = adm
			c.admOpen.Store(true)
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
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
			c.closeAdmission()
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

// refuseOverCap counts and warns (rate-limited) about a connection over
// MaxConns, and refuses it with refuseBusy.
func (s *Server) refuseOverCap(nc net.Conn) {
	s.stats.refused.Add(1)
	remote := nc.RemoteAddr().String()
	s.limited.warn("refused", fmt.Sprintf("refusing connection from %s: %d connections are open, the cap (MaxConns)", remote, s.cfg.MaxConns),
		"remote", remote, "max_conns", s.cfg.MaxConns)
	msg := fmt.Sprintf("%s is over its connection cap (%d connections open): try again later, or another server", nc.LocalAddr(), s.cfg.MaxConns)
	s.refuseBusy(nc, msg)
}

// refuseByGate counts and warns (rate-limited) about a connection the
// Gate refused, and refuses it with refuseBusy, saying why.
func (s *Server) refuseByGate(nc net.Conn, why error) {
	s.stats.refused.Add(1)
	remote := nc.RemoteAddr().String()
	s.limited.warn("refused_gate", fmt.Sprintf("refusing connection from %s: %v", remote, why), "remote", remote)
	msg := fmt.Sprintf("%s refuses the connection: %v: try again later, or another server", nc.LocalAddr(), why)
	s.refuseBusy(nc, msg)
}

// refusalMaxFrame is the largest request a refused connection may send to
// be answered why (refuseBusy; a plaintext peer on a TLS port).
const refusalMaxFrame = 64 << 10

// refuseBusy ends a connection refused at its acceptance. On a plaintext
// port it reads the connection's first request (within busyWait) and
// answers it BUSY with msg (why: the server is over its connection cap,
// say), so the client knows it met a live server that is full (and may
// retry, here or elsewhere), not something that hangs up on every client;
// then it closes. A oneway request, a frame over refusalMaxFrame, or bytes
// that are not a frame are closed unanswered.
func (s *Server) refuseBusy(nc net.Conn, msg string) {
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
		f, err := readFrame(nc, refusalMaxFrame, growBig)
		if err != nil || f.IsResponse() || f.IsOneway() {
			return
		}
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

// DropConns closes every trusted connection whose identity (what a
// handler stored with Request.SetPeer) match reports, as a Gate's drop
// does: what it was answered is still written, nothing more is read. The
// owner calls it when identities it trusted are revoked; the server knows
// nothing of them. It returns how many it closed. It never blocks on a
// peer; match is called under the server's lock and must be quick.
func (s *Server) DropConns(match func(peer any) bool, why error) int {
	s.mu.Lock()
	var drop []*serverConn
	for c := range s.conns {
		if !c.trusted.Load() || c.dropped.Load() {
			continue
		}
		var peer any
		if p := c.peer.Load(); p != nil {
			peer = *p
		}
		if match(peer) {
			drop = append(drop, c)
		}
	}
	s.mu.Unlock()
	for _, c := range drop {
		c.drop(why)
	}
	return len(drop)
}

// forget drops a connection that is gone from the server's set and count.
func (s *Server) forget(c *serverConn) {
	s.mu.Lock()
	_, ok := s.conns[c]
	delete(s.conns, c)
	s.mu.Unlock()
	if ok {
		s.stats.conns.Add(-1)
		c.closeAdmission()
	}
}
