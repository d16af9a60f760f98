package fsm

import (
	"fmt"
	"slices"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// The epoch commands. An epoch's start is fixed once, by the epoch's own
// master, and never moves again (DESIGN.md, "Epochs"); before that, it is
// the promoted slave's last reported log end, which a rejoining old master
// does not cut by.

// Command types of this file. None has the IgnoreUnknown bit: a node that
// skipped one would tell rejoining brokers a different place to cut, or
// order a resync the others do not know of.
const (
	TypeFixEpochStart CommandType = 20
	TypeResyncBroker  CommandType = 21
	TypeResyncDone    CommandType = 22
)

// FixEpochStart fixes where a group's current epoch began: Start is the
// master's log end when it took the epoch over, which it recorded on its
// disk before it took a write. It applies once per epoch, and only to the
// current epoch by its own master: a start that is fixed never moves (a
// different Start is refused CONFLICT), so no restart, and no order of
// restarts, can move an epoch's start past records written in it.
type FixEpochStart struct {
	Group  string `json:"group"`
	Epoch  uint32 `json:"epoch"`
	Master string `json:"master"`
	Start  int64  `json:"start"`
}

// ResyncBroker orders a broker that is not its group's master to set its
// log aside and copy it again from the master (an operator's way back for a
// slave that cannot follow because of its own log). Seq numbers the orders
// of a group; the broker reports the Seq it carried out (ResyncDone).
type ResyncBroker struct {
	Group  string `json:"group"`
	Broker string `json:"broker"`
	At     int64  `json:"at"`
}

// ResyncDone clears a group's resync order once its broker carried it out.
type ResyncDone struct {
	Group  string `json:"group"`
	Broker string `json:"broker"`
	Seq    uint64 `json:"seq"`
}

func (FixEpochStart) Type() CommandType { return TypeFixEpochStart }
func (ResyncBroker) Type() CommandType  { return TypeResyncBroker }
func (ResyncDone) Type() CommandType    { return TypeResyncDone }

func (f *FSM) fixEpochStart(c *FixEpochStart) any {
	g := f.s.Groups[c.Group]
	if g == nil {
		return notFound("broker group %q does not exist", c.Group)
	}
	n := len(g.History)
	if n == 0 || g.Epoch != c.Epoch || g.History[n-1].Epoch != c.Epoch || g.Master.ID != c.Master || g.History[n-1].Master != c.Master {
		return conflict("group %q is at epoch %d under %q, not epoch %d under %q", c.Group, g.Epoch, g.Master.ID, c.Epoch, c.Master)
	}
	if c.Start < 0 {
		return &protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("epoch start %d is negative", c.Start)}
	}
	cur := g.History[n-1]
	if cur.Fixed {
		if cur.Start == c.Start {
			return &Result{Version: g.Version}
		}
		return conflict("epoch %d of group %q began at log offset %d (fixed); %s reports %d", c.Epoch, c.Group, cur.Start, c.Master, c.Start)
	}
	g.History = slices.Clone(g.History)
	g.History[n-1].Start, g.History[n-1].Fixed = c.Start, true
	return f.bumpGroup(g)
}

func (f *FSM) resyncBroker(c *ResyncBroker) any {
	g := f.s.Groups[c.Group]
	if g == nil {
		return notFound("broker group %q does not exist", c.Group)
	}
	role, ok := g.RoleOf(c.Broker)
	switch {
	case !ok:
		return notFound("broker %q is not a member of group %q", c.Broker, c.Group)
	case role == routing.RoleMaster:
		return conflict("broker %q is the master of group %q: only a slave copies its log again from its master", c.Broker, c.Group)
	}
	g.Resync = &routing.ResyncOrder{Broker: c.Broker, Seq: g.ResyncSeq() + 1, At: c.At}
	return f.bumpGroup(g)
}

func (f *FSM) resyncDone(c *ResyncDone) any {
	g := f.s.Groups[c.Group]
	if g == nil {
		return notFound("broker group %q does not exist", c.Group)
	}
	if g.Resync == nil || g.Resync.Broker != c.Broker || g.Resync.Seq != c.Seq {
		return &Result{Version: g.Version}
	}
	g.LastResync = g.Resync.Seq
	g.Resync = nil
	return f.bumpGroup(g)
}
