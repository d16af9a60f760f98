package clientcore

import (
	"sync"

	"github.com/ferrymq/ferrymq/internal/transport"
)

// PoolConfig configures a Pool.
type PoolConfig struct {
	// Transport tunes every connection (TLS, token, timeouts).
	Transport transport.ClientConfig
	// Dial maps an address to the one dialed (nil: the address itself;
	// tests put a proxy between).
	Dial func(addr string) string
}

// Pool keeps one connection (a transport.Client, which dials on first use
// and again after a loss) per address, for its owner's lifetime: Close
// closes them all, and Get refuses from then on. It is safe for concurrent
// use.
type Pool struct {
	cfg PoolConfig

	mu     sync.Mutex
	conns  map[string]*transport.Client
	closed bool
}

// NewPool returns an empty pool.
func NewPool(cfg PoolConfig) *Pool {
	return &Pool{cfg: cfg, conns: map[string]*transport.Client{}}
}

// Get returns addr's connection, made on first use; after Close it returns
// transport.ErrClosed.
func (p *Pool) Get(addr string) (*transport.Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, transport.ErrClosed
	}
	tc := p.conns[addr]
	if tc == nil {
		dial := addr
		if p.cfg.Dial != nil {
			dial = p.cfg.Dial(addr)
		}
		tc = transport.NewClient(dial, p.cfg.Transport)
		p.conns[addr] = tc
	}
	return tc, nil
}

// Close closes every connection: calls under way on them fail with
// transport.ErrClosed.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = map[string]*transport.Client{}
	p.mu.Unlock()
	for _, tc := range conns {
		_ = tc.Close()
	}
	return nil
}
