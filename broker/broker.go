package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

// Broker is one broker of a group, master or slave.
//
// Goroutines: the data server's and (master) the HA server's, from package
// transport; the heartbeat loop; (master) the HA loop that answers parked
// fetches and expires HIGH waiters; (slave) the fetch loop that copies the
// master's log. The commit log has its writer and flusher. Close stops all
// of them, in an order that answers every request already read.
type Broker struct {
	cfg   Config
	log   hclog.Logger
	store *storage.Log
	meta  *client.Client

	rpc    *transport.Server
	addr   string
	ha     *transport.Server // master only
	haAddr string

	routes routeCache
	repl   replication // master only
	stats  Stats

	// metaWritable is the group's state in the last accepted heartbeat reply;
	// lastAccepted is when that was (unix nanoseconds, 0 before the first).
	metaWritable atomic.Bool
	lastAccepted atomic.Int64
	masterHA     atomic.Value // string: the master's HA address, learned (slave)

	inflightReqs  atomic.Int64
	inflightBytes atomic.Int64

	closing   atomic.Bool
	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// New opens the commit log (recovering it), binds the listeners and starts
// the broker. It is read-only until a heartbeat is accepted.
func New(cfg Config) (*Broker, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b := &Broker{cfg: cfg, log: cfg.Logger.Named("broker").With("broker", cfg.ID, "group", cfg.Group, "role", cfg.Role)}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.masterHA.Store(cfg.MasterHAAddr)
	b.routes.init()
	b.repl.init(b)

	var err error
	b.store, err = storage.Open(storage.Config{
		Dir: cfg.Dir, FS: cfg.FS, SegmentSize: cfg.SegmentSize, Flush: cfg.Flush, FlushInterval: cfg.FlushInterval,
		MaxPayloadSize: protocol.MaxFrameSize, Logger: b.log.Named("storage"),
	})
	if err != nil {
		b.cancel()
		return nil, fmt.Errorf("broker: open commit log: %w", err)
	}
	if b.meta, err = client.New(client.Config{Addrs: cfg.MetaAddrs}); err != nil {
		b.cancel()
		_ = b.store.Close()
		return nil, err
	}
	fail := func(err error) (*Broker, error) {
		b.closeStarted()
		return nil, err
	}

	b.rpc = transport.NewServer(transport.ServerConfig{
		Workers: cfg.Workers, MaxInflightPerConn: cfg.MaxInflightPerConn, Logger: b.log.Named("rpc"),
	})
	b.rpc.Handle(protocol.CodeSend, b.handleSend)
	b.rpc.Handle(protocol.CodePull, b.handlePull)
	bound, err := b.rpc.Listen(cfg.Addr)
	if err != nil {
		return fail(fmt.Errorf("broker: %w", err))
	}
	b.addr = cfg.AdvertiseAddr
	if b.addr == "" {
		b.addr = bound.String()
	}
	if cfg.Role == routing.RoleMaster {
		b.ha = transport.NewServer(transport.ServerConfig{Workers: 2, Logger: b.log.Named("ha")})
		b.ha.Handle(protocol.CodeHAFetch, b.repl.handleFetch)
		haBound, err := b.ha.Listen(cfg.HAAddr)
		if err != nil {
			return fail(fmt.Errorf("broker: HA %w", err))
		}
		b.haAddr = haBound.String()
		b.goFunc(b.repl.loop)
	} else {
		b.goFunc(b.slaveLoop)
	}
	b.goFunc(b.heartbeatLoop)
	if cfg.RetentionBytes > 0 {
		b.goFunc(b.retentionLoop)
	}
	b.log.Info("broker started", "addr", b.addr, "ha-addr", b.haAddr, "log-end", b.store.EndOffset(), "flush", cfg.Flush.String())
	return b, nil
}

func (b *Broker) goFunc(f func()) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		f()
	}()
}

// Addr is the broker's advertised data address.
func (b *Broker) Addr() string { return b.addr }

// HAAddr is the master's HA address ("" on a slave).
func (b *Broker) HAAddr() string { return b.haAddr }

// Store exposes the commit log (reads and offsets).
func (b *Broker) Store() *storage.Log { return b.store }

// IsMaster reports the broker's role.
func (b *Broker) IsMaster() bool { return b.cfg.Role == routing.RoleMaster }

// Writable reports whether the broker takes writes now: the metaserver's
// last word is writable, and it was said within one session.
func (b *Broker) Writable() bool {
	last := b.lastAccepted.Load()
	return b.metaWritable.Load() && last != 0 && time.Since(time.Unix(0, last)) < b.cfg.SessionTimeout
}

// Close stops the broker: it refuses new requests, fails HIGH messages still
// waiting for the slave, answers every request already read, stops its
// goroutines, and syncs and closes the commit log.
func (b *Broker) Close() error {
	var err error
	b.closeOnce.Do(func() {
		b.log.Info("broker closing")
		b.closing.Store(true)
		b.repl.failWaiters("the broker is shutting down")
		err = b.closeStarted()
	})
	return err
}

func (b *Broker) closeStarted() error {
	b.closing.Store(true)
	b.cancel()
	if b.rpc != nil {
		_ = b.rpc.Close()
	}
	b.wg.Wait() // the HA loop answers its parked fetches as it stops
	if b.ha != nil {
		_ = b.ha.Close()
	}
	_ = b.meta.Close()
	if err := b.store.Close(); err != nil {
		return fmt.Errorf("broker: close commit log: %w", err)
	}
	return nil
}

// admit counts a request in, or refuses it when the broker is over its bounds.
func (b *Broker) admit(size int) bool {
	n := b.inflightReqs.Add(1)
	by := b.inflightBytes.Add(int64(size))
	if n > b.cfg.MaxInflightRequests || by > b.cfg.MaxInflightBytes {
		b.release(size)
		return false
	}
	return true
}

func (b *Broker) release(size int) {
	b.inflightReqs.Add(-1)
	b.inflightBytes.Add(-int64(size))
}

// statusOfStoreError maps a commit-log error to a message status.
func statusOfStoreError(err error) protocol.Status {
	switch {
	case errors.Is(err, storage.ErrInvalidEntry):
		return protocol.StatusInvalid
	case errors.Is(err, storage.ErrClosed):
		return protocol.StatusShuttingDown
	default:
		return protocol.StatusStoreError
	}
}

// retentionLoop deletes whole segments before the last RetentionBytes of
// the log, every RetentionCheck. A slave runs it on its own copy.
func (b *Broker) retentionLoop() {
	tick := time.NewTicker(b.cfg.RetentionCheck)
	defer tick.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-tick.C:
		}
		end := b.store.EndOffset()
		if end-b.store.StartOffset() <= b.cfg.RetentionBytes {
			continue
		}
		if _, err := b.store.DeleteBefore(end - b.cfg.RetentionBytes); err != nil {
			b.log.Warn("retention failed", "error", err)
		}
	}
}
