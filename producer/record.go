package producer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/sdkmetrics"
)

// record is one message on its way, with its one promise.
type record struct {
	msg      protocol.Message
	size     int
	ctx      context.Context
	deadline time.Time
	key      string
	promise  func(Result, error)
	done     atomic.Bool
	txn      *Txn // the transaction it belongs to (nil: none)

	// Set by dispatch, read by the batch that carries the record.
	group    string
	view     view // the group's master, epoch and state in the route the record was dispatched by
	attempts int
	lastErr  error
	// cause is the last failure before lastErr that was not a timeout: when
	// the last attempt ran into the delivery deadline (a TIMEOUT), it says
	// why the message was still not delivered.
	cause error

	// Idempotence, under the sink's mu while the record is in a sink:
	// gen is the identity generation of rec.msg.Producer (0: unstamped);
	// maybe says an attempt with this stamp had an unknown outcome, and
	// maybeSince when the first did (by the producer's clock; FailoverWait
	// counts from it); possibleDup says an earlier stamp's did and the
	// record left it.
	gen         uint64
	maybe       bool
	maybeSince  time.Time
	maybeEpoch  uint32 // the latest group epoch an unknown attempt was sent for
	possibleDup bool
}

// newRecord makes the record of m, with the message id id, or says why m
// cannot be sent. Its size counts the stamp it will carry if cfg is
// idempotent, and its delivery deadline is the sooner of ctx's and
// DeliveryTimeout from now.
func newRecord(ctx context.Context, m *Message, id string, cfg *config, promise func(Result, error)) (*record, error) {
	now := time.Now()
	rec := &record{ctx: ctx, key: m.Key, promise: promise}
	rec.msg = protocol.Message{
		ID:          id,
		Topic:       m.Topic,
		Reliability: m.Reliability,
		Timestamp:   now.UnixMilli(),
		Tag:         m.Tag,
		Body:        m.Body,
	}
	if len(m.Properties) > 0 || m.Key != "" {
		rec.msg.Properties = clientcore.Properties(m.Properties, m.Key)
	}
	sc, err := schedule(m, cfg.clock.Now())
	if err != nil {
		return nil, fmt.Errorf("producer: message to %q: %w", m.Topic, err)
	}
	rec.msg.Schedule = sc
	if err := rec.msg.Validate(); err != nil {
		return nil, fmt.Errorf("producer: message to %q: %w", m.Topic, err)
	}
	if cfg.idempotent {
		// Its stamp is part of its size in a batch.
		rec.msg.Producer.ID = 1
		rec.size = rec.msg.EncodedSize()
		rec.msg.Producer.ID = 0
	} else {
		rec.size = rec.msg.EncodedSize()
	}
	rec.deadline = now.Add(cfg.deliveryTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(rec.deadline) {
		rec.deadline = dl
	}
	return rec, nil
}

// schedule is the Schedule of m: a delayed one at DeliverAt, or at
// DeliverAfter from now (the producer's clock), or none; an error (of
// status INVALID) when both are set, DeliverAfter is negative, or the time
// is not after 1970.
func schedule(m *Message, now time.Time) (protocol.Schedule, error) {
	invalid := func(format string, args ...any) error {
		return &protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf(format, args...)}
	}
	var at time.Time
	switch {
	case !m.DeliverAt.IsZero() && m.DeliverAfter != 0:
		return protocol.Schedule{}, invalid("give DeliverAt or DeliverAfter, not both (DeliverAt %v, DeliverAfter %v)",
			m.DeliverAt.Format(time.RFC3339Nano), m.DeliverAfter)
	case m.DeliverAfter < 0:
		return protocol.Schedule{}, invalid("DeliverAfter %v is negative", m.DeliverAfter)
	case m.DeliverAfter > 0:
		at = now.Add(m.DeliverAfter)
	case !m.DeliverAt.IsZero():
		at = m.DeliverAt
	default:
		return protocol.Schedule{}, nil
	}
	ms := at.UnixMilli()
	if ms <= 0 {
		return protocol.Schedule{}, invalid("delivery time %v is not after 1970-01-01T00:00:00Z", at.Format(time.RFC3339Nano))
	}
	return protocol.Schedule{Kind: protocol.ScheduleDelayed, At: ms, Ref: -1}, nil
}

// delayed reports whether the record is a delayed message: it goes to its
// queue's internal queue of pending messages, DelayTopic(topic), whose
// sequences are the producer's apart from the queue's own.
func (r *record) delayed() bool { return r.msg.Schedule.Kind == protocol.ScheduleDelayed }

// lineKey is the line (and sequence space) of the record: its queue, or
// for a delayed message that queue's internal queue of pending messages.
func (r *record) lineKey() qkey {
	return qkey{topic: r.msg.Topic, queue: r.msg.Queue, delayed: r.delayed()}
}

// messageID appends the producer's next message id (prefix, '-', n in
// base 36) to buf.
func messageID(buf []byte, prefix string, n uint64) []byte {
	return strconv.AppendUint(append(append(buf, prefix...), '-'), n, 36)
}

// deadlineWithin is the deadline of a request made for the record: d
// from now, or its delivery deadline if sooner.
func (r *record) deadlineWithin(d time.Duration) time.Time {
	deadline := time.Now().Add(d)
	if r.deadline.Before(deadline) {
		deadline = r.deadline
	}
	return deadline
}

// backoff is the wait before the attempt after attempt failed ones (1 for
// the first retry): RetryBackoff doubled per failure up to limit, jittered.
func (c *config) backoff(attempt int, limit time.Duration) time.Duration {
	return routing.Jitter(min(c.retryBackoff<<min(attempt-1, 10), limit))
}

// failed records err as the record's latest failure (see cause).
func (r *record) failed(err error) {
	if r.lastErr != nil && !errors.Is(r.lastErr, protocol.ErrTimeout) {
		r.cause = r.lastErr
	}
	r.lastErr = err
}

// unstamp drops a record's stamp, flagging it a possible duplicate (and
// counting it in stats) if an attempt with that stamp had an unknown
// outcome.
func (r *record) unstamp(stats *statCounters) {
	if r.maybe && !r.possibleDup {
		r.possibleDup = true
		stats.add(sdkmetrics.ProducerPossibleDuplicates)
	}
	r.maybe, r.maybeSince, r.maybeEpoch = false, time.Time{}, 0
	r.gen = 0
	r.msg.Producer, r.msg.Txn = protocol.ProducerStamp{}, 0
}

// stays reports whether a failed record must wait for its own queue: a
// keyed one (gated), and one of a transaction, which must not reach a
// second group.
func (c *config) stays(rec *record) bool { return c.gated(rec) || rec.txn != nil }

// gated reports whether a record passes its key's gate: its key's records
// reach their queue one at a time, in order.
func (c *config) gated(rec *record) bool { return rec.key != "" && !c.moveKeyed }

func lastGroup(rec *record) string {
	if rec.attempts == 0 {
		return ""
	}
	return rec.group
}

// deliveryTimeout is the error of a record whose retries ran out of time:
// err is the last attempt's cause, prev the one before.
func deliveryTimeout(rec *record, err, prev error) error {
	if prev != nil && errors.Is(err, protocol.ErrTimeout) && !errors.Is(prev, protocol.ErrTimeout) {
		// The last attempt ran into the delivery deadline: the attempt
		// before says why the message was still not delivered.
		err = fmt.Errorf("%w (the attempt before: %w)", err, prev)
	}
	return fmt.Errorf("%w: message %s to %q (attempts: %d): %w",
		ErrDeliveryTimeout, rec.msg.ID, rec.msg.Topic, rec.attempts, err)
}

// ended is a record to finish (err nil: with res) or to retry elsewhere.
type ended struct {
	rec *record
	res Result
	err error
}
