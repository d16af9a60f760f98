package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// coordinator is the metaserver's side of a consumer group.
type coordinator interface {
	ConsumerHeartbeat(ctx context.Context, hb api.ConsumerHeartbeat) (api.ConsumerHeartbeatReply, error)
	CommitOffsets(ctx context.Context, req api.CommitRequest) (api.CommitReply, error)
}

// router looks a topic's route up without creating the topic.
type router interface {
	RouteExisting(ctx context.Context, topic string) (routing.Route, error)
}

// puller reads a queue from a broker. The answer's messages may be dec's:
// valid until the next Pull with dec.
type puller interface {
	Pull(ctx context.Context, addr string, req *protocol.PullRequest, dec *protocol.PullDecoder) (protocol.PullResponse, error)
}

// deadLetterer stores a dead letter: m in its topic, by key's queue if key
// is set.
type deadLetterer interface {
	DeadLetter(ctx context.Context, m *protocol.Message, key string) error
}

var _ coordinator = (*client.Client)(nil)
var _ router = (*client.Client)(nil)

// brokerPuller PULLs over the consumer's connections (one per broker).
type brokerPuller struct{ pool *clientcore.Pool }

func (p brokerPuller) Pull(ctx context.Context, addr string, req *protocol.PullRequest, dec *protocol.PullDecoder) (protocol.PullResponse, error) {
	tc, err := p.pool.Get(addr)
	if err != nil {
		return protocol.PullResponse{}, fmt.Errorf("%w: %w", ErrClosed, err)
	}
	resp, err := tc.Call(ctx, protocol.CodePull, protocol.AppendPullRequest(nil, req))
	if err != nil {
		return protocol.PullResponse{}, err
	}
	pr, err := dec.Decode(resp.Body)
	if err != nil {
		return protocol.PullResponse{}, fmt.Errorf("consumer: PULL answer from %s: %w", addr, err)
	}
	return pr, nil
}

// coreDLQ stores dead letters with the client core's sender: once each
// (stamped with an identity of the consumer's own), on the consumer's
// connections, without a producer.
type coreDLQ struct{ s *clientcore.Sender }

func newCoreDLQ(meta *client.Client, pool *clientcore.Pool, requestTimeout time.Duration) coreDLQ {
	return coreDLQ{clientcore.NewSender(clientcore.SenderConfig{
		Lookup: meta.Route, // the dead-letter topic is created on first use where the metaserver auto-creates
		InitProducer: func(ctx context.Context) (uint64, uint16, error) {
			r, err := meta.InitProducer(ctx, "")
			return r.ID, r.Epoch, err
		},
		Pool: pool, RequestTimeout: requestTimeout,
	})}
}

func (d coreDLQ) DeadLetter(ctx context.Context, m *protocol.Message, key string) error {
	_, err := d.s.Send(ctx, m, key)
	if errors.Is(err, transport.ErrClosed) {
		return fmt.Errorf("%w: dead letter: %w", ErrClosed, err)
	}
	return err
}
