package producer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/protocol"
)

// sink batches the records bound for one broker group. A batch leaves when
// it is full, when it is urgent (a synchronous Send or a Flush), or when the
// oldest record has lingered long enough, and only while fewer than
// MaxInflightPerGroup batches are in flight: under load records pile up
// behind the in-flight batches and leave together.
type sink struct {
	c     *Client
	group string

	mu       sync.Mutex
	buf      []*record
	bufBytes int
	oldest   time.Time
	urgent   bool
	inflight int
	timer    *time.Timer
	// closedOut holds records sendLocked could not send because the producer
	// is closed; unlock ends them (promises never run under mu).
	closedOut []*record
}

// unlock releases mu and ends the records found closed meanwhile.
func (s *sink) unlock() {
	out := s.closedOut
	s.closedOut = nil
	s.mu.Unlock()
	for _, r := range out {
		s.c.finish(r, Result{}, ErrClosed)
	}
}

func (c *Client) sink(group string) *sink {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sinks[group]
	if s == nil {
		s = &sink{c: c, group: group}
		c.sinks[group] = s
	}
	return s
}

func (s *sink) add(rec *record, urgent bool) {
	s.mu.Lock()
	if len(s.buf) == 0 {
		s.oldest = time.Now()
	}
	s.buf = append(s.buf, rec)
	s.bufBytes += rec.size
	s.urgent = s.urgent || urgent
	s.sendLocked()
	s.unlock()
}

func (s *sink) kick() {
	s.mu.Lock()
	s.sendLocked()
	s.unlock()
}

// sendLocked starts as many batches as may leave now.
func (s *sink) sendLocked() {
	cfg := &s.c.cfg
	for len(s.buf) > 0 && s.inflight < cfg.maxInflight {
		ready := s.urgent || cfg.linger == 0 || s.bufBytes >= cfg.maxBatchBytes ||
			s.c.flushing.Load() > 0 || time.Since(s.oldest) >= cfg.linger
		if !ready {
			if s.timer == nil {
				s.timer = time.AfterFunc(cfg.linger-time.Since(s.oldest), func() {
					s.mu.Lock()
					s.timer = nil
					s.sendLocked()
					s.unlock()
				})
			}
			return
		}
		n, bytes := 0, 0
		for n < len(s.buf) && (n == 0 || bytes+s.buf[n].size <= cfg.maxBatchBytes) {
			bytes += s.buf[n].size
			n++
		}
		batch := make([]*record, n)
		copy(batch, s.buf)
		s.buf = append(s.buf[:0], s.buf[n:]...)
		s.bufBytes -= bytes
		if len(s.buf) == 0 {
			s.urgent = false
		} else {
			s.oldest = time.Now()
		}
		if s.c.dead.Load() {
			// Closed: no goroutine may start now (Close may be waiting).
			s.closedOut = append(s.closedOut, batch...)
			continue
		}
		s.inflight++
		s.c.wg.Add(1)
		go s.send(batch)
	}
}

// send sends one batch and hands every record its result, or a retry.
func (s *sink) send(batch []*record) {
	defer s.c.wg.Done()
	c := s.c
	deadline := time.Now().Add(c.cfg.requestTimeout)
	for _, r := range batch {
		if r.deadline.Before(deadline) {
			deadline = r.deadline
		}
	}
	addr := batch[len(batch)-1].addr // the newest route's master
	// The transport copies the body into its write buffer before Call
	// waits, so the buffer goes back to the pool once Call returns.
	bp := bodyPool.Get().(*[]byte)
	// A SEND body is a u32 count and the messages, encoded straight from the
	// records (no copy of the messages into a slice first).
	body := binary.BigEndian.AppendUint32((*bp)[:0], uint32(len(batch)))
	for _, r := range batch {
		body = protocol.AppendMessage(body, &r.msg)
	}
	defer func() {
		if cap(body) <= 4<<20 {
			*bp = body[:0]
			bodyPool.Put(bp)
		}
	}()
	conn := c.conn(addr)
	if conn == nil {
		s.mu.Lock()
		s.inflight--
		s.mu.Unlock()
		for _, r := range batch {
			c.finish(r, Result{}, ErrClosed)
		}
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	start := time.Now()
	resp, err := conn.Call(ctx, protocol.CodeSend, body)
	cancel()
	latency := time.Since(start)

	s.mu.Lock()
	s.inflight--
	s.sendLocked()
	s.unlock()

	var results []protocol.SendResult
	if err == nil {
		results, err = protocol.DecodeSendResponse(resp.Body, nil)
		if err == nil && len(results) != len(batch) {
			err = fmt.Errorf("%w: broker answered %d results for %d messages", protocol.ErrMalformed, len(results), len(batch))
		}
	}
	if err != nil {
		// A broken connection or a late answer counts against the group;
		// a status the broker answered for the whole batch, as its row of
		// the status table says.
		var pe *protocol.Error
		fault := !errors.As(err, &pe) || pe.Status.Fault()
		c.sel.Avoider().Report(s.group, latency, fault, c.cfg.clock.Now())
		err = sendErr(s.group, addr, err)
		for _, r := range batch {
			c.retryOrFail(r, err)
		}
		return
	}
	fault := false
	for _, res := range results {
		if res.Status != protocol.StatusOK && res.Status.Fault() {
			fault = true
			break
		}
	}
	c.sel.Avoider().Report(s.group, latency, fault, c.cfg.clock.Now())
	for i, res := range results {
		r := batch[i]
		if res.Status == protocol.StatusOK {
			c.finish(r, Result{ID: r.msg.ID, Topic: r.msg.Topic, Queue: r.msg.Queue, QueueOffset: res.QueueOffset,
				LogOffset: res.LogOffset, Group: s.group, Broker: addr}, nil)
			continue
		}
		c.retryOrFail(r, &protocol.Error{Status: res.Status, Message: fmt.Sprintf("from group %s at %s", s.group, addr)})
	}
}

var bodyPool = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

// failAll ends every buffered record with err.
func (s *sink) failAll(err error) {
	s.mu.Lock()
	buf := s.buf
	s.buf = nil
	s.bufBytes = 0
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	s.mu.Unlock()
	for _, r := range buf {
		s.c.finish(r, Result{}, err)
	}
}
