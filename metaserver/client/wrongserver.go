package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

var (
	// ErrNotMetaserver matches the error of a call whose addresses all
	// answered, but none as a metaserver: a broker's port, or a server that
	// does not speak ferrymq (see WrongServerError). The addresses given
	// are wrong; trying again does not help.
	ErrNotMetaserver = errors.New("not a metaserver")
	// ErrNotFerrymq matches a WrongServerError whose server does not speak
	// the ferrymq protocol at all (an HTTP port, say). It also matches
	// ErrNotMetaserver.
	ErrNotFerrymq = errors.New("not a ferrymq server")
)

// WrongServerError is what answered at an address that is not a
// metaserver. It matches ErrNotMetaserver, and ErrNotFerrymq when the
// server does not speak ferrymq.
type WrongServerError struct {
	Addr string
	// Identity is what the server said it is, when it said (Kind "" when
	// it did not).
	Identity protocol.Identity
	// Ferrymq reports whether the server speaks the ferrymq protocol.
	Ferrymq bool
	// Why says what the server did, when it did not say what it is.
	Why string
}

func (e *WrongServerError) Error() string {
	switch {
	case !e.Ferrymq:
		return fmt.Sprintf("%s is not a ferrymq server: %s", e.Addr, e.Why)
	case e.Identity.Kind == protocol.KindBroker:
		return fmt.Sprintf("%s is a ferrymq broker (group %s, id %s), not a metaserver", e.Addr, e.Identity.Group, e.Identity.ID)
	case e.Identity.Kind != "":
		return fmt.Sprintf("%s is a ferrymq %s (id %s), not a metaserver", e.Addr, e.Identity.Kind, e.Identity.ID)
	default:
		return fmt.Sprintf("%s is a ferrymq server but not a metaserver, or not one of this version: %s", e.Addr, e.Why)
	}
}

// Is matches ErrNotMetaserver, and ErrNotFerrymq for a server that does
// not speak ferrymq.
func (e *WrongServerError) Is(target error) bool {
	return target == ErrNotMetaserver || target == ErrNotFerrymq && !e.Ferrymq
}

// wrongServers is the error of a call whose every address is not a
// metaserver: each address's WrongServerError, in the order found.
type wrongServers []*WrongServerError

func (w wrongServers) Error() string {
	parts := make([]string, len(w))
	for i, e := range w {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "; ")
}

func (w wrongServers) Unwrap() []error {
	out := make([]error, len(w))
	for i, e := range w {
		out[i] = e
	}
	return out
}

// identifyTimeout bounds the IDENTIFY a suspect address is asked.
const identifyTimeout = time.Second

// suspect reports whether a call's error may mean that addr is not a
// metaserver: it answered UNKNOWN_CODE (no handler for a metaserver
// request), sent something that is not a frame, or took the connection and
// closed it without an answer.
func suspect(err error) bool {
	return errors.Is(err, protocol.ErrUnknownCode) || badFrame(err) || closedUnanswered(err)
}

// badFrame reports whether err is a peer's bytes that are not a ferrymq
// frame (not a frame cut short by a close, which a crashing server sends).
func badFrame(err error) bool {
	return errors.Is(err, transport.ErrBadFrame) && !errors.Is(err, io.ErrUnexpectedEOF)
}

// closedUnanswered reports whether err is a connection that was made and
// then closed (or reset) by the peer before it answered.
func closedUnanswered(err error) bool {
	var op *net.OpError
	if !errors.Is(err, transport.ErrConnLost) || errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// identify finds out whether addr, whose answer to a request of code was
// callErr (one that suspect reports), is not a metaserver, and says what it
// is instead; nil when it cannot tell, or when it is a metaserver after all
// (callErr then stands). A server that answered UNKNOWN_CODE is asked
// IDENTIFY (a broker answers it); a server that closed the connection
// unanswered is asked too, on a new connection. Only an answer proves
// anything: bytes that are not a frame are enough by themselves, an
// answered IDENTIFY says what the server is, but a server that closes
// again without answering is not judged (a metaserver at its connection
// cap, or shutting down, does that too; a current one says BUSY first):
// the call goes on as if it were unreachable.
func identify(ctx context.Context, tc *transport.Client, addr string, code protocol.Code, callErr error) *WrongServerError {
	if badFrame(callErr) {
		return &WrongServerError{Addr: addr, Why: "it answered with bytes that are not a ferrymq frame"}
	}
	ctx, cancel := context.WithTimeout(ctx, identifyTimeout)
	defer cancel()
	resp, err := tc.Call(ctx, protocol.CodeIdentify, nil)
	switch {
	case err == nil:
		id, err := protocol.DecodeIdentity(resp.Body)
		if err != nil || id.Kind == protocol.KindMetaserver {
			return nil
		}
		return &WrongServerError{Addr: addr, Identity: id, Ferrymq: true}
	case badFrame(err):
		return &WrongServerError{Addr: addr, Why: "it answered with bytes that are not a ferrymq frame"}
	case errors.Is(err, protocol.ErrUnknownCode) && errors.Is(callErr, protocol.ErrUnknownCode):
		return &WrongServerError{Addr: addr, Ferrymq: true,
			Why: fmt.Sprintf("it has no handler for %v (request code %d) and does not say what it is", code, uint16(code))}
	}
	return nil
}
