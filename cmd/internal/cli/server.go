package cli

import (
	"flag"
	"io"

	"github.com/hashicorp/go-hclog"
)

// ServerFlags are the flags every server has besides its own: the log,
// TLS, authorization, the metrics endpoint (-metrics-addr) and the
// profiler (-pprof).
type ServerFlags struct {
	Log         LogFlags
	TLS         TLSFlags
	Auth        AuthFlags
	MetricsAddr string
	PprofAddr   string
}

// Register adds the flags to fs; with admin, the metaservers'
// -auth-admin-token-file too.
func (f *ServerFlags) Register(fs *flag.FlagSet, admin bool) {
	fs.StringVar(&f.MetricsAddr, "metrics-addr", "", "serve Prometheus metrics (/metrics) and the health checks (/healthz, /readyz) on this address (empty: off); HTTPS with -tls-cert, and with authorization on /metrics needs a describe principal's bearer token or client certificate")
	fs.StringVar(&f.PprofAddr, "pprof", "", PprofHelp)
	f.Log.Register(fs)
	f.TLS.Register(fs)
	f.Auth.Register(fs, admin)
}

// Logger builds the root logger named name and logs a warning for each
// token file others may read (AuthFlags.LogWarnings).
func (f *ServerFlags) Logger(name string, out io.Writer) (hclog.Logger, error) {
	lg, err := f.Log.Logger(name, out)
	if err != nil {
		return nil, err
	}
	f.Auth.LogWarnings(lg)
	return lg, nil
}

// Serve serves m on -metrics-addr and the profiler on -pprof until stop,
// which closes both. A listener that cannot start is a ConfigError.
func (f *ServerFlags) Serve(m *Metrics, log hclog.Logger) (stop func(), err error) {
	if err := m.Serve(f.MetricsAddr, log); err != nil {
		return nil, &ConfigError{Err: err}
	}
	stopPprof, err := ServePprof(f.PprofAddr, log)
	if err != nil {
		m.Close()
		return nil, &ConfigError{Err: err}
	}
	return func() {
		stopPprof()
		m.Close()
	}, nil
}
