package console

import (
	"container/list"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/metaserver/client"
)

// cookieName is the session cookie's name.
const cookieName = "ferrymq_console"

// maxSessions bounds the sessions kept: past it the least recently used
// one ends to make room. maxPerPrincipal bounds one principal's (with
// authorization on): past it that principal's least recently used session
// ends, so no principal's logins crowd out another's sessions.
const (
	maxSessions     = 10000
	maxPerPrincipal = 64
)

// session is a logged-in principal (with authorization off, a visitor).
// Its token is kept for its calls and never put in a page.
type session struct {
	id   string
	csrf string
	// principal is resolved again from the registry's table on every
	// request: a principal removed or given a new token is logged out.
	principal auth.Principal
	token     string // "": logged in by certificate, or authorization off
	byCert    bool
	meta      *client.Client // nil with authorization off (the console's)
	created   time.Time
	used      time.Time
	bucket    *bucket // shared by the copies each request gets (sessionOf)
	notes     *notes  // what a form did, for the page it leads to (shared too)
}

// notes hold what a session's forms did until the page after each shows
// it once: a page's notice comes from the form, never from its link.
type notes struct {
	mu sync.Mutex
	by map[string][]string
}

// maxNotes bounds the notes a session holds (forms whose next page was
// never opened); past it the notes start again.
const maxNotes = 16

// put keeps lines and returns the key the next page names them by.
func (n *notes) put(lines []string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.by == nil || len(n.by) >= maxNotes {
		n.by = map[string][]string{}
	}
	k := randomID()[:16]
	n.by[k] = lines
	return k
}

// take returns the lines kept under key, once.
func (n *notes) take(key string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	lines := n.by[key]
	delete(n.by, key)
	return lines
}

// sessions holds the live sessions by id, least recently used last, so
// that ending the expired ones and making room at the cap costs as much as
// the sessions that end.
type sessions struct {
	clock     clockwork.Clock
	idle, max time.Duration
	mu        sync.Mutex
	byID      map[string]*list.Element // of *session
	lru       *list.List               // front: the most recently used
	perName   map[string]int           // sessions per principal (capped when capped)
	capped    bool                     // maxPerPrincipal applies (authorization on)
}

func newSessions(clock clockwork.Clock, idle, max time.Duration) *sessions {
	return &sessions{clock: clock, idle: idle, max: max, byID: map[string]*list.Element{}, lru: list.New(), perName: map[string]int{}}
}

// randomID is 32 random bytes, URL-safe.
func randomID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// add makes a session for p and returns it.
func (ss *sessions) add(p auth.Principal, token string, byCert bool, meta *client.Client, rate float64) *session {
	now := ss.clock.Now()
	s := &session{id: randomID(), csrf: randomID(), principal: p, token: token, byCert: byCert, meta: meta,
		created: now, used: now, bucket: newBucket(rate, now), notes: &notes{}}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.capped && ss.perName[p.Name] >= maxPerPrincipal {
		for e := ss.lru.Back(); e != nil; e = e.Prev() {
			if o := e.Value.(*session); o.principal.Name == p.Name {
				ss.endLocked(o)
				break
			}
		}
	}
	for e := ss.lru.Back(); e != nil; e = ss.lru.Back() {
		if o := e.Value.(*session); ss.lru.Len() >= maxSessions || ss.expired(o, now) {
			ss.endLocked(o)
			continue
		}
		break
	}
	ss.byID[s.id] = ss.lru.PushFront(s)
	ss.perName[p.Name]++
	return s
}

// get returns a copy of the live session id names, marking it used.
func (ss *sessions) get(id string) (*session, bool) {
	now := ss.clock.Now()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	e, ok := ss.byID[id]
	if !ok {
		return nil, false
	}
	s := e.Value.(*session)
	if ss.expired(s, now) {
		ss.endLocked(s)
		return nil, false
	}
	s.used = now
	ss.lru.MoveToFront(e)
	mine := *s // the caller's copy: the session's other requests may be running
	return &mine, true
}

func (ss *sessions) expired(s *session, now time.Time) bool {
	return now.Sub(s.used) >= ss.idle || now.Sub(s.created) >= ss.max
}

// end ends the session.
func (ss *sessions) end(s *session) {
	ss.mu.Lock()
	ss.endLocked(s)
	ss.mu.Unlock()
}

func (ss *sessions) endLocked(s *session) {
	if e, ok := ss.byID[s.id]; ok {
		ss.lru.Remove(e)
		delete(ss.byID, s.id)
		if ss.perName[s.principal.Name]--; ss.perName[s.principal.Name] <= 0 {
			delete(ss.perName, s.principal.Name)
		}
	}
	if s.meta != nil {
		_ = s.meta.Close()
	}
}

func (ss *sessions) closeAll() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for ss.lru.Len() > 0 {
		ss.endLocked(ss.lru.Back().Value.(*session))
	}
}

// setCookie gives the browser the session's cookie.
func (c *Console) setCookie(w http.ResponseWriter, s *session) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: s.id, Path: Prefix, HttpOnly: true,
		Secure: c.cfg.Secure, SameSite: http.SameSiteStrictMode})
}

func (c *Console) clearCookie(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true,
		Secure: c.cfg.Secure, SameSite: http.SameSiteStrictMode})
}

// sessionOf returns the request's live session: a copy of it for this
// request alone, its principal read again from the registry's table. With authorization off a
// visitor without one gets one. Otherwise a request without one is sent to
// the login page (false: answered).
func (c *Console) sessionOf(w http.ResponseWriter, r *http.Request) (*session, bool) {
	ck, err := r.Cookie(cookieName)
	if err == nil {
		if s, ok := c.sessions.get(ck.Value); ok {
			if p, err := c.refresh(s); err == nil {
				s.principal = p // s is this request's copy
				return s, true
			}
			c.sessions.end(s)
		}
	}
	if !c.authOn() {
		s := c.sessions.add(auth.Principal{Name: "anyone"}, "", false, nil, c.cfg.RequestsPerSecond)
		c.setCookie(w, s)
		return s, true
	}
	if ck != nil {
		c.clearCookie(w) // a session that ended
	}
	next := r.URL.RequestURI()
	if r.Method != http.MethodGet || !strings.HasPrefix(next, Prefix) {
		next = Prefix
	}
	http.Redirect(w, r, Prefix+"login?next="+url.QueryEscape(next), http.StatusSeeOther)
	return nil, false
}

// refresh reads the session's principal again from the table: an error
// when it is gone or its token changed.
func (c *Console) refresh(s *session) (auth.Principal, error) {
	if !c.authOn() {
		return s.principal, nil
	}
	t := c.cfg.Principals()
	var p auth.Principal
	var ok bool
	if s.byCert {
		p, ok = t.Lookup(s.principal.Name)
	} else {
		p, ok = t.Authenticate(s.token)
	}
	if !ok || p.Name != s.principal.Name {
		return auth.Principal{}, errors.New("the principal was removed or its token changed")
	}
	return p, nil
}

// serveLogin shows the login form (GET) or logs in (POST): with a token,
// or with the TLS client certificate the connection presented.
func (c *Console) serveLogin(w http.ResponseWriter, r *http.Request) {
	if !c.authOn() {
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	view := loginView{Next: safeNext(r.FormValue("next")), CertName: certName(r)}
	if r.Method != http.MethodPost {
		c.renderLogin(w, http.StatusOK, view)
		return
	}
	if err := sameOrigin(r); err != nil {
		view.Error = err.Error()
		c.renderLogin(w, http.StatusForbidden, view)
		return
	}
	source, _, _ := net.SplitHostPort(r.RemoteAddr)
	now := c.cfg.Clock.Now()
	if wait := c.logins.wait(source, now); wait > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(int(wait.Seconds())+1))
		view.Error = fmt.Sprintf("too many failed logins from this address: try again in %s", wait.Round(time.Second))
		c.renderLogin(w, http.StatusTooManyRequests, view)
		return
	}
	s, err := c.login(r)
	if err != nil {
		c.logins.failed(source, now)
		c.cfg.Logger.Warn("console login failed", "source", source, "error", err)
		view.Error = err.Error()
		c.renderLogin(w, http.StatusUnauthorized, view)
		return
	}
	c.cfg.Logger.Info("console login", "principal", s.principal.Name, "source", source, "by-certificate", s.byCert)
	c.setCookie(w, s)
	http.Redirect(w, r, view.Next, http.StatusSeeOther)
}

// login makes a session from the login form.
func (c *Console) login(r *http.Request) (*session, error) {
	t := c.cfg.Principals()
	if r.PostFormValue("method") == "certificate" {
		name := certName(r)
		if name == "" {
			return nil, errors.New("this connection presented no verified TLS client certificate")
		}
		p, ok := t.Lookup(name)
		if !ok {
			return nil, fmt.Errorf("the TLS client certificate's name %q is not a principal", name)
		}
		if c.cfg.ClusterToken == "" || c.cfg.RaftSecret == "" {
			return nil, errors.New("certificate logins need the server's cluster token and raft secret (-auth-cluster-token-file, -raft-secret-file); log in with a token")
		}
		meta, err := c.actingClient(p.Name)
		if err != nil {
			return nil, err
		}
		return c.sessions.add(p, "", true, meta, c.cfg.RequestsPerSecond), nil
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	if token == "" || len(token) > auth.MaxTokenLen {
		return nil, errors.New("token not recognised")
	}
	p, ok := t.Authenticate(token)
	if !ok {
		return nil, errors.New("token not recognised")
	}
	meta, err := c.metaClient(token)
	if err != nil {
		return nil, err
	}
	return c.sessions.add(p, token, false, meta, c.cfg.RequestsPerSecond), nil
}

// certName is the name of the verified TLS client certificate r's
// connection presented ("": none).
func certName(r *http.Request) string {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return ""
	}
	return r.TLS.VerifiedChains[0][0].Subject.CommonName
}

// safeNext is where a login goes on to: a console path, nothing else (no
// other host, no scheme).
func safeNext(next string) string {
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || !strings.HasPrefix(u.Path, Prefix) || strings.Contains(next, "\\") ||
		strings.HasPrefix(u.Path, Prefix+"login") || strings.HasPrefix(u.Path, Prefix+"logout") {
		return Prefix
	}
	return u.RequestURI()
}

func (c *Console) serveLogout(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		http.Error(w, "log out with POST", http.StatusMethodNotAllowed)
		return
	}
	if ck, err := r.Cookie(cookieName); err == nil {
		if s, ok := c.sessions.get(ck.Value); ok {
			if err := c.checkForm(r, s); err != nil {
				http.Error(w, err.Error(), http.StatusForbidden)
				return
			}
			c.sessions.end(s)
		}
	}
	c.clearCookie(w)
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}

// checkForm checks a POST: it comes from the console's own origin and
// carries the session's CSRF token.
func (c *Console) checkForm(r *http.Request, s *session) error {
	if err := sameOrigin(r); err != nil {
		return err
	}
	got := r.PostFormValue("csrf")
	if subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) != 1 {
		return errors.New("the form's CSRF token is missing or stale: reload the page and submit it again")
	}
	return nil
}

// sameOrigin refuses a POST whose Origin (or, without one, Referer) names
// another host than the one it was sent to. A browser sends one of them
// with every cross-site form.
func sameOrigin(r *http.Request) error {
	from := r.Header.Get("Origin")
	if from == "null" {
		// A sandboxed frame or a redirect's: a browser's form from a page
		// that would not say where it is.
		return errors.New("a form from an opaque origin may not act on this console")
	}
	if from == "" {
		from = r.Header.Get("Referer")
	}
	if from == "" {
		return nil // not from a browser's cross-site form: the CSRF token decides
	}
	u, err := url.Parse(from)
	if err != nil || !strings.EqualFold(u.Host, r.Host) {
		return fmt.Errorf("a form from %q may not act on this console", from)
	}
	return nil
}

// loginThrottle makes a source that failed to log in wait: 1 s after its
// fifth failure, doubling to 5 minutes. A source's count is forgotten only
// once it has not failed for forgetAfter, not by a good login (whoever
// holds one valid token would otherwise guess others between its logins).
// An IPv6 source counts by its /64, what one host usually holds.
type loginThrottle struct {
	clock clockwork.Clock
	mu    sync.Mutex
	by    map[string]*failures
}

type failures struct {
	n     int
	until time.Time // the wait's end
	last  time.Time // the last failure
}

const (
	// maxThrottled bounds the sources remembered; past it the one that
	// failed longest ago makes room.
	maxThrottled = 4096
	// freeFailures is how many failed logins a source has before it waits.
	freeFailures = 5
	// forgetAfter is how long after its last failure a source's count goes.
	forgetAfter = 15 * time.Minute
)

func newLoginThrottle(clock clockwork.Clock) *loginThrottle {
	return &loginThrottle{clock: clock, by: map[string]*failures{}}
}

// sourceKey is whom a source's failures count against: its address, or
// its /64 for IPv6.
func sourceKey(source string) string {
	ip := net.ParseIP(source)
	if ip == nil || ip.To4() != nil {
		return source
	}
	return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// wait is how long source must still wait before its next login.
func (l *loginThrottle) wait(source string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, ok := l.by[sourceKey(source)]
	if !ok || !now.Before(f.until) {
		return 0
	}
	return f.until.Sub(now)
}

func (l *loginThrottle) failed(source string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := sourceKey(source)
	f, ok := l.by[key]
	if ok && now.Sub(f.last) >= forgetAfter {
		f.n = 0
	}
	if !ok {
		if len(l.by) >= maxThrottled {
			var oldest string
			for k, o := range l.by {
				if oldest == "" || o.last.Before(l.by[oldest].last) {
					oldest = k
				}
			}
			delete(l.by, oldest)
		}
		f = &failures{}
		l.by[key] = f
	}
	f.n++
	f.last = now
	if f.n >= freeFailures {
		d := time.Second << min(f.n-freeFailures, 9)
		f.until = now.Add(min(d, 5*time.Minute))
	}
}

// bucket is a token bucket: rate a second, a burst of twice as many.
type bucket struct {
	mu     sync.Mutex
	rate   float64
	tokens float64
	at     time.Time
}

func newBucket(rate float64, now time.Time) *bucket {
	return &bucket{rate: rate, tokens: 2 * rate, at: now}
}

// take takes one token if there is one.
func (b *bucket) take(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if d := now.Sub(b.at); d > 0 {
		b.tokens = min(2*b.rate, b.tokens+d.Seconds()*b.rate)
		b.at = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
