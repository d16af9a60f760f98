package clientcore

import (
	"context"
	"errors"
	"strings"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

// ErrNoNode is the metaserver client's error when no metaserver node could
// be reached (metaserver/client.ErrNoNode is this error). It is defined
// here so that the core tells it apart without importing the metaserver
// client, which uses the core's pool.
var ErrNoNode = errors.New("metaserver client: no metaserver node reachable")

// Kind is what a failed call's error means to an SDK, which gives each kind
// its own public sentinel (producer.ErrUnreachable, consumer.ErrClosed...).
type Kind uint8

const (
	// KindOther is a status a server answered, or anything else: the
	// error stays as it is.
	KindOther Kind = iota
	// KindClosed: the client was closed (its connections refuse calls).
	KindClosed
	// KindUnreachable: nobody answered: no metaserver node could be
	// reached, a connection was lost, or the call's deadline passed (not a
	// TLS handshake that failed for the TLS settings: KindOther).
	KindUnreachable
)

// KindOf classifies err.
func KindOf(err error) Kind {
	switch {
	case err == nil:
		return KindOther
	case errors.Is(err, transport.ErrClosed):
		return KindClosed
	case errors.Is(err, transport.ErrTLSMismatch):
		// The TLS settings do not match the server's: no retry helps,
		// though the connection was lost too.
		return KindOther
	case errors.Is(err, ErrNoNode), errors.Is(err, transport.ErrConnLost), errors.Is(err, protocol.ErrTimeout),
		errors.Is(err, context.DeadlineExceeded):
		return KindUnreachable
	}
	return KindOther
}

// Retriable reports whether a failed attempt may be tried again: a status
// whose row in the status table says so, or no answer at all.
func Retriable(err error) bool {
	return protocol.IsRetriable(err) || KindOf(err) == KindUnreachable
}

// kindError is err given an SDK's sentinel (its kind), for a message's
// error to wrap: that error names the SDK, so this one says its kind
// without the sentinel's package prefix ("metaserver unreachable: route
// lookup: ..."). It matches the sentinel and everything err matches.
type kindError struct {
	kind error // a sentinel
	err  error
}

func (e *kindError) Error() string {
	text := e.kind.Error()
	if _, rest, ok := strings.Cut(text, ": "); ok {
		text = rest
	}
	return text + ": " + e.err.Error()
}

func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// OfKind returns err under the sentinel kind: it matches both, and its text
// is kind's without its package prefix, then err's.
func OfKind(kind, err error) error { return &kindError{kind: kind, err: err} }
