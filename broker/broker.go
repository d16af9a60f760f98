package broker

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/broker/delay"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

// Broker is one broker of a group, master or slave. It is built from parts,
// each made by its own constructor, in the order they depend on each
// other, with only what it needs (see DESIGN.md, section 11):
//
//   - session (session.go): heartbeats, the write lease (lease.go) and
//     kicks; it publishes each accepted reply as a groupView.
//   - routeCache (routecache.go): which queues are routed to this group;
//     the metaserver leader pushes new topics into it (routepush.go).
//   - longPoll (longpoll.go): holds PULLs that wait for a message; the
//     PULLs themselves are answered by handlePull (pull.go), on either
//     role, checked against the epochs the roles last acted on
//     (epochState, epochs.go).
//   - aclCopy (authz.go), when authorization is on: the permission table,
//     refetched when a view names another version.
//   - tailHandover (recover.go): hands a cut tail to the new master.
//   - roles (roles.go): makes the broker what the session's views say,
//     master or slave, and switches at a failover (cutting its log when it
//     rejoins); it runs replication (replication.go) while master and the
//     follower (follower.go) while slave.
//   - sender (send.go): the send path; on a slave it refuses SENDs.
//   - endpoints (endpoints.go): every request code, with its authorization
//     check, on the data and HA servers from package transport.
//   - delayer (delayed.go): the delayed messages: the timer index
//     (package delay) on both roles; firing, cancels and moves as master.
//   - retainer (below): deletes old segments (moving pending delayed
//     messages out of them first).
//
// Goroutines: the data server's and the HA server's, from package
// transport; the heartbeat loop; the route refresher and the route watch;
// the long-poll loop; the ACL copy's fetcher; the tail handover;
// the role loop and, under it, the replication loop (master) or the
// follower (slave); the delayer; the retention loop if enabled. The
// commit log has its writer and flusher. Close stops all of them, in an
// order that answers every request already read.
type Broker struct {
	cfg   Config
	log   hclog.Logger
	store *storage.Log
	meta  *client.Client

	rpc    *transport.Server
	addr   string
	ha     *transport.Server // serves the slave while this broker is master
	haAddr string

	sess   *session
	routes *routeCache
	send   *sender
	pulls  *longPoll
	reads  *deliveries // who read what, for LOOKUP (deliveries.go)
	delays *delayer
	txns   *txns // the transactions (txns.go)
	roles  *roles
	acl    *aclCopy      // nil: authorization off
	gates  [2]*auth.Gate // by port; nil: authorization off
	stats  Stats
	ends   queueEndsReport // the heartbeat loop's
	// handover hands this broker's cut tails to its master (nil:
	// -failover-tail=discard); recovering is set while this broker, as
	// master, appends one (recover.go).
	handover   *tailHandover
	recovering atomic.Bool

	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// New opens the commit log (recovering it), binds the listeners and starts
// the broker. It takes no writes until a heartbeat reply names it the
// master of a writable group, and follows no master until one names it the
// slave: cfg.Role is only its preference when it first joins its group.
func New(cfg Config) (*Broker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	lg := cfg.Logger.Named("broker").With("broker", cfg.ID, "group", cfg.Group, "role", string(cfg.Role))
	b := &Broker{cfg: cfg, log: lg}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.stats.initHistograms()
	var err error
	if b.store, err = openCommitLog(cfg, &b.stats, lg.Named("storage")); err != nil {
		b.cancel()
		return nil, err
	}
	if b.meta, err = client.New(client.Config{Addrs: cfg.MetaAddrs, Token: cfg.ClusterToken, Transport: transport.ClientConfig{TLS: cfg.TLSClient}}); err != nil {
		b.cancel()
		_ = b.store.Close()
		return nil, err
	}

	b.sess = newSession(cfg.ID, b.meta, cfg.HeartbeatInterval, cfg.SessionTimeout, cfg.Clock, lg.Named("heartbeat"))
	b.routes = newRouteCache(cfg.Group, b.meta, cfg.Clock, lg.Named("routes"))
	b.routes.store = b.store
	epochs := &epochState{}
	b.reads = newDeliveries(cfg.Clock)
	b.txns = newTxns(cfg, b.store, &b.sess.lease, func() *replication { return b.roles.replication() }, &b.stats, lg.Named("txns"))
	b.pulls = newLongPoll(pullStore{Log: b.store, epoch: epochs.local.Load, epochStart: epochs.epochStart, routed: b.routes.routed, readable: b.readableEnd,
		reads: b.reads, txns: b.txns},
		cfg.Clock, &b.stats, lg.Named("longpoll"))
	b.txns.pulls, b.txns.readable, b.txns.registry = b.pulls, b.readableEnd, b.meta
	if cfg.ClusterToken != "" {
		b.acl = newACLCopy(cfg.ClusterToken, b.meta, b.sess, lg.Named("acl"))
	}
	b.handover = newTailHandover(cfg, b.store, epochs, &b.stats, lg.Named("recover"))
	if b.roles, err = newRoles(cfg, b.store, b.sess, epochs, b.pulls, b.handover, &b.stats, lg, b.meta.AlterSyncSet); err != nil {
		_ = b.shutdown()
		return nil, err
	}
	idx, err := delay.Open(delay.Config{Log: b.store, Dir: filepath.Join(cfg.Dir, delayDir), FS: cfg.FS, Now: cfg.Clock.Now,
		Logger: lg.Named("delay")})
	if err != nil {
		_ = b.shutdown()
		return nil, fmt.Errorf("broker: open the timer index: %w", err)
	}
	b.delays = newDelayer(cfg, idx, b.store, b.roles, &b.sess.lease, b.pulls, &b.stats, lg.Named("delayer"))
	b.roles.cut = func() {
		b.delays.truncated()
		b.txns.truncated()
	}
	b.send = newSender(cfg, b.store, b.sess, b.routes, b.roles.replication, b.pulls, &b.stats, lg)
	b.send.delays = b.delays
	b.send.txns = b.txns
	b.delays.txns = b.txns

	b.goFunc(b.pulls.run) // before the data server listens: it answers parked PULLs at Close
	if err := b.listen(); err != nil {
		_ = b.shutdown()
		return nil, err
	}
	b.start()
	lg.Info("broker started", "addr", b.addr, "ha-addr", b.haAddr, "log-end", b.store.EndOffset(), "flush", cfg.Flush.String())
	return b, nil
}

// openCommitLog opens (and recovers) the commit log.
func openCommitLog(cfg Config, stats *Stats, lg hclog.Logger) (*storage.Log, error) {
	l, err := storage.Open(storage.Config{
		Dir: cfg.Dir, FS: cfg.FS, SegmentSize: cfg.SegmentSize, Flush: cfg.Flush, FlushInterval: cfg.FlushInterval,
		MaxPayloadSize: protocol.MaxFrameSize, Logger: lg,
		ProducerStamp: func(payload []byte) (storage.ProducerStamp, bool) {
			ps, ok := protocol.PeekProducerStamp(payload)
			return storage.ProducerStamp(ps), ok
		},
		MessageID:    protocol.PeekMessageID,
		Fingerprint:  protocol.EncodedTagFingerprint,
		LookupKeys:   protocol.LookupKeys,
		ProducerIdle: cfg.ProducerIdle,
		Pretouch:     cfg.Pretouch,
		OnSync:       stats.observeFlush,
	})
	if err != nil {
		return nil, fmt.Errorf("broker: open commit log: %w", err)
	}
	return l, nil
}

// serverConfig is the transport configuration of the data port (ha:
// the HA port). Answers are sent from the commit log's and replication's
// goroutines and never wait on a peer: what a connection may have queued
// is bounded when its next request is admitted, from the endpoints'
// estimates of each answer's size, and a peer that stops reading for
// WriteTimeout is cut.
func (b *Broker) serverConfig(p port) transport.ServerConfig {
	cfg := b.cfg
	if p == haPort {
		return transport.ServerConfig{Workers: 2, WriteTimeout: cfg.WriteTimeout, Logger: b.log.Named("ha"), TLS: cfg.TLSServer,
			Gate: b.admissionGate(haPort), MaxWriteBuffer: haWriteBuffer(cfg.HAFetchBytes)}
	}
	return transport.ServerConfig{Workers: cfg.Workers, MaxInflightPerConn: cfg.MaxInflightPerConn, WriteTimeout: cfg.WriteTimeout,
		Logger: b.log.Named("rpc"), TLS: cfg.TLSServer, Gate: b.admissionGate(dataPort)}
}

// listen registers the endpoints and binds the data port, then the HA
// port. The HA port is open on both roles, so its address stays the same
// across role changes; it serves fetches only while this broker is the
// master, and only from the group's slave.
func (b *Broker) listen() error {
	b.rpc = transport.NewServer(b.serverConfig(dataPort))
	b.register(dataPort, b.rpc)
	bound, err := b.rpc.Listen(b.cfg.Addr)
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	b.addr = b.cfg.AdvertiseAddr
	if b.addr == "" {
		b.addr = bound.String()
	}
	b.ha = transport.NewServer(b.serverConfig(haPort))
	b.register(haPort, b.ha)
	haBound, err := b.ha.Listen(b.cfg.HAAddr)
	if err != nil {
		return fmt.Errorf("broker: HA %w", err)
	}
	b.haAddr = haBound.String()
	if b.acl != nil {
		b.acl.revoke = b.dropRevoked
	}
	return nil
}

// register hands srv the endpoints of port p.
func (b *Broker) register(p port, srv *transport.Server) {
	for _, e := range b.endpoints() {
		if e.port == p {
			e.register(srv, b.acl)
		}
	}
}

// start starts the loops of the parts, once the listeners are bound (the
// heartbeats report their addresses).
func (b *Broker) start() {
	if b.acl != nil {
		b.goFunc(b.acl.run)
	}
	b.goFunc(b.roles.run)
	b.goFunc(b.delays.run)
	b.goFunc(b.txns.run)
	if b.handover != nil {
		b.goFunc(b.handover.run)
	}
	b.goFunc(func(ctx context.Context) { b.sess.run(ctx, b.describe) })
	b.goFunc(b.routes.run)
	b.goFunc(func(ctx context.Context) { b.routes.watch(ctx, b.meta, b.cfg.ID) })
	if b.cfg.RetentionBytes > 0 {
		r := &retainer{log: b.store, keep: b.cfg.RetentionBytes, every: b.cfg.RetentionCheck, clock: b.cfg.Clock, lg: b.log.Named("retention"),
			pending: func(ctx context.Context, before int64) int64 {
				return b.txns.retainFrom(b.delays.retainFrom(ctx, before))
			}}
		b.goFunc(r.run)
	}
}

func (b *Broker) goFunc(f func(context.Context)) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		f(b.ctx)
	}()
}

// describe fills a heartbeat with the broker's state.
func (b *Broker) describe(hb *api.Heartbeat) {
	ps := b.store.ProducerStats()
	*hb = api.Heartbeat{Group: b.cfg.Group, Role: b.cfg.Role, BrokerID: b.cfg.ID, Addr: b.addr, HAAddr: b.haAddr,
		LogEnd: b.store.EndOffset(), LogStart: b.store.StartOffset(), RetentionBytes: b.cfg.RetentionBytes,
		Epoch: b.roles.epochs.local.Load(), Producers: ps.Tracked, Duplicates: ps.Duplicates}
	if rep := b.roles.replication(); rep != nil {
		all := rep.replicas()
		s := slowest(all)
		hb.SlaveConnected, hb.SlaveAckOffset, hb.LagBytes, hb.LagMillis = s.Connected, s.AckOffset, s.LagBytes, s.LagTime.Milliseconds()
		hb.HighAcked = rep.highAcked()
		for _, s := range all {
			hb.Replicas = append(hb.Replicas, api.ReplicaStatus{ID: s.ID, Connected: s.Connected, AckOffset: s.AckOffset,
				LagBytes: s.LagBytes, LagMillis: s.LagTime.Milliseconds(), InSync: s.InSync})
		}
		if start := b.roles.start.Load(); start >= 0 {
			hb.EpochStart = &start
		}
		hb.QueueEnds = b.ends.take(b.store)
	} else {
		hb.MasterEnd = b.roles.masterEnd.Load()
		b.ends.notMaster()
	}
	switch st := b.roles.State(); st.Kind {
	case RoleBroken:
		hb.Broken = st.Why
	case RoleWaiting:
		hb.Waiting = st.Why
	}
	hb.ResyncDone = b.roles.resyncDone.Load()
	hb.LastCut = b.roles.lastCut.Load()
}

// readableEnd is where the broker's reads stop: while it is a slave, at
// what every member of the sync set held at the master's last report (the
// registry's word in the heartbeat reply); -1: no limit (a master, or no
// word).
func (b *Broker) readableEnd() int64 {
	if b.roles == nil || b.roles.replication() != nil {
		return -1
	}
	if v := b.sess.latest(); v != nil && v.Role == routing.RoleSlave {
		return v.ReadableEnd
	}
	return -1
}

// ID is the broker's id.
func (b *Broker) ID() string { return b.cfg.ID }

// Addr is the broker's advertised data address.
func (b *Broker) Addr() string { return b.addr }

// HAAddr is where the broker serves its slave while it is the master.
func (b *Broker) HAAddr() string { return b.haAddr }

// Store exposes the commit log (reads and offsets).
func (b *Broker) Store() *storage.Log { return b.store }

// IsMaster reports whether the broker is its group's master now.
func (b *Broker) IsMaster() bool { return b.roles.replication() != nil }

// Role is what the broker is now: starting (no word from the registry
// yet), master, slave, waiting (a slave that will follow once its master
// confirms where its epoch began) or broken (a slave that cannot follow
// without an operator's resync), with the reason for the last two.
func (b *Broker) Role() RoleState { return b.roles.State() }

// Epoch is the last epoch whose records the broker's log holds.
func (b *Broker) Epoch() uint32 { return b.roles.epochs.local.Load() }

// Clock is the clock the broker reads.
func (b *Broker) Clock() clockwork.Clock { return b.cfg.Clock }

// Writable reports whether the broker takes writes now: the metaserver's
// last word is writable, and it was said within one session.
func (b *Broker) Writable() bool { return b.sess.lease.valid() }

// TakesHigh reports whether the broker is a master whose sync set holds
// the copies a HIGH message needs (the registry committed it).
func (b *Broker) TakesHigh() bool {
	rep := b.roles.replication()
	return rep != nil && !rep.refusesHigh()
}

// Replicas returns the master's view of each of its slaves (none on a
// slave).
func (b *Broker) Replicas() []SlaveState {
	if rep := b.roles.replication(); rep != nil {
		return rep.replicas()
	}
	return nil
}

// Slave returns the master's view of the slowest member of its sync set
// (the zero state on a slave).
func (b *Broker) Slave() SlaveState {
	rep := b.roles.replication()
	if rep == nil {
		return SlaveState{}
	}
	return rep.state()
}

// Stats returns the broker's counters.
func (b *Broker) Stats() *Stats { return &b.stats }

// Close stops the broker: it refuses new requests, fails HIGH messages still
// waiting for the slave, answers every request already read, stops its
// goroutines, and syncs and closes the commit log.
func (b *Broker) Close() error {
	var err error
	b.closeOnce.Do(func() {
		b.log.Info("broker closing")
		b.send.closing.Store(true)
		if rep := b.roles.replication(); rep != nil {
			rep.failWaiters("the broker is shutting down", protocol.StatusSlaveSyncTimeout)
		}
		err = b.shutdown()
	})
	return err
}

// shutdown stops what New started, in order: it cancels the broker's
// context (the long-poll loop then answers its parked PULLs, and any parked
// later, SHUTTING_DOWN), closes the data server (answering every request
// read), waits for the broker's goroutines (the replication loop answers its
// parked fetches), and closes the HA server, the metaserver client, and the
// commit log.
func (b *Broker) shutdown() error {
	b.cancel()
	if b.rpc != nil {
		_ = b.rpc.Close()
	}
	b.wg.Wait()
	if b.ha != nil {
		_ = b.ha.Close()
	}
	_ = b.meta.Close()
	if b.delays != nil {
		if err := b.delays.idx.Close(); err != nil {
			b.log.Warn("closing the timer index", "error", err)
		}
	}
	if err := b.store.Close(); err != nil {
		return fmt.Errorf("broker: close commit log: %w", err)
	}
	return nil
}

// retainLog is the part of the commit log that retention trims.
type retainLog interface {
	StartOffset() int64
	EndOffset() int64
	DeleteBefore(offset int64) (int64, error)
}

// retainer deletes whole segments before the last keep bytes of the log,
// every interval. A slave runs it on its own copy.
type retainer struct {
	log   retainLog
	keep  int64
	every time.Duration
	clock clockwork.Clock
	lg    hclog.Logger
	// pending moves (master) or keeps (slave) the pending delayed messages
	// before a log offset, and keeps the open marks of open transactions:
	// it returns the offset retention may delete before (nil: delete up to
	// it).
	pending func(ctx context.Context, before int64) int64
}

func (r *retainer) run(ctx context.Context) {
	tick := r.clock.NewTicker(r.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.Chan():
		}
		end := r.log.EndOffset()
		if end-r.log.StartOffset() <= r.keep {
			continue
		}
		before := end - r.keep
		if r.pending != nil {
			before = r.pending(ctx, before)
		}
		if before <= r.log.StartOffset() {
			continue
		}
		if _, err := r.log.DeleteBefore(before); err != nil {
			r.lg.Warn("retention failed", "error", err)
		}
	}
}
