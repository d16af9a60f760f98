package clientcore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// KeyHash is the FNV-1a hash of a message key: a keyed message's queue is
// KeyHash(key) mod the topic's queues, for the producer and the core's
// Sender alike.
func KeyHash(key string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return h.Sum32()
}

// Properties returns a message's properties as sent: props sorted by key,
// then key (if set) under "key".
func Properties(props map[string]string, key string) []protocol.Property {
	out := make([]protocol.Property, 0, len(props)+1)
	for k, v := range props {
		out = append(out, protocol.Property{Key: k, Value: v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	if key != "" {
		out = append(out, protocol.Property{Key: protocol.KeyProperty, Value: key})
	}
	return out
}

// DecodeSendAnswer decodes a SEND answer of n messages: one result each.
func DecodeSendAnswer(resp protocol.Frame, n int) ([]protocol.SendResult, error) {
	results, err := protocol.DecodeSendResponse(resp.Body, nil)
	if err == nil && len(results) != n {
		err = fmt.Errorf("%w: broker answered %d results for %d messages", protocol.ErrMalformed, len(results), n)
	}
	return results, err
}

// NeverSent reports whether a request failed before any byte of it could
// leave: no connection could be made.
func NeverSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// SenderConfig configures a Sender.
type SenderConfig struct {
	// Lookup reads a topic's route; it may create the topic (the
	// metaserver's Route). Required.
	Lookup func(ctx context.Context, topic string) (routing.Route, error)
	// InitProducer takes an anonymous producer identity (the metaserver's
	// InitProducer with no name). Required.
	InitProducer func(ctx context.Context) (id uint64, epoch uint16, err error)
	// Pool holds the brokers' connections. Required; the owner closes it.
	Pool *Pool
	// RequestTimeout bounds one SEND and one lookup. Default 5 s.
	RequestTimeout time.Duration
	// Backoff is the wait before the first retry; it doubles per attempt
	// up to a second, with jitter. Default 50 ms.
	Backoff time.Duration
}

// Sender stores single messages, one at a time, each once (a consumer's
// dead letters): it stamps a message with an identity of its own and the
// queue's next sequence, and retries an attempt of unknown outcome with the
// same stamp on the same queue, so the broker answers DUPLICATE rather than
// storing it twice, as the producer does. It is safe for concurrent use
// (sends wait for each other).
type Sender struct {
	cfg    SenderConfig
	routes *Routes[struct{}]
	rr     atomic.Uint32 // round-robin over an unkeyed message's queues

	mu    sync.Mutex
	id    uint64 // 0: no identity yet
	epoch uint16
	next  map[queueKey]int64 // each queue's next sequence under the identity
}

type queueKey struct {
	topic string
	queue uint32
}

// seqKey is the sequence space of m in queue: the queue's, or for a
// delayed message the queue's internal queue of pending messages
// (protocol.DelayTopic), where the broker checks its stamp.
func seqKey(m *protocol.Message, queue uint32) queueKey {
	if m.Schedule.Kind == protocol.ScheduleDelayed {
		return queueKey{protocol.DelayTopic(m.Topic), queue}
	}
	return queueKey{m.Topic, queue}
}

// NewSender returns a sender.
func NewSender(cfg SenderConfig) *Sender {
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 5 * time.Second
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = 50 * time.Millisecond
	}
	return &Sender{cfg: cfg, routes: NewRoutes(RoutesConfig[struct{}]{Lookup: cfg.Lookup}), next: map[queueKey]int64{}}
}

// Send stores m in its topic (by the key's hash if key is set, else in the
// writable queues in turn), retrying what can be retried until ctx ends.
// It sets m's queue and stamp: a message sent again after an error keeps
// them (it is answered DUPLICATE if an earlier call stored it). The error
// is the last attempt's: a status the broker answered, or a lost
// connection or timeout.
func (s *Sender) Send(ctx context.Context, m *protocol.Message, key string) (protocol.SendResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A message stamped by an earlier call under the current identity keeps
	// its stamp: that call's outcome may have been unknown.
	stamped := m.Producer.ID != 0 && m.Producer.ID == s.id
	maybe := stamped
	backoff := s.cfg.Backoff
	var lastErr error
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			t := time.NewTimer(routing.Jitter(backoff))
			select {
			case <-ctx.Done():
				t.Stop()
				if maybe {
					// The stamp may be stored: its sequence never goes to
					// another message (a gap, if it was not, takes a new
					// identity).
					s.next[seqKey(m, m.Queue)] = m.Producer.Seq + 1
				}
				return protocol.SendResult{}, fmt.Errorf("%w (last attempt: %w)", ctx.Err(), lastErr)
			case <-t.C:
			}
			backoff = min(2*backoff, time.Second)
		}
		q, err := s.queue(ctx, m, key, stamped)
		if err != nil {
			if lastErr = err; !Retriable(err) {
				return protocol.SendResult{}, err
			}
			continue
		}
		if !stamped {
			if err := s.identity(ctx); err != nil {
				if lastErr = err; !Retriable(err) {
					return protocol.SendResult{}, err
				}
				continue
			}
			m.Queue = q.Queue
			m.Producer = protocol.ProducerStamp{ID: s.id, Epoch: s.epoch, Seq: s.next[seqKey(m, q.Queue)]}
			stamped = true
		}
		res, err := s.call(ctx, q, m)
		if err == nil {
			if k := (seqKey(m, m.Queue)); m.Producer.ID == s.id && m.Producer.Seq >= s.next[k] {
				s.next[k] = m.Producer.Seq + 1
			}
			return res, nil
		}
		lastErr = err
		st := protocol.StatusOf(err)
		if st.RefreshesRoute() || !errors.As(err, new(*protocol.Error)) {
			s.routes.MarkStale(m.Topic)
		}
		switch {
		case st == protocol.StatusOutOfOrderSequence:
			// The broker lost this identity's sequence: take a new one.
			s.id, s.next = 0, map[queueKey]int64{}
			stamped, maybe = false, false
		case st != protocol.StatusOK && st.MaybeStored(), !NeverSent(err) && !errors.As(err, new(*protocol.Error)) && Retriable(err):
			maybe = true // the same stamp, on the same queue
		case Retriable(err):
			if !maybe {
				stamped = false // not stored: the sequence is still the queue's next; any queue will do
			}
		default:
			if maybe {
				s.next[seqKey(m, m.Queue)] = m.Producer.Seq + 1
			}
			return protocol.SendResult{}, err
		}
	}
}

// queue returns the queue m goes to: the one it is stamped for, or its
// key's, or the next writable one.
func (s *Sender) queue(ctx context.Context, m *protocol.Message, key string, stamped bool) (routing.QueueRoute, error) {
	e := s.routes.Get(m.Topic)
	if !s.routes.Fresh(e, s.routes.Now()) {
		lctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
		var err error
		e, err = s.routes.Lookup(lctx, m.Topic)
		cancel()
		if err != nil {
			return routing.QueueRoute{}, fmt.Errorf("route lookup: %w", err)
		}
	}
	qs := e.Route.Queues
	noRoute := func(format string, args ...any) error {
		return &protocol.Error{Status: protocol.StatusNoRoute, Message: fmt.Sprintf(format, args...)}
	}
	switch {
	case len(qs) == 0:
		return routing.QueueRoute{}, noRoute("topic %q has no queues", m.Topic)
	case stamped:
		for _, q := range qs {
			if q.Queue == m.Queue {
				return q, nil
			}
		}
		return routing.QueueRoute{}, noRoute("topic %q has no queue %d", m.Topic, m.Queue)
	case key != "":
		return qs[KeyHash(key)%uint32(len(qs))], nil
	}
	start := s.rr.Add(1)
	for i := range uint32(len(qs)) {
		if q := qs[(start+i)%uint32(len(qs))]; q.Writable && q.Master != "" {
			return q, nil
		}
	}
	return routing.QueueRoute{}, &protocol.Error{Status: protocol.StatusReadOnly, Message: fmt.Sprintf("topic %q has no writable queue", m.Topic)}
}

// identity takes the sender's identity if it has none.
func (s *Sender) identity(ctx context.Context) error {
	if s.id != 0 {
		return nil
	}
	ictx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	id, epoch, err := s.cfg.InitProducer(ictx)
	if err != nil {
		return fmt.Errorf("producer id: %w", err)
	}
	s.id, s.epoch, s.next = id, epoch, map[queueKey]int64{}
	return nil
}

// call sends one SEND of m to q's master; a status other than OK or
// DUPLICATE is returned as a *protocol.Error.
func (s *Sender) call(ctx context.Context, q routing.QueueRoute, m *protocol.Message) (protocol.SendResult, error) {
	if q.Master == "" {
		return protocol.SendResult{}, &protocol.Error{Status: protocol.StatusNoRoute, Message: fmt.Sprintf("group %s has no master in the route", q.Group)}
	}
	conn, err := s.cfg.Pool.Get(q.Master)
	if err != nil {
		return protocol.SendResult{}, err
	}
	body := protocol.AppendSendRequestHeader(make([]byte, 0, protocol.SendRequestHeaderSize+m.EncodedSize()), q.Epoch, 1)
	body = protocol.AppendMessage(body, m)
	cctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	resp, err := conn.Call(cctx, protocol.CodeSend, body)
	if err != nil {
		if errors.Is(err, transport.ErrClosed) {
			return protocol.SendResult{}, err
		}
		return protocol.SendResult{}, fmt.Errorf("send to group %s at %s: %w", q.Group, q.Master, err)
	}
	rs, err := DecodeSendAnswer(resp, 1)
	if err != nil {
		return protocol.SendResult{}, fmt.Errorf("send to group %s at %s: %w", q.Group, q.Master, err)
	}
	if st := rs[0].Status; st != protocol.StatusOK && st != protocol.StatusDuplicate {
		return rs[0], &protocol.Error{Status: st, Message: fmt.Sprintf("from group %s at %s", q.Group, q.Master)}
	}
	return rs[0], nil
}
