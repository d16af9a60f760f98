package consumer

import (
	"errors"
	"fmt"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

// Errors of the consumer. The package documentation's Errors section says
// which errors every call can give and how to match them.
var (
	// ErrClosed is returned by a closed consumer.
	ErrClosed = errors.New("consumer: closed")
	// ErrUnreachable means no metaserver node answered in time.
	ErrUnreachable = errors.New("consumer: metaserver unreachable")
	// ErrRebalanced means a commit was refused because the group moved to
	// a newer generation (STALE_GENERATION, also matched by
	// protocol.ErrStaleGeneration): the member takes its new assignment,
	// and what it had processed of a queue it lost and not committed is
	// delivered again to the queue's new owner.
	ErrRebalanced = errors.New("consumer: the group rebalanced")
	// ErrBusy is returned by Run or Poll while the other style is in use,
	// or by a second concurrent Run.
	ErrBusy = errors.New("consumer: Run and Poll cannot be mixed, and Run runs once at a time")
	// ErrUnknownTopic means a subscribed topic does not exist (also
	// matched by protocol.ErrUnknownTopic).
	ErrUnknownTopic = errors.New("consumer: unknown topic")
)

// metaErr gives an error of a metaserver call its public sentinel.
func metaErr(what string, err error) error {
	switch {
	case errors.Is(err, protocol.ErrStaleGeneration):
		return fmt.Errorf("%w: %s: %w", ErrRebalanced, what, err)
	case errors.Is(err, protocol.ErrUnknownTopic):
		return fmt.Errorf("%w: %s: %w", ErrUnknownTopic, what, err)
	}
	switch clientcore.KindOf(err) {
	case clientcore.KindClosed:
		return fmt.Errorf("%w: %s: %w", ErrClosed, what, err)
	case clientcore.KindUnreachable:
		return fmt.Errorf("%w: %s: %w", ErrUnreachable, what, err)
	}
	return fmt.Errorf("consumer: %s: %w", what, err)
}

// masterDown reports whether a failed PULL means the master is not serving
// (so the slave should be asked).
func masterDown(err error) bool {
	return errors.Is(err, transport.ErrConnLost) || errors.Is(err, protocol.ErrTimeout) ||
		errors.Is(err, protocol.ErrNotMaster) || errors.Is(err, protocol.ErrShuttingDown) ||
		errors.Is(err, protocol.ErrNoRoute)
}
