package metaserver

import (
	"fmt"
	"sort"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/routing"
)

// What an operator sees of the brokers' heartbeats (ferryctl brokers).
//
// The judge's sessions are per group and per role, and a promotion starts
// the group's session afresh, so they cannot say when a given broker was
// last heard: the master a failover replaced drops out of the group (and of
// the sessions), and the promoted slave's earlier heartbeats count for
// nothing as master. The judge therefore also keeps, per broker, the last
// heartbeat it took in any role. Like the sessions it lives only in this
// leader's memory and starts empty at each takeover: a new leader knows no
// heartbeat older than its leadership and says so (LeaderForMillis).

// heardBroker is the last heartbeat the leader took from one broker.
type heardBroker struct {
	addr string
	at   time.Time
}

type brokerKey struct{ group, id string }

// maxFormer bounds the former members remembered per group.
const maxFormer = 4

// noteHeardLocked records a heartbeat taken at now from a broker that g
// names. j.mu is held.
func (j *judge) noteHeardLocked(g routing.Group, hb api.Heartbeat, now time.Time) {
	k := brokerKey{g.Name, hb.BrokerID}
	if h := j.heard[k]; h != nil {
		h.addr, h.at = hb.Addr, now
		return
	}
	if j.heard == nil {
		j.heard = map[brokerKey]*heardBroker{}
	}
	j.heard[k] = &heardBroker{addr: hb.Addr, at: now}
	// A new broker of the group: forget the oldest former members past
	// maxFormer, so that made-up broker ids cannot grow this map for long.
	var former []brokerKey
	for fk := range j.heard {
		if _, named := g.RoleOf(fk.id); fk.group == g.Name && !named {
			former = append(former, fk)
		}
	}
	if len(former) <= maxFormer {
		return
	}
	sort.Slice(former, func(a, b int) bool { return j.heard[former[a]].at.After(j.heard[former[b]].at) })
	for _, fk := range former[maxFormer:] {
		delete(j.heard, fk)
	}
}

// membersLocked returns g's master and slaves (those it has) and then the
// former masters this leader heard, the maxFormer latest heard first, as
// of now. j.mu is held.
func (j *judge) membersLocked(g routing.Group, now time.Time) []api.BrokerStatus {
	out := []api.BrokerStatus{}
	if g.Master.ID != "" {
		out = append(out, j.brokerStatusLocked(g.Name, g.Master.ID, g.Master.Addr, string(routing.RoleMaster), now))
	}
	var last api.Heartbeat // the master's last report of its slaves
	s := j.sessions[g.Name]
	if s != nil && s.seenMaster && s.last.BrokerID == g.Master.ID {
		last = s.last
	}
	for _, b := range g.Slaves {
		st := j.brokerStatusLocked(g.Name, b.ID, b.Addr, string(routing.RoleSlave), now)
		st.InSync = g.IsInSync(b.ID)
		if s != nil {
			h, heard := s.slave(b.ID)
			if heard {
				st.Broken, st.Waiting = h.hb.Broken, h.hb.Waiting
			}
			alive := heard && now.Sub(h.at) <= j.cfg.SessionTimeout
			st.IneligibleReason, st.NotEligible = j.ineligibleLocked(g, s, b.ID, h, alive)
			st.Eligible = st.IneligibleReason == ""
		} else {
			st.IneligibleReason, st.NotEligible = refuseSlaveOut, fmt.Sprintf("the slave %s has not heartbeated since this leader took over", b.ID)
		}
		for _, r := range last.Replicas {
			if r.ID == b.ID {
				st.Reported, st.AckOffset, st.LagBytes, st.LagMillis = true, r.AckOffset, r.LagBytes, r.LagMillis
			}
		}
		out = append(out, st)
	}
	var former []api.BrokerStatus
	for k, h := range j.heard {
		if _, named := g.RoleOf(k.id); k.group != g.Name || named {
			continue
		}
		st := j.brokerStatusLocked(g.Name, k.id, h.addr, api.RoleFormerMaster, now)
		// The registry's epoch history says which promotion replaced it; a
		// broker that led no epoch it remembers (a slave an operator
		// removed) is no former master.
		led := false
		for i := len(g.History) - 2; i >= 0; i-- {
			if g.History[i].Master == k.id {
				st.ReplacedAtEpoch, st.ReplacedBy = g.History[i+1].Epoch, g.History[i+1].Master
				led = true
				break
			}
		}
		if led {
			former = append(former, st)
		}
	}
	sort.Slice(former, func(a, b int) bool {
		if former[a].LastHeartbeatAgeMillis != former[b].LastHeartbeatAgeMillis {
			return former[a].LastHeartbeatAgeMillis < former[b].LastHeartbeatAgeMillis
		}
		return former[a].ID < former[b].ID
	})
	return append(out, former[:min(len(former), maxFormer)]...)
}

// brokerStatusLocked is one broker's heartbeat status as of now. j.mu is held.
func (j *judge) brokerStatusLocked(group, id, addr, role string, now time.Time) api.BrokerStatus {
	st := api.BrokerStatus{ID: id, Addr: addr, Role: role, LastHeartbeatAgeMillis: -1}
	from := j.since // unheard: silent since the takeover, as far as this leader knows
	if h := j.heard[brokerKey{group, id}]; h != nil {
		st.Heard, st.LastHeartbeatAgeMillis, from = true, now.Sub(h.at).Milliseconds(), h.at
	}
	silent := now.Sub(from)
	st.Alive = st.Heard && silent <= j.cfg.SessionTimeout
	st.Lost = silent > j.cfg.SessionTimeout
	return st
}
