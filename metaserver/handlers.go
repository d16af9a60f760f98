package metaserver

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

type empty struct{}

func (s *Server) routes() {
	// IDENTIFY: this is a metaserver (a client that got an answer it did
	// not expect asks, to tell a wrong address from an old metaserver).
	s.rpc.Handle(protocol.CodeIdentify, func(r *transport.Request) {
		_ = r.Reply(protocol.AppendIdentity(nil, &protocol.Identity{Kind: protocol.KindMetaserver, ID: s.cfg.ID}))
	})
	handle(s, protocol.CodeHeartbeat, true, s.heartbeatAndEnds)
	s.rpc.Handle(protocol.CodeRouteLookup, func(r *transport.Request) { s.handleRouteLookup(r, s.cfg.AutoCreateTopics) })
	s.rpc.Handle(protocol.CodeRouteGet, func(r *transport.Request) { s.handleRouteLookup(r, false) })
	s.rpc.Handle(protocol.CodeRouteWatch, s.handleRouteWatch)
	handle(s, protocol.CodeInitProducer, true, s.initProducer)
	handle(s, protocol.CodeAdminGroups, true, s.groups)
	handle(s, protocol.CodeAdminTopics, false, func(context.Context, empty) ([]routing.Topic, error) {
		return s.fsm.Topics(), nil
	})
	handle(s, protocol.CodeAdminCreateTopic, true, s.createTopic)
	handle(s, protocol.CodeAdminAddQueues, true, s.addQueues)
	handle(s, protocol.CodeAdminSetGroupMode, true, s.setGroupMode)
	handle(s, protocol.CodeAdminResync, true, s.resyncBroker)
	handle(s, protocol.CodeAdminRaftStatus, false, func(context.Context, empty) (api.RaftStatus, error) {
		return s.raftStatus(), nil
	})
	handle(s, protocol.CodeAdminAddVoter, true, s.addVoter)
	handle(s, protocol.CodeAdminRemoveVoter, true, s.removeVoter)
	handle(s, protocol.CodeConsumerHeartbeat, true, s.consumerHeartbeat)
	handle(s, protocol.CodeCommitOffsets, true, s.commitOffsets)
	handle(s, protocol.CodeConsumerGroups, true, s.consumerGroups)
	handle(s, protocol.CodeResetOffsets, true, s.resetOffsets)
	handle(s, protocol.CodeDeleteGroup, true, s.deleteConsumerGroup)
	handle(s, protocol.CodeSetGroupFilter, true, s.setGroupFilter)
	s.authRoutes()
	s.groupRoutes()
	s.syncSetRoutes()
	s.txnRoutes()
	s.auditRoutes()
}

func invalid(format string, args ...any) error {
	return &protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf(format, args...)}
}

func (s *Server) heartbeat(ctx context.Context, hb api.Heartbeat) (api.HeartbeatReply, error) {
	if hb.Group == "" || hb.BrokerID == "" || hb.Addr == "" || (hb.Role != routing.RoleMaster && hb.Role != routing.RoleSlave) {
		return api.HeartbeatReply{}, invalid("heartbeat needs a group, a broker id, an address and a role (master or slave)")
	}
	now := s.cfg.Clock.Now()
	want := routing.Broker{ID: hb.BrokerID, Addr: hb.Addr, HAAddr: hb.HAAddr}
	g, ok := s.fsm.Group(hb.Group)
	role, known := g.RoleOf(hb.BrokerID)
	slave, _ := g.SlaveByID(hb.BrokerID)
	if !ok || !known || (role == routing.RoleMaster && g.Master != want) || (role == routing.RoleSlave && slave != want) {
		// Roles are the registry's: hb.Role is only the broker's preference
		// when it first joins its group (a group with a master and a slave
		// takes it as one more slave).
		if err := s.register(ctx, g, known, hb, want, now); err != nil {
			return api.HeartbeatReply{}, err
		}
		g, _ = s.fsm.Group(hb.Group)
		role, _ = g.RoleOf(hb.BrokerID)
		s.log.Info("broker registered", "group", hb.Group, "role", role, "preferred", hb.Role, "broker", hb.BrokerID,
			"addr", hb.Addr, "epoch", g.Epoch, "slaves", len(g.Slaves))
	}
	if promoting := s.judge.heartbeat(hb, now); promoting != nil {
		// Answer from the registry as the promotion left it (judge.heartbeat).
		select {
		case <-promoting:
		case <-ctx.Done():
			return api.HeartbeatReply{}, ctx.Err()
		}
		g, _ = s.fsm.Group(hb.Group)
		role, _ = g.RoleOf(hb.BrokerID)
	}
	s.epochWord(ctx, g, role, hb)
	s.judge.judgeGroup(ctx, hb.Group, now)
	g, _ = s.fsm.Group(hb.Group)
	reply := api.HeartbeatReply{Group: g, SessionMillis: s.cfg.SessionTimeout.Milliseconds(), ACLVersion: s.fsm.ACLVersion(),
		LagTimeMillis: s.cfg.LagTime.Milliseconds(), NowMillis: s.cfg.Clock.Now().UnixMilli()}
	if role == routing.RoleSlave {
		reply.ReadableEnd = s.judge.readableEnd(g)
	}
	return reply, nil
}

// handleRouteLookup answers a route lookup: the body is the topic name, the
// answer a binary route (routing.AppendRoute). Encoded routes are cached per
// topic until the registry's version moves.
func (s *Server) handleRouteLookup(r *transport.Request, create bool) {
	if !s.started.Load() {
		r.ReplyError(&protocol.Error{Status: protocol.StatusBusy, Message: "metaserver node is starting"})
		return
	}
	defer s.observeRouteLookup(time.Now())
	topic := string(r.Body)
	if err := s.authorizeTopic(r, topic); err != nil {
		r.ReplyError(err)
		return
	}
	version := s.fsm.Version()
	if body, ok := s.routeCache.get(topic, version); ok {
		_ = r.Reply(body)
		return
	}
	ctx, cancel := context.WithTimeout(s.requestContext(r, nil), 5*time.Second)
	defer cancel()
	route, err := s.routeLookup(ctx, topic, create)
	if err != nil {
		r.ReplyError(err)
		return
	}
	body := routing.AppendRoute(nil, &route)
	if route.Version == version {
		s.routeCache.put(topic, version, body)
	}
	_ = r.Reply(body)
}

// routeCache holds encoded routes by topic, valid for one registry version.
type routeCache struct {
	mu      sync.RWMutex
	version uint64
	routes  map[string][]byte
}

func (c *routeCache) get(topic string, version uint64) ([]byte, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.version != version {
		return nil, false
	}
	b, ok := c.routes[topic]
	return b, ok
}

func (c *routeCache) put(topic string, version uint64, body []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.version != version {
		c.version, c.routes = version, map[string][]byte{}
	}
	if len(c.routes) < 100_000 {
		c.routes[topic] = body
	}
}

func (s *Server) routeLookup(ctx context.Context, topic string, create bool) (routing.Route, error) {
	if err := protocol.ValidateTopic(topic); err != nil {
		return routing.Route{}, invalid("%v", err)
	}
	if r, ok := s.fsm.Route(topic); ok {
		return r, nil
	}
	if !create {
		// A follower may not have applied the topic's creation yet: only the
		// leader's "unknown" is the cluster's.
		if leader := s.leaderRPC(); leader != "" && leader != s.addr {
			return s.leaderRoute(ctx, leader, topic)
		}
		return routing.Route{}, &protocol.Error{Status: protocol.StatusUnknownTopic, Message: fmt.Sprintf("topic %q does not exist", topic)}
	}
	req := api.CreateTopicRequest{Name: topic, Queues: s.cfg.DefaultQueues, IfMissing: true}
	if s.IsLeader() {
		return s.createTopic(ctx, req)
	}
	return s.peers.CreateTopic(ctx, req)
}

func (s *Server) groups(context.Context, empty) ([]api.GroupInfo, error) {
	now := s.cfg.Clock.Now()
	holders := map[string]int{}
	for _, t := range s.fsm.Topics() {
		for _, g := range t.Queues {
			holders[g]++
		}
	}
	var out []api.GroupInfo
	for _, g := range s.fsm.Groups() {
		gi := s.judge.info(g, now)
		gi.Holders = holders[g.Name]
		out = append(out, gi)
	}
	return out, nil
}

// writableGroups returns the admitted writable groups that have a master:
// those new queues go to.
func (s *Server) writableGroups() []string {
	var out []string
	for _, g := range s.fsm.Groups() {
		if g.Placeable() {
			out = append(out, g.Name)
		}
	}
	return out
}

func (s *Server) createTopic(ctx context.Context, req api.CreateTopicRequest) (routing.Route, error) {
	if err := protocol.ValidateTopic(req.Name); err != nil {
		return routing.Route{}, invalid("%v", err)
	}
	if r, ok := s.fsm.Route(req.Name); ok {
		if req.IfMissing {
			s.pushTopic(ctx, req.Name, false, false) // a creation under way may still be pushing it
			return r, nil
		}
		return routing.Route{}, &protocol.Error{Status: protocol.StatusConflict, Message: fmt.Sprintf("topic %q already exists", req.Name)}
	}
	// A new topic's name has the rules of new names (a topic made before
	// them is found above, whatever its name).
	if err := protocol.ValidateNewTopic(req.Name); err != nil {
		return routing.Route{}, invalid("%v", err)
	}
	n := req.Queues
	if n <= 0 {
		n = s.cfg.DefaultQueues
	}
	if n > maxQueues {
		return routing.Route{}, invalid("%d queues is over the limit of %d", n, maxQueues)
	}
	groups := req.Groups
	if len(groups) == 0 {
		groups = s.writableGroups()
	}
	if len(groups) == 0 {
		return routing.Route{}, &protocol.Error{Status: protocol.StatusNoRoute, Message: "no admitted, writable broker group to place queues on"}
	}
	queues := routing.SpreadQueues(n, groups, len(s.fsm.Topics()))
	if _, err := s.apply(ctx, &fsm.CreateTopic{Name: req.Name, Queues: queues}); err != nil {
		return routing.Route{}, err
	}
	s.pushTopic(ctx, req.Name, true, false)
	s.log.Info("topic created", "topic", req.Name, "queues", n)
	r, _ := s.fsm.Route(req.Name)
	return r, nil
}

// initProducer allocates a producer identity through raft: one write per
// producer start. The identity is answered only once committed and applied,
// so no later leader can hand it out again.
func (s *Server) initProducer(ctx context.Context, req api.InitProducerRequest) (api.InitProducerReply, error) {
	if err := fsm.ValidateProducerName(req.Name); err != nil {
		return api.InitProducerReply{}, invalid("%v", err)
	}
	res, err := s.apply(ctx, &fsm.InitProducer{Name: req.Name})
	if err != nil {
		return api.InitProducerReply{}, err
	}
	if req.Name != "" {
		s.log.Info("named producer started", "producer", req.Name, "id", res.Producer.ID, "epoch", res.Producer.Epoch)
	}
	return api.InitProducerReply{ID: res.Producer.ID, Epoch: res.Producer.Epoch}, nil
}

func (s *Server) addQueues(ctx context.Context, req api.AddQueuesRequest) (routing.Route, error) {
	if req.Count <= 0 || req.Count > maxQueues {
		return routing.Route{}, invalid("queue count must be 1 to %d, got %d", maxQueues, req.Count)
	}
	topics := s.fsm.Topics()
	i := sort.Search(len(topics), func(i int) bool { return topics[i].Name >= req.Topic })
	if i == len(topics) || topics[i].Name != req.Topic {
		return routing.Route{}, &protocol.Error{Status: protocol.StatusUnknownTopic, Message: fmt.Sprintf("topic %q does not exist", req.Topic)}
	}
	// A topic holds at most maxQueues queues, created or grown: the apply
	// below expects this version of the topic, so the count checked here
	// is the one grown.
	if have := len(topics[i].Queues); have+req.Count > maxQueues {
		return routing.Route{}, invalid("topic %q has %d queues: adding %d would make %d, over the limit of %d a topic has (add at most %d)",
			req.Topic, have, req.Count, have+req.Count, maxQueues, max(0, maxQueues-have))
	}
	groups := s.writableGroups()
	if len(groups) == 0 {
		return routing.Route{}, &protocol.Error{Status: protocol.StatusNoRoute, Message: "no admitted, writable broker group to place queues on"}
	}
	add := routing.SpreadQueues(req.Count, groups, len(topics[i].Queues))
	res, err := s.apply(ctx, &fsm.AddQueues{Topic: req.Topic, Groups: add, ExpectVersion: topics[i].Version, At: s.cfg.Clock.Now().UnixMilli()})
	if err != nil {
		return routing.Route{}, err
	}
	if res.Rebalanced > 0 {
		s.consumers.rebalances.Add(int64(res.Rebalanced))
		s.log.Info("queues added; consumer groups subscribed to the topic rebalanced", "topic", req.Topic, "groups", res.Rebalanced)
	}
	s.pushTopic(ctx, req.Topic, res.Changed, res.Changed)
	r, _ := s.fsm.Route(req.Topic)
	return r, nil
}

func (s *Server) setGroupMode(ctx context.Context, req api.SetGroupModeRequest) (routing.Group, error) {
	cmd := &fsm.SetGroupReasons{Group: req.Group, At: s.cfg.Clock.Now().UnixMilli()}
	if req.ReadOnly {
		cmd.Set = routing.Admin
	} else {
		cmd.Clear = routing.Admin
	}
	if _, err := s.apply(ctx, cmd); err != nil {
		return routing.Group{}, err
	}
	s.log.Info("admin changed a group's mode", "group", req.Group, "read-only", req.ReadOnly)
	g, _ := s.fsm.Group(req.Group)
	return g, nil
}

func (s *Server) raftStatus() api.RaftStatus {
	stats := s.raft.Stats()
	parse := func(k string) uint64 {
		var v uint64
		_, _ = fmt.Sscan(stats[k], &v)
		return v
	}
	_, leaderID := s.raft.LeaderWithID()
	st := api.RaftStatus{
		Node: s.cfg.ID, State: s.raft.State().String(), LeaderID: string(leaderID), LeaderAddr: s.leaderRPC(),
		Term: parse("term"), LastIndex: parse("last_log_index"), CommitIndex: parse("commit_index"), AppliedIndex: parse("applied_index"),
		LastContactMillis: -1,
	}
	// Raft stamps its contacts with the real clock, not Config.Clock.
	if st.State == raft.Leader.String() {
		st.LastContactMillis = 0
	} else if last := s.raft.LastContact(); !last.IsZero() {
		st.LastContactMillis = time.Since(last).Milliseconds()
	}
	members := s.fsm.Members()
	if f := s.raft.GetConfiguration(); f.Error() == nil {
		for _, srv := range f.Configuration().Servers {
			rpc, ok := members[string(srv.ID)]
			for _, p := range s.cfg.Peers {
				if !ok && p.ID == string(srv.ID) {
					rpc = p.RPCAddr // the leader records it in the registry soon after the bootstrap
				}
			}
			st.Members = append(st.Members, api.RaftMember{ID: string(srv.ID), RaftAddr: string(srv.Address),
				RPCAddr: rpc, Suffrage: srv.Suffrage.String(), Leader: srv.ID == leaderID})
		}
	}
	return st
}

func (s *Server) addVoter(ctx context.Context, req api.VoterRequest) (api.RaftStatus, error) {
	if req.ID == "" || req.RaftAddr == "" || req.RPCAddr == "" {
		return api.RaftStatus{}, invalid("add voter needs an id, a raft address and an RPC address")
	}
	if _, err := s.apply(ctx, &fsm.SetMember{ID: req.ID, RPCAddr: req.RPCAddr}); err != nil {
		return api.RaftStatus{}, err
	}
	if err := s.raft.AddVoter(raft.ServerID(req.ID), raft.ServerAddress(req.RaftAddr), 0, 10*time.Second).Error(); err != nil {
		return api.RaftStatus{}, fmt.Errorf("add voter %s: %w", req.ID, err)
	}
	s.log.Info("voter added", "id", req.ID, "raft-addr", req.RaftAddr)
	s.noteAudit(ctx, "add-voter", req)
	return s.raftStatus(), nil
}

func (s *Server) removeVoter(ctx context.Context, req api.VoterRequest) (api.RaftStatus, error) {
	if req.ID == "" {
		return api.RaftStatus{}, invalid("remove voter needs an id")
	}
	// raft takes the removal of a server it does not have as done: an id
	// mistyped would say it removed what was never there.
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return api.RaftStatus{}, fmt.Errorf("remove voter %s: %w", req.ID, err)
	}
	var ids []string
	for _, srv := range f.Configuration().Servers {
		ids = append(ids, string(srv.ID))
	}
	if !slices.Contains(ids, req.ID) {
		return api.RaftStatus{}, &protocol.Error{Status: protocol.StatusNotFound,
			Message: fmt.Sprintf("no metaserver %q in the Raft configuration (members: %s)", protocol.Clip(req.ID), strings.Join(ids, ", "))}
	}
	if err := s.raft.RemoveServer(raft.ServerID(req.ID), 0, 10*time.Second).Error(); err != nil {
		return api.RaftStatus{}, fmt.Errorf("remove voter %s: %w", req.ID, err)
	}
	if req.ID != s.cfg.ID {
		if _, err := s.apply(ctx, &fsm.RemoveMember{ID: req.ID}); err != nil {
			return api.RaftStatus{}, err
		}
	}
	s.log.Info("voter removed", "id", req.ID)
	s.noteAudit(ctx, "remove-voter", api.VoterRequest{ID: req.ID})
	return s.raftStatus(), nil
}

// leaderRoute asks the leader for a route that this follower does not know.
func (s *Server) leaderRoute(ctx context.Context, leader, topic string) (routing.Route, error) {
	s.leaderMu.Lock()
	if s.leaderConn == nil || s.leaderConn.Addr() != leader {
		if s.leaderConn != nil {
			_ = s.leaderConn.Close()
		}
		s.leaderConn = transport.NewClient(leader, s.clusterClient())
	}
	conn := s.leaderConn
	s.leaderMu.Unlock()
	resp, err := conn.Call(ctx, protocol.CodeRouteGet, []byte(topic))
	if err != nil {
		return routing.Route{}, err
	}
	return routing.DecodeRoute(resp.Body)
}
