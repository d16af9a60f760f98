package metaserver

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/routing"
)

// judge is the leader's failure detector. Heartbeats live only in its
// memory (never in raft); it applies a state change only when a group's
// state should change:
//
//   - no master heartbeat for SessionTimeout -> RO(heartbeat-lost);
//   - the master reports its slave behind by more than LagBytes, or not
//     caught up for more than LagTime -> RO(slave-lag);
//   - RecoverHeartbeats healthy master heartbeats in a row clear both;
//   - the admin reason is never touched here.
//
// A new leader starts every session at the moment it took over, so no
// broker is expired by an election alone (one full session of grace).
type judge struct {
	s          *Server
	ready      atomic.Bool
	heartbeats atomic.Int64 // heartbeats taken while leading, for metrics

	mu       sync.Mutex
	since    time.Time // when this leadership's judge started
	sessions map[string]*session
}

type session struct {
	lastMaster time.Time // last master heartbeat; starts at judge.since
	lastSlave  time.Time
	seenMaster bool
	seenSlave  bool
	streak     int // healthy master heartbeats in a row
	lagBad     bool
	last       api.Heartbeat
}

func (j *judge) init(s *Server) { j.s = s }

// run judges every group each JudgeInterval until ctx ends.
func (j *judge) run(ctx context.Context) {
	j.mu.Lock()
	j.since = time.Now()
	j.sessions = map[string]*session{}
	j.mu.Unlock()
	j.ready.Store(true)
	defer j.ready.Store(false)
	tick := time.NewTicker(j.s.cfg.JudgeInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			for _, g := range j.s.fsm.Groups() {
				j.judgeGroup(ctx, g.Name)
			}
		}
	}
}

// sessionLocked returns a group's session, starting it at j.since.
func (j *judge) sessionLocked(group string) *session {
	s := j.sessions[group]
	if s == nil {
		s = &session{lastMaster: j.since, lastSlave: j.since}
		j.sessions[group] = s
	}
	return s
}

// heartbeat records a heartbeat.
func (j *judge) heartbeat(hb api.Heartbeat, now time.Time) {
	j.heartbeats.Add(1)
	j.mu.Lock()
	defer j.mu.Unlock()
	s := j.sessionLocked(hb.Group)
	if hb.Role != routing.RoleMaster {
		s.lastSlave, s.seenSlave = now, true
		return
	}
	if now.Sub(s.lastMaster) > j.s.cfg.SessionTimeout {
		s.streak = 0 // heartbeats resumed after a loss: count again from here
	}
	s.lagBad = hb.LagBytes > j.s.cfg.LagBytes || hb.LagMillis > j.s.cfg.LagTime.Milliseconds()
	if s.lagBad {
		s.streak = 0
	} else {
		s.streak++
	}
	s.lastMaster, s.seenMaster, s.last = now, true, hb
}

// judgeGroup decides a group's reasons from its session and applies a
// change if there is one.
func (j *judge) judgeGroup(ctx context.Context, name string) {
	g, ok := j.s.fsm.Group(name)
	if !ok {
		return
	}
	now := time.Now()
	j.mu.Lock()
	s := j.sessionLocked(name)
	lost := now.Sub(s.lastMaster) > j.s.cfg.SessionTimeout
	lagBad, streak := s.lagBad, s.streak
	j.mu.Unlock()

	want := g.Reasons
	recovered := streak >= j.s.cfg.RecoverHeartbeats
	switch {
	case lost:
		want |= routing.HeartbeatLost
	case recovered:
		want &^= routing.HeartbeatLost
	}
	hasSlave := g.Slave.ID != ""
	switch {
	case lost:
		// No fresh word on the slave; keep what we had.
	case hasSlave && lagBad:
		want |= routing.SlaveLag
	case !hasSlave || recovered:
		want &^= routing.SlaveLag
	}
	if want == g.Reasons {
		return
	}
	_, err := j.s.apply(ctx, &fsm.SetGroupReasons{Group: name, Set: want &^ g.Reasons, Clear: g.Reasons &^ want,
		ExpectVersion: g.Version, At: now.UnixMilli()})
	if err != nil {
		j.s.log.Warn("changing a group's state failed", "group", name, "to", want.String(), "error", err)
		return
	}
	if want.Writable() {
		j.s.log.Info("broker group writable", "group", name, "cleared", (g.Reasons &^ want).String())
	} else {
		j.s.log.Warn("broker group read-only", "group", name, "reasons", want.String())
	}
}

// info returns what the judge knows of a group's heartbeats.
func (j *judge) info(g routing.Group, now time.Time) api.GroupInfo {
	gi := api.GroupInfo{Group: g, State: g.Reasons.State(), Reason: g.Reasons.String(),
		MasterHeartbeatAgeMillis: -1, SlaveHeartbeatAgeMillis: -1}
	j.mu.Lock()
	defer j.mu.Unlock()
	if s := j.sessions[g.Name]; s != nil {
		if s.seenMaster {
			gi.MasterHeartbeatAgeMillis = now.Sub(s.lastMaster).Milliseconds()
			gi.Last = s.last
		}
		if s.seenSlave {
			gi.SlaveHeartbeatAgeMillis = now.Sub(s.lastSlave).Milliseconds()
		}
	}
	return gi
}
