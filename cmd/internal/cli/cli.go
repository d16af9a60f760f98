// Package cli holds what ferrymq's programs share: a config file under the
// flags, the root logger, and the Prometheus metrics endpoint.
package cli

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Exit codes of the servers.
const (
	ExitOK     = 0
	ExitError  = 1 // the server failed while running
	ExitConfig = 2 // a bad flag, config file or setting, a taken port, an unusable directory
)

// Version is the programs' version, set at build time with
// -ldflags "-X github.com/ferrymq/ferrymq/cmd/internal/cli.Version=v1.2.3";
// "devel" in a plain build.
var Version = "devel"

// VersionLine is what -version prints: the program, its version and the Go
// that built it.
func VersionLine(name string) string {
	return fmt.Sprintf("%s %s (%s %s/%s)", name, Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// ErrVersion is what Parse returns for -version: print VersionLine, exit 0.
var ErrVersion = errors.New("version asked")

// ConfigError marks an error in the settings (exit code 2).
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// Main runs a server program and exits: run gets the command line and a
// context that SIGINT or SIGTERM cancels; an error is printed under name.
// The process runs with Umask.
func Main(name string, run func(ctx context.Context, args []string, stderr io.Writer) error) {
	setUmask(Umask)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	if errors.Is(err, ErrVersion) {
		fmt.Println(VersionLine(name))
	} else if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	}
	os.Exit(ExitCode(err))
}

// ExitCode maps a Run error to the process exit code.
func ExitCode(err error) int {
	var ce *ConfigError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp), errors.Is(err, ErrVersion):
		return ExitOK
	case errors.As(err, &ce), errors.Is(err, syscall.EADDRINUSE), errors.Is(err, syscall.EADDRNOTAVAIL),
		errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EROFS):
		// A taken port or an unusable data directory is a setting to fix.
		return ExitConfig
	default:
		return ExitError
	}
}

// Parse parses args into fs, then fills every flag not given on the command
// line from the JSON object in the file named by the -config flag (keys are
// flag names; values strings, numbers or booleans).
func Parse(fs *flag.FlagSet, args []string) error {
	config := fs.String("config", "", "a JSON file of settings (keys are flag names); flags given on the command line win")
	version := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return &ConfigError{err}
	}
	if *version {
		return ErrVersion
	}
	if fs.NArg() > 0 {
		return &ConfigError{fmt.Errorf("unexpected arguments: %v", fs.Args())}
	}
	if *config == "" {
		return nil
	}
	b, err := os.ReadFile(*config)
	if err != nil {
		return &ConfigError{fmt.Errorf("read config file: %w", err)}
	}
	var values map[string]any
	if err := json.Unmarshal(b, &values); err != nil {
		return &ConfigError{fmt.Errorf("config file %s: %w", *config, err)}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for k, v := range values {
		if fs.Lookup(k) == nil || k == "config" || k == "version" {
			return &ConfigError{fmt.Errorf("config file %s: unknown setting %q", *config, k)}
		}
		if set[k] {
			continue
		}
		if err := fs.Set(k, fmt.Sprint(v)); err != nil {
			return &ConfigError{fmt.Errorf("config file %s: %s: %w", *config, k, err)}
		}
	}
	return nil
}

// LogFlags are the logging flags every server has.
type LogFlags struct {
	JSON  bool
	Level string
}

// Register adds -log-json and -log-level to fs.
func (l *LogFlags) Register(fs *flag.FlagSet) {
	fs.BoolVar(&l.JSON, "log-json", false, "write logs as JSON lines")
	fs.StringVar(&l.Level, "log-level", "info", "log level: trace, debug, info, warn or error")
}

// Logger builds the root logger.
func (l *LogFlags) Logger(name string, out io.Writer) (hclog.Logger, error) {
	level := hclog.LevelFromString(l.Level)
	if level == hclog.NoLevel {
		return nil, &ConfigError{fmt.Errorf("unknown log level %q", l.Level)}
	}
	return hclog.New(&hclog.LoggerOptions{Name: name, Level: level, JSONFormat: l.JSON, Output: out}), nil
}

// Metrics serves a registry (with the Go and process collectors added) on
// addr at /metrics until Close, and the health checks /healthz (liveness:
// Health's error, or 200) and /readyz (readiness: Ready's error, or 200);
// a nil check answers 200. An empty addr serves nothing. With TLS it serves
// HTTPS; with Principals (authorization on) every path but /healthz and
// /readyz, which stay open for probes, needs the describe permission
// (httpauth.go).
type Metrics struct {
	Registry *prometheus.Registry
	// Health says why the process should be restarted (nil: it is live).
	Health func() error
	// Ready says why the server cannot serve yet (nil: it can).
	Ready func() error
	// TLS, when set, is the server's own TLS config (the other ports'):
	// the endpoint serves HTTPS with its certificate, and verifies a
	// client certificate with its CA when one is presented (not required:
	// probes present none).
	TLS *tls.Config
	// Principals, when set, is who may read the endpoint (authorization
	// on): see httpauth.go.
	Principals Principals
	// Console, when set, is served under /console/ (and / leads there):
	// it checks its own sessions, so the describe guard is not in front
	// of it.
	Console http.Handler

	srv     *http.Server
	done    chan struct{}
	Addr    string
	limiter failLimiter
}

// NewMetrics makes the registry; Serve starts the endpoint.
func NewMetrics() *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &Metrics{Registry: reg}
}

// Serve listens on addr and serves /metrics in the background.
func (m *Metrics) Serve(addr string, log hclog.Logger) error {
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	m.Addr = ln.Addr().String()
	scheme := "http"
	if m.TLS != nil {
		ln = tls.NewListener(ln, httpTLS(m.TLS))
		scheme = "https"
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	open := http.NewServeMux()
	open.Handle("/healthz", checkHandler(m.Health))
	open.Handle("/readyz", checkHandler(m.Ready))
	open.Handle("/", m.guard(mux))
	if m.Console != nil {
		open.Handle("/console/", m.Console)
		open.Handle("GET /{$}", http.RedirectHandler("/console/", http.StatusSeeOther))
	}
	m.srv = &http.Server{Handler: open, ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug})}
	m.done = make(chan struct{})
	go func() {
		defer close(m.done)
		if err := m.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server failed", "error", err)
		}
	}()
	log.Info("serving metrics", "addr", m.Addr, "scheme", scheme, "describe-required", m.Principals != nil, "health", "/healthz /readyz")
	if m.Console != nil {
		log.Info("serving the console", "url", scheme+"://"+m.Addr+"/console/")
	}
	return nil
}

// httpTLS is the HTTP endpoint's TLS config from the server's: the same
// certificate and CA, a client certificate verified if given but not
// required (Kubernetes probes and a Prometheus with a bearer token present
// none), HTTP/1.1.
func httpTLS(server *tls.Config) *tls.Config {
	cfg := server.Clone()
	if cfg.ClientAuth == tls.RequireAndVerifyClientCert {
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	}
	cfg.NextProtos = []string{"http/1.1"}
	return cfg
}

// checkHandler answers 200 "ok" when check passes (or is nil), and 503 with
// the reason when it does not.
func checkHandler(check func() error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if check != nil {
			if err := check(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintln(w, err)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})
}

// Close stops the endpoint.
func (m *Metrics) Close() {
	if m.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = m.srv.Shutdown(ctx)
	<-m.done
}

// GaugeFunc registers a gauge read at scrape time.
func (m *Metrics) GaugeFunc(name, help string, f func() float64) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
}

// CounterFunc registers a counter read at scrape time.
func (m *Metrics) CounterFunc(name, help string, f func() float64) {
	m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f))
}
