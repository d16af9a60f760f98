package cli

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/auth"
)

// The metrics endpoint with authorization on (Metrics.Principals): every
// path but /healthz and /readyz (open, for probes: they say only "ok" or
// why not) needs a principal holding describe (or admin), named by a
// bearer token (`Authorization: Bearer <token>`) or else by a verified TLS
// client certificate whose CN is a principal's name, as on the other
// ports. No credentials, an unknown token or a certificate naming no
// principal: 401; a principal without describe: 403; a server that has
// not loaded its permission table yet: 503. A source that presented more
// than failedPerSecond unknown tokens in the current second is answered
// 429 without a look at its token, so one address guesses at most that
// many tokens a second here.

// Principals is who the server knows: the metaserver's table, or the
// broker's copy of it.
type Principals interface {
	// Authenticate returns the principal whose token is token (false:
	// none); an error when the server cannot tell yet.
	Authenticate(ctx context.Context, token string) (auth.Principal, bool, error)
	// LookupPrincipal returns the registry principal named name (a TLS
	// client certificate's name).
	LookupPrincipal(name string) (auth.Principal, bool, error)
}

// TablePrincipals is Principals read from a table (the metaserver's own:
// its ACL method).
type TablePrincipals func() *auth.Table

// Authenticate looks the token up in the table.
func (f TablePrincipals) Authenticate(_ context.Context, token string) (auth.Principal, bool, error) {
	p, ok := f().Authenticate(token)
	return p, ok, nil
}

// LookupPrincipal looks the name up in the table.
func (f TablePrincipals) LookupPrincipal(name string) (auth.Principal, bool, error) {
	p, ok := f().Lookup(name)
	return p, ok, nil
}

// failedPerSecond is how many unknown tokens one source may present to the
// HTTP endpoint in a second.
const failedPerSecond = 10

// guard lets a request through to next when its principal holds describe;
// without Principals, every request.
func (m *Metrics) guard(next http.Handler) http.Handler {
	if m.Principals == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status, msg := m.check(r)
		if status == http.StatusOK {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ferrymq"`)
		}
		w.WriteHeader(status)
		fmt.Fprintln(w, msg)
	})
}

// check returns http.StatusOK when r's principal may read the endpoint,
// else the status and why.
func (m *Metrics) check(r *http.Request) (int, string) {
	source, _, _ := net.SplitHostPort(r.RemoteAddr)
	var p auth.Principal
	var ok bool
	var err error
	switch h := r.Header.Get("Authorization"); {
	case h != "":
		scheme, token, _ := strings.Cut(h, " ")
		if !strings.EqualFold(scheme, "Bearer") || token == "" {
			return http.StatusUnauthorized, "the Authorization header must be: Bearer <token>"
		}
		if !m.limiter.allow(source, time.Now()) {
			return http.StatusTooManyRequests, "too many unknown tokens from this address; wait a second"
		}
		if len(token) <= auth.MaxTokenLen {
			p, ok, err = m.Principals.Authenticate(r.Context(), strings.TrimSpace(token))
		}
		if err == nil && !ok {
			m.limiter.failed(source, time.Now())
			return http.StatusUnauthorized, "token not recognised"
		}
	case r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0:
		name := r.TLS.VerifiedChains[0][0].Subject.CommonName
		if p, ok, err = m.Principals.LookupPrincipal(name); err == nil && !ok {
			return http.StatusUnauthorized, fmt.Sprintf("the TLS client certificate's name %q is not a principal", name)
		}
	default:
		return http.StatusUnauthorized, "authenticate: Authorization: Bearer <token>, or a TLS client certificate naming a principal"
	}
	if err != nil {
		return http.StatusServiceUnavailable, err.Error()
	}
	if !p.IsAdmin() && !p.Has(auth.Describe) {
		return http.StatusForbidden, fmt.Sprintf("principal %q lacks describe (GET %s)", p.Name, r.URL.Path)
	}
	return http.StatusOK, ""
}

// failLimiter counts unknown tokens by source within the current second.
type failLimiter struct {
	mu     sync.Mutex
	second time.Time
	counts map[string]int
}

// maxFailSources bounds the sources counted in a second; past it every
// source shares one count.
const maxFailSources = 4096

func (l *failLimiter) roll(now time.Time) {
	if sec := now.Truncate(time.Second); !sec.Equal(l.second) {
		l.second, l.counts = sec, map[string]int{}
	}
}

func (l *failLimiter) key(source string) string {
	if _, ok := l.counts[source]; !ok && len(l.counts) >= maxFailSources {
		return ""
	}
	return source
}

// allow reports whether source may present a token now.
func (l *failLimiter) allow(source string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.roll(now)
	return l.counts[l.key(source)] < failedPerSecond
}

// failed counts an unknown token from source.
func (l *failLimiter) failed(source string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.roll(now)
	l.counts[l.key(source)]++
}
