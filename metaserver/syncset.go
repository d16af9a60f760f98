package metaserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// Groups of more than two brokers (fsm/syncset.go has the rules): a third
// broker's heartbeat joins it as a slave, a master changes its sync set
// (ALTER_SYNC_SET), and an operator sets a group's policy and removes a
// slave.

func (s *Server) syncSetRoutes() {
	handle(s, protocol.CodeAlterSyncSet, true, s.alterSyncSet)
	handle(s, protocol.CodeAdminGroupPolicy, true, s.setGroupPolicy)
	handle(s, protocol.CodeAdminRemoveSlave, true, s.removeSlave)
}

// register records a broker that heartbeats with an identity or addresses
// the group does not have: RegisterBroker fills the group's master and
// first slave places, and a broker past them joins as a slave (JoinSlave).
// Each is tried on the group as this node read it; if the group moved so
// that the other applies (a place freed, or filled), it is tried once.
func (s *Server) register(ctx context.Context, g routing.Group, known bool, hb api.Heartbeat, b routing.Broker, now time.Time) error {
	reg := fsm.Command(&fsm.RegisterBroker{Group: hb.Group, Role: hb.Role, Broker: b, LogEnd: hb.LogEnd,
		At: now.UnixMilli(), Pending: s.cfg.AdmitGroups == AdmitManual, MoreSlaves: true})
	join := fsm.Command(&fsm.JoinSlave{Group: hb.Group, Broker: b, At: now.UnixMilli()})
	first, then := reg, join
	if !known && g.Master.ID != "" && len(g.Slaves) > 0 {
		first, then = join, reg
	}
	_, err := s.apply(ctx, first)
	if errors.Is(err, protocol.ErrConflict) && !known {
		if g2, ok := s.fsm.Group(hb.Group); ok && (g2.Master.ID != "" && len(g2.Slaves) > 0) != (first == join) {
			_, err = s.apply(ctx, then)
		}
	}
	return err
}

// alterSyncSet serves ALTER_SYNC_SET: a group's master replaces the sync
// set it waits for, if the group is still at its epoch, with it as master,
// and the set at the version it read. It answers the group after the
// change (CONFLICT when any of those moved).
func (s *Server) alterSyncSet(ctx context.Context, req api.AlterSyncSetRequest) (routing.Group, error) {
	if req.Group == "" || req.Master == "" {
		return routing.Group{}, invalid("changing a sync set needs the group and its master")
	}
	if len(req.InSync) > routing.MaxSlaves {
		return routing.Group{}, invalid("a sync set of %d slaves: a group has at most %d", len(req.InSync), routing.MaxSlaves)
	}
	if promoting := s.judge.promotingChan(req.Group); promoting != nil {
		// The judge chose a slave from the set as it was: let its
		// promotion commit first (the change is then refused, a new epoch
		// having begun). A change committed just before the judge marked
		// the promotion is harmless: the master's lease had run out, so it
		// answers no HIGH message on the changed set.
		select {
		case <-promoting:
		case <-ctx.Done():
			return routing.Group{}, ctx.Err()
		}
	}
	before, _ := s.fsm.Group(req.Group)
	if _, err := s.apply(ctx, &fsm.AlterSyncSet{Group: req.Group, Epoch: req.Epoch, Master: req.Master,
		ExpectVersion: req.ExpectVersion, InSync: req.InSync, At: s.cfg.Clock.Now().UnixMilli()}); err != nil {
		return routing.Group{}, err
	}
	g, _ := s.fsm.Group(req.Group)
	s.log.Info("sync set changed by its master", "group", g.Name, "master", req.Master, "epoch", g.Epoch,
		"from", strings.Join(before.InSync, ","), "to", strings.Join(g.InSync, ","), "version", g.SyncVersion,
		"high-allowed", g.HighAllowed())
	return g, nil
}

// setGroupPolicy serves ADMIN_GROUP_POLICY.
func (s *Server) setGroupPolicy(ctx context.Context, req api.GroupPolicyRequest) (routing.Group, error) {
	if req.Group == "" {
		return routing.Group{}, invalid("setting a group's policy needs its name")
	}
	res, err := s.apply(ctx, &fsm.SetGroupPolicy{Group: req.Group, MinInSync: req.MinInSync, AckQuorum: req.AckQuorum,
		At: s.cfg.Clock.Now().UnixMilli()})
	if err != nil {
		return routing.Group{}, err
	}
	g, _ := s.fsm.Group(req.Group)
	if res.Version == g.Version {
		s.log.Info("admin set a broker group's HIGH policy", "group", g.Name, "min-copies", g.MinCopies(),
			"ack-quorum", g.AckQuorum, "in-sync", len(g.InSync), "high-allowed", g.HighAllowed())
	}
	return g, nil
}

// removeSlave serves ADMIN_REMOVE_SLAVE: a slave this leader has not heard
// for a session leaves its group and the sync set. A live one is refused:
// it would join again at its next heartbeat.
func (s *Server) removeSlave(ctx context.Context, req api.RemoveSlaveRequest) (routing.Group, error) {
	if req.Broker == "" {
		return routing.Group{}, invalid("removing a slave needs its broker id")
	}
	g, ok := s.fsm.Group(req.Group)
	if !ok {
		return routing.Group{}, &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("broker group %q does not exist", protocol.Clip(req.Group))}
	}
	role, known := g.RoleOf(req.Broker)
	switch {
	case !known:
		return routing.Group{}, &protocol.Error{Status: protocol.StatusNotFound,
			Message: fmt.Sprintf("broker group %q has no slave %q (its slaves: %s)", g.Name, protocol.Clip(req.Broker), strings.Join(slaveIDs(g), ", "))}
	case role == routing.RoleMaster:
		return routing.Group{}, &protocol.Error{Status: protocol.StatusConflict,
			Message: fmt.Sprintf("broker %s is the master of group %q: stop it, and a failover promotes one of its slaves", req.Broker, g.Name)}
	}
	now := s.cfg.Clock.Now()
	if why := s.judge.brokerLive(g, req.Broker, "slave", now); why != "" {
		return routing.Group{}, &protocol.Error{Status: protocol.StatusGroupActive,
			Message: fmt.Sprintf("slave %s of group %q may be alive: %s; stop it first (it would join again at its next heartbeat)", req.Broker, g.Name, why)}
	}
	if _, err := s.apply(ctx, &fsm.RemoveGroupBroker{Group: g.Name, Broker: req.Broker, At: now.UnixMilli()}); err != nil {
		return routing.Group{}, err
	}
	g, _ = s.fsm.Group(g.Name)
	s.log.Warn("admin removed a slave from its broker group", "group", g.Name, "broker", req.Broker, "slaves", len(g.Slaves),
		"in-sync", len(g.InSync), "high-allowed", g.HighAllowed())
	return g, nil
}

// slaveIDs lists the ids of g's slaves.
func slaveIDs(g routing.Group) []string {
	out := make([]string, len(g.Slaves))
	for i, b := range g.Slaves {
		out[i] = b.ID
	}
	return out
}
