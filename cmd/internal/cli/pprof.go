package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/hashicorp/go-hclog"
)

// PprofHelp is the help of the servers' -pprof flag.
const PprofHelp = "debug: serve net/http/pprof (/debug/pprof/) on this address, its own listener (empty: off; it exposes profiles and stacks, so bind it to 127.0.0.1)"

// ServePprof serves the Go profiler's endpoints at addr under /debug/pprof/
// until the returned stop is called. An empty addr serves nothing. It has
// its own mux and listener: nothing of it shows on the metrics endpoint or
// http.DefaultServeMux.
func ServePprof(addr string, log hclog.Logger) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pprof listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("pprof server failed", "error", err)
		}
	}()
	log.Info("serving pprof", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx) // a profile being taken is cut short
		_ = srv.Close()
		<-done
	}, nil
}
