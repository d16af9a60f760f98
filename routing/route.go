package routing

import (
	"errors"
	"fmt"
	"slices"
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

// EpochRecord is one epoch of a group: who was master, and the commit-log
// offset at which the epoch began: the master's log end when it took the
// epoch over (0 for a group's first epoch on an empty log).
//
// A promotion records the promoted slave's last reported log end, which
// may be off (the slave kept copying after that report); the new master
// then reports its real start and the registry fixes it (Fixed). A fixed
// start never changes again: every member's log agrees with the master's
// below it (DESIGN.md, "Epochs").
type EpochRecord struct {
	Epoch  uint32 `json:"epoch"`
	Master string `json:"master"` // broker id
	Start  int64  `json:"start"`
	At     int64  `json:"at"` // unix ms, stamped by the leader
	// Fixed is set once the epoch's master has confirmed Start.
	Fixed bool `json:"fixed,omitempty"`
}

// MaxEpochHistory is how many epochs a group remembers.
const MaxEpochHistory = 16

// Admission is whether a broker group may hold queues: "" (admitted),
// Pending or Retired.
type Admission string

const (
	// Admitted groups take queues: topic creation, add-queues and a
	// retirement place queues on them. It is the zero value, so a group
	// from a registry older than admission is admitted.
	Admitted Admission = ""
	// Pending: the group registered while the metaserver admits groups by
	// hand (-admit-groups=manual) and waits for `ferryctl broker add-group`;
	// it is a working group but never gets a queue.
	Pending Admission = "pending"
	// Retired: `ferryctl broker retire-group` moved its queues to other
	// groups. It has no brokers and holds no queue, and a broker naming it
	// is refused until an operator admits it again.
	Retired Admission = "retired"
)

// Word is the admission as ferryctl shows it.
func (a Admission) Word() string {
	if a == Admitted {
		return "admitted"
	}
	return string(a)
}

// Group is a broker group: a master and, usually, a slave.
//
// Roles are the registry's: a broker's own preference counts only when it
// first registers. Epoch increases with every change of master (a
// promotion); every write and every replication request carries it, and a
// broker that sees a higher one than its own has been replaced.
type Group struct {
	Name   string `json:"name"`
	Master Broker `json:"master"`
	// Slave is one of Slaves, for readers of one slave (a route names one,
	// and older tools): the first slave of the sync set, else the first
	// slave, else none. The registry keeps it so; nothing sets it alone.
	Slave Broker `json:"slave"`
	// Slaves are the group's slaves, in the order they joined.
	Slaves []Broker `json:"slaves,omitempty"`
	// InSync is the sync set: the ids of the slaves that hold every HIGH
	// message the master acknowledged in this epoch (the master waits for
	// them, and changes the set through the registry). SyncVersion counts
	// its changes.
	InSync      []string `json:"in_sync,omitempty"`
	SyncVersion uint64   `json:"sync_version,omitempty"`
	// Eligible are slaves that left the sync set when it fell below
	// MinCopies: the master answers no HIGH message while the set is below
	// it, so they still hold every one it answered, and a failover may
	// promote them (Kafka's eligible leader replicas). Cleared when the set
	// holds MinCopies again.
	Eligible []string `json:"eligible,omitempty"`
	// MinInSync is how many copies (the master's counted) a HIGH message
	// needs: with fewer in the sync set HIGH is refused before it is
	// stored. 0 means DefaultMinInSync.
	MinInSync int `json:"min_in_sync,omitempty"`
	// AckQuorum, when not 0, answers a HIGH message once that many copies
	// (the master's counted) of the sync set hold it, not every one.
	AckQuorum int     `json:"ack_quorum,omitempty"`
	Reasons   Reasons `json:"reasons"`
	// Admission says whether the group may hold queues ("": admitted).
	Admission Admission `json:"admission,omitempty"`
	// Epoch is the current master's epoch, 0 until the group has a master.
	Epoch uint32 `json:"epoch"`
	// History is the last MaxEpochHistory epochs, oldest first; the last one
	// is the current epoch.
	History []EpochRecord `json:"history,omitempty"`
	// Version increases with every change of the group.
	Version uint64 `json:"version"`
	// Resync is an operator's order to one of its slaves to set its log
	// aside and copy it again from the master (nil: none pending);
	// LastResync is the Seq of the last order carried out.
	Resync     *ResyncOrder `json:"resync,omitempty"`
	LastResync uint64       `json:"last_resync,omitempty"`
	// ChangedAt is when the state last changed (unix ms, stamped by the leader).
	ChangedAt int64 `json:"changed_at"`
}

// ResyncOrder is an order to a group's slave to copy its log afresh.
type ResyncOrder struct {
	Broker string `json:"broker"`
	Seq    uint64 `json:"seq"`
	At     int64  `json:"at"` // unix ms, stamped by the leader
}

// ResyncSeq is the Seq of the group's latest resync order.
func (g Group) ResyncSeq() uint64 {
	if g.Resync != nil {
		return g.Resync.Seq
	}
	return g.LastResync
}

// Writable reports whether the group takes writes.
func (g Group) Writable() bool { return g.Reasons.Writable() }

// Placeable reports whether queues may be placed on the group: it is
// admitted, writable and has a master.
func (g Group) Placeable() bool {
	return g.Admission == Admitted && g.Writable() && g.Master.Addr != ""
}

// RoleOf returns the role the registry gives broker id in the group, and
// false if the group does not name it.
func (g Group) RoleOf(id string) (Role, bool) {
	switch {
	case id == "":
		return "", false
	case g.Master.ID == id:
		return RoleMaster, true
	}
	if _, ok := g.SlaveByID(id); ok {
		return RoleSlave, true
	}
	return "", false
}

// SlaveByID returns the group's slave with id.
func (g Group) SlaveByID(id string) (Broker, bool) {
	for _, b := range g.Slaves {
		if b.ID == id {
			return b, true
		}
	}
	return Broker{}, false
}

// DefaultMinInSync is a group's MinInSync when it sets none: the master
// and one slave.
const DefaultMinInSync = 2

// MaxSlaves is the most slaves a group has.
const MaxSlaves = 8

// IsInSync reports whether slave id is in the sync set.
func (g Group) IsInSync(id string) bool { return slices.Contains(g.InSync, id) }

// MinCopies is how many copies of a HIGH message, the master's counted,
// the group's policy requires: MinInSync (its default if 0), and at least
// AckQuorum.
func (g Group) MinCopies() int {
	n := g.MinInSync
	if n <= 0 {
		n = DefaultMinInSync
	}
	return max(n, g.AckQuorum)
}

// HighAllowed reports whether the sync set, with the master, holds the
// copies a HIGH message needs.
func (g Group) HighAllowed() bool { return len(g.InSync)+1 >= g.MinCopies() }

// Promotable reports whether slave id holds, by the registry's word,
// every HIGH message the master answered: it is in the sync set or
// eligible. With neither, any slave may be only in a group whose set never
// formed (SyncVersion 0: no HIGH message was answered with a slave's copy)
// or whose policy asks for the master's copy alone; the failover then
// judges it by what the master last reported. A set that formed and is
// empty now (its only member was promoted) promotes nobody until the new
// master has added a member.
func (g Group) Promotable(id string) bool {
	if len(g.InSync) == 0 && len(g.Eligible) == 0 {
		return g.SyncVersion == 0 || g.MinCopies() <= 1
	}
	return g.IsInSync(id) || slices.Contains(g.Eligible, id)
}

// MirrorSlave sets Slave from Slaves and InSync (see Slave).
func (g *Group) MirrorSlave() {
	g.Slave = Broker{}
	for _, id := range g.InSync {
		if b, ok := g.SlaveByID(id); ok {
			g.Slave = b
			return
		}
	}
	if len(g.Slaves) > 0 {
		g.Slave = g.Slaves[0]
	}
}

// ErrStartPending is TruncationPoint's answer while the current epoch's
// start is not fixed yet: the broker must wait for its master to confirm
// where the epoch began before it can tell what to cut.
var ErrStartPending = errors.New("routing: the current epoch's start is not confirmed by its master yet")

// TruncationPoint returns where a broker whose log holds records of epochs
// up to led (0: none, an empty or fresh log) must cut its log before it
// follows the current master: the lowest start of the epochs after led.
// Past that offset its log may hold records that the epochs after led
// never had. cut is false when it has nothing to cut (led is the current
// epoch, or 0).
//
// ErrStartPending means an epoch after led is the current one and its
// start is not fixed yet: the broker must wait (its master will confirm
// it). Any other error means the history no longer holds the epoch after
// led: the broker cannot tell where its log left the group's and must not
// follow without an operator.
func (g Group) TruncationPoint(led uint32) (offset int64, cut bool, err error) {
	if led == 0 || led >= g.Epoch {
		return 0, false, nil
	}
	if len(g.History) == 0 || g.History[0].Epoch > led+1 {
		return 0, false, fmt.Errorf("group %s: epoch %d, the one after the last this broker's log holds, is older than the history (oldest %d)",
			g.Name, led+1, g.oldestEpoch())
	}
	for _, e := range g.History {
		if e.Epoch <= led {
			continue
		}
		if e.Epoch == g.Epoch && !e.Fixed {
			return 0, false, ErrStartPending
		}
		if !cut || e.Start < offset {
			offset, cut = e.Start, true
		}
	}
	return offset, cut, nil
}

// Record returns the history's record of epoch e.
func (g Group) Record(e uint32) (EpochRecord, bool) {
	for _, r := range g.History {
		if r.Epoch == e {
			return r, true
		}
	}
	return EpochRecord{}, false
}

// LastLed returns the last epoch the history shows broker id leading, 0 if none.
func (g Group) LastLed(id string) uint32 {
	var led uint32
	for _, e := range g.History {
		if e.Master == id {
			led = e.Epoch
		}
	}
	return led
}

func (g Group) oldestEpoch() uint32 {
	if len(g.History) == 0 {
		return 0
	}
	return g.History[0].Epoch
}

// Topic maps a topic's queues to broker groups: Queues[i] is the group of
// queue i.
type Topic struct {
	Name    string   `json:"name"`
	Queues  []string `json:"queues"`
	Version uint64   `json:"version"`
}

// QueueRoute is where one queue lives, as a producer needs it.
type QueueRoute struct {
	Queue  uint32 `json:"queue"`
	Group  string `json:"group"`
	Master string `json:"master"` // the master's address
	// Slave is the slave's address ("" when the group has none); it serves
	// reads while the master is down.
	Slave    string `json:"slave,omitempty"`
	Epoch    uint32 `json:"epoch"` // the group's epoch; sends carry it
	Writable bool   `json:"writable"`
	// Base is the queue offset at which Group took the queue up when it
	// moved there from a retired group (0: it never moved): the group's
	// broker starts the queue there, so its offsets continue past the old
	// group's.
	Base int64 `json:"base,omitempty"`
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
