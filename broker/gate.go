package broker

import (
	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/transport"
)

// admissionGate is what a connection to the port p may do before it
// authenticates (transport.ServerConfig.Gate): with authorization on,
// AUTH and IDENTIFY only, within auth's default caps, shares, deadlines
// and AUTH backoff (a gate per port, each with its own cap); off, no
// gate. The gate warns through the port's logger.
func (b *Broker) admissionGate(p port) transport.Gate {
	if b.acl == nil {
		return nil
	}
	name := "rpc"
	if p == haPort {
		name = "ha"
	}
	g := auth.NewGate(auth.GateConfig{Logger: b.log.Named(name)})
	b.gates[p] = g
	return g
}

// AuthFailures is how many AUTHs failed on the data and HA ports (the
// ferrymq_broker_auth_failures_total metric); 0 with authorization off.
func (b *Broker) AuthFailures() int64 {
	var n int64
	for _, g := range b.gates {
		if g != nil {
			n += g.AuthFailures()
		}
	}
	return n
}

// dropRevoked closes the connections to the data and HA ports whose
// principal the table t no longer knows (removed, or its token replaced):
// each of their requests would be refused anyway, but the transport would
// still read their frames as a trusted peer's.
func (b *Broker) dropRevoked(t *auth.Table) {
	n := 0
	for _, srv := range []*transport.Server{b.rpc, b.ha} {
		n += srv.DropConns(auth.Revoked(t), auth.ErrRevoked)
	}
	if n > 0 {
		b.log.Info("closed the connections of revoked credentials", "connections", n, "acl-version", t.Version())
	}
}
