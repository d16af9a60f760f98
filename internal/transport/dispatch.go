package transport

import (
	"fmt"

	"github.com/ferrymq/ferrymq/protocol"
)

// Dispatch: the workers, and the ordered and inline hand-offs of a
// connection's requests (see the package doc's Ordered codes and Inline
// hand-offs).

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
