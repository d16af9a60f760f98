package console

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sync"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/ops"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// brokerToken is the token a page's calls for queue ranges (QUEUE_COUNT)
// present: the session's own, or the cluster token for a certificate
// session, which has none (the console checked its permissions itself, and
// a range shows no message); "" with authorization off. The pages that read
// messages refuse a certificate session (page.brokers).
func (q *query) brokerToken() string {
	if q.s.byCert {
		return q.c.cfg.ClusterToken
	}
	return q.s.token
}

// brokers is a page's calls to brokers with the session's credential, as
// ferryctl makes them: one connection per broker, and each queue's log
// range read once, however many rows need it. close ends the connections.
type brokers struct {
	q      *query
	mu     sync.Mutex
	conns  map[string]*transport.Client
	ranges map[string]*logRange
}

// logRange is a queue's log range, read once (ready closes when it is).
type logRange struct {
	ready      chan struct{}
	start, end int64
	err        error
}

func (q *query) brokers() *brokers {
	return &brokers{q: q, conns: map[string]*transport.Client{}, ranges: map[string]*logRange{}}
}

func (b *brokers) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		_ = c.Close()
	}
	b.conns = map[string]*transport.Client{}
}

// conn is the page's connection to the broker at addr.
func (b *brokers) conn(addr string) *transport.Client {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.conns[addr]
	if c == nil {
		cfg := b.q.c.cfg
		c = transport.NewClient(addr, transport.ClientConfig{TLS: cfg.TLS, Login: auth.TokenLogin(b.q.brokerToken()), CallTimeout: cfg.CallTimeout})
		b.conns[addr] = c
	}
	return c
}

// with runs fn on the page's connection to the broker at addr (an
// ops.With).
func (b *brokers) with(ctx context.Context, addr string, fn func(context.Context, *transport.Client) error) error {
	return fn(ctx, b.conn(addr))
}

// onQueueBroker runs fn on the queue's master, or on its slave when the
// master does not serve, as ferryctl reads (ops.OnQueueBroker).
func (b *brokers) onQueueBroker(ctx context.Context, topic string, qr routing.QueueRoute, fn func(context.Context, *transport.Client) error) error {
	return ops.OnQueueBroker(ctx, b.with, qr, topic, nil, fn)
}

// queueRange reads a queue's oldest offset and its next offset to be
// written from its broker (countRange), once per page, within a call slot.
func (b *brokers) queueRange(topic string, qr routing.QueueRoute) (start, end int64, err error) {
	k := fmt.Sprint(topic, "/", qr.Queue)
	b.mu.Lock()
	r, ok := b.ranges[k]
	if !ok {
		r = &logRange{ready: make(chan struct{})}
		b.ranges[k] = r
	}
	b.mu.Unlock()
	if ok {
		<-r.ready
		return r.start, r.end, r.err
	}
	defer close(r.ready)
	release, err := b.q.slot()
	if err != nil {
		r.err = err
		return 0, 0, err
	}
	defer release()
	r.err = b.onQueueBroker(b.q.ctx, topic, qr, func(ctx context.Context, tc *transport.Client) error {
		var err error
		r.start, r.end, err = countRange(ctx, tc, topic, qr.Queue)
		return err
	})
	return r.start, r.end, r.err
}

// countRange reads a queue's oldest offset and its next offset to be
// written: one QUEUE_COUNT of the whole queue without a filter, which the
// broker answers from its index at once (Count: the messages held,
// ScannedTo: the log end) and which shows no message, so describe may ask
// it.
func countRange(ctx context.Context, tc *transport.Client, topic string, queue uint32) (minOff, maxOff int64, err error) {
	body, _ := json.Marshal(protocol.QueueCountRequest{Topic: topic, Queue: queue, From: 0, To: math.MaxInt64})
	resp, err := tc.Call(ctx, protocol.CodeQueueCount, body)
	if err != nil {
		return 0, 0, err
	}
	var c protocol.QueueCount
	if err := json.Unmarshal(resp.Body, &c); err != nil {
		return 0, 0, fmt.Errorf("QUEUE_COUNT answer: %w", err)
	}
	return c.ScannedTo - c.Count, c.ScannedTo, nil
}
