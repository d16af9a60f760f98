package consumer

import (
	"context"
	"fmt"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/protocol"
)

// Properties a dead letter carries besides the original's.
const (
	PropOriginTopic  = "DLQ_ORIGIN_TOPIC"
	PropOriginQueue  = "DLQ_ORIGIN_QUEUE"
	PropOriginOffset = "DLQ_ORIGIN_OFFSET"
	PropOriginID     = protocol.DeadLetterOriginID
	PropError        = "DLQ_ERROR"      // the last delivery's error (cut to 1 KiB)
	PropDeliveries   = "DLQ_DELIVERIES" // how many times it was delivered
)

const maxErrorProp = 1 << 10

// work is Run's worker of one part: it hands the part's messages to the
// handler in offset order, retrying failures and dead-lettering messages
// out of retries. prev is the queue's previous worker (a part of an earlier
// generation), which it waits for so a queue taken back never has two
// handler calls at once.
func (c *Consumer) work(p *part, prev <-chan struct{}, done chan struct{}) {
	defer c.workWG.Done()
	defer close(done)
	if prev != nil {
		select {
		case <-prev:
		case <-p.ctx.Done():
			return
		}
	}
	max := 1
	if c.batch {
		max = c.cfg.maxPollRecords
	}
	// Run's handler gets one message, never the slice: one slice serves
	// every hand-out. RunBatch's handler may keep its slice.
	var scratch []*Message
	for {
		// A queue let go (or a consumer closing) hands nothing more out;
		// nor does a member whose lease lapsed (lease.go).
		if p.ctx.Err() != nil || !c.waitLease(p.ctx) {
			return
		}
		var msgs []*Message
		if c.batch {
			msgs = p.take(nil, max)
		} else {
			scratch = p.take(scratch[:0], max)
			msgs = scratch
		}
		if len(msgs) == 0 {
			select {
			case <-p.ready:
				continue
			case <-p.ctx.Done():
				return
			case <-p.hctx.Done():
				return
			}
		}
		if !c.deliver(p, msgs) {
			return
		}
	}
}

// deliver hands msgs to the handler until it succeeds or they are out of
// retries (then dead-lettered), and marks them processed. With
// NonBlockingRetries a failure stores the messages in the retry topic
// instead of waiting, and marks them processed at once. It returns false
// when the part or the consumer stopped first.
func (c *Consumer) deliver(p *part, msgs []*Message) bool {
	log := p.log
	first, last := msgs[0].Offset, msgs[len(msgs)-1].Offset
	// Messages of the retry topic are handed as the originals they retry.
	for i, m := range msgs {
		if v := c.asOriginal(m); v != nil {
			msgs[i] = v
			c.stats.redeliveries.Add(1)
		}
	}
	for {
		err := c.call(p, msgs, log)
		if err == nil {
			p.noteRedelivered(msgs, c.cfg.clock.Now())
			p.done(first, last)
			return true
		}
		if p.hctx.Err() != nil || p.ctx.Err() != nil {
			return false // revoked or closing: not processed, delivered again later
		}
		c.stats.handlerErrors.Add(1)
		if c.cfg.nonBlocking {
			if !c.retryLater(p, msgs, err, log) {
				return false
			}
			p.done(first, last)
			return true
		}
		n := msgs[0].Deliveries
		if n > c.cfg.maxRetries {
			log.Warn("handler failed: out of retries, sending to the dead-letter topic", "offset", msgs[0].Offset,
				"messages", len(msgs), "deliveries", n, "topic", c.cfg.deadLetter, "err", err)
			for _, m := range msgs {
				if !c.deadLetter(p, m, err, log) {
					return false
				}
				c.stats.deadLetters.Add(1)
			}
			p.done(first, last)
			return true
		}
		due := c.retryDue(n, err)
		d := due.Sub(c.cfg.clock.Now())
		log.Debug("handler failed: delivering again", "offset", msgs[0].Offset, "deliveries", n, "in", d, "err", err)
		if d > 0 && !wait(p.hctx, c.cfg.clock, d) || p.ctx.Err() != nil || p.hctx.Err() != nil {
			return false
		}
		for _, m := range msgs {
			m.Deliveries++
		}
		c.stats.redeliveries.Add(int64(len(msgs)))
	}
}

// retryLater stores each of msgs, whose delivery failed with err, in the
// retry topic (NonBlockingRetries), or in the dead-letter topic when it is
// out of retries. It returns false when the part stopped first.
func (c *Consumer) retryLater(p *part, msgs []*Message, err error, log interface {
	Warn(string, ...any)
	Debug(string, ...any)
}) bool {
	var due time.Time
	for _, m := range msgs {
		n := m.Deliveries
		if n > c.cfg.maxRetries {
			log.Warn("handler failed: out of retries, sending to the dead-letter topic", "offset", m.Offset,
				"deliveries", n, "topic", c.cfg.deadLetter, "err", err)
			if !c.deadLetter(p, m, err, log) {
				return false
			}
			c.stats.deadLetters.Add(1)
			continue
		}
		if due.IsZero() {
			due = c.retryDue(n, err) // one time for the batch
		}
		log.Debug("handler failed: storing a retry", "offset", m.Offset, "deliveries", n, "due", due, "err", err)
		if !c.storeRetry(p, m, due, err, log) {
			return false
		}
	}
	return true
}

// backoff is the wait before the delivery after the n-th.
func (c *Consumer) backoff(n int) time.Duration {
	ws := c.cfg.retryWaits
	return ws[min(max(n-1, 0), len(ws)-1)]
}

// call runs the handler, turning a panic into an error.
func (c *Consumer) call(p *part, msgs []*Message, log interface {
	Error(string, ...any)
}) (err error) {
	defer func() {
		if r := recover(); r != nil {
			c.stats.panics.Add(1)
			log.Error("handler panicked", "offset", msgs[0].Offset, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("consumer: handler panicked: %v", r)
		}
	}()
	return c.handle(p.hctx, p, msgs)
}

// deadLetter stores m in the dead-letter topic, retrying until it is stored
// or the part stops (false).
func (c *Consumer) deadLetter(p *part, m *Message, cause error, log interface {
	Warn(string, ...any)
}) bool {
	props := make(map[string]string, len(m.Properties)+6)
	for k, v := range m.Properties {
		props[k] = v
	}
	errText := cutError(cause)
	props[PropOriginTopic] = m.Topic
	props[PropOriginQueue] = strconv.FormatUint(uint64(m.Queue), 10)
	props[PropOriginOffset] = strconv.FormatInt(m.Offset, 10)
	props[PropOriginID] = m.ID
	props[PropError] = errText
	props[PropDeliveries] = strconv.Itoa(m.Deliveries)
	// The dead letter is built once: its retries carry its id (and, once
	// sent, its stamp), so a retry after an unknown outcome is not stored
	// twice.
	dl := &protocol.Message{
		ID:         c.dlqPrefix + "-" + strconv.FormatUint(c.dlqIDs.Add(1), 36),
		Topic:      c.cfg.deadLetter,
		Timestamp:  time.Now().UnixMilli(),
		Tag:        m.Tag,
		Body:       m.Body,
		Properties: clientcore.Properties(props, m.Key),
	}
	backoff, limit := c.storeBackoff()
	for {
		ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
		err := dl.Validate()
		if err == nil {
			err = c.cfg.dlq.DeadLetter(ctx, dl, m.Key)
		}
		cancel()
		if err == nil {
			return true
		}
		if p.ctx.Err() != nil {
			return false
		}
		log.Warn("could not store a dead letter; retrying (the queue waits)", "topic", c.cfg.deadLetter, "offset", m.Offset, "err", err)
		if !wait(p.ctx, c.cfg.clock, backoff) {
			return false
		}
		backoff = min(2*backoff, limit)
	}
}
