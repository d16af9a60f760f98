package metaserverd

import (
	"flag"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/cmd/internal/cli"
	"github.com/ferrymq/ferrymq/console"
	"github.com/ferrymq/ferrymq/metaserver"
)

// consoleFlags are the web console's flags.
type consoleFlags struct {
	on         bool
	bodies     bool
	idle       time.Duration
	perSession float64
}

func (f *consoleFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.on, "console", true, "serve the web console under /console/ on -metrics-addr (false: off)")
	fs.BoolVar(&f.bodies, "console-bodies", true, "show message bodies in the console to principals who may consume them (false: to nobody)")
	fs.DurationVar(&f.idle, "console-session", 30*time.Minute, "a console session unused this long ends (1m to 24h; any session ends 12h after its login)")
	fs.Float64Var(&f.perSession, "console-rate", 10, "requests a console session may make a second (a burst of twice as many; 1 to 1000)")
}

// console builds the console for node s, or nil when it is off or there is
// no HTTP endpoint to serve it on.
func (f *consoleFlags) console(cfg metaserver.Config, s *metaserver.Server, httpAddr string) (*console.Console, error) {
	if !f.on || httpAddr == "" {
		return nil, nil
	}
	if f.idle < time.Minute || f.idle > 24*time.Hour {
		return nil, &cli.ConfigError{Err: fmt.Errorf("-console-session must be from 1m to 24h, got %v", f.idle)}
	}
	if !(f.perSession >= 1 && f.perSession <= 1000) {
		return nil, &cli.ConfigError{Err: fmt.Errorf("-console-rate must be from 1 to 1000, got %v", f.perSession)}
	}
	addrs := []string{s.RPCAddr()}
	for _, p := range cfg.Peers {
		if p.ID != cfg.ID {
			addrs = append(addrs, p.RPCAddr)
		}
	}
	cc := console.Config{MetaAddrs: addrs, TLS: cfg.TLSClient, HideBodies: !f.bodies, SessionIdle: f.idle,
		Secure: cfg.TLSServer != nil, RequestsPerSecond: f.perSession, Logger: cfg.Logger.Named("console")}
	if cfg.AuthEnabled() {
		cc.Principals = s.ACL
		cc.ClusterToken, cc.RaftSecret = cfg.ClusterToken, cfg.RaftSecret
	}
	return console.New(cc)
}
