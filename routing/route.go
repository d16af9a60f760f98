package routing

import (
	"sort"
	"strings"
)

// Reasons is the set of reasons a broker group is read-only. A group with
// no reason is writable.
type Reasons uint8

const (
	// HeartbeatLost: the metaserver has not heard from the group's master
	// for one session.
	HeartbeatLost Reasons = 1 << iota
	// SlaveLag: the slave is absent or behind the threshold.
	SlaveLag
	// Admin: an operator marked the group read-only; only an operator
	// clears it.
	Admin
)

// Writable reports whether no reason holds.
func (r Reasons) Writable() bool { return r == 0 }

// String lists the reasons, e.g. "heartbeat-lost,slave-lag", or "" when none.
func (r Reasons) String() string {
	var parts []string
	if r&HeartbeatLost != 0 {
		parts = append(parts, "heartbeat-lost")
	}
	if r&SlaveLag != 0 {
		parts = append(parts, "slave-lag")
	}
	if r&Admin != 0 {
		parts = append(parts, "admin")
	}
	return strings.Join(parts, ",")
}

// State is "RW" or "RO".
func (r Reasons) State() string {
	if r.Writable() {
		return "RW"
	}
	return "RO"
}

// Role is a broker's place in its group.
type Role string

// The roles of a broker group.
const (
	RoleMaster Role = "master"
	RoleSlave  Role = "slave"
)

// Valid reports whether r is a known role.
func (r Role) Valid() bool { return r == RoleMaster || r == RoleSlave }

// Broker is one member of a broker group.
type Broker struct {
	ID     string `json:"id"`
	Addr   string `json:"addr"`    // where producers send and consumers pull
	HAAddr string `json:"ha_addr"` // where the slave fetches the log (master only)
}

// Group is a broker group: a master and, usually, a slave.
type Group struct {
	Name    string  `json:"name"`
	Master  Broker  `json:"master"`
	Slave   Broker  `json:"slave"`
	Reasons Reasons `json:"reasons"`
	// Version increases with every change of the group.
	Version uint64 `json:"version"`
	// ChangedAt is when the state last changed (unix ms, stamped by the leader).
	ChangedAt int64 `json:"changed_at"`
}

// Writable reports whether the group takes writes.
func (g Group) Writable() bool { return g.Reasons.Writable() }

// Topic maps a topic's queues to broker groups: Queues[i] is the group of
// queue i.
type Topic struct {
	Name    string   `json:"name"`
	Queues  []string `json:"queues"`
	Version uint64   `json:"version"`
}

// QueueRoute is where one queue lives, as a producer needs it.
type QueueRoute struct {
	Queue    uint32 `json:"queue"`
	Group    string `json:"group"`
	Master   string `json:"master"` // the master's address
	Writable bool   `json:"writable"`
}

// Route is a topic's queues with their groups' masters and states. Version
// is the registry's version when the route was read: a larger one is newer.
type Route struct {
	Topic   string       `json:"topic"`
	Version uint64       `json:"version"`
	Queues  []QueueRoute `json:"queues"`
}

// WritableQueues returns the queues whose groups take writes.
func (r *Route) WritableQueues() []QueueRoute {
	out := make([]QueueRoute, 0, len(r.Queues))
	for _, q := range r.Queues {
		if q.Writable {
			out = append(out, q)
		}
	}
	return out
}

// Groups returns the names of the groups the route uses, sorted.
func (r *Route) Groups() []string {
	seen := map[string]bool{}
	var out []string
	for _, q := range r.Queues {
		if !seen[q.Group] {
			seen[q.Group] = true
			out = append(out, q.Group)
		}
	}
	sort.Strings(out)
	return out
}

// SpreadQueues assigns n queues to groups round-robin, starting at the
// group after `start` (so successive topics begin on different groups).
// groups must be non-empty; it is not modified.
func SpreadQueues(n int, groups []string, start int) []string {
	sorted := append([]string(nil), groups...)
	sort.Strings(sorted)
	out := make([]string, n)
	for i := range out {
		out[i] = sorted[(start+i)%len(sorted)]
	}
	return out
}
