package metaserver

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/routing"
)

// judge is the leader's failure detector. Heartbeats live only in its
// memory (never in raft); it applies a state change only when a group's
// state should change:
//
//   - no master heartbeat for more than SessionTimeout -> RO(heartbeat-lost);
//   - RecoverHeartbeats master heartbeats in a row clear it;
//   - the admin reason is never touched here;
//   - no master heartbeat for SessionTimeout + FailoverMargin, and a slave
//     eligible (alive, in the sync set, holding every acknowledged HIGH
//     message, close enough) -> promote the most caught-up (failover.go).
//
// A slave's lag makes no group read-only: a master drops a slave that lags
// from the sync set (ALTER_SYNC_SET) and refuses HIGH messages while the
// set is below the group's MinInSync, and NORMAL messages are written
// meanwhile. The judge clears a slave-lag reason left by an earlier
// version.
//
// Heartbeats count for the role the registry gives their broker, not the
// role the broker claims: a fenced master that comes back speaks as the
// slave it now is.
//
// A new leader starts every session at the moment it took over, so no
// broker is expired by an election alone (one full session of grace).
//
// Every time it reads comes from cfg.Clock (the heartbeat handler passes
// the time it read from the same clock), and the times it stamps into
// commands too, so a test can move a fake clock; the FSM only sees those
// stamps. The judge needs no raft: it reads the registry from fsm and
// changes it through apply.
type judge struct {
	cfg   Config // timings and Clock, defaults filled in
	fsm   *fsm.FSM
	apply func(context.Context, fsm.Command) (*fsm.Result, error)
	log   hclog.Logger

	ready      atomic.Bool
	heartbeats atomic.Int64 // heartbeats taken while leading, for metrics
	rounds     atomic.Int64 // rounds over every group finished, for metrics and tests
	failovers  failoverStats
	// consumers, when set, has its member sessions started at each
	// takeover and judged at the end of each round.
	consumers *consumers
	// txnExpiry, when set, is called at the end of each round
	// (Server.expireTxns).
	txnExpiry func(ctx context.Context, now time.Time)

	mu        sync.Mutex
	since     time.Time // when this leadership's judge started
	sessions  map[string]*session
	heard     map[brokerKey]*heardBroker // each broker's last heartbeat, for operators (status.go)
	lastRound time.Time                  // the clock reading of the last finished round
	roundDone chan struct{}              // closed (and replaced) when a round finishes
}

type session struct {
	lastMaster time.Time // last master heartbeat; starts at judge.since
	seenMaster bool
	streak     int           // master heartbeats in a row, since the last loss
	last       api.Heartbeat // the master's last heartbeat
	// slaves is each slave's last heartbeat, by broker id, for the slaves
	// the group names (a slave promoted or removed leaves it).
	slaves map[string]*slaveHeard
	// cutNoted is the epoch whose old master's cut is in the failover word.
	cutNoted uint32
	// failover is why no slave of the group is being promoted, or what the
	// last promotion did; "" when there is nothing to say.
	failover string
	// promoting, while the judge applies a promotion of one of the group's
	// slaves, is closed when that apply has finished (nil otherwise).
	promoting chan struct{}
	// readable is the largest readable end told to the slaves in epoch
	// readableEpoch: what the set held never shrinks within an epoch (acks
	// only grow, a shrink raises the minimum, a member joins holding what
	// HIGH confirmed), so a master report that predates a new member does
	// not take the slaves' reads back.
	readable      int64
	readableEpoch uint32
}

// slaveHeard is one slave's last heartbeat and when it came.
type slaveHeard struct {
	at time.Time
	hb api.Heartbeat
}

// slave returns the last heartbeat of the group's slave id, if the session
// has one.
func (s *session) slave(id string) (*slaveHeard, bool) {
	h, ok := s.slaves[id]
	return h, ok
}

func (j *judge) init(cfg Config, f *fsm.FSM, apply func(context.Context, fsm.Command) (*fsm.Result, error), log hclog.Logger) {
	j.cfg, j.fsm, j.apply, j.log = cfg, f, apply, log
	j.roundDone = make(chan struct{})
}

// begin starts a term of leadership: every session starts now.
func (j *judge) begin() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.since = j.cfg.Clock.Now()
	j.sessions = map[string]*session{}
	j.heard = map[brokerKey]*heardBroker{}
	if j.consumers != nil {
		j.consumers.begin(j.since)
	}
}

// run judges every group each JudgeInterval of the clock until ctx ends.
// The ticker exists before the judge reports ready, so a test that sees
// the node lead can move a fake clock past a tick.
func (j *judge) run(ctx context.Context) {
	j.begin()
	tick := j.cfg.Clock.NewTicker(j.cfg.JudgeInterval)
	defer tick.Stop()
	j.ready.Store(true)
	defer j.ready.Store(false)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.Chan():
			j.round(ctx)
		}
	}
}

// round judges every group at one reading of the clock.
func (j *judge) round(ctx context.Context) {
	now := j.cfg.Clock.Now()
	for _, g := range j.fsm.Groups() {
		j.judgeGroup(ctx, g.Name, now)
	}
	if j.consumers != nil {
		j.consumers.round(ctx, now)
	}
	if j.txnExpiry != nil {
		j.txnExpiry(ctx, now)
	}
	j.rounds.Add(1)
	j.mu.Lock()
	j.lastRound = now
	close(j.roundDone)
	j.roundDone = make(chan struct{})
	j.mu.Unlock()
}

// promotingChan returns, while the judge applies a promotion in group, a
// channel closed when that apply has finished; nil otherwise.
func (j *judge) promotingChan(group string) <-chan struct{} {
	j.mu.Lock()
	defer j.mu.Unlock()
	if s := j.sessions[group]; s != nil && s.promoting != nil {
		return s.promoting
	}
	return nil
}

// waitRound waits until a round that read the clock at or after at has
// finished, or ctx ends.
func (j *judge) waitRound(ctx context.Context, at time.Time) error {
	for {
		j.mu.Lock()
		last, done := j.lastRound, j.roundDone
		j.mu.Unlock()
		if !last.Before(at) {
			return nil
		}
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// sessionLocked returns a group's session, starting it at j.since.
func (j *judge) sessionLocked(group string) *session {
	s := j.sessions[group]
	if s == nil {
		s = &session{lastMaster: j.since, slaves: map[string]*slaveHeard{}}
		j.sessions[group] = s
	}
	return s
}

// heartbeat records a heartbeat taken at now (read from cfg.Clock), for the
// role the registry gives its broker; a broker the group does not name is
// ignored.
//
// If the judge is promoting the group's slave, heartbeat returns a channel
// closed when that promotion has been applied or has failed: the caller
// must answer the heartbeat only after it, from the registry as it is then.
// Otherwise a master back from a pause, heartbeating in the moment between
// the decision and its commit, could be told it is still the master of a
// writable group in the old epoch, and renew its write lease just as its
// slave takes over. A heartbeat recorded before the decision, on the
// other hand, keeps the decision from being made (the master was heard).
func (j *judge) heartbeat(hb api.Heartbeat, now time.Time) (promoting <-chan struct{}) {
	j.heartbeats.Add(1)
	g, ok := j.fsm.Group(hb.Group)
	if !ok {
		return nil
	}
	role, ok := g.RoleOf(hb.BrokerID)
	if !ok {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.noteHeardLocked(g, hb, now)
	s := j.sessionLocked(hb.Group)
	if s.promoting != nil {
		promoting = s.promoting
	}
	if role != routing.RoleMaster {
		if c := hb.LastCut; c != nil && c.Epoch == g.Epoch && s.cutNoted != c.Epoch {
			// The old master rejoined and cut what the failover lost.
			s.cutNoted = c.Epoch
			j.failovers.cutBytes.Add(c.Bytes)
			s.failover += fmt.Sprintf("; %s rejoined as a slave and cut %d bytes (%d records) into %s", hb.BrokerID, c.Bytes, c.Records, c.SideFile)
		}
		for id := range s.slaves {
			if _, named := g.SlaveByID(id); !named {
				delete(s.slaves, id) // promoted or removed since it was heard
			}
		}
		s.slaves[hb.BrokerID] = &slaveHeard{at: now, hb: hb}
		return promoting
	}
	if now.Sub(s.lastMaster) > j.cfg.SessionTimeout {
		s.streak = 0 // heartbeats resumed after a loss: count again from here
	}
	s.streak++
	s.lastMaster, s.seenMaster, s.last = now, true, hb
	return promoting
}

// judgeGroup decides a group's reasons from its session as of now (read
// from cfg.Clock) and applies a change if there is one.
func (j *judge) judgeGroup(ctx context.Context, name string, now time.Time) {
	g, ok := j.fsm.Group(name)
	if !ok || g.Admission == routing.Retired { // a retired group has no brokers to judge
		return
	}
	if j.maybePromote(ctx, g, now) {
		return
	}
	j.mu.Lock()
	s := j.sessionLocked(name)
	lost := now.Sub(s.lastMaster) > j.cfg.SessionTimeout
	streak := s.streak
	j.mu.Unlock()

	want := g.Reasons
	recovered := streak >= j.cfg.RecoverHeartbeats
	switch {
	case lost:
		want |= routing.HeartbeatLost
	case recovered:
		want &^= routing.HeartbeatLost
	}
	// A lagging slave leaves the sync set instead (the master's act); a
	// slave-lag reason from an earlier version goes.
	want &^= routing.SlaveLag
	if want == g.Reasons {
		return
	}
	_, err := j.apply(ctx, &fsm.SetGroupReasons{Group: name, Set: want &^ g.Reasons, Clear: g.Reasons &^ want,
		ExpectVersion: g.Version, At: now.UnixMilli()})
	if err != nil {
		j.log.Warn("changing a group's state failed", "group", name, "to", want.String(), "error", err)
		return
	}
	if want.Writable() {
		j.log.Info("broker group writable", "group", name, "cleared", (g.Reasons &^ want).String())
	} else {
		j.log.Warn("broker group read-only", "group", name, "reasons", want.String())
	}
}

// readableEnd is the log offset every member of g's sync set held at its
// master's last heartbeat in g's epoch (the lowest acknowledgement the
// master reported for them), or nil when the set is empty or the judge has
// no such report.
func (j *judge) readableEnd(g routing.Group) *int64 {
	if len(g.InSync) == 0 {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	// Without a report of this epoch's master (just promoted, or a new
	// leader), reads stop where the epoch began: every member holds that.
	var start *int64
	if n := len(g.History); n > 0 && g.History[n-1].Epoch == g.Epoch {
		at := g.History[n-1].Start
		start = &at
	}
	s := j.sessions[g.Name]
	if s != nil && s.readableEpoch == g.Epoch && (start == nil || s.readable > *start) {
		at := s.readable
		start = &at
	}
	if s == nil || !s.seenMaster || s.last.BrokerID != g.Master.ID || s.last.Epoch != g.Epoch {
		return start
	}
	end, found := int64(0), 0
	for _, r := range s.last.Replicas {
		if g.IsInSync(r.ID) {
			if found == 0 || r.AckOffset < end {
				end = r.AckOffset
			}
			found++
		}
	}
	if found < len(g.InSync) {
		return start // the master's report predates a member: no word on it
	}
	if start != nil && *start > end {
		return start
	}
	s.readable, s.readableEpoch = end, g.Epoch
	return &end
}

// info returns what the judge knows of a group's heartbeats. The master's
// and the slave's ages are those of the brokers' last heartbeats in any
// role (a slave promoted a moment ago was heard as a slave); "the slave"
// is g.Slave, the one slave a reader of one slave sees.
func (j *judge) info(g routing.Group, now time.Time) api.GroupInfo {
	gi := api.GroupInfo{Group: g, State: g.Reasons.State(), Reason: g.Reasons.String(),
		MasterHeartbeatAgeMillis: -1, SlaveHeartbeatAgeMillis: -1, SessionMillis: j.cfg.SessionTimeout.Milliseconds()}
	j.mu.Lock()
	defer j.mu.Unlock()
	gi.LeaderForMillis = now.Sub(j.since).Milliseconds()
	gi.Members = j.membersLocked(g, now)
	for _, m := range gi.Members {
		switch m.Role {
		case string(routing.RoleMaster):
			gi.MasterHeartbeatAgeMillis = m.LastHeartbeatAgeMillis
		case string(routing.RoleSlave):
			if m.ID != g.Slave.ID {
				continue
			}
			gi.SlaveHeartbeatAgeMillis = m.LastHeartbeatAgeMillis
		}
	}
	if s := j.sessions[g.Name]; s != nil {
		gi.Failover = s.failover
		if s.seenMaster {
			gi.Last = s.last
		}
		if h, ok := s.slave(g.Slave.ID); ok {
			gi.LastSlave = h.hb
		}
	}
	return gi
}
