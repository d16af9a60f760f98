package broker

import (
	"context"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
)

// heartbeatLoop sends a heartbeat every interval and enforces the group
// state in the reply. Missing heartbeats need no action here: Writable
// turns false by itself once the last accepted one is a session old.
func (b *Broker) heartbeatLoop() {
	tick := time.NewTicker(b.cfg.HeartbeatInterval)
	defer tick.Stop()
	failing := false
	for {
		b.heartbeat(&failing)
		select {
		case <-b.ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (b *Broker) heartbeat(failing *bool) {
	hb := api.Heartbeat{Group: b.cfg.Group, Role: b.cfg.Role, BrokerID: b.cfg.ID, Addr: b.addr, HAAddr: b.haAddr,
		LogEnd: b.store.EndOffset()}
	if b.IsMaster() {
		s := b.Slave()
		hb.SlaveConnected, hb.SlaveAckOffset, hb.LagBytes, hb.LagMillis = s.Connected, s.AckOffset, s.LagBytes, s.LagTime.Milliseconds()
	}
	ctx, cancel := context.WithTimeout(b.ctx, b.cfg.HeartbeatInterval)
	defer cancel()
	reply, err := b.meta.Heartbeat(ctx, hb)
	if err != nil {
		if b.ctx.Err() == nil && !*failing {
			b.log.Warn("heartbeat failed; the broker turns read-only if none is accepted for a session",
				"session", b.cfg.SessionTimeout, "error", err)
		}
		*failing = true
		return
	}
	if *failing {
		b.log.Info("heartbeats accepted again")
	}
	*failing = false
	wasWritable := b.Writable()
	b.metaWritable.Store(reply.Group.Writable())
	b.lastAccepted.Store(time.Now().UnixNano())
	if now := b.Writable(); now != wasWritable && b.IsMaster() {
		b.log.Info("group state changed", "writable", now, "reasons", reply.Group.Reasons.String())
	}
	if !b.IsMaster() && b.cfg.MasterHAAddr == "" {
		b.masterHA.Store(reply.Group.Master.HAAddr)
	}
}
