package console

import (
	"context"
	"crypto/tls"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
)

// Prefix is the path the console is served under.
const Prefix = "/console/"

// Config configures a Console.
type Config struct {
	// MetaAddrs are the metaserver RPC addresses the console calls, this
	// node's first. Required.
	MetaAddrs []string
	// TLS is the client TLS config for calls to metaservers and brokers
	// (nil: plaintext).
	TLS *tls.Config
	// Principals returns the registry's principal table (the metaserver's
	// ACL); nil when authorization is off: no login, every page open.
	Principals func() *auth.Table
	// ClusterToken is the servers' cluster token. A session logged in by a
	// TLS client certificate has no token of its own: the console checks
	// its permissions itself and calls with this one. Empty: certificate
	// logins are refused.
	ClusterToken string
	// RaftSecret is the metaservers' own secret: a certificate session's
	// requests name their principal with a proof made from it
	// (auth.ActorProof), which the metaservers take only with it. Empty:
	// certificate logins are refused.
	RaftSecret string
	// HideBodies shows no message body on any page, whatever the
	// principal may consume.
	HideBodies bool
	// SessionIdle ends a session unused this long (default 30 min);
	// SessionMax ends any session this long after its login (default 12 h).
	SessionIdle, SessionMax time.Duration
	// Secure says the console is served over HTTPS: its cookie gets the
	// Secure flag.
	Secure bool
	// RequestsPerSecond is how many requests a session may make a second,
	// with a burst of twice as many (default 10).
	RequestsPerSecond float64
	// Calls is how many calls to the cluster the console makes at once,
	// whatever the number of sessions (default 4): its work waits, the
	// cluster's does not.
	Calls int
	// CallTimeout bounds the calls one page makes (default 5 s).
	CallTimeout time.Duration
	Clock       clockwork.Clock
	Logger      hclog.Logger
}

func (c *Config) withDefaults() error {
	if len(c.MetaAddrs) == 0 {
		return errors.New("console: no metaserver addresses")
	}
	if c.SessionIdle <= 0 {
		c.SessionIdle = 30 * time.Minute
	}
	if c.SessionMax <= 0 {
		c.SessionMax = 12 * time.Hour
	}
	if c.RequestsPerSecond <= 0 {
		c.RequestsPerSecond = 10
	}
	if c.Calls <= 0 {
		c.Calls = 4
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = 5 * time.Second
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	return nil
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Console serves the pages. It is an http.Handler for Prefix.
type Console struct {
	cfg      Config
	pages    []*page
	byPath   map[string]*page
	tmpl     map[string]*template.Template
	static   http.Handler
	sessions *sessions
	logins   *loginThrottle
	calls    chan struct{} // a slot per call to the cluster under way
	anon     *client.Client
	// own is the console's client with the cluster token (authorization
	// on), which the charts' sampler calls with; nil without a token.
	own     *client.Client
	sampler *sampler // nil: no charts (authorization on, no cluster token)
}

// New builds the console; Close releases its sessions' connections.
func New(cfg Config) (*Console, error) {
	if err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, byPath: map[string]*page{}, calls: make(chan struct{}, cfg.Calls)}
	c.sessions = newSessions(cfg.Clock, cfg.SessionIdle, cfg.SessionMax)
	c.sessions.capped = cfg.Principals != nil
	c.logins = newLoginThrottle(cfg.Clock)
	for _, p := range allPages() {
		c.pages = append(c.pages, p)
		c.byPath[p.path] = p
	}
	if err := c.parseTemplates(); err != nil {
		return nil, err
	}
	sub, _ := fs.Sub(staticFS, "static")
	c.static = http.StripPrefix(Prefix+"static/", http.FileServer(http.FS(sub)))
	if cfg.Principals == nil {
		var err error
		if c.anon, err = c.metaClient(""); err != nil {
			return nil, err
		}
		c.sampler = startSampler(cfg, c.anon, "")
	} else if cfg.ClusterToken != "" {
		var err error
		if c.own, err = c.metaClient(cfg.ClusterToken); err != nil {
			return nil, err
		}
		c.sampler = startSampler(cfg, c.own, cfg.ClusterToken)
	}
	return c, nil
}

// Close ends every session and closes the console's connections.
func (c *Console) Close() error {
	if c.sampler != nil {
		c.sampler.stop()
	}
	c.sessions.closeAll()
	if c.own != nil {
		_ = c.own.Close()
	}
	if c.anon != nil {
		return c.anon.Close()
	}
	return nil
}

// metaClient is a metaserver client presenting token (none: "").
func (c *Console) metaClient(token string) (*client.Client, error) {
	cc := client.Config{Addrs: c.cfg.MetaAddrs, Token: token, CallTimeout: c.cfg.CallTimeout}
	cc.Transport.TLS = c.cfg.TLS
	return client.New(cc)
}

// authOn reports whether authorization is on.
func (c *Console) authOn() bool { return c.cfg.Principals != nil }

// ServeHTTP routes a request under Prefix.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	path, under := strings.CutPrefix(r.URL.Path, strings.TrimSuffix(Prefix, "/"))
	if !under || (path != "" && path[0] != '/') {
		http.NotFound(w, r)
		return
	}
	if !c.authOn() && !addressedByIP(r.Host) {
		// Open to anyone who reaches the port, it answers only a request
		// addressed to it by IP or as localhost: a web page whose name
		// was pointed at this address (DNS rebinding) gets nothing.
		http.Error(w, "with authorization off the console answers only requests to an IP address or localhost", http.StatusMisdirectedRequest)
		return
	}
	switch {
	case strings.HasPrefix(path, "/static/"):
		c.static.ServeHTTP(w, r)
		return
	case path == "/login":
		c.serveLogin(w, r)
		return
	case path == "/logout":
		c.serveLogout(w, r)
		return
	}
	s, ok := c.sessionOf(w, r)
	if !ok {
		return
	}
	if !s.bucket.take(c.cfg.Clock.Now()) {
		h.Set("Retry-After", "1")
		c.fail(w, r, s, http.StatusTooManyRequests, errors.New("too many requests from this session: wait a second"))
		return
	}
	if path == "" {
		path = "/"
	}
	p, ok := c.byPath[path]
	if !ok {
		c.fail(w, r, s, http.StatusNotFound, fmt.Errorf("no page %q", r.URL.Path))
		return
	}
	c.servePage(w, r, s, p)
}

// addressedByIP reports whether a request's Host names an IP address or
// localhost.
func addressedByIP(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	return net.ParseIP(host) != nil || strings.EqualFold(host, "localhost")
}

// page is one of the console's pages: GET shows it, POST (if act is set)
// runs its action.
type page struct {
	path  string // under Prefix, e.g. "/" or "/topics"
	title string // in the navigation ("": not there)
	// heading is the page's heading when it is not in the navigation (a
	// row's page: one topic, one consumer group).
	heading string
	// code is the request the page stands for: the navigation shows the
	// page to a principal it authorizes (for any topic), and a page is
	// refused to others before anything is asked (a page checks its
	// request's own target too).
	code protocol.Code
	tmpl string // the template file, without .html
	// get reads what the page shows.
	get func(q *query) (any, error)
	// brokers: the page calls brokers, with the session's own token; a
	// certificate session has none to give them (see certBrokers).
	brokers bool
	// act runs the page's form (POST), checked for CSRF first; it returns
	// where to go next (a console path with its query) or an error shown
	// on the page.
	act func(q *query) (string, error)
}

// query is one request to a page, with its session.
type query struct {
	c   *Console
	w   http.ResponseWriter
	r   *http.Request
	s   *session
	ctx context.Context
}

// allow returns nil if the session's principal may make a request of
// code naming target (always, with authorization off).
func (q *query) allow(code protocol.Code, target auth.Target) error {
	if !q.c.authOn() {
		return nil
	}
	return auth.Authorize(q.s.principal, code, target)
}

// noted keeps what a form did for the page it leads to and returns the
// query parameter naming it ("done=KEY"), which the page reads with notes.
func (q *query) noted(lines ...string) url.Values {
	return url.Values{"done": {q.s.notes.put(lines)}}
}

// notesOf is what the form that led to this page did (none: nil).
func (q *query) notesOf() []string { return q.s.notes.take(q.r.URL.Query().Get("done")) }

// routes is the metaserver client the session's route lookups go
// through: its own, or for a certificate session (whose client acts for
// its principal, which a route lookup cannot carry) the console's with the
// cluster token; the pages check the topic themselves first.
func (q *query) routes() *client.Client {
	if q.s.byCert && q.c.own != nil {
		return q.c.own
	}
	return q.meta()
}

// meta is the metaserver client the session calls with.
func (q *query) meta() *client.Client {
	if q.s.meta != nil {
		return q.s.meta
	}
	return q.c.anon
}

// slot takes one of the console's call slots until release; it fails when
// the page's time runs out first.
func (q *query) slot() (release func(), err error) {
	select {
	case q.c.calls <- struct{}{}:
		return func() { <-q.c.calls }, nil
	case <-q.ctx.Done():
		return nil, fmt.Errorf("the console is busy: %w", q.ctx.Err())
	}
}

func (c *Console) servePage(w http.ResponseWriter, r *http.Request, s *session, p *page) {
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.CallTimeout)
	defer cancel()
	q := &query{c: c, w: w, r: r, s: s, ctx: ctx}
	if err := q.allow(p.code, auth.Target{}); err != nil && !anyTopic(s, p.code) {
		c.fail(w, r, s, http.StatusForbidden, err)
		return
	}
	if p.brokers && s.byCert {
		c.fail(w, r, s, http.StatusForbidden, errCertBrokers)
		return
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
	case http.MethodPost:
		if p.act == nil {
			c.fail(w, r, s, http.StatusMethodNotAllowed, errors.New("this page has no form"))
			return
		}
		if err := c.checkForm(r, s); err != nil {
			c.fail(w, r, s, http.StatusForbidden, err)
			return
		}
		next, err := p.act(q)
		if err != nil {
			c.fail(w, r, s, statusOf(err), err)
			return
		}
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	default:
		w.Header().Set("Allow", "GET, HEAD, POST")
		c.fail(w, r, s, http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed", r.Method))
		return
	}
	data, err := p.get(q)
	if err != nil {
		c.fail(w, r, s, statusOf(err), err)
		return
	}
	c.render(w, s, http.StatusOK, p, data)
}

// errCertBrokers refuses a certificate session a page that calls the
// brokers: the console has no credential of the principal to present to
// them (a certificate's key stays in the browser), and a broker takes no
// request made for someone else.
var errCertBrokers = errors.New("this page reads from the brokers with your own credential, and a client certificate cannot be lent: log in with your token to see it")

// anyTopic reports whether the session's principal holds a permission
// that authorizes code for some topic (a consumer of one topic may see
// that topic's page).
func anyTopic(s *session, code protocol.Code) bool {
	for _, perm := range s.principal.Permissions {
		if perm.Topic == "" {
			continue
		}
		// A name the pattern matches: the pattern's prefix.
		t := auth.Target{Topics: []string{strings.TrimSuffix(string(perm.Topic), "*")},
			Group: strings.TrimSuffix(string(perm.Group), "*")}
		if auth.Authorize(s.principal, code, t) == nil {
			return true
		}
	}
	return false
}

// badInput is an error in what the browser sent: answered 400.
type badInput struct{ msg string }

func (e badInput) Error() string { return e.msg }

func bad(format string, args ...any) error { return badInput{fmt.Sprintf(format, args...)} }

// statusOf is the HTTP status for an error a page returns.
func statusOf(err error) int {
	var b badInput
	var pe *protocol.Error
	switch {
	case errors.As(err, &b):
		return http.StatusBadRequest
	case errors.As(err, &pe) && pe.Status == protocol.StatusNotAuthorized:
		return http.StatusForbidden
	case errors.As(err, &pe) && (pe.Status == protocol.StatusInvalid || pe.Status == protocol.StatusConflict):
		return http.StatusBadRequest
	case errors.As(err, &pe) && (pe.Status == protocol.StatusNoRoute || pe.Status == protocol.StatusNotFound):
		return http.StatusNotFound
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	default:
		return http.StatusBadGateway
	}
}
