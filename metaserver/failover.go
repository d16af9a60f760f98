package metaserver

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/routing"
)

// Failover: the leader promotes one of a group's slaves when its master is
// lost. The argument for why no two masters ever acknowledge writes at
// once, with the timings, is in DESIGN.md ("Failover"). In short:
//
//   - the old master's write lease runs from when it sent its last accepted
//     heartbeat, for one session by its own monotonic clock, and it
//     acknowledges nothing once the lease has run out;
//   - the leader promotes only when more than SessionTimeout +
//     FailoverMargin have passed on its own monotonic clock since it
//     received that heartbeat, which was after it was sent;
//   - the promoted slave takes writes only after it has read the new epoch
//     in a heartbeat reply, after the promotion committed.
//
// The candidates are the slaves heard within the session, not broken, in
// the group's epoch, members of the committed sync set (any slave while
// the set is empty, as a group of one slave before it has one), holding at
// least what the master last reported as acknowledged: HighAcked, and the
// slave's own AckOffset among the master's Replicas. So no HIGH message
// acknowledged to a producer is lost. With an ack quorum of k copies and n
// members in the set, a quorum-answered message is on k-1 members, so the
// leader waits until n-k+2 members are heard, alive and in the epoch: one
// of them holds it. The candidate with the largest log end is promoted
// (the lowest id on a tie), if what it lacks of the master's log, by the
// last reports, is at most FailoverMaxLoss bytes (NORMAL messages).

// failoverStats counts the leader's failover decisions, for metrics.
type failoverStats struct {
	promotions atomic.Int64
	lostBytes  atomic.Int64 // NORMAL bytes the promotions lost, by the last reports
	cutBytes   atomic.Int64 // bytes the old masters cut when they rejoined

	mu      sync.Mutex
	refused map[string]int64 // refusals by reason, counted once per episode
}

func (f *failoverStats) refuse(reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refused == nil {
		f.refused = map[string]int64{}
	}
	f.refused[reason]++
}

// FailoverStats is what the leader decided about failovers, over all its
// terms of leadership.
type FailoverStats struct {
	Promotions int64
	// LostBytes is the NORMAL bytes the promotions lost, by the last
	// reports of the old master's and the slave's log ends (a lower bound:
	// the master may have taken more after its last report).
	LostBytes int64
	// CutBytes is what the old masters cut from their logs when they
	// rejoined as slaves: the NORMAL bytes the promotions did lose (they
	// are in the brokers' side files).
	CutBytes int64
	// Refused counts refusals by reason; one episode (a group refused for
	// the same reason round after round) counts once.
	Refused map[string]int64
}

// Failovers returns the node's failover counters.
func (s *Server) Failovers() FailoverStats {
	f := &s.judge.failovers
	f.mu.Lock()
	defer f.mu.Unlock()
	out := FailoverStats{Promotions: f.promotions.Load(), LostBytes: f.lostBytes.Load(), CutBytes: f.cutBytes.Load(), Refused: map[string]int64{}}
	for k, v := range f.refused {
		out.Refused[k] = v
	}
	return out
}

const notePromoted = "promoted"

// Refusal reasons, as counted in metrics.
const (
	refuseOff      = "failover-off"
	refuseNoSlave  = "no-slave"
	refuseSlaveOut = "slave-not-alive"
	refuseAdmin    = "admin"
	refuseBroken   = "slave-broken"
	refuseEpoch    = "slave-not-in-epoch"
	refuseHigh     = "slave-missing-acknowledged"
	refuseLoss     = "slave-too-far-behind"
	refuseNotInSet = "slave-not-in-sync-set"
	refuseQuorum   = "sync-set-not-heard"
	refuseMixed    = "no-eligible-slave" // the slaves are not eligible for different reasons
	refuseWaiting  = "waiting-for-margin"
	refuseFailed   = "apply-failed"
)

// maybePromote promotes one of g's slaves if its master is lost past the
// margin and a slave qualifies, and records why not otherwise. It reports
// whether it promoted (the group changed under the caller).
func (j *judge) maybePromote(ctx context.Context, g routing.Group, now time.Time) bool {
	j.mu.Lock()
	s := j.sessionLocked(g.Name)
	silent := now.Sub(s.lastMaster)
	if s.promoting != nil {
		j.mu.Unlock()
		return false // another goroutine is promoting it (a round, a slave's heartbeat)
	}
	if silent <= j.cfg.SessionTimeout || g.Master.ID == "" {
		if !strings.HasPrefix(s.failover, notePromoted) {
			s.failover = "" // the last promotion stays on show until the next loss
		}
		j.mu.Unlock()
		return false
	}
	chosen, reason, note := j.chooseLocked(g, s, now, silent)
	var loss, start int64
	if reason == "" {
		start = chosen.LogEnd
		loss = max(0, max(s.last.LogEnd, chosen.MasterEnd)-start)
	}
	changed := note != s.failover
	s.failover = note
	var done chan struct{}
	if reason == "" {
		// Heartbeats that come in from now on are answered after the
		// promotion is applied (judge.heartbeat).
		done = make(chan struct{})
		s.promoting = done
	}
	j.mu.Unlock()
	if reason != "" {
		if changed && reason != refuseWaiting {
			j.failovers.refuse(reason)
			j.log.Warn("not promoting a slave of a group whose master is lost", "group", g.Name, "master", g.Master.ID,
				"slaves", len(g.Slaves), "why", note)
		}
		return false
	}
	next := chosen.BrokerID
	cmd := &fsm.Promote{Group: g.Name, Epoch: g.Epoch, Master: g.Master.ID, Slave: next, Start: start, At: now.UnixMilli()}
	_, err := j.apply(ctx, cmd)
	j.mu.Lock()
	s.promoting = nil
	j.mu.Unlock()
	defer close(done)
	if err != nil {
		j.failovers.refuse(refuseFailed)
		j.log.Warn("promoting a slave failed", "group", g.Name, "slave", next, "error", err)
		return false
	}
	j.failovers.promotions.Add(1)
	j.failovers.lostBytes.Add(loss)
	j.mu.Lock()
	// The new master's session starts now: it has one session to heartbeat
	// (unless a heartbeat of it, as master, already came in since the
	// commit). The other slaves stay slaves: their last heartbeats stay.
	ns := session{lastMaster: now, slaves: map[string]*slaveHeard{},
		failover: fmt.Sprintf(notePromoted+" %s over %s at epoch %d, log offset %d; at least %d bytes lost by the last reports",
			next, g.Master.ID, g.Epoch+1, start, loss)}
	for id, h := range s.slaves {
		if id != next {
			ns.slaves[id] = h
		}
	}
	if s.seenMaster && s.last.BrokerID == next {
		ns.lastMaster, ns.seenMaster, ns.last, ns.streak = s.lastMaster, true, s.last, s.streak
	}
	*s = ns
	j.mu.Unlock()
	j.log.Warn("promoted a slave of a group whose master is lost", "group", g.Name, "new-master", next,
		"old-master", g.Master.ID, "epoch", g.Epoch+1, "start", start, "silent", silent,
		"lost-normal-bytes", loss, "lost-note", "NORMAL messages the old master acknowledged after its slave's copy, by the last reports")
	return true
}

// chooseLocked returns the slave of g to promote now, by its last
// heartbeat, or why none may be promoted now, as a metric reason and a
// sentence. j.mu is held.
func (j *judge) chooseLocked(g routing.Group, s *session, now time.Time, silent time.Duration) (api.Heartbeat, string, string) {
	switch {
	case j.cfg.DisableFailover:
		return api.Heartbeat{}, refuseOff, "failover is off: the group stays read-only until its master returns or an operator acts"
	case len(g.Slaves) == 0:
		return api.Heartbeat{}, refuseNoSlave, "the group has no slave"
	case g.Reasons&routing.Admin != 0:
		return api.Heartbeat{}, refuseAdmin, "an operator marked the group read-only"
	}
	var (
		best    api.Heartbeat
		found   bool
		reasons []string // each slave's reason, in the group's order
		whys    []string
		inEpoch int // sync set members heard within the session, not broken, in the epoch
	)
	for _, b := range g.Slaves {
		h, heard := s.slave(b.ID)
		alive := heard && now.Sub(h.at) <= j.cfg.SessionTimeout
		if alive && g.IsInSync(b.ID) && h.hb.Broken == "" && h.hb.Epoch == g.Epoch {
			inEpoch++
		}
		reason, why := j.ineligibleLocked(g, s, b.ID, h, alive)
		if reason != "" {
			reasons, whys = append(reasons, reason), append(whys, why)
			continue
		}
		if !found || h.hb.LogEnd > best.LogEnd || h.hb.LogEnd == best.LogEnd && b.ID < best.BrokerID {
			best, found = h.hb, true
		}
	}
	if !found {
		reason := reasons[0]
		for _, r := range reasons[1:] {
			if r != reason {
				reason = refuseMixed
			}
		}
		if len(whys) == 1 {
			return api.Heartbeat{}, reason, whys[0]
		}
		return api.Heartbeat{}, reason, "no slave may be promoted: " + strings.Join(whys, "; ")
	}
	if k, n := g.AckQuorum, len(g.InSync); k > 0 && n > 0 {
		// A message answered at k copies is on k-1 members of the set: any
		// n-k+2 of them include one holding it.
		if need := max(1, n-k+2); inEpoch < need {
			return api.Heartbeat{}, refuseQuorum, fmt.Sprintf("the group answers HIGH at %d copies: %d of the %d members of the sync set must be heard in epoch %d to be sure one holds every message answered, and %d are",
				k, need, n, g.Epoch, inEpoch)
		}
	}
	behind := max(s.last.LogEnd, best.MasterEnd) - best.LogEnd
	if j.cfg.FailoverMaxLoss == NoLoss && behind > 0 || j.cfg.FailoverMaxLoss != NoLoss && behind > j.cfg.FailoverMaxLoss {
		return api.Heartbeat{}, refuseLoss, fmt.Sprintf("the slave %s, the most caught-up, is %d bytes behind the master's last report, over the failover limit of %d",
			best.BrokerID, behind, max(j.cfg.FailoverMaxLoss, 0))
	}
	if wait := j.cfg.SessionTimeout + j.cfg.FailoverMargin; silent <= wait {
		return api.Heartbeat{}, refuseWaiting, fmt.Sprintf("the master has been silent %v; promoting %s after %v (session + margin)",
			silent.Round(time.Millisecond), best.BrokerID, wait)
	}
	return best, "", ""
}

// ineligibleLocked returns why slave id of g, last heard h (alive: within
// the session), may not be promoted, as a metric reason and a sentence;
// "" if it may. j.mu is held.
func (j *judge) ineligibleLocked(g routing.Group, s *session, id string, h *slaveHeard, alive bool) (string, string) {
	switch {
	case !g.Promotable(id):
		return refuseNotInSet, fmt.Sprintf("the slave %s is not in the sync set %v nor eligible %v: it may lack HIGH messages the master acknowledged", id, g.InSync, g.Eligible)
	case !alive:
		return refuseSlaveOut, fmt.Sprintf("the slave %s has not heartbeated within a session", id)
	case h.hb.Broken != "":
		return refuseBroken, fmt.Sprintf("the slave %s cannot follow its master (%s): it needs an operator's resync", id, h.hb.Broken)
	case h.hb.Epoch != g.Epoch:
		// Its log may hold records of an earlier epoch that this one's
		// master never had (it has not cut back to where this epoch
		// began), or lack the registry's word on where to cut: promoted,
		// it would keep them at offsets the others hold differently.
		why := fmt.Sprintf("the slave %s has not joined epoch %d yet (its log is of epoch %d)", id, g.Epoch, h.hb.Epoch)
		if h.hb.Waiting != "" {
			why += ": " + h.hb.Waiting
		}
		return refuseEpoch, why
	}
	if acked := ackedBound(g, s, id); h.hb.LogEnd < acked {
		return refuseHigh, fmt.Sprintf("the slave %s holds %d bytes, below the acknowledged %d the master last reported: HIGH messages would be lost",
			id, h.hb.LogEnd, acked)
	}
	return "", ""
}

// ackedBound is how much of the master's log slave id must hold, by the
// master's last heartbeat: every HIGH message it answered (HighAcked), what
// it reported the slave acknowledged (its Replicas), and, for a member of
// the set, what the slowest member acknowledged (SlaveAckOffset: every
// member acknowledged at least that; an eligible slave that left the set
// need not have).
func ackedBound(g routing.Group, s *session, id string) int64 {
	if !s.seenMaster {
		return 0
	}
	bound := s.last.HighAcked
	if g.IsInSync(id) || len(g.InSync) == 0 { // (a group without a set: its only slave's)
		bound = max(bound, s.last.SlaveAckOffset)
	}
	for _, r := range s.last.Replicas {
		if r.ID == id {
			bound = max(bound, r.AckOffset)
		}
	}
	return bound
}
