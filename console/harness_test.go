package console

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/broker"
	tc "github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testlog"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is a real in-process cluster (a metaserver, group g1 with a slave)
// and the console in front of it on an httptest server. With auth, the
// cluster has authorization on, an admin token and a cluster token.
type env struct {
	*tc.Cluster
	auth                 bool
	adminTok, clusterTok string
	admin                *client.Client // the admin's (authorization off: nobody's)
	clock                *clockwork.FakeClock
	con                  *Console
	srv                  *httptest.Server
}

// envOpts shape an env.
type envOpts struct {
	auth       bool
	hideBodies bool
	fakeClock  bool // the console's clock is a fake one (sessions, logins, rates)
	edit       func(*Config)
	broker     func(*broker.Config) // more settings for every broker
}

func startEnv(t testing.TB, o envOpts) *env {
	t.Helper()
	e := &env{auth: o.auth}
	if o.auth {
		e.adminTok, e.clusterTok = auth.NewToken(), auth.NewToken()
	}
	e.Cluster = tc.Start(t, tc.Opts{Groups: []string{"g1"}, Slaves: true,
		MetaEdit: func(c *metaserver.Config) {
			tc.SteadyMeta(c)
			if o.auth {
				c.ClusterToken = e.clusterTok
				c.Auth.Admin = auth.HashToken(e.adminTok)
			}
		},
		BrokerEdit: func(c *broker.Config) {
			tc.SteadyBroker(c)
			c.ClusterToken = e.clusterTok
			if o.broker != nil {
				o.broker(c)
			}
		},
	})
	var err error
	if e.admin, err = client.New(client.Config{Addrs: e.Meta.Addrs(), Token: e.adminTok}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.admin.Close() })
	cfg := Config{MetaAddrs: e.Meta.Addrs(), HideBodies: o.hideBodies, Logger: testlog.New("console")}
	if o.fakeClock {
		e.clock = clockwork.NewFakeClock()
		cfg.Clock = e.clock
	}
	if o.auth {
		_, node := e.Meta.Leader()
		cfg.Principals, cfg.ClusterToken, cfg.RaftSecret = node.ACL, e.clusterTok, tc.RaftSecret
	}
	if o.edit != nil {
		o.edit(&cfg)
	}
	if e.con, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(e.con)
	t.Cleanup(func() {
		e.srv.Close()
		_ = e.con.Close()
	})
	return e
}

// principal makes a principal with a fresh token and the permissions
// (as ferryctl acl add takes them), and returns the token.
func (e *env) principal(t *testing.T, name string, perms ...string) string {
	t.Helper()
	tok := auth.NewToken()
	if _, err := e.admin.SetPrincipal(context.Background(), api.ACLSetRequest{Name: name,
		TokenSHA256: auth.HashToken(tok).String(), Permissions: perms}); err != nil {
		t.Fatal(err)
	}
	return tok
}

// browser is an HTTP client with a cookie jar that does not follow
// redirects (tests look at them), and remembers the last page's CSRF token.
type browser struct {
	t    *testing.T
	e    *env
	hc   *http.Client
	csrf string
}

func (e *env) browser(t *testing.T) *browser {
	jar, _ := cookiejar.New(nil)
	b := &browser{t: t, e: e, hc: &http.Client{Jar: jar, Timeout: 20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	t.Cleanup(b.hc.CloseIdleConnections)
	return b
}

// page is an answer: its status, where it redirects, and its body.
type pageAnswer struct {
	status   int
	location string
	body     string
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func (b *browser) do(req *http.Request) pageAnswer {
	b.t.Helper()
	resp, err := b.hc.Do(req)
	if err != nil {
		b.t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	if m := csrfField.FindSubmatch(body); m != nil {
		b.csrf = string(m[1])
	}
	return pageAnswer{status: resp.StatusCode, location: resp.Header.Get("Location"), body: string(body)}
}

// get fetches a console path (with its query).
func (b *browser) get(path string) pageAnswer {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.e.srv.URL+path, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return b.do(req)
}

// post submits a form to a console path, with the CSRF token of the last
// page fetched unless the form has one, from the console's own origin.
func (b *browser) post(path string, form url.Values) pageAnswer {
	b.t.Helper()
	if form == nil {
		form = url.Values{}
	}
	if _, ok := form["csrf"]; !ok && b.csrf != "" {
		form.Set("csrf", b.csrf)
	}
	req, err := http.NewRequest(http.MethodPost, b.e.srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", b.e.srv.URL)
	return b.do(req)
}

// login logs in with token and fails the test unless it worked.
func (b *browser) login(token string) {
	b.t.Helper()
	a := b.post(Prefix+"login", url.Values{"token": {token}})
	if a.status != http.StatusSeeOther || a.location != Prefix {
		b.t.Fatalf("login: status %d to %q, want 303 to %s: %s", a.status, a.location, Prefix, a.body)
	}
}

// must fetches path and fails the test unless it answered 200.
func (b *browser) must(path string) string {
	b.t.Helper()
	a := b.get(path)
	if a.status != http.StatusOK {
		b.t.Fatalf("GET %s: status %d, want 200: %s", path, a.status, a.body)
	}
	return a.body
}
