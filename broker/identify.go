package broker

import (
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

// handleIdentify answers IDENTIFY: this is a broker, its id, group and
// current role. A metaserver client that reached a broker by mistake asks
// it, to tell its user which address is wrong.
func (b *Broker) handleIdentify(r *transport.Request) {
	_ = r.Reply(protocol.AppendIdentity(nil, &protocol.Identity{
		Kind: protocol.KindBroker, ID: b.cfg.ID, Group: b.cfg.Group, Role: b.Role().Kind.String(),
	}))
}
