//go:build !unix

package transport

import "net"

// socket writes to a socket without waiting; only on unix.
type socket struct{}

// socketOf returns nil: replies always go through the writer goroutine.
func socketOf(net.Conn) *socket { return nil }

func (r *socket) tryWrite([]byte) (int, error) { return 0, nil }
