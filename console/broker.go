package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// brokerToken is the token the session's calls to brokers present: its
// own, or the cluster token for a certificate session (whose permissions
// the console checked itself); "" with authorization off.
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

// onQueueBroker runs fn on the queue's master, or on its slave when the
// master does not serve (half the time left goes to each when both are
// there), as ferryctl reads.
func (b *brokers) onQueueBroker(ctx context.Context, qr routing.QueueRoute, fn func(context.Context, *transport.Client) error) error {
	if qr.Master == "" && qr.Slave == "" {
		return fmt.Errorf("its group %s has no broker", qr.Group)
	}
	var masterErr error
	if qr.Master != "" {
		mctx, cancel := ctx, context.CancelFunc(func() {})
		if deadline, ok := ctx.Deadline(); ok && qr.Slave != "" {
			mctx, cancel = context.WithTimeout(ctx, time.Until(deadline)/2)
		}
		err := fn(mctx, b.conn(qr.Master))
		cancel()
		if err == nil {
			return nil
		}
		masterErr = fmt.Errorf("the master %s: %w", qr.Master, err)
		if qr.Slave == "" || !clientcore.NotServing(err) || ctx.Err() != nil {
			return masterErr
		}
	}
	if err := fn(ctx, b.conn(qr.Slave)); err != nil {
		return errors.Join(masterErr, fmt.Errorf("the slave %s: %w", qr.Slave, err))
	}
	return nil
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
	r.err = b.onQueueBroker(b.q.ctx, qr, func(ctx context.Context, tc *transport.Client) error {
		var err error
		r.start, r.end, err = countRange(ctx, tc, topic, qr.Queue)
		return err
	})
	return r.start, r.end, r.err
}

// pullOnce sends one PULL; NO_ROUTE (a broker looking up a queue that just
// moved to its group) is asked again every 50 ms until ctx ends.
func pullOnce(ctx context.Context, tc *transport.Client, req *protocol.PullRequest) (protocol.PullResponse, error) {
	for {
		resp, err := tc.Call(ctx, protocol.CodePull, protocol.AppendPullRequest(nil, req))
		if errors.Is(err, protocol.ErrNoRoute) {
			select {
			case <-ctx.Done():
				return protocol.PullResponse{}, err
			case <-time.After(50 * time.Millisecond):
				continue
			}
		}
		if err != nil {
			return protocol.PullResponse{}, err
		}
		return protocol.DecodePullResponse(resp.Body)
	}
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
