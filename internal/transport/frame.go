package transport

import (
	"bufio"
	"errors"
	"fmt"
	"io"

	"github.com/ferrymq/ferrymq/protocol"
)

// Errors of the transport.
var (
	// ErrConnLost fails every call pending on a connection that broke.
	ErrConnLost = errors.New("transport: connection lost")
	// ErrClosed is returned by a closed Client or Server.
	ErrClosed = errors.New("transport: closed")
	// ErrBadFrame marks a peer that sent something that is not a valid frame;
	// its connection is closed.
	ErrBadFrame = errors.New("transport: bad frame from peer")
)

// readFrame reads one whole frame. Its buffer is freshly allocated (the frame
// is handed to another goroutine), and never larger than the validated length.
func readFrame(br *bufio.Reader) (protocol.Frame, error) {
	var lenBuf [4]byte
	if _, err := io.ReadFull(br, lenBuf[:]); err != nil {
		return protocol.Frame{}, err
	}
	n, err := protocol.FrameLength(lenBuf[:])
	if err != nil {
		return protocol.Frame{}, fmt.Errorf("%w: %w", ErrBadFrame, err)
	}
	buf := make([]byte, n)
	copy(buf, lenBuf[:])
	if _, err := io.ReadFull(br, buf[4:]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return protocol.Frame{}, fmt.Errorf("%w: closed mid-frame: %w", ErrBadFrame, err)
	}
	f, err := protocol.DecodeFrame(buf)
	if err != nil {
		return protocol.Frame{}, fmt.Errorf("%w: %w", ErrBadFrame, err)
	}
	return f, nil
}
