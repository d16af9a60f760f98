package metaserver

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/protocol"
)

// Consumer groups on the leader. Membership, generations, assignments and
// committed offsets live in the registry (fsm/consumers.go); the members'
// sessions live only in the leader's memory, like brokers' (judge.go):
//
//   - a heartbeat records the member's session, and applies JoinGroup when
//     the registry does not have the member with these topics and session;
//   - a heartbeat with Leave applies LeaveGroup at once;
//   - each judge round, a member unheard of for longer than its session
//     leaves the group (LeaveGroup naming the generation it was judged in);
//   - a new leader starts every member's session at its takeover, so no
//     member is expired by an election alone (one full session of grace).
//
// Every time read here comes from Config.Clock.

const (
	// minConsumerSession and maxConsumerSession bound a member's session.
	minConsumerSession = time.Second
	maxConsumerSession = 5 * time.Minute
)

type memberKey struct{ group, member string }

// consumers is the leader's memory of consumer group members.
type consumers struct {
	cfg   Config
	fsm   *fsm.FSM
	apply func(context.Context, fsm.Command) (*fsm.Result, error)
	log   hclog.Logger

	commits    atomic.Int64 // commits applied
	rebalances atomic.Int64 // new generations this node applied as leader
	expired    atomic.Int64 // members removed because their session ran out

	// handover observes how long queues waited for their holder to let go
	// (handover.go).
	handover prometheus.Histogram

	mu       sync.Mutex
	since    time.Time               // when this leadership's judge started
	sessions map[memberKey]time.Time // last heartbeat by member
	// incs is the last heartbeat of each incarnation of a member that
	// names one (handover.go).
	incs map[memberKey]map[uint64]time.Time
	// redelivered holds the latest redeliveries each group's commits
	// reported, at most redeliveredPerGroup a group, redeliveredGroups
	// groups.
	redelivered map[string][]api.Redelivery
}

// Bounds of the redeliveries a leader keeps.
const (
	redeliveredPerGroup = 1024
	redeliveredGroups   = 4096
)

// noteRedelivered keeps what a member's commit reported.
func (c *consumers) noteRedelivered(group, member string, rs []api.Redelivery) {
	if len(rs) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.redelivered == nil {
		c.redelivered = map[string][]api.Redelivery{}
	}
	if _, ok := c.redelivered[group]; !ok && len(c.redelivered) >= redeliveredGroups {
		for g := range c.redelivered {
			delete(c.redelivered, g)
			break
		}
	}
	kept := c.redelivered[group]
	for _, r := range rs {
		r.Member = member
		kept = append(kept, r)
	}
	if over := len(kept) - redeliveredPerGroup; over > 0 {
		kept = slices.Clone(kept[over:])
	}
	c.redelivered[group] = kept
}

func (c *consumers) init(cfg Config, f *fsm.FSM, apply func(context.Context, fsm.Command) (*fsm.Result, error), log hclog.Logger) {
	c.cfg, c.fsm, c.apply, c.log = cfg, f, apply, log
	c.sessions = map[memberKey]time.Time{}
	c.incs = map[memberKey]map[uint64]time.Time{}
	c.handover = newHandoverHistogram()
}

// begin starts a term of leadership at now: every session starts now.
func (c *consumers) begin(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.since = now
	c.sessions = map[memberKey]time.Time{}
	c.incs = map[memberKey]map[uint64]time.Time{}
}

func (c *consumers) heartbeat(k memberKey, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sessions[k] = now
}

func (c *consumers) forget(k memberKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.sessions, k)
	delete(c.incs, k)
}

// sessionOf is the session the leader applies to a member of the registry.
func (c *consumers) sessionOf(m *fsm.ConsumerMember) time.Duration {
	if m == nil || m.SessionMillis == 0 {
		return c.cfg.ConsumerSession
	}
	return time.Duration(m.SessionMillis) * time.Millisecond
}

// lastLocked is a member's last heartbeat, or the takeover if none since.
func (c *consumers) lastLocked(k memberKey) (time.Time, bool) {
	if t, ok := c.sessions[k]; ok {
		return t, true
	}
	return c.since, false
}

// live reports whether group has a member whose session has not run out at
// now, in the leader's memory.
func (c *consumers) live(group string, now time.Time) bool {
	g, _ := c.fsm.ConsumerGroup(group)
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, last := range c.sessions {
		if k.group == group && now.Sub(last) <= c.sessionOf(g.Members[k.member]) {
			return true
		}
	}
	return false
}

// round expires, at now, every member whose session ran out, group by
// group, one LeaveGroup each (re-reading the group after each, since each
// moves the generation).
func (c *consumers) round(ctx context.Context, now time.Time) {
	for _, g := range c.fsm.ConsumerGroups() {
		for range len(g.Members) {
			id, silent := c.expiredMember(g, now)
			if id == "" {
				break
			}
			var leave fsm.Command = &fsm.LeaveGroup{Group: g.Name, Member: id, ExpectGeneration: g.Generation, At: now.UnixMilli()}
			if g.Cooperative {
				leave = &fsm.LeaveMember{Group: g.Name, Member: id, ExpectGeneration: g.Generation, At: now.UnixMilli()}
			}
			_, err := c.apply(ctx, leave)
			if err == nil {
				c.observeReleased(g, id, 0, nil, true, now)
			}
			if err != nil {
				c.log.Warn("expiring a consumer group member failed", "group", g.Name, "member", id, "error", err)
				break
			}
			c.forget(memberKey{g.Name, id})
			c.expired.Add(1)
			c.rebalances.Add(1)
			g, _ = c.fsm.ConsumerGroup(g.Name)
			c.log.Warn("consumer group member expired: no heartbeat within its session", "group", g.Name, "member", id,
				"silent", silent, "generation", g.Generation)
		}
	}
	c.cooperativeRound(ctx, now)
	// Forget sessions of members the registry no longer has (a join that
	// failed), once no session could still be running.
	c.mu.Lock()
	for k, last := range c.sessions {
		if now.Sub(last) > maxConsumerSession {
			delete(c.sessions, k)
		}
	}
	c.mu.Unlock()
}

// expiredMember returns the first member of g (by id) whose session ran out
// at now, and how long it has been silent; "" if none.
func (c *consumers) expiredMember(g fsm.ConsumerGroup, now time.Time) (string, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range slices.Sorted(maps.Keys(g.Members)) {
		last, _ := c.lastLocked(memberKey{g.Name, id})
		if silent := now.Sub(last); silent > c.sessionOf(g.Members[id]) {
			return id, silent
		}
	}
	return "", 0
}

// ConsumerStats counts what the leader did with consumer groups, over all
// its terms of leadership.
type ConsumerStats struct {
	Commits    int64 // offset commits applied
	Rebalances int64 // new generations applied (joins, leaves, expiries, added queues)
	Expired    int64 // members removed because their session ran out
}

// ConsumerStats returns the node's consumer group counters.
func (s *Server) ConsumerStats() ConsumerStats {
	c := &s.consumers
	return ConsumerStats{Commits: c.commits.Load(), Rebalances: c.rebalances.Load(), Expired: c.expired.Load()}
}

// consumerSession is the session applied to a member asking for ms (0: the
// default), bounded to [1 s, 5 min].
func (s *Server) consumerSession(ms int64) (time.Duration, error) {
	if ms < 0 {
		return 0, invalid("session must not be negative, got %d ms", ms)
	}
	if ms == 0 {
		return s.cfg.ConsumerSession, nil
	}
	return min(max(time.Duration(ms)*time.Millisecond, minConsumerSession), maxConsumerSession), nil
}

func validateMember(group, member string) error {
	if err := fsm.ValidateConsumerName("group", group); err != nil {
		return invalid("%v", err)
	}
	if err := fsm.ValidateConsumerName("member", member); err != nil {
		return invalid("%v", err)
	}
	return nil
}

func (s *Server) validateTopics(topics []string) ([]string, error) {
	topics = fsm.NormalizeTopics(topics)
	if len(topics) == 0 || len(topics) > fsm.MaxConsumerTopics {
		return nil, invalid("a member subscribes to 1 to %d topics, got %d", fsm.MaxConsumerTopics, len(topics))
	}
	for _, t := range topics {
		if err := protocol.ValidateTopic(t); err != nil {
			return nil, invalid("%v", err)
		}
		if _, ok := s.fsm.Route(t); !ok {
			return nil, &protocol.Error{Status: protocol.StatusUnknownTopic, Message: fmt.Sprintf("topic %q does not exist", t)}
		}
	}
	return topics, nil
}

func (s *Server) consumerHeartbeat(ctx context.Context, hb api.ConsumerHeartbeat) (api.ConsumerHeartbeatReply, error) {
	if err := validateMember(hb.Group, hb.Member); err != nil {
		return api.ConsumerHeartbeatReply{}, err
	}
	session, err := s.consumerSession(hb.SessionMillis)
	if err != nil {
		return api.ConsumerHeartbeatReply{}, err
	}
	// Another principal's member: refused before anything is recorded (the
	// registry checks again at apply).
	who := principalOf(ctx)
	if err := s.fsm.CheckBound(hb.Group, hb.Member, who); err != nil {
		return api.ConsumerHeartbeatReply{}, err
	}
	if hb.Filter, err = canonicalFilter(hb.Filter); err != nil {
		return api.ConsumerHeartbeatReply{}, err
	}
	if hb.Incarnation != 0 {
		return s.cooperativeHeartbeat(ctx, hb, session)
	}
	now := s.cfg.Clock.Now()
	k := memberKey{hb.Group, hb.Member}
	reply := api.ConsumerHeartbeatReply{Assignment: []api.QueueAssignment{}, SessionMillis: session.Milliseconds()}
	if hb.Leave {
		res, err := s.apply(ctx, &fsm.LeaveGroup{Group: hb.Group, Member: hb.Member, At: now.UnixMilli(), Principal: who})
		if err != nil {
			return api.ConsumerHeartbeatReply{}, err
		}
		s.consumers.forget(k)
		reply.Generation = res.Generation
		if res.Changed {
			s.consumers.rebalances.Add(1)
			s.log.Info("consumer group member left", "group", hb.Group, "member", hb.Member, "generation", res.Generation)
		}
		return reply, nil
	}
	topics, err := s.validateTopics(hb.Topics)
	if err != nil {
		return api.ConsumerHeartbeatReply{}, err
	}
	// The session first, so the judge cannot expire the member between its
	// join and its record.
	s.consumers.heartbeat(k, now)
	g, _ := s.fsm.ConsumerGroup(hb.Group)
	if m := g.Members[hb.Member]; m == nil || !slices.Equal(m.Topics, topics) || m.SessionMillis != session.Milliseconds() ||
		m.Principal == "" && who != "" {
		res, err := s.apply(ctx, &fsm.JoinGroup{Group: hb.Group, Member: hb.Member, Topics: topics,
			SessionMillis: session.Milliseconds(), At: now.UnixMilli(), Principal: who, Filter: hb.Filter})
		if err != nil {
			if m == nil {
				s.consumers.forget(k)
			}
			return api.ConsumerHeartbeatReply{}, err
		}
		if res.Rebalanced > 0 {
			s.consumers.rebalances.Add(1)
			s.log.Info("consumer group member joined", "group", hb.Group, "member", hb.Member, "topics", topics,
				"session", session, "generation", res.Generation)
		}
	}
	var queues []fsm.QueueOffset
	reply.Generation, queues = s.fsm.MemberQueues(hb.Group, hb.Member)
	reply.Filter = s.fsm.GroupFilter(hb.Group)
	for _, q := range queues {
		reply.Assignment = append(reply.Assignment, api.QueueAssignment{Topic: q.Topic, Queue: q.Queue, Committed: q.Offset,
			CommittedEpoch: q.Epoch, EpochGroup: q.EpochGroup})
	}
	return reply, nil
}

func toFSMOffsets(in []api.QueueOffset) []fsm.QueueOffset {
	out := make([]fsm.QueueOffset, len(in))
	for i, o := range in {
		out[i] = fsm.QueueOffset{Topic: o.Topic, Queue: o.Queue, Offset: o.Offset, Epoch: o.Epoch, EpochGroup: o.EpochGroup, Rewound: o.Rewound}
	}
	return out
}

func toAPIOffsets(in []fsm.QueueOffset) []api.QueueOffset {
	out := make([]api.QueueOffset, len(in))
	for i, o := range in {
		out[i] = api.QueueOffset{Topic: o.Topic, Queue: o.Queue, Offset: o.Offset, Epoch: o.Epoch}
	}
	return out
}

func checkOffsets(what string, offsets []api.QueueOffset) error {
	if len(offsets) > fsm.MaxCommitOffsets {
		return invalid("a %s carries at most %d offsets, got %d", what, fsm.MaxCommitOffsets, len(offsets))
	}
	for _, o := range offsets {
		if o.Offset < 0 {
			return invalid("offset of %s queue %d is %d; offsets are 0 or more", o.Topic, o.Queue, o.Offset)
		}
	}
	return nil
}

// commitOffsets applies one commit: one Raft write per request (the SDK
// batches a member's queues into one). What the local registry already
// refuses (a generation or a queue that can no longer be the member's) is
// refused without a write; the FSM checks again at apply.
func (s *Server) commitOffsets(ctx context.Context, req api.CommitRequest) (api.CommitReply, error) {
	if err := validateMember(req.Group, req.Member); err != nil {
		return api.CommitReply{}, err
	}
	if err := checkOffsets("commit", req.Offsets); err != nil {
		return api.CommitReply{}, err
	}
	if len(req.Redelivered) > api.MaxRedelivered {
		return api.CommitReply{}, invalid("a commit reports at most %d redeliveries, got %d", api.MaxRedelivered, len(req.Redelivered))
	}
	who := principalOf(ctx)
	cmd := &fsm.CommitOffsets{Group: req.Group, Member: req.Member, Generation: req.Generation, Offsets: toFSMOffsets(req.Offsets), Principal: who}
	g, ok := s.fsm.ConsumerGroup(req.Group)
	if !ok {
		return api.CommitReply{}, &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("consumer group %q does not exist", req.Group)}
	}
	if err := g.CheckBound(req.Member, who); err != nil {
		return api.CommitReply{}, err
	}
	s.consumers.noteRedelivered(req.Group, req.Member, req.Redelivered)
	if req.Incarnation != 0 {
		// The queues this instance holds, whatever the generation: the
		// registry checks at apply (a local refusal saves a write).
		for _, o := range req.Offsets {
			if h, ok := g.Holder(o.Topic, o.Queue); !ok || h.Member != req.Member || h.Incarnation != req.Incarnation {
				if m := g.Members[req.Member]; m != nil && req.Incarnation < m.Incarnation {
					return api.CommitReply{}, &protocol.Error{Status: protocol.StatusMemberFenced,
						Message: fmt.Sprintf("member %q of consumer group %q was replaced by a newer instance", req.Member, req.Group)}
				}
				return api.CommitReply{}, &protocol.Error{Status: protocol.StatusStaleGeneration,
					Message: fmt.Sprintf("%s queue %d is not held by member %q of consumer group %q: rejoin", o.Topic, o.Queue, req.Member, req.Group)}
			}
		}
		if len(req.Offsets) == 0 {
			return api.CommitReply{Generation: g.Generation}, nil
		}
		res, err := s.apply(ctx, &fsm.CommitHeld{Group: req.Group, Member: req.Member, Incarnation: req.Incarnation, Offsets: toFSMOffsets(req.Offsets),
			Principal: who})
		if err != nil {
			return api.CommitReply{}, err
		}
		s.consumers.commits.Add(1)
		return api.CommitReply{Generation: res.Generation}, nil
	}
	if req.Generation != g.Generation {
		return api.CommitReply{}, &protocol.Error{Status: protocol.StatusStaleGeneration,
			Message: fmt.Sprintf("consumer group %q is at generation %d, not %d: rejoin", req.Group, g.Generation, req.Generation)}
	}
	for _, o := range req.Offsets {
		if owners := g.Assignment[o.Topic]; int(o.Queue) >= len(owners) || owners[o.Queue] != req.Member {
			return api.CommitReply{}, &protocol.Error{Status: protocol.StatusStaleGeneration,
				Message: fmt.Sprintf("%s queue %d is not assigned to member %q in generation %d of consumer group %q: rejoin",
					o.Topic, o.Queue, req.Member, g.Generation, req.Group)}
		}
	}
	if len(req.Offsets) == 0 {
		return api.CommitReply{Generation: g.Generation}, nil
	}
	res, err := s.apply(ctx, cmd)
	if err != nil {
		return api.CommitReply{}, err
	}
	s.consumers.commits.Add(1)
	return api.CommitReply{Generation: res.Generation}, nil
}

func (s *Server) consumerGroups(ctx context.Context, req api.ConsumerGroupsRequest) ([]api.ConsumerGroupInfo, error) {
	now := s.cfg.Clock.Now()
	var groups []fsm.ConsumerGroup
	if req.Group != "" {
		if err := fsm.ValidateConsumerName("group", req.Group); err != nil {
			return nil, invalid("%v", err)
		}
		g, ok := s.fsm.ConsumerGroup(req.Group)
		if !ok {
			return nil, &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("consumer group %q does not exist", req.Group)}
		}
		groups = []fsm.ConsumerGroup{g}
	} else {
		groups = s.fsm.ConsumerGroups()
	}
	out := make([]api.ConsumerGroupInfo, 0, len(groups))
	for _, g := range groups {
		out = append(out, onlyTopics(s.consumerGroupInfo(g, now), describesTopic(ctx, g.Name)))
	}
	return out, nil
}

// onlyTopics cuts from gi every topic show does not allow: the group's
// topics and offsets, the members' topics and queues, and the members left
// with no topic. A nil show allows every topic.
func onlyTopics(gi api.ConsumerGroupInfo, show func(topic string) bool) api.ConsumerGroupInfo {
	if show == nil {
		return gi
	}
	gi.Topics = slices.DeleteFunc(gi.Topics, func(t string) bool { return !show(t) })
	gi.Offsets = slices.DeleteFunc(gi.Offsets, func(o api.QueueOffset) bool { return !show(o.Topic) })
	members := gi.Members[:0]
	for _, m := range gi.Members {
		m.Topics = slices.DeleteFunc(m.Topics, func(t string) bool { return !show(t) })
		if len(m.Topics) == 0 {
			continue
		}
		m.Queues = slices.DeleteFunc(m.Queues, func(o api.QueueOffset) bool { return !show(o.Topic) })
		m.Waiting = slices.DeleteFunc(m.Waiting, func(q api.QueueRef) bool { return !show(q.Topic) })
		members = append(members, m)
	}
	gi.Members = members
	return gi
}

func (s *Server) consumerGroupInfo(g fsm.ConsumerGroup, now time.Time) api.ConsumerGroupInfo {
	committed := g.Committed()
	topics := g.Topics()
	for _, o := range committed {
		topics = append(topics, o.Topic)
	}
	gi := api.ConsumerGroupInfo{Name: g.Name, Generation: g.Generation, Topics: fsm.NormalizeTopics(topics),
		Members: []api.ConsumerMemberInfo{}, Offsets: toAPIOffsets(committed), Filter: g.Filter, FilterBy: g.FilterBy}
	c := &s.consumers
	c.mu.Lock()
	defer c.mu.Unlock()
	gi.Redelivered = slices.Clone(c.redelivered[g.Name])
	for _, id := range slices.Sorted(maps.Keys(g.Members)) {
		mi := api.ConsumerMemberInfo{ID: id, Topics: slices.Clone(g.Members[id].Topics), Queues: toAPIOffsets(g.Queues(id)),
			HeartbeatAgeMillis: -1}
		for _, q := range mi.Queues {
			if h, ok := g.Holder(q.Topic, q.Queue); ok && (h.Member != id || h.Incarnation != g.Members[id].Incarnation) {
				mi.Waiting = append(mi.Waiting, api.QueueRef{Topic: q.Topic, Queue: q.Queue})
			}
		}
		if last, ok := c.sessions[memberKey{g.Name, id}]; ok {
			mi.HeartbeatAgeMillis = now.Sub(last).Milliseconds()
		}
		gi.Members = append(gi.Members, mi)
	}
	return gi
}

// canonicalFilter is a filter's canonical form ("" stays ""), or INVALID
// with what is wrong with it.
func canonicalFilter(expr string) (string, error) {
	if expr == "" {
		return "", nil
	}
	f, err := protocol.ParseFilter(expr)
	if err != nil {
		return "", invalid("%v", err)
	}
	c := f.Canonical()
	if len(c) > protocol.MaxFilterLen {
		return "", invalid("filter %.32q...: its canonical form is %d bytes, over the cap %d (write it shorter)", expr, len(c), protocol.MaxFilterLen)
	}
	return c, nil
}

// setGroupFilter sets the filter of the messages a group receives; its
// members take it from their next heartbeat.
func (s *Server) setGroupFilter(ctx context.Context, req api.SetGroupFilterRequest) (api.ConsumerGroupInfo, error) {
	if err := fsm.ValidateConsumerName("group", req.Group); err != nil {
		return api.ConsumerGroupInfo{}, invalid("%v", err)
	}
	if req.Filter == "" {
		return api.ConsumerGroupInfo{}, invalid(`a filter is needed ("*" for every message)`)
	}
	filter, err := canonicalFilter(req.Filter)
	if err != nil {
		return api.ConsumerGroupInfo{}, err
	}
	now := s.cfg.Clock.Now()
	if _, err := s.apply(ctx, &fsm.SetGroupFilter{Group: req.Group, Filter: filter, Principal: principalOf(ctx), At: now.UnixMilli()}); err != nil {
		return api.ConsumerGroupInfo{}, err
	}
	s.log.Info("consumer group filter set", "group", req.Group, "filter", filter, "principal", principalOf(ctx))
	g, _ := s.fsm.ConsumerGroup(req.Group)
	return s.consumerGroupInfo(g, now), nil
}

// resetOffsets sets a group's offsets, only when the registry has no member
// in it and the leader no live session of it.
func (s *Server) resetOffsets(ctx context.Context, req api.ResetOffsetsRequest) (api.ConsumerGroupInfo, error) {
	if err := fsm.ValidateConsumerName("group", req.Group); err != nil {
		return api.ConsumerGroupInfo{}, invalid("%v", err)
	}
	if len(req.Offsets) == 0 {
		return api.ConsumerGroupInfo{}, invalid("a reset names at least one queue's offset")
	}
	if err := checkOffsets("reset", req.Offsets); err != nil {
		return api.ConsumerGroupInfo{}, err
	}
	now := s.cfg.Clock.Now()
	if _, ok := s.fsm.ConsumerGroup(req.Group); !ok && !req.Create {
		// Offsets are a group's; a reset never creates one (its first member does).
		return api.ConsumerGroupInfo{}, &protocol.Error{Status: protocol.StatusNotFound,
			Message: fmt.Sprintf("consumer group %q does not exist (its first member makes it, or a reset that says to create it)", req.Group)}
	}
	if g, _ := s.fsm.ConsumerGroup(req.Group); len(g.Members) > 0 || s.consumers.live(req.Group, now) {
		return api.ConsumerGroupInfo{}, &protocol.Error{Status: protocol.StatusGroupActive,
			Message: fmt.Sprintf("consumer group %q has %d live members; stop them (or wait for their sessions to run out) before resetting its offsets",
				req.Group, max(len(g.Members), 1))}
	}
	if _, err := s.apply(ctx, &fsm.ResetOffsets{Group: req.Group, Offsets: toFSMOffsets(req.Offsets), At: now.UnixMilli()}); err != nil {
		return api.ConsumerGroupInfo{}, err
	}
	s.log.Info("consumer group offsets reset", "group", req.Group, "queues", len(req.Offsets))
	g, _ := s.fsm.ConsumerGroup(req.Group)
	return s.consumerGroupInfo(g, now), nil
}
