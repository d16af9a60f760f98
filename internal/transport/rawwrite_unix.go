//go:build unix

package transport

import (
	"net"
	"syscall"
)

// socket writes to a socket without waiting (see writer.flush).
type socket struct{ rc syscall.RawConn }

// socketOf returns nc's raw socket, or nil when nc has none (a wrapped or
// in-memory connection: its replies always go through the writer goroutine).
func socketOf(nc net.Conn) *socket {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return &socket{rc}
}

// tryWrite writes as much of b as the socket takes now, without waiting
// (the runtime keeps sockets non-blocking): it returns what was written,
// and an error only for a failed write, not for a full socket.
func (r *socket) tryWrite(b []byte) (int, error) {
	var n int
	var werr error
	err := r.rc.Write(func(fd uintptr) bool {
		for n < len(b) {
			m, e := syscall.Write(int(fd), b[n:])
			if m > 0 {
				n += m
			}
			if e == syscall.EINTR {
				continue
			}
			if e != nil && e != syscall.EAGAIN {
				werr = e
			}
			if e != nil || m <= 0 {
				break
			}
		}
		return true // never wait for the socket to take more
	})
	if err == nil {
		err = werr
	}
	return n, err
}
