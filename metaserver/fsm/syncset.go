package fsm

import (
	"fmt"
	"slices"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// Groups of more than two brokers, and their sync sets.
//
// A group has one master and up to routing.MaxSlaves slaves. Its sync set
// (routing.Group.InSync) names the slaves that hold every HIGH message the
// master acknowledged in the current epoch: the master waits for each of
// them before it answers a HIGH message, and it alone changes the set, by
// AlterSyncSet with a compare-and-set on the set's version, in its epoch.
// It adds a slave only after it began to wait for it, and stops waiting for
// one only after its removal is committed, so every member of the
// committed set holds every HIGH message answered: those are the slaves a
// failover may promote (metaserver/failover.go).
//
// The commands have no IgnoreUnknown bit: a node that skipped one would
// promote another slave, or let a master answer HIGH messages on fewer
// copies, once it led. Every metaserver must know them before a leader
// proposes one.
const (
	TypeJoinSlave         CommandType = 43
	TypeAlterSyncSet      CommandType = 44
	TypeSetGroupPolicy    CommandType = 45
	TypeRemoveGroupBroker CommandType = 46
)

// JoinSlave adds a slave to a group that has a master and a slave already
// (RegisterBroker fills the first two places). It joins outside the sync
// set. Joining again changes nothing but its addresses.
type JoinSlave struct {
	Group  string         `json:"group"`
	Broker routing.Broker `json:"broker"`
	At     int64          `json:"at"`
}

// AlterSyncSet replaces a group's sync set. Epoch and Master must be the
// group's (a master of an earlier epoch changes nothing) and
// ExpectVersion its SyncVersion (else CONFLICT: the master re-reads the
// group and decides again). Every id must be one of the group's slaves,
// named once.
type AlterSyncSet struct {
	Group         string   `json:"group"`
	Epoch         uint32   `json:"epoch"`
	Master        string   `json:"master"`
	ExpectVersion uint64   `json:"expect_version"`
	InSync        []string `json:"in_sync"`
	At            int64    `json:"at"`
}

// SetGroupPolicy sets a group's MinInSync (0: the default) and AckQuorum
// (0: every member of the sync set).
type SetGroupPolicy struct {
	Group     string `json:"group"`
	MinInSync int    `json:"min_in_sync"`
	AckQuorum int    `json:"ack_quorum"`
	At        int64  `json:"at"`
}

// RemoveGroupBroker removes a slave from its group (and from the sync set).
// The master cannot be removed: it is stopped, and a failover promotes a
// slave. Removing a broker the group does not name changes nothing.
type RemoveGroupBroker struct {
	Group  string `json:"group"`
	Broker string `json:"broker"`
	At     int64  `json:"at"`
}

func (JoinSlave) Type() CommandType         { return TypeJoinSlave }
func (AlterSyncSet) Type() CommandType      { return TypeAlterSyncSet }
func (SetGroupPolicy) Type() CommandType    { return TypeSetGroupPolicy }
func (RemoveGroupBroker) Type() CommandType { return TypeRemoveGroupBroker }

// MaxMinInSync bounds MinInSync and AckQuorum: a group has at most a
// master and routing.MaxSlaves slaves.
const MaxMinInSync = routing.MaxSlaves + 1

func (f *FSM) joinSlave(c *JoinSlave) any {
	g := f.s.Groups[c.Group]
	if g == nil {
		return notFound("broker group %q does not exist", c.Group)
	}
	if c.Broker.ID == "" || c.Broker.Addr == "" {
		return &protocol.Error{Status: protocol.StatusInvalid, Message: "join: broker id and address are required"}
	}
	if err := refuseRetired(g, c.Broker.ID); err != nil {
		return err
	}
	switch role, known := g.RoleOf(c.Broker.ID); {
	case known && role == routing.RoleMaster:
		return conflict("broker %s is the master of group %q", c.Broker.ID, c.Group)
	case known:
		if b, _ := g.SlaveByID(c.Broker.ID); b == c.Broker {
			return &Result{Version: g.Version}
		}
		g.Slaves = replaceSlave(g.Slaves, c.Broker)
		g.MirrorSlave()
		return f.bumpGroup(g)
	}
	if g.Master.ID == "" || len(g.Slaves) == 0 {
		return conflict("group %q has a free place: %s registers into it", c.Group, c.Broker.ID)
	}
	if len(g.Slaves) >= routing.MaxSlaves {
		return conflict("group %q has %d slaves, the most a group has; remove one before %s can join", c.Group, len(g.Slaves), c.Broker.ID)
	}
	g.Slaves = append(slices.Clone(g.Slaves), c.Broker)
	g.MirrorSlave()
	g.ChangedAt = c.At
	return f.bumpGroup(g)
}

// replaceSlave returns slaves with b in the place of the slave of its id.
func replaceSlave(slaves []routing.Broker, b routing.Broker) []routing.Broker {
	out := slices.Clone(slaves)
	for i := range out {
		if out[i].ID == b.ID {
			out[i] = b
		}
	}
	return out
}

func (f *FSM) alterSyncSet(c *AlterSyncSet) any {
	g := f.s.Groups[c.Group]
	if g == nil {
		return notFound("broker group %q does not exist", c.Group)
	}
	if g.Epoch != c.Epoch || g.Master.ID != c.Master || c.Master == "" {
		return conflict("group %q is at epoch %d with master %q, not epoch %d with master %q", c.Group, g.Epoch, g.Master.ID, c.Epoch, c.Master)
	}
	if g.SyncVersion != c.ExpectVersion {
		return conflict("group %q's sync set is at version %d, not %d", c.Group, g.SyncVersion, c.ExpectVersion)
	}
	for i, id := range c.InSync {
		if _, ok := g.SlaveByID(id); !ok {
			return conflict("broker %q is not a slave of group %q", id, c.Group)
		}
		if slices.Contains(c.InSync[:i], id) {
			return &protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("broker %q is named twice", id)}
		}
	}
	if len(c.InSync)+1 >= g.MinCopies() || g.AckQuorum > 0 {
		// At the minimum nobody needs to be eligible; under a quorum a
		// leaving member need not hold every message answered.
		g.Eligible = nil
	} else {
		// Below the minimum the master answers no HIGH message: those
		// leaving now hold every one it answered.
		elr := slices.Clone(g.Eligible)
		for _, id := range g.InSync {
			if !slices.Contains(c.InSync, id) && !slices.Contains(elr, id) {
				elr = append(elr, id)
			}
		}
		g.Eligible = slices.DeleteFunc(elr, func(id string) bool { return slices.Contains(c.InSync, id) })
	}
	g.InSync = slices.Clone(c.InSync)
	g.SyncVersion++
	g.MirrorSlave()
	g.ChangedAt = c.At
	return f.bumpGroup(g)
}

func (f *FSM) setGroupPolicy(c *SetGroupPolicy) any {
	g := f.s.Groups[c.Group]
	if g == nil {
		return notFound("broker group %q does not exist", c.Group)
	}
	switch {
	case c.MinInSync < 0 || c.MinInSync > MaxMinInSync:
		return &protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("min in-sync %d: want 1 to %d copies (the master's counted), or 0 for the default %d", c.MinInSync, MaxMinInSync, routing.DefaultMinInSync)}
	case c.AckQuorum == 1 || c.AckQuorum < 0 || c.AckQuorum > MaxMinInSync:
		return &protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("ack quorum %d: want 2 to %d copies (the master's counted), or 0 for every member of the sync set", c.AckQuorum, MaxMinInSync)}
	}
	if g.MinInSync == c.MinInSync && g.AckQuorum == c.AckQuorum {
		return &Result{Version: g.Version}
	}
	g.MinInSync, g.AckQuorum = c.MinInSync, c.AckQuorum
	if g.HighAllowed() {
		g.Eligible = nil // the set holds every HIGH message from now on
	}
	g.ChangedAt = c.At
	return f.bumpGroup(g)
}

func (f *FSM) removeGroupBroker(c *RemoveGroupBroker) any {
	g := f.s.Groups[c.Group]
	if g == nil {
		return notFound("broker group %q does not exist", c.Group)
	}
	role, known := g.RoleOf(c.Broker)
	switch {
	case !known:
		return &Result{Version: g.Version}
	case role == routing.RoleMaster:
		return conflict("broker %s is the master of group %q: stop it, and a failover promotes one of its slaves", c.Broker, c.Group)
	case g.AckQuorum > 0 && g.IsInSync(c.Broker):
		// It may hold the only slave copy of messages answered on a quorum:
		// the failover's count of members to hear from assumes it is there.
		return conflict("broker %s is in group %q's sync set, which answers HIGH at %d copies: its master takes it out once the others hold what it does",
			c.Broker, c.Group, g.AckQuorum)
	}
	g.Slaves = slices.DeleteFunc(slices.Clone(g.Slaves), func(b routing.Broker) bool { return b.ID == c.Broker })
	if g.IsInSync(c.Broker) {
		g.InSync = slices.DeleteFunc(slices.Clone(g.InSync), func(id string) bool { return id == c.Broker })
		g.SyncVersion++
	}
	g.Eligible = slices.DeleteFunc(slices.Clone(g.Eligible), func(id string) bool { return id == c.Broker })
	g.MirrorSlave()
	g.ChangedAt = c.At
	return f.bumpGroup(g)
}

// migrateSlaves fills Slaves of a group from a snapshot taken before
// groups had more than one slave, as replaying the log that made it would:
// its slave, outside the sync set (its master adds it once caught up).
func migrateSlaves(g *routing.Group) {
	if len(g.Slaves) > 0 || g.Slave.ID == "" {
		return
	}
	g.Slaves = []routing.Broker{g.Slave}
}
