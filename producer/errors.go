package producer

import (
	"errors"
	"fmt"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

// Errors of the producer. The package documentation's Errors section says
// which errors every call can give and how to match them.
var (
	// ErrClosed is returned by a closed producer.
	ErrClosed = errors.New("producer: closed")
	// ErrBufferFull is returned when the buffer is full and FailWhenFull is set.
	ErrBufferFull = errors.New("producer: buffer full")
	// ErrConnLost means a broker's connection broke or could not be made.
	ErrConnLost = errors.New("producer: connection to broker lost")
	// ErrUnreachable means no metaserver node answered a route lookup or
	// the request for the producer's identity.
	ErrUnreachable = errors.New("producer: metaserver unreachable")
	// ErrDeliveryTimeout means retries ran out of time; the last cause is
	// wrapped too.
	ErrDeliveryTimeout = errors.New("producer: not delivered in time")
	// ErrFenced means a later instance of this named producer (see
	// Identity) has written to a queue: brokers refuse this one's messages
	// (PRODUCER_FENCED). It is not retried; every message the producer
	// still holds, and every later send, fails with it. Close the producer.
	ErrFenced = errors.New("producer: fenced by a later instance of the same producer")
)

// ofKind is fmt.Errorf(format, args...) under the sentinel kind, for a
// message's error to wrap: it matches kind and its text drops kind's
// "producer: " (the message's error names the producer).
func ofKind(kind error, format string, args ...any) error {
	return clientcore.OfKind(kind, fmt.Errorf(format, args...))
}

// sendErr gives an error of a SEND call to a broker its public sentinel.
func sendErr(group, addr string, err error) error {
	switch {
	case errors.Is(err, transport.ErrClosed):
		// Only Close closes the producer's connections.
		return ofKind(ErrClosed, "send to group %s at %s: %w", group, addr, err)
	case errors.Is(err, transport.ErrConnLost):
		return ofKind(ErrConnLost, "group %s at %s: %w", group, addr, err)
	}
	return fmt.Errorf("send to group %s at %s: %w", group, addr, err)
}

// metaErr gives an error of a metaserver call (what: "route lookup",
// "producer id") its public sentinel. A call that got no answer (no node
// reachable, a broken connection, no answer in time) means the metaserver
// is unreachable; a status the cluster answered (UNKNOWN_TOPIC, INVALID)
// stays as it is. The message's error around it names the producer, the
// message and its topic, so this adds only what failed.
func metaErr(what string, err error) error {
	switch clientcore.KindOf(err) {
	case clientcore.KindClosed:
		return ofKind(ErrClosed, "%s: %w", what, err)
	case clientcore.KindUnreachable:
		return ofKind(ErrUnreachable, "%s: %w", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// lookupErr is metaErr of a route lookup.
func lookupErr(err error) error { return metaErr("route lookup", err) }

// maybeStored reports whether err carries a status that leaves the
// outcome unknown (protocol.Status.MaybeStored); an idempotent producer
// retries those.
func maybeStored(err error) bool {
	var pe *protocol.Error
	return errors.As(err, &pe) && pe.Status.MaybeStored()
}
