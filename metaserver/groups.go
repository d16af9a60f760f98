package metaserver

import (
	"context"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// Broker group admission and retirement (fsm/groups.go has the rules), and
// the queue ends masters report.

func (s *Server) groupRoutes() {
	handle(s, protocol.CodeAdminAdmitGroup, true, s.admitGroup)
	handle(s, protocol.CodeAdminRetireGroup, true, s.retireGroup)
}

func (s *Server) admitGroup(ctx context.Context, req api.AdmitGroupRequest) (routing.Group, error) {
	if req.Group == "" {
		return routing.Group{}, invalid("admitting a group needs its name")
	}
	before, _ := s.fsm.Group(req.Group)
	res, err := s.apply(ctx, &fsm.AdmitGroup{Group: req.Group, At: s.cfg.Clock.Now().UnixMilli()})
	if err != nil {
		return routing.Group{}, err
	}
	if res.Changed {
		s.log.Info("broker group admitted: it takes queues from now on", "group", req.Group, "was", before.Admission.Word())
	}
	g, _ := s.fsm.Group(req.Group)
	return g, nil
}

func (s *Server) retireGroup(ctx context.Context, req api.RetireGroupRequest) (api.RetireGroupReply, error) {
	g, ok := s.fsm.Group(req.Group)
	if !ok {
		return api.RetireGroupReply{}, &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("broker group %q does not exist", req.Group)}
	}
	now := s.cfg.Clock.Now()
	if !req.DryRun && !req.Force {
		if why := s.judge.liveMember(g, now); why != "" {
			return api.RetireGroupReply{}, &protocol.Error{Status: protocol.StatusGroupActive,
				Message: fmt.Sprintf("broker group %q may be alive: %s; retire it once its brokers are stopped, or with --force (its master takes writes until its lease ends, at most a session, and those messages are lost to the queues' new groups)", req.Group, why)}
		}
	}
	plan, err := s.fsm.PlanRetire(req.Group, s.writableGroups())
	if err != nil {
		return api.RetireGroupReply{}, err
	}
	reply := api.RetireGroupReply{Group: g, Moved: []api.MovedQueue{}, DryRun: req.DryRun}
	moves := make([]fsm.QueueMove, len(plan))
	for i, m := range plan {
		moves[i] = m.QueueMove
		reply.Moved = append(reply.Moved, api.MovedQueue{Topic: m.Topic, Queue: m.Queue, To: m.To, Base: m.Base, KnownEnd: m.KnownEnd, Committed: m.Committed})
	}
	if req.DryRun {
		return reply, nil
	}
	if _, err := s.apply(ctx, &fsm.RetireGroup{Group: req.Group, Moves: moves, At: now.UnixMilli()}); err != nil {
		return api.RetireGroupReply{}, err
	}
	// The FSM may have taken a higher base (a commit or a report applied
	// after the plan): answer what it recorded.
	for i := range reply.Moved {
		m := &reply.Moved[i]
		m.Base = max(m.Base, s.fsm.QueueState(m.Topic, m.Queue).Base)
	}
	reply.Group, _ = s.fsm.Group(req.Group)
	s.log.Warn("broker group retired: its queues moved to other groups", "group", req.Group, "queues", len(moves), "forced", req.Force)
	return reply, nil
}

// liveMember says why a member of g may be alive as of now ("" if none
// may): it heartbeated within the session, or this leader has not led for
// a session and has not heard it (heartbeats live in its memory only).
func (j *judge) liveMember(g routing.Group, now time.Time) string {
	if why := j.brokerLive(g, g.Master.ID, "master", now); why != "" {
		return why
	}
	for _, b := range g.Slaves {
		if why := j.brokerLive(g, b.ID, "slave", now); why != "" {
			return why
		}
	}
	return ""
}

// brokerLive says why g's broker id (of role) may be alive as of now (""
// if it may not), as liveMember does.
func (j *judge) brokerLive(g routing.Group, id, role string, now time.Time) string {
	if id == "" {
		return ""
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	st := j.brokerStatusLocked(g.Name, id, "", role, now)
	switch {
	case st.Lost:
		return ""
	case st.Heard:
		return fmt.Sprintf("its %s %s heartbeated %s ago, within the session (%s)", role, id,
			time.Duration(st.LastHeartbeatAgeMillis)*time.Millisecond, j.cfg.SessionTimeout)
	}
	return fmt.Sprintf("this leader took over %s ago and has not heard its %s %s yet; it can tell only once a session (%s) has passed",
		now.Sub(j.since).Round(time.Millisecond), role, id, j.cfg.SessionTimeout)
}

// queueEndsWait bounds the raft write of a heartbeat's queue ends.
const queueEndsWait = 250 * time.Millisecond

// heartbeatAndEnds is the heartbeat handler, and then records the queue
// ends a master of the group's current epoch reported.
func (s *Server) heartbeatAndEnds(ctx context.Context, hb api.Heartbeat) (api.HeartbeatReply, error) {
	reply, err := s.heartbeat(ctx, hb)
	if err == nil && len(hb.QueueEnds) > 0 && reply.Group.Master.ID == hb.BrokerID && reply.Group.Epoch == hb.Epoch {
		s.recordQueueEnds(ctx, hb.Group, hb.QueueEnds)
	}
	return reply, err
}

// recordQueueEnds applies the ends the registry does not know yet. It
// waits at most queueEndsWait for raft, so a slow commit delays the
// heartbeat's answer little; ends not recorded then come again in the
// master's next full report (every 5 heartbeats).
func (s *Server) recordQueueEnds(ctx context.Context, group string, ends []api.QueueEnd) {
	in := make([]fsm.QueueEnd, len(ends))
	for i, e := range ends {
		in[i] = fsm.QueueEnd{Topic: e.Topic, Queue: e.Queue, End: e.End}
	}
	fresh := s.fsm.NewQueueEnds(group, in)
	if len(fresh) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, queueEndsWait)
	defer cancel()
	if _, err := s.apply(ctx, &fsm.RecordQueueEnds{Group: group, Ends: fresh}); err != nil {
		s.log.Debug("recording the queue ends a master reported failed; its next full report brings them again",
			"group", group, "queues", len(fresh), "error", err)
	}
}
