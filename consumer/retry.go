package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/protocol"
)

// RetryError is a handler's error that chooses when its message is
// delivered again: at At when At is not zero, else After from when the
// handler returned (a time past, or After not positive, means at once).
// The redelivery counts toward MaxRetries like any other: a message out of
// retries is dead-lettered whatever the error asks. For a BatchHandler the
// time applies to the whole batch. Make one with RetryAt or RetryAfter; a
// handler may wrap it (errors.As finds it).
type RetryError struct {
	At    time.Time
	After time.Duration
	// Err is the cause (nil: none), what a dead letter records as its
	// error.
	Err error
}

// RetryAt returns an error that has the handler's message delivered again
// at t instead of after the retry schedule's wait (RetryBackoff,
// RetrySchedule), wrapping causes (errors.Join of them; none is fine).
// Without NonBlockingRetries the message's queue waits until t. With it,
// the retry is a delayed message due at t, and the broker may refuse a time
// further than its maximum delay (90 days by default): the message is then
// dead-lettered with that refusal.
func RetryAt(t time.Time, causes ...error) error {
	return &RetryError{At: t, Err: errors.Join(causes...)}
}

// RetryAfter is RetryAt the handler's return plus d.
func RetryAfter(d time.Duration, causes ...error) error {
	return &RetryError{After: d, Err: errors.Join(causes...)}
}

func (e *RetryError) Error() string {
	when := "after " + e.After.String()
	if !e.At.IsZero() {
		when = "at " + e.At.Format(time.RFC3339Nano)
	}
	if e.Err == nil {
		return "consumer: retry " + when
	}
	return "consumer: retry " + when + ": " + e.Err.Error()
}

func (e *RetryError) Unwrap() error { return e.Err }

// Properties of a message in a group's retry topic (NonBlockingRetries):
// the original's properties, plus its origin and its deliveries so far.
// The consumer takes them off again when it hands the retry to the handler
// as the original, leaving PropRetry.
const (
	// PropRetry marks a message handed to the handler from the retry topic;
	// its value is the error of the delivery that failed (cut to 1 KiB).
	PropRetry = "RETRY"

	PropRetryTopic      = "RETRY_ORIGIN_TOPIC"
	PropRetryQueue      = "RETRY_ORIGIN_QUEUE"
	PropRetryOffset     = "RETRY_ORIGIN_OFFSET"
	PropRetryID         = protocol.RetryOriginID
	PropRetryStoreTime  = "RETRY_ORIGIN_STORE_TIME" // unix milliseconds
	PropRetryProducer   = "RETRY_ORIGIN_PRODUCER"   // the producer stamp's id (absent: unstamped)
	PropRetrySeq        = "RETRY_ORIGIN_SEQ"        // the producer stamp's sequence
	PropRetryDeliveries = "RETRY_DELIVERIES"        // deliveries before it was stored
	// A delayed original's DueAt and ReleasedAt (unix milliseconds) and
	// DelayedHandle ("GROUP@OFFSET/DUE"); absent for any other.
	PropRetryDueAt      = "RETRY_ORIGIN_DUE_AT"
	PropRetryReleasedAt = "RETRY_ORIGIN_RELEASED_AT"
	PropRetryHandle     = "RETRY_ORIGIN_HANDLE"
)

// retryProps are the properties the consumer takes off a retry.
var retryProps = []string{PropRetryTopic, PropRetryQueue, PropRetryOffset, PropRetryID, PropRetryStoreTime,
	PropRetryProducer, PropRetrySeq, PropRetryDeliveries, PropRetryDueAt, PropRetryReleasedAt, PropRetryHandle}

// errPollNonBlocking is Poll's answer with NonBlockingRetries.
var errPollNonBlocking = errors.New("consumer: NonBlockingRetries works with Run and RunBatch: Poll has no retries")

// retryDue is when the message whose n-th delivery failed with err is to be
// delivered again: the time err asks for (RetryAt, RetryAfter), or the
// retry schedule's.
func (c *Consumer) retryDue(n int, err error) time.Time {
	now := c.cfg.clock.Now()
	var re *RetryError
	if errors.As(err, &re) {
		if !re.At.IsZero() {
			return re.At
		}
		return now.Add(max(re.After, 0))
	}
	return now.Add(c.backoff(n))
}

// storeBackoff is the first wait and the cap of the attempts to store a
// dead letter or a retry: the schedule's first wait and its longest.
func (c *Consumer) storeBackoff() (first, limit time.Duration) {
	ws := c.cfg.retryWaits
	first, limit = ws[0], ws[0]
	for _, d := range ws {
		limit = max(limit, d)
	}
	return first, limit
}

// asOriginal returns m as the handler is to see it: a message read from the
// retry topic as the original it retries (nil for any other message, and
// for one without its origin, which is handed as it is).
func (c *Consumer) asOriginal(m *Message) *Message {
	if c.cfg.retryTopic == "" || m.Topic != c.cfg.retryTopic || m.Properties[PropRetryTopic] == "" {
		return nil
	}
	pr := m.Properties
	v := *m
	v.Topic = pr[PropRetryTopic]
	if q, err := strconv.ParseUint(pr[PropRetryQueue], 10, 32); err == nil {
		v.Queue = uint32(q)
	}
	if o, err := strconv.ParseInt(pr[PropRetryOffset], 10, 64); err == nil {
		v.Offset = o
	}
	v.ID = pr[PropRetryID]
	if ms, err := strconv.ParseInt(pr[PropRetryStoreTime], 10, 64); err == nil {
		v.StoreTime = time.UnixMilli(ms)
	}
	v.ProducerID, v.Seq = 0, 0
	if id, err := strconv.ParseUint(pr[PropRetryProducer], 10, 64); err == nil {
		v.ProducerID = id
		v.Seq, _ = strconv.ParseInt(pr[PropRetrySeq], 10, 64)
	}
	// The retry's own release is not the original's.
	v.DueAt, v.ReleasedAt, v.DelayedHandle = time.Time{}, time.Time{}, protocol.Handle{}
	if ms, err := strconv.ParseInt(pr[PropRetryDueAt], 10, 64); err == nil {
		v.DueAt = time.UnixMilli(ms)
	}
	if ms, err := strconv.ParseInt(pr[PropRetryReleasedAt], 10, 64); err == nil {
		v.ReleasedAt = time.UnixMilli(ms)
	}
	if h, err := protocol.ParseHandle(pr[PropRetryHandle]); err == nil {
		v.DelayedHandle = h
	}
	n, _ := strconv.Atoi(pr[PropRetryDeliveries])
	v.Deliveries = max(n, 0) + 1
	v.Properties = make(map[string]string, len(pr))
	for k, val := range pr {
		v.Properties[k] = val
	}
	for _, k := range retryProps {
		delete(v.Properties, k)
	}
	_, v.Recovered = v.Properties[protocol.RecoveredProperty]
	return &v
}

// storeRetry stores m (as the handler saw it, whose delivery failed with
// cause) in the group's retry topic as a delayed message due at due,
// retrying until it is stored or the part stops (false). A retry the broker
// refuses for good (refusedForGood) is dead-lettered instead.
func (c *Consumer) storeRetry(p *part, m *Message, due time.Time, cause error, log interface {
	Warn(string, ...any)
}) bool {
	props := make(map[string]string, len(m.Properties)+len(retryProps)+1)
	for k, v := range m.Properties {
		props[k] = v
	}
	props[PropRetry] = cutError(cause)
	props[PropRetryTopic] = m.Topic
	props[PropRetryQueue] = strconv.FormatUint(uint64(m.Queue), 10)
	props[PropRetryOffset] = strconv.FormatInt(m.Offset, 10)
	props[PropRetryID] = m.ID
	props[PropRetryStoreTime] = strconv.FormatInt(m.StoreTime.UnixMilli(), 10)
	if m.ProducerID != 0 {
		props[PropRetryProducer] = strconv.FormatUint(m.ProducerID, 10)
		props[PropRetrySeq] = strconv.FormatInt(m.Seq, 10)
	}
	props[PropRetryDeliveries] = strconv.Itoa(m.Deliveries)
	if !m.DueAt.IsZero() {
		props[PropRetryDueAt] = strconv.FormatInt(m.DueAt.UnixMilli(), 10)
		props[PropRetryReleasedAt] = strconv.FormatInt(m.ReleasedAt.UnixMilli(), 10)
		props[PropRetryHandle] = m.DelayedHandle.String()
	}
	// Due in whole milliseconds, rounded up: never before due.
	at := due.UnixMilli()
	if due.After(time.UnixMilli(at)) {
		at++
	}
	// Built once, like a dead letter: its retries carry its id and, once
	// sent, its stamp, so it is stored once.
	rm := &protocol.Message{
		ID:         c.dlqPrefix + "-" + strconv.FormatUint(c.dlqIDs.Add(1), 36),
		Topic:      c.cfg.retryTopic,
		Timestamp:  m.Timestamp.UnixMilli(),
		Schedule:   protocol.Schedule{Kind: protocol.ScheduleDelayed, At: max(at, 1), Ref: -1},
		Tag:        m.Tag,
		Body:       m.Body,
		Properties: clientcore.Properties(props, m.Key),
	}
	backoff, limit := c.storeBackoff()
	for {
		ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
		err := rm.Validate()
		if err == nil {
			err = c.cfg.dlq.DeadLetter(ctx, rm, m.Key)
		}
		cancel()
		if err == nil {
			c.stats.retriesStored.Add(1)
			return true
		}
		if p.ctx.Err() != nil {
			return false
		}
		if refusedForGood(err) {
			log.Warn("the retry topic refuses the retry: sending it to the dead-letter topic", "topic", c.cfg.retryTopic,
				"offset", m.Offset, "due", due, "err", err)
			if !c.deadLetter(p, m, fmt.Errorf("retry refused: %w (the delivery's error: %w)", err, cause), log) {
				return false
			}
			c.stats.deadLetters.Add(1)
			return true
		}
		log.Warn("could not store a retry; trying again (the queue waits)", "topic", c.cfg.retryTopic, "offset", m.Offset, "err", err)
		if !wait(p.ctx, c.cfg.clock, backoff) {
			return false
		}
		backoff = min(2*backoff, limit)
	}
}

// refusedForGood reports whether a broker refused a retry as it is
// (INVALID: a time past its maximum delay; MESSAGE_TOO_LARGE), so trying it
// again cannot succeed. Anything else is tried again, a full DELAY_QUOTA
// included: the queue waits, as it would without NonBlockingRetries.
func refusedForGood(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	st := protocol.StatusOf(err)
	return st == protocol.StatusInvalid || st == protocol.StatusMessageTooLarge
}

// cutError is err's text cut to maxErrorProp bytes.
func cutError(err error) string {
	s := err.Error()
	if len(s) > maxErrorProp {
		s = s[:maxErrorProp]
	}
	return s
}

// checkTopic checks that a subscribed topic exists; the group's retry topic
// is created when it does not (where the metaserver auto-creates topics).
func (c *Consumer) checkTopic(ctx context.Context, topic string) error {
	_, err := c.route(ctx, topic)
	if err == nil || topic != c.cfg.retryTopic || c.meta == nil || !errors.Is(err, protocol.ErrUnknownTopic) {
		return err
	}
	if _, err := c.meta.Route(ctx, topic); err != nil {
		if errors.Is(err, protocol.ErrUnknownTopic) {
			return fmt.Errorf("the retry topic does not exist and the metaserver does not create topics (create it, or turn NonBlockingRetries off): %w", err)
		}
		return fmt.Errorf("create the retry topic: %w", err)
	}
	_, err = c.route(ctx, topic)
	return err
}
