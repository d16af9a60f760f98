package metaserver

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/routing"
)

// Failover: the leader promotes a group's slave when its master is lost.
// The argument for why no two masters ever acknowledge writes at once, with
// the timings, is in DESIGN.md ("Failover"). In short:
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
// The slave is promoted only if it holds every byte the master reported
// the slave had acknowledged (so no HIGH message acknowledged to a producer
// is lost), and if what it lacks of the master's log, by the last reports,
// is at most FailoverMaxLoss bytes (NORMAL messages acknowledged by the
// master alone).

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
	refuseWaiting  = "waiting-for-margin"
	refuseFailed   = "apply-failed"
)

// maybePromote promotes g's slave if its master is lost past the margin and
// the slave qualifies, and records why not otherwise. It reports whether
// it promoted (the group changed under the caller).
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
	reason, note := j.refusalLocked(g, s, now, silent)
	var loss int64
	var start int64
	if reason == "" {
		start = s.lastSl.LogEnd
		loss = max(0, max(s.last.LogEnd, s.lastSl.MasterEnd)-start)
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
			j.log.Warn("not promoting the slave of a group whose master is lost", "group", g.Name, "master", g.Master.ID,
				"slave", g.Slave.ID, "why", note)
		}
		return false
	}
	cmd := &fsm.Promote{Group: g.Name, Epoch: g.Epoch, Master: g.Master.ID, Slave: g.Slave.ID, Start: start, At: now.UnixMilli()}
	_, err := j.apply(ctx, cmd)
	j.mu.Lock()
	s.promoting = nil
	j.mu.Unlock()
	defer close(done)
	if err != nil {
		j.failovers.refuse(refuseFailed)
		j.log.Warn("promoting a slave failed", "group", g.Name, "slave", g.Slave.ID, "error", err)
		return false
	}
	j.failovers.promotions.Add(1)
	j.failovers.lostBytes.Add(loss)
	j.mu.Lock()
	// The new master's session starts now: it has one session to heartbeat
	// (unless a heartbeat of it, as master, already came in since the commit).
	ns := session{lastMaster: now, lastSlave: now,
		failover: fmt.Sprintf(notePromoted+" %s over %s at epoch %d, log offset %d; at least %d bytes lost by the last reports",
			g.Slave.ID, g.Master.ID, g.Epoch+1, start, loss)}
	if s.seenMaster && s.last.BrokerID == g.Slave.ID {
		ns.lastMaster, ns.seenMaster, ns.last, ns.streak = s.lastMaster, true, s.last, s.streak
	}
	*s = ns
	j.mu.Unlock()
	j.log.Warn("promoted the slave of a group whose master is lost", "group", g.Name, "new-master", g.Slave.ID,
		"old-master", g.Master.ID, "epoch", g.Epoch+1, "start", start, "silent", silent,
		"lost-normal-bytes", loss, "lost-note", "NORMAL messages the old master acknowledged after its slave's copy, by the last reports")
	return true
}

// refusalLocked returns why g's slave may not be promoted now ("" if it
// may), as a metric reason and a sentence.
func (j *judge) refusalLocked(g routing.Group, s *session, now time.Time, silent time.Duration) (string, string) {
	switch {
	case j.cfg.DisableFailover:
		return refuseOff, "failover is off: the group stays read-only until its master returns or an operator acts"
	case g.Slave.ID == "":
		return refuseNoSlave, "the group has no slave"
	case g.Reasons&routing.Admin != 0:
		return refuseAdmin, "an operator marked the group read-only"
	case !s.seenSlave || now.Sub(s.lastSlave) > j.cfg.SessionTimeout || s.lastSl.BrokerID != g.Slave.ID:
		return refuseSlaveOut, fmt.Sprintf("the slave %s has not heartbeated within a session", g.Slave.ID)
	case s.lastSl.Broken != "":
		return refuseBroken, fmt.Sprintf("the slave %s cannot follow its master (%s): it needs an operator's resync", g.Slave.ID, s.lastSl.Broken)
	case s.lastSl.Epoch != g.Epoch:
		// Its log may hold records of an earlier epoch that this one's
		// master never had (it has not cut back to where this epoch
		// began), or lack the registry's word on where to cut: promoted,
		// it would keep them at offsets the others hold differently.
		why := fmt.Sprintf("the slave %s has not joined epoch %d yet (its log is of epoch %d)", g.Slave.ID, g.Epoch, s.lastSl.Epoch)
		if s.lastSl.Waiting != "" {
			why += ": " + s.lastSl.Waiting
		}
		return refuseEpoch, why
	case s.seenMaster && s.lastSl.LogEnd < s.last.SlaveAckOffset:
		return refuseHigh, fmt.Sprintf("the slave holds %d bytes but the master last reported it had acknowledged %d: HIGH messages would be lost",
			s.lastSl.LogEnd, s.last.SlaveAckOffset)
	}
	behind := max(s.last.LogEnd, s.lastSl.MasterEnd) - s.lastSl.LogEnd
	if j.cfg.FailoverMaxLoss == NoLoss && behind > 0 || j.cfg.FailoverMaxLoss != NoLoss && behind > j.cfg.FailoverMaxLoss {
		return refuseLoss, fmt.Sprintf("the slave is %d bytes behind the master's last report, over the failover limit of %d", behind, max(j.cfg.FailoverMaxLoss, 0))
	}
	if wait := j.cfg.SessionTimeout + j.cfg.FailoverMargin; silent <= wait {
		return refuseWaiting, fmt.Sprintf("the master has been silent %v; promoting after %v (session + margin)", silent.Round(time.Millisecond), wait)
	}
	return "", ""
}
