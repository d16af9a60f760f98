package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
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

// brokerCall runs fn on a connection to the broker at addr presenting the
// session's credential, as ferryctl does.
func (q *query) brokerCall(ctx context.Context, addr string, fn func(context.Context, *transport.Client) error) error {
	return callBroker(ctx, addr, q.c.cfg, q.brokerToken(), fn)
}

func callBroker(ctx context.Context, addr string, cfg Config, token string, fn func(context.Context, *transport.Client) error) error {
	tc := transport.NewClient(addr, transport.ClientConfig{TLS: cfg.TLS, Login: auth.TokenLogin(token), CallTimeout: cfg.CallTimeout})
	defer tc.Close()
	return fn(ctx, tc)
}

// onQueueBroker runs fn on the queue's master, or on its slave when the
// master does not serve (half the time left goes to each when both are
// there), as ferryctl reads.
func (q *query) onQueueBroker(ctx context.Context, qr routing.QueueRoute, fn func(context.Context, *transport.Client) error) error {
	if qr.Master == "" && qr.Slave == "" {
		return fmt.Errorf("its group %s has no broker", qr.Group)
	}
	var masterErr error
	if qr.Master != "" {
		mctx, cancel := ctx, context.CancelFunc(func() {})
		if deadline, ok := ctx.Deadline(); ok && qr.Slave != "" {
			mctx, cancel = context.WithTimeout(ctx, time.Until(deadline)/2)
		}
		err := q.brokerCall(mctx, qr.Master, fn)
		cancel()
		if err == nil {
			return nil
		}
		masterErr = fmt.Errorf("the master %s: %w", qr.Master, err)
		if qr.Slave == "" || !clientcore.NotServing(err) || ctx.Err() != nil {
			return masterErr
		}
	}
	if err := q.brokerCall(ctx, qr.Slave, fn); err != nil {
		return errors.Join(masterErr, fmt.Errorf("the slave %s: %w", qr.Slave, err))
	}
	return nil
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

// queueRange reads a queue's oldest offset and its next offset to be
// written from its broker (countRange) with the session's credential.
func (q *query) queueRange(ctx context.Context, topic string, qr routing.QueueRoute) (minOff, maxOff int64, err error) {
	err = q.onQueueBroker(ctx, qr, func(ctx context.Context, tc *transport.Client) error {
		minOff, maxOff, err = countRange(ctx, tc, topic, qr.Queue)
		return err
	})
	return minOff, maxOff, err
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
