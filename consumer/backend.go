package consumer

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/producer"
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

// puller reads a queue from a broker.
type puller interface {
	Pull(ctx context.Context, addr string, req *protocol.PullRequest) (protocol.PullResponse, error)
	Close() error
}

// deadLetterer stores a dead letter.
type deadLetterer interface {
	DeadLetter(ctx context.Context, m *producer.Message) error
	Close() error
}

var _ coordinator = (*client.Client)(nil)
var _ router = (*client.Client)(nil)

// brokerPuller keeps one connection per broker address.
type brokerPuller struct {
	tls    *tls.Config // nil: plaintext
	token  string      // "": none
	mu     sync.Mutex
	conns  map[string]*transport.Client
	closed bool
}

func newBrokerPuller(tlsCfg *tls.Config, token string) *brokerPuller {
	return &brokerPuller{tls: tlsCfg, token: token, conns: map[string]*transport.Client{}}
}

func (p *brokerPuller) Pull(ctx context.Context, addr string, req *protocol.PullRequest) (protocol.PullResponse, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return protocol.PullResponse{}, ErrClosed
	}
	tc := p.conns[addr]
	if tc == nil {
		tc = transport.NewClient(addr, transport.ClientConfig{TLS: p.tls, Login: auth.TokenLogin(p.token)})
		p.conns[addr] = tc
	}
	p.mu.Unlock()
	resp, err := tc.Call(ctx, protocol.CodePull, protocol.AppendPullRequest(nil, req))
	if err != nil {
		return protocol.PullResponse{}, err
	}
	pr, err := protocol.DecodePullResponse(resp.Body)
	if err != nil {
		return protocol.PullResponse{}, fmt.Errorf("consumer: PULL answer from %s: %w", addr, err)
	}
	return pr, nil
}

func (p *brokerPuller) Close() error {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, tc := range conns {
		_ = tc.Close()
	}
	return nil
}

// producerDLQ stores dead letters with a producer made on first use.
type producerDLQ struct {
	addrs []string
	tls   *tls.Config
	token string
	mu    sync.Mutex
	p     *producer.Client
}

func (d *producerDLQ) DeadLetter(ctx context.Context, m *producer.Message) error {
	d.mu.Lock()
	if d.p == nil {
		p, err := producer.New(producer.MetaAddrs(d.addrs...), producer.TLS(d.tls), producer.Token(d.token))
		if err != nil {
			d.mu.Unlock()
			return err
		}
		d.p = p
	}
	p := d.p
	d.mu.Unlock()
	_, err := p.Send(ctx, m)
	return err
}

func (d *producerDLQ) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.p != nil {
		return d.p.Close()
	}
	return nil
}
