package console

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/jonboulle/clockwork"
)

// A visitor without a session is sent to the login page; a wrong token is
// refused; the right one opens the overview, which shows the cluster; a
// principal without describe may log in but not see the overview.
func TestLoginAndOverview(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	viewer := e.principal(t, "viewer", "describe")
	app := e.principal(t, "app", "produce:orders")

	b := e.browser(t)
	a := b.get(Prefix)
	if a.status != http.StatusSeeOther || !strings.HasPrefix(a.location, Prefix+"login?next=") {
		t.Fatalf("no session: status %d to %q, want a redirect to the login page", a.status, a.location)
	}
	b.must(Prefix + "login")
	if a := b.post(Prefix+"login", url.Values{"token": {"not-a-token-of-anyone-000000000000000"}}); a.status != http.StatusUnauthorized {
		t.Fatalf("a wrong token: status %d, want 401", a.status)
	}
	b.login(viewer)
	body := b.must(Prefix)
	for _, want := range []string{`id="principal">viewer<`, `>g1</a>`, `id="meta-leader"`} {
		if !strings.Contains(body, want) {
			t.Fatalf("the overview lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, viewer) {
		t.Fatal("the page holds the principal's token")
	}

	b2 := e.browser(t)
	b2.login(app)
	if a := b2.get(Prefix); a.status != http.StatusForbidden || !strings.Contains(a.body, "lacks describe") {
		t.Fatalf("a principal without describe: status %d, want 403 naming describe:\n%s", a.status, a.body)
	}
}

// A source that keeps giving wrong tokens waits, longer each time; the
// right token is refused while it waits, and accepted after.
func TestLoginThrottled(t *testing.T) {
	e := startEnv(t, envOpts{auth: true, fakeClock: true})
	good := e.principal(t, "viewer", "describe")
	b := e.browser(t)
	wrong := url.Values{"token": {"wrong-token-0000000000000000000000000000"}}
	for i := range freeFailures {
		if a := b.post(Prefix+"login", wrong); a.status != http.StatusUnauthorized {
			t.Fatalf("failure %d: status %d, want 401", i+1, a.status)
		}
	}
	a := b.post(Prefix+"login", url.Values{"token": {good}})
	if a.status != http.StatusTooManyRequests {
		t.Fatalf("after %d failures: status %d, want 429", freeFailures, a.status)
	}
	e.clock.Advance(time.Second)
	if a := b.post(Prefix+"login", wrong); a.status != http.StatusUnauthorized {
		t.Fatalf("after the wait: status %d, want 401", a.status)
	}
	if a := b.post(Prefix+"login", url.Values{"token": {good}}); a.status != http.StatusTooManyRequests {
		t.Fatalf("after another failure: status %d, want 429 (the wait doubled)", a.status)
	}
	e.clock.Advance(2 * time.Second)
	b.login(good)
}

// A session ends after its idle time; a principal removed or given a new
// token is logged out at its next request.
func TestSessionEnds(t *testing.T) {
	e := startEnv(t, envOpts{auth: true, fakeClock: true})
	tok := e.principal(t, "viewer", "describe")
	b := e.browser(t)
	b.login(tok)
	b.must(Prefix)
	e.clock.Advance(29 * time.Minute)
	b.must(Prefix)
	e.clock.Advance(30 * time.Minute)
	if a := b.get(Prefix); a.status != http.StatusSeeOther {
		t.Fatalf("after 30 idle minutes: status %d, want a redirect to the login page", a.status)
	}

	b.login(tok)
	b.must(Prefix)
	e.principal(t, "viewer", "describe") // a new token
	if a := b.get(Prefix); a.status != http.StatusSeeOther {
		t.Fatalf("after the principal's token changed: status %d, want a redirect to the login page", a.status)
	}
}

// A POST without the session's CSRF token, or from another origin, does
// nothing.
func TestFormsNeedTheirToken(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	tok := e.principal(t, "viewer", "describe")
	b := e.browser(t)
	b.login(tok)
	b.must(Prefix)
	if a := b.post(Prefix+"logout", url.Values{"csrf": {"forged"}}); a.status != http.StatusForbidden {
		t.Fatalf("logout with a forged token: status %d, want 403", a.status)
	}
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+Prefix+"logout", strings.NewReader(url.Values{"csrf": {b.csrf}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	if a := b.do(req); a.status != http.StatusForbidden {
		t.Fatalf("logout from another origin: status %d, want 403", a.status)
	}
	b.must(Prefix) // still logged in
	if a := b.post(Prefix+"logout", nil); a.status != http.StatusSeeOther {
		t.Fatalf("logout: status %d, want 303", a.status)
	}
	if a := b.get(Prefix); a.status != http.StatusSeeOther {
		t.Fatalf("after logout: status %d, want a redirect to the login page", a.status)
	}
}

// With authorization off there is no login: the overview is open, and says
// authorization is off.
func TestAuthorizationOff(t *testing.T) {
	e := startEnv(t, envOpts{})
	b := e.browser(t)
	body := b.must(Prefix)
	if !strings.Contains(body, "authorization off") || !strings.Contains(body, ">g1</a>") {
		t.Fatalf("the overview with authorization off:\n%s", body)
	}
	if a := b.get(Prefix + "login"); a.status != http.StatusSeeOther {
		t.Fatalf("the login page with authorization off: status %d, want a redirect", a.status)
	}
}

// A session's requests are limited to the configured rate.
func TestSessionRateLimited(t *testing.T) {
	e := startEnv(t, envOpts{fakeClock: true, edit: func(c *Config) { c.RequestsPerSecond = 1 }})
	b := e.browser(t)
	b.must(Prefix)
	b.must(Prefix)
	if a := b.get(Prefix); a.status != http.StatusTooManyRequests {
		t.Fatalf("the third request at once at 1 a second (burst 2): status %d, want 429", a.status)
	}
	e.clock.Advance(time.Second)
	b.must(Prefix)
}

// The login page sends on only to a console path.
func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"/console/topics?page=2": "/console/topics?page=2",
		"https://evil.example/":  Prefix,
		"//evil.example/x":       Prefix,
		"/\\evil.example":        Prefix,
		"/other":                 Prefix,
		"/console/logout":        Prefix,
		"":                       Prefix,
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

// A request outside the console's path (a browser's /favicon.ico) neither
// answers with a page nor ends the session whose cookie it did not carry.
func TestOutsideThePrefixLeavesTheSession(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	tok := e.principal(t, "viewer", "describe")
	b := e.browser(t)
	b.login(tok)
	if a := b.get("/favicon.ico"); a.status != http.StatusNotFound {
		t.Fatalf("/favicon.ico: status %d, want 404", a.status)
	}
	b.must(Prefix)
}

// At the cap a new session ends the least recently used one; expired
// sessions end when the next one is made.
func TestSessionsCapAndExpiry(t *testing.T) {
	clock := clockwork.NewFakeClock()
	ss := newSessions(clock, time.Minute, time.Hour)
	first := ss.add(auth.Principal{Name: "first"}, "", false, nil, 1)
	second := ss.add(auth.Principal{Name: "second"}, "", false, nil, 1)
	for range maxSessions - 2 {
		ss.add(auth.Principal{Name: "filler"}, "", false, nil, 1)
	}
	if _, ok := ss.get(first.id); !ok { // used: now the most recent
		t.Fatal("the first session ended before the cap")
	}
	ss.add(auth.Principal{Name: "over"}, "", false, nil, 1)
	if _, ok := ss.get(second.id); ok {
		t.Fatal("at the cap the least recently used session did not end")
	}
	if _, ok := ss.get(first.id); !ok {
		t.Fatal("at the cap a recently used session ended")
	}
	clock.Advance(time.Minute)
	ss.add(auth.Principal{Name: "later"}, "", false, nil, 1)
	if n := len(ss.byID); n != 1 {
		t.Fatalf("after the idle time a new session leaves %d sessions, want 1 (the expired ones end)", n)
	}
}
