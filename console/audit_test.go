package console

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
)

// The audit page as each kind of principal: describe (or admin) sees it;
// a consumer or a producer of a topic is refused before anything is asked;
// without a session, the login page.
func TestAuditPagePermissions(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	tokens := map[string]string{
		"admin":    e.adminTok,
		"describe": e.principal(t, "viewer", "describe"),
		"consume":  e.principal(t, "reader", "consume:orders:cg"),
		"produce":  e.principal(t, "app", "produce:orders"),
	}
	for _, tc := range []struct {
		who    string
		status int
	}{
		{"admin", http.StatusOK},
		{"describe", http.StatusOK},
		{"consume", http.StatusForbidden},
		{"produce", http.StatusForbidden},
		{"no session", http.StatusSeeOther},
	} {
		t.Run(tc.who, func(t *testing.T) {
			b := e.browser(t)
			if tok, ok := tokens[tc.who]; ok {
				b.login(tok)
			}
			a := b.get(Prefix + "audit")
			if a.status != tc.status {
				t.Fatalf("status %d, want %d:\n%s", a.status, tc.status, a.body)
			}
			switch {
			case a.status == http.StatusOK && !strings.Contains(a.body, `id="audit"`):
				t.Fatalf("no audit table:\n%s", a.body)
			case a.status == http.StatusForbidden && !strings.Contains(a.body, "lacks describe"):
				t.Fatalf("the refusal does not name describe:\n%s", a.body)
			case a.status == http.StatusSeeOther && !strings.HasPrefix(a.location, Prefix+"login"):
				t.Fatalf("redirected to %q, want the login page", a.location)
			}
			if nav := strings.Contains(a.body, `href="/console/audit"`); nav != (tc.status == http.StatusOK) {
				t.Fatalf("the navigation links the audit page: %v", nav)
			}
		})
	}
}

// The page shows the changes made, newest first, filtered by principal
// and kind, a page at a time.
func TestAuditPageShowsChanges(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	ctx := context.Background()
	viewer := e.principal(t, "viewer", "describe")
	for _, name := range []string{"audit-one", "audit-two"} {
		if _, err := e.admin.CreateTopic(ctx, api.CreateTopicRequest{Name: name, Queues: 1}); err != nil {
			t.Fatal(err)
		}
	}
	b := e.browser(t)
	b.login(viewer)
	body := b.must(Prefix + "audit?kind=create-topic&principal=admin&size=1")
	rows := strings.Count(body, "<tr><td>")
	if rows != 1 || !strings.Contains(body, "audit-two") || strings.Contains(body, "audit-one") || !strings.Contains(body, "applied") {
		t.Fatalf("first page (%d rows):\n%s", rows, body)
	}
	older := olderLink(t, body)
	body = b.must(older)
	if !strings.Contains(body, "audit-one") || strings.Contains(body, "audit-two") || !strings.Contains(body, `rel="first"`) {
		t.Fatalf("second page:\n%s", body)
	}
	if body := b.must(Prefix + "audit?principal=nobody"); !strings.Contains(body, "no records") {
		t.Fatalf("a principal with no records:\n%s", body)
	}
	// The principals the admin set are there, without their tokens' hashes.
	body = b.must(Prefix + "audit?kind=set-principal")
	if !strings.Contains(body, "viewer") || strings.Contains(body, tokenHashOf(viewer)) {
		t.Fatalf("set-principal records:\n%s", body)
	}
}

func olderLink(t *testing.T, body string) string {
	t.Helper()
	i := strings.Index(body, `rel="next"`)
	j := strings.LastIndex(body[:max(i, 0)], `href="`)
	if i < 0 || j < 0 {
		t.Fatalf("no link to older records:\n%s", body)
	}
	href := body[j+len(`href="`):]
	href = href[:strings.Index(href, `"`)]
	return strings.ReplaceAll(href, "&amp;", "&")
}

// Hostile query parameters are a 400 with a message, or are shown
// escaped; never a 500.
func TestAuditPageHostileInput(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	b := e.browser(t)
	b.login(e.adminTok)
	long := strings.Repeat("x", 300)
	for _, tc := range []struct {
		query  string
		status int
	}{
		{"size=0", http.StatusBadRequest},
		{"size=501", http.StatusBadRequest},
		{"size=abc", http.StatusBadRequest},
		{"size=99999999999999999999999", http.StatusBadRequest},
		{"below=-1", http.StatusBadRequest},
		{"below=0", http.StatusBadRequest},
		{"below=abc", http.StatusBadRequest},
		{"below=99999999999999999999999", http.StatusBadRequest},
		{"below=18446744073709551615", http.StatusOK},
		{"kind=" + url.QueryEscape("<script>alert(1)</script>"), http.StatusBadRequest},
		{"kind=no-such-kind", http.StatusBadRequest},
		{"kind=" + long, http.StatusBadRequest},
		{"principal=" + long, http.StatusBadRequest},
		{"principal=%ff%fe", http.StatusBadRequest},
		{"principal=" + url.QueryEscape("<script>alert(1)</script>"), http.StatusOK},
	} {
		a := b.get(Prefix + "audit?" + tc.query)
		if a.status != tc.status {
			t.Errorf("%.60s: status %d, want %d:\n%.300s", tc.query, a.status, tc.status, a.body)
		}
		if strings.Contains(a.body, "<script>") {
			t.Errorf("%.60s: the page holds an unescaped <script>", tc.query)
		}
	}
}

// A certificate session calls with the cluster's token and names its
// principal: the metaserver refuses it what the principal may not do, and
// the audit record of what it does names the principal.
func TestCertificateSessionActsAsItsPrincipal(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	ctx := context.Background()
	e.principal(t, "alice", "describe")
	e.principal(t, "bob", "admin")
	certSession := func(name string) *session {
		r := httptest.NewRequest(http.MethodPost, Prefix+"login", strings.NewReader("method=certificate"))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{{Subject: pkix.Name{CommonName: name}}}}}
		s, err := e.con.login(r)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	alice := certSession("alice")
	_, err := alice.meta.CreateTopic(ctx, api.CreateTopicRequest{Name: "by-alice", Queues: 1})
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Status != protocol.StatusNotAuthorized || !strings.Contains(pe.Message, `"alice"`) {
		t.Fatalf("alice (describe) creating a topic through the console's cluster token: %v, want NOT_AUTHORIZED naming alice", err)
	}
	if _, err := certSession("bob").meta.CreateTopic(ctx, api.CreateTopicRequest{Name: "by-bob", Queues: 1}); err != nil {
		t.Fatal(err)
	}
	b := e.browser(t)
	b.login(e.adminTok)
	body := b.must(Prefix + "audit?kind=create-topic&size=1")
	if !strings.Contains(body, "bob (console)") || !strings.Contains(body, "by-bob") {
		t.Fatalf("the record of bob's topic:\n%s", body)
	}

	// The pages that read from the brokers need the principal's own token:
	// a certificate session is refused them, and its navigation omits them.
	cb := e.browser(t)
	u, _ := url.Parse(e.srv.URL + Prefix)
	cb.hc.Jar.SetCookies(u, []*http.Cookie{{Name: cookieName, Value: certSession("bob").id, Path: Prefix}})
	overview := cb.must(Prefix)
	for _, p := range []string{"messages", "deadletters", "delayed", "txns"} {
		if strings.Contains(overview, `href="`+Prefix+p+`"`) {
			t.Errorf("a certificate session's navigation links %s", p)
		}
		if a := cb.get(Prefix + p); a.status != http.StatusForbidden || !strings.Contains(a.body, "log in with your token") {
			t.Errorf("%s for a certificate session: status %d, want 403 saying to log in with a token", p, a.status)
		}
	}
}

func tokenHashOf(token string) string { return auth.HashToken(token).String() }

// With authorization off anyone sees the page; the changes have no
// principal.
func TestAuditPageAuthorizationOff(t *testing.T) {
	e := startEnv(t, envOpts{})
	if _, err := e.admin.CreateTopic(context.Background(), api.CreateTopicRequest{Name: "open-topic", Queues: 1}); err != nil {
		t.Fatal(err)
	}
	body := e.browser(t).must(Prefix + "audit?kind=create-topic")
	if !strings.Contains(body, "open-topic") || !strings.Contains(body, "<td>-</td>") {
		t.Fatalf("the audit page with authorization off:\n%s", body)
	}
}
