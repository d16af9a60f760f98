package broker

import (
	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/transport"
)

// admissionGate is what a connection to one of the broker's ports may do
// before it authenticates (transport.ServerConfig.Gate): with
// authorization on, AUTH and IDENTIFY only, within auth's default caps and
// deadlines (a gate per port, each with its own cap); off, no gate.
func admissionGate(authOn bool) transport.Gate {
	if !authOn {
		return nil
	}
	return auth.NewGate(auth.GateConfig{})
}
