package metaserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage/vfs"
)

// Server is one metaserver node: a raft member over the registry FSM, an
// RPC server for brokers, producers and admins, and, while it leads, the
// judge of broker groups.
//
// Goroutines: the RPC server's (see transport), raft's, the leadership loop
// (leaderLoop), and while leading one leader-work goroutine (lead) that runs
// the judge (which also expires old transaction decisions: txns.go). Close stops
// all of them.
type Server struct {
	cfg  Config
	log  hclog.Logger
	fsm  *fsm.FSM
	rpc  *transport.Server
	gate *auth.Gate // the RPC port's admission; nil: authorization off
	addr string     // advertised RPC address

	trans  *raft.NetworkTransport
	stream *streamLayer // the transport's, drained before raft shuts down
	store  *raftboltdb.BoltStore
	snaps  raft.SnapshotStore
	raft   *raft.Raft
	// started is set once raft runs; handlers refuse work before.
	started atomic.Bool
	// startWarned holds, per group, the epoch whose master reported a start
	// other than the fixed one (logged once per group and epoch).
	startWarned syncMap[string, uint32]

	peers    *client.Client // to reach the leader for forwarded work
	leaderCh chan bool
	stop     chan struct{}
	loopDone chan struct{}

	judge      judge
	consumers  consumers // consumer group sessions, judged with the brokers'
	routeCache routeCache
	push       routePush // topic changes to the brokers (topicpush.go)
	// routeLookups observes the route lookups this node answers (metrics.go).
	routeLookups prometheus.Histogram
	txnm         txnMetrics // the transaction decisions' (txns.go)
	// txnsCheckedAt is when the judge last looked for decisions to expire
	// (expireTxns; only the judge's goroutine touches it).
	txnsCheckedAt time.Time
	// auditCheckedAt is the same for the audit records (expireAudit).
	auditCheckedAt time.Time

	leaderMu   sync.Mutex
	leaderConn *transport.Client // to ask the leader for routes this node lacks

	closeOnce sync.Once
}

// New binds the node's RPC and raft listeners and opens its stores, but
// does not start raft: call Start. Splitting the two lets a caller learn
// every node's bound addresses (port 0) before building the peer list.
func New(cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:      cfg,
		log:      cfg.Logger.Named("metaserver").With("node", cfg.ID),
		fsm:      fsm.New(),
		leaderCh: make(chan bool, 16),
		stop:     make(chan struct{}),
		loopDone: make(chan struct{}),
	}
	s.routeLookups = newRouteLookupHistogram()
	s.txnm = newTxnMetrics(s.fsm)
	s.judge.init(cfg, s.fsm, s.apply, s.log.Named("judge"))
	s.consumers.init(cfg, s.fsm, s.apply, s.log.Named("consumers"))
	s.judge.consumers = &s.consumers
	s.judge.txnExpiry = func(ctx context.Context, now time.Time) {
		s.expireTxns(ctx, now)
		s.expireAudit(ctx, now)
	}
	s.push.init(cfg, s.fsm, s.log.Named("route-push"))
	var err error
	defer func() {
		if err != nil {
			s.closeResources()
		}
	}()
	// The directory, the raft store and the snapshot directory must
	// survive a power loss: a node that forgets its raft log or its vote
	// breaks raft's guarantees. bbolt and the snapshot store sync their
	// files and the snapshots' directory, not the names they create here.
	if err = vfs.MkdirAllDurable(vfs.Default, cfg.Dir); err != nil {
		return nil, fmt.Errorf("metaserver: data directory: %w", err)
	}
	if err = makeSnapshotDir(cfg.Dir); err != nil {
		return nil, err
	}
	if s.store, err = raftboltdb.New(raftboltdb.Options{Path: filepath.Join(cfg.Dir, "raft.db")}); err != nil {
		return nil, fmt.Errorf("metaserver: open raft store in %s: %w", cfg.Dir, err)
	}
	if s.snaps, err = raft.NewFileSnapshotStoreWithLogger(cfg.Dir, 2, s.log.Named("snapshots")); err != nil {
		return nil, fmt.Errorf("metaserver: open snapshot store: %w", err)
	}
	if err = vfs.Default.SyncDir(cfg.Dir); err != nil {
		return nil, fmt.Errorf("metaserver: data directory: %w", err)
	}
	var stream *streamLayer
	if stream, err = newRaftStream(cfg, s.log.Named("raft-net")); err != nil {
		return nil, fmt.Errorf("metaserver: raft transport on %s: %w", cfg.RaftAddr, err)
	}
	s.stream = stream
	s.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: stream, MaxPool: 3, Timeout: 10 * time.Second, Logger: s.log.Named("raft-net"),
	})
	s.rpc = transport.NewServer(transport.ServerConfig{Logger: s.log.Named("rpc"), TLS: cfg.TLSServer, Gate: s.admissionGate()})
	s.routes()
	var bound net.Addr
	if bound, err = s.rpc.Listen(cfg.RPCAddr); err != nil {
		return nil, fmt.Errorf("metaserver: %w", err)
	}
	s.addr = cfg.AdvertiseRPC
	if s.addr == "" {
		s.addr = bound.String()
	}
	return s, nil
}

// Open is New then Start with cfg.Peers.
func Open(cfg Config) (*Server, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.Start(cfg.Peers); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// RPCAddr is the node's advertised RPC address.
func (s *Server) RPCAddr() string { return s.addr }

// RaftAddr is the node's raft transport address.
func (s *Server) RaftAddr() string { return string(s.trans.LocalAddr()) }

// ID is the node's raft ID.
func (s *Server) ID() string { return s.cfg.ID }

// FSM exposes the node's registry for reads.
func (s *Server) FSM() *fsm.FSM { return s.fsm }

// Start starts raft. If the node has no raft state yet and its ID is in
// peers, it bootstraps the cluster from peers (identical on every node, so
// whichever node's bootstrap wins, they agree); a node with state ignores
// peers and resumes.
func (s *Server) Start(peers []Peer) error {
	s.cfg.Peers = peers
	rc := s.cfg.raftConfig()
	rc.Logger = quietWhenStopping(s.log.Named("raft"), s.stop)
	rc.NotifyCh = s.leaderCh
	if err := raft.ValidateConfig(rc); err != nil {
		return fmt.Errorf("metaserver: raft config: %w", err)
	}
	hasState, err := raft.HasExistingState(s.store, s.store, s.snaps)
	if err != nil {
		return fmt.Errorf("metaserver: read raft state: %w", err)
	}
	r, err := raft.NewRaft(rc, revokingFSM{s.fsm, s}, s.store, s.store, s.snaps, s.trans)
	if err != nil {
		return fmt.Errorf("metaserver: start raft: %w", err)
	}
	s.raft = r
	var addrs []string
	inPeers := false
	var servers []raft.Server
	for _, p := range peers {
		servers = append(servers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.RaftAddr), Suffrage: raft.Voter})
		addrs = append(addrs, p.RPCAddr)
		inPeers = inPeers || p.ID == s.cfg.ID
	}
	if !hasState && inPeers {
		err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
		if err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			return fmt.Errorf("metaserver: bootstrap: %w", err)
		}
		s.log.Info("bootstrapped the cluster", "peers", len(peers))
	} else if hasState {
		s.log.Info("resuming from existing raft state")
	}
	if len(addrs) == 0 {
		addrs = []string{s.addr}
	}
	s.peers, _ = client.New(client.Config{Addrs: addrs, Transport: s.clusterClient()})
	s.started.Store(true)
	go s.leaderLoop()
	return nil
}

// leaderLoop follows raft's leadership notifications: it starts the leader
// work when this node becomes leader and stops it when it steps down.
func (s *Server) leaderLoop() {
	defer close(s.loopDone)
	var work *leaderWork
	defer func() { work.stop() }()
	for {
		select {
		case leading := <-s.leaderCh:
			if leading && work == nil {
				work = s.startLeading()
			} else if !leading {
				work.stop()
				work = nil
			}
		case <-s.stop:
			return
		}
	}
}

// leaderWork is the running leader work of one term of leadership.
type leaderWork struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (s *Server) startLeading() *leaderWork {
	ctx, cancel := context.WithCancel(context.Background())
	w := &leaderWork{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		s.lead(ctx)
	}()
	return w
}

// stop cancels the work and waits for it; a nil work is a no-op.
func (w *leaderWork) stop() {
	if w == nil {
		return
	}
	w.cancel()
	<-w.done
}

// lead is the leader's work: a barrier so the FSM holds every committed
// entry, recording the members' RPC addresses, then the judge until ctx ends.
func (s *Server) lead(ctx context.Context) {
	defer s.push.release()
	s.log.Info("gained leadership; waiting for the barrier")
	if err := s.raft.Barrier(10 * time.Second).Error(); err != nil {
		s.log.Warn("barrier failed after gaining leadership", "error", err)
		return
	}
	members := s.fsm.Members()
	want := map[string]string{s.cfg.ID: s.addr}
	for _, p := range s.cfg.Peers {
		if _, known := members[p.ID]; !known && p.ID != s.cfg.ID {
			want[p.ID] = p.RPCAddr
		}
	}
	for id, addr := range want {
		if members[id] != addr {
			if _, err := s.apply(ctx, &fsm.SetMember{ID: id, RPCAddr: addr}); err != nil {
				s.log.Warn("recording a member's address failed", "member", id, "error", err)
			}
		}
	}
	s.judge.run(ctx)
	s.log.Info("lost leadership; judge stopped")
}

// Heartbeats is how many broker heartbeats this node took as leader.
func (s *Server) Heartbeats() int64 { return s.judge.heartbeats.Load() }

// JudgeRounds is how many rounds over every group the judge has finished on
// this node while leading (over all its terms).
func (s *Server) JudgeRounds() int64 { return s.judge.rounds.Load() }

// WaitJudged waits until the judge on this node has finished a round over
// every group that read Config.Clock at or after at, or until ctx ends. A
// test that moves a fake clock by at least JudgeInterval waits here for the
// judge to have looked at the new time, instead of sleeping.
func (s *Server) WaitJudged(ctx context.Context, at time.Time) error {
	return s.judge.waitRound(ctx, at)
}

// RaftStatus is this node's view of the Raft cluster.
func (s *Server) RaftStatus() api.RaftStatus {
	if !s.started.Load() {
		return api.RaftStatus{Node: s.cfg.ID, State: "Starting"}
	}
	return s.raftStatus()
}

// IsLeader reports whether this node leads and its leader work is ready.
func (s *Server) IsLeader() bool {
	return s.started.Load() && s.raft.State() == raft.Leader && s.judge.ready.Load()
}

// leaderRPC returns the current leader's RPC address, or "" if none is known.
func (s *Server) leaderRPC() string {
	if !s.started.Load() {
		return ""
	}
	_, id := s.raft.LeaderWithID()
	if id == "" {
		return ""
	}
	if id == raft.ServerID(s.cfg.ID) {
		return s.addr
	}
	if addr, ok := s.fsm.Members()[string(id)]; ok {
		return addr
	}
	for _, p := range s.cfg.Peers {
		if p.ID == string(id) {
			return p.RPCAddr
		}
	}
	return ""
}

// apply commits a command through raft and returns the FSM's result. The
// entry carries its audit stamp (stampOf: who, and the leader's clock) in
// its Extensions, so every node keeps the same audit record of it.
func (s *Server) apply(ctx context.Context, cmd fsm.Command) (*fsm.Result, error) {
	b, err := fsm.Encode(cmd)
	if err != nil {
		return nil, err
	}
	timeout := 5 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	f := s.raft.ApplyLog(raft.Log{Data: b, Extensions: fsm.EncodeStamp(s.stampOf(ctx))}, timeout)
	if err := f.Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrLeadershipTransferInProgress) {
			return nil, &protocol.Error{Status: protocol.StatusNotLeader, Message: s.leaderRPC()}
		}
		return nil, fmt.Errorf("metaserver: apply %T: %w", cmd, err)
	}
	switch r := f.Response().(type) {
	case error:
		return nil, r
	case *fsm.Result:
		return r, nil
	default:
		return &fsm.Result{}, nil
	}
}

// Close stops the node: the RPC server, the leader work, raft, and the stores.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		s.push.close() // parked route watches hold the RPC server's Close
		if s.rpc != nil {
			_ = s.rpc.Close()
		}
		if s.started.Load() {
			<-s.loopDone
			s.stream.drain()
			if err := s.raft.Shutdown().Error(); err != nil {
				s.log.Warn("raft shutdown failed", "error", err)
			}
		}
		if s.peers != nil {
			_ = s.peers.Close()
		}
		s.leaderMu.Lock()
		if s.leaderConn != nil {
			_ = s.leaderConn.Close()
		}
		s.leaderMu.Unlock()
		s.closeResources()
	})
	return nil
}

func (s *Server) closeResources() {
	if s.rpc != nil && !s.started.Load() {
		_ = s.rpc.Close()
	}
	if s.trans != nil {
		_ = s.trans.Close()
	}
	if s.store != nil {
		_ = s.store.Close()
	}
}

// handle registers a JSON request/response handler. With authorization
// on, a request is checked (authz.go) before anything else is said of it:
// as the connection's principal, or as the actor the cluster names for it
// (actorOf: the console's certificate sessions), whose name the audit
// records of its commands then carry.
// leaderOnly handlers answer NOT_LEADER (with the leader's address as the
// body) on a follower.
func handle[Req, Resp any](s *Server, code protocol.Code, leaderOnly bool, fn func(ctx context.Context, req Req) (Resp, error)) {
	s.rpc.Handle(code, func(r *transport.Request) {
		if !s.started.Load() {
			r.ReplyError(&protocol.Error{Status: protocol.StatusBusy, Message: "metaserver node is starting"})
			return
		}
		var req Req
		if err := json.Unmarshal(r.Body, &req); err != nil {
			r.ReplyError(&protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("decode %v request: %v", code, err)})
			return
		}
		actor, err := s.actorOf(r)
		switch {
		case err != nil:
		case actor != nil:
			err = auth.Authorize(*actor, code, targetOf(req))
		default:
			err = s.authorize(r, code, targetOf(req))
		}
		if err != nil {
			r.ReplyError(err)
			return
		}
		if leaderOnly && !s.IsLeader() {
			if s.raft.State() == raft.Leader {
				r.ReplyError(&protocol.Error{Status: protocol.StatusBusy, Message: "leader is not ready yet"})
				return
			}
			_ = r.ReplyStatus(protocol.StatusNotLeader, []byte(s.leaderRPC()))
			return
		}
		ctx, cancel := context.WithTimeout(s.requestContext(r, actor), 5*time.Second)
		defer cancel()
		resp, err := fn(ctx, req)
		if err != nil {
			var pe *protocol.Error
			if errors.As(err, &pe) && pe.Status == protocol.StatusNotLeader {
				_ = r.ReplyStatus(protocol.StatusNotLeader, []byte(pe.Message))
				return
			}
			r.ReplyError(err)
			return
		}
		body, err := json.Marshal(resp)
		if err != nil {
			r.ReplyError(fmt.Errorf("encode %v response: %w", code, err))
			return
		}
		_ = r.Reply(body)
	})
}
