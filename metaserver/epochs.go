package metaserver

import (
	"context"
	"errors"
	"sync"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// epochWord takes what a heartbeat says about epochs: a master's start of
// the epoch it leads (fixed once, fsm.FixEpochStart), and a slave's report
// that it carried out a resync order.
func (s *Server) epochWord(ctx context.Context, g routing.Group, role routing.Role, hb api.Heartbeat) {
	n := len(g.History)
	if role == routing.RoleMaster && hb.EpochStart != nil && n > 0 && hb.Epoch == g.Epoch &&
		(!g.History[n-1].Fixed || g.History[n-1].Start != *hb.EpochStart) {
		_, err := s.apply(ctx, &fsm.FixEpochStart{Group: g.Name, Epoch: g.Epoch, Master: hb.BrokerID, Start: *hb.EpochStart})
		switch {
		case err == nil:
			s.log.Info("fixed where an epoch began, as its master reported it", "group", g.Name, "epoch", g.Epoch,
				"master", hb.BrokerID, "start", *hb.EpochStart, "promoted-at", g.History[n-1].Start)
		case errors.Is(err, protocol.ErrConflict):
			if prev, _ := s.startWarned.Swap(g.Name, g.Epoch); prev != g.Epoch { // once per group and epoch
				s.log.Error("a master reports another start of its epoch than the fixed one; the fixed one stands", "group", g.Name,
					"epoch", g.Epoch, "master", hb.BrokerID, "reported", *hb.EpochStart, "fixed", g.History[n-1].Start)
			}
		default:
			s.log.Warn("fixing where an epoch began failed", "group", g.Name, "epoch", g.Epoch, "error", err)
		}
	}
	if o := g.Resync; o != nil && o.Broker == hb.BrokerID && hb.ResyncDone == o.Seq {
		if _, err := s.apply(ctx, &fsm.ResyncDone{Group: g.Name, Broker: hb.BrokerID, Seq: o.Seq}); err != nil {
			s.log.Warn("clearing a carried-out resync order failed", "group", g.Name, "broker", hb.BrokerID, "error", err)
		}
	}
}

// resyncBroker orders a slave to set its log aside and copy it again from
// its master.
func (s *Server) resyncBroker(ctx context.Context, req api.ResyncBrokerRequest) (routing.Group, error) {
	if req.Broker == "" {
		return routing.Group{}, invalid("resync: a broker id is required")
	}
	var group string
	for _, g := range s.fsm.Groups() {
		if _, ok := g.RoleOf(req.Broker); ok {
			group = g.Name
			break
		}
	}
	if group == "" {
		return routing.Group{}, &protocol.Error{Status: protocol.StatusNotFound, Message: "no broker group names broker \"" + req.Broker + "\""}
	}
	if _, err := s.apply(ctx, &fsm.ResyncBroker{Group: group, Broker: req.Broker, At: s.cfg.Clock.Now().UnixMilli()}); err != nil {
		return routing.Group{}, err
	}
	g, _ := s.fsm.Group(group)
	s.log.Warn("an operator ordered a broker to copy its log again from its master", "group", group, "broker", req.Broker,
		"seq", g.ResyncSeq())
	return g, nil
}

// syncMap is a typed sync.Map.
type syncMap[K comparable, V any] struct{ m sync.Map }

// Swap stores v under k and returns the value it replaced.
func (s *syncMap[K, V]) Swap(k K, v V) (prev V, loaded bool) {
	p, loaded := s.m.Swap(k, v)
	if loaded {
		prev = p.(V)
	}
	return prev, loaded
}
