package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/routing"
)

// kindBrowsers logs in one browser per permission kind the console's
// pages are tested as: admin, describe, consume on topic as group, produce
// only (on topic), and none (no session). The principals are made here.
func kindBrowsers(t *testing.T, e *env, topic, group string) map[string]*browser {
	t.Helper()
	toks := map[string]string{
		"admin":    e.adminTok,
		"describe": e.principal(t, "viewer", "describe"),
		"consume":  e.principal(t, "reader", "consume:"+topic+":"+group),
		"produce":  e.principal(t, "writer", "produce:"+topic),
	}
	out := map[string]*browser{"none": e.browser(t)}
	for kind, tok := range toks {
		b := e.browser(t)
		b.login(tok)
		out[kind] = b
	}
	return out
}

// certBrowser is a browser logged in as principal name the way a TLS
// client certificate logs in: the session has no token of its own and
// calls the cluster with the cluster token, so the console's own
// permission checks are the only ones that stand for the principal.
func certBrowser(t *testing.T, e *env, name string) *browser {
	t.Helper()
	p, ok := e.con.cfg.Principals().Lookup(name)
	if !ok {
		t.Fatalf("no principal %s", name)
	}
	meta, err := e.con.metaClient(e.clusterTok)
	if err != nil {
		t.Fatal(err)
	}
	s := e.con.sessions.add(p, "", true, meta, e.con.cfg.RequestsPerSecond)
	b := e.browser(t)
	u, _ := url.Parse(e.srv.URL + Prefix)
	b.hc.Jar.SetCookies(u, []*http.Cookie{{Name: cookieName, Value: s.id, Path: Prefix}})
	return b
}

// wantStatus fetches path as each kind and checks the status (a missing
// session: a redirect to the login page).
func wantStatus(t *testing.T, bs map[string]*browser, path string, want map[string]int) {
	t.Helper()
	for kind, status := range want {
		a := bs[kind].get(path)
		if a.status != status {
			t.Errorf("GET %s as %s: status %d, want %d\n%s", path, kind, a.status, status, a.body)
		}
		if kind == "none" && (a.status != http.StatusSeeOther || !strings.HasPrefix(a.location, Prefix+"login")) {
			t.Errorf("GET %s with no session: %d to %q, want a redirect to the login page", path, a.status, a.location)
		}
	}
}

// unlimited lifts the sessions' rate for tests that make many requests.
func unlimited(c *Config) { c.RequestsPerSecond = 1e6 }

// hostile are values every query parameter and form field is tried with:
// each must come back a 400 or a page that shows it escaped.
var hostile = []string{"-1", "99999999999999999999", "0x10", "<script>alert(1)</script>", strings.Repeat("x", 300), "a\x00b", "\xff\xfe", "%00", "../../etc"}

// noRawScript fails when the answer holds a hostile value unescaped.
func noRawScript(t *testing.T, what string, a pageAnswer) {
	t.Helper()
	if a.status >= 500 {
		t.Errorf("%s: status %d: %s", what, a.status, a.body)
	}
	if strings.Contains(a.body, "<script>alert") {
		t.Errorf("%s: the page holds <script> unescaped:\n%s", what, a.body)
	}
}

// hostilePaging requests page with each hostile value in each paging
// parameter (page, size, q), besides fixed, and checks each answer with
// noRawScript.
func hostilePaging(t *testing.T, b *browser, page string, fixed url.Values, v string) {
	t.Helper()
	for _, param := range []string{"page", "size", "q"} {
		q := url.Values{param: {v}}
		for k, vs := range fixed {
			q[k] = vs
		}
		noRawScript(t, page+"?"+param+"="+v, b.get(Prefix+page+"?"+q.Encode()))
	}
}

// The broker groups page is shown to who may describe (admin, describe)
// and refused to others; it shows group g1's members, sync set and epochs;
// one group alone with ?group=.
func TestGroupsPageAsEachKind(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	bs := kindBrowsers(t, e, "orders", "billing")
	for _, path := range []string{Prefix + "groups", Prefix + "groups?group=g1"} {
		wantStatus(t, bs, path, map[string]int{"admin": 200, "describe": 200, "consume": 403, "produce": 403, "none": 303})
	}
	body := bs["describe"].must(Prefix + "groups?group=g1")
	gi := groupInfo(t, e, "g1")
	for _, want := range []string{`id="group-g1"`, ">" + gi.Master.ID + "<", gi.Master.Addr, `class="members"`, `class="slaves"`,
		`class="epochs"`, "min in-sync", `class="holders">` + strconv.Itoa(gi.Holders) + "<"} {
		if !strings.Contains(body, want) {
			t.Errorf("the group's page lacks %q:\n%s", want, body)
		}
	}
	for _, m := range gi.Members {
		if !strings.Contains(body, ">"+m.ID+"<") {
			t.Errorf("the group's page does not name member %s", m.ID)
		}
	}
	if strings.Contains(body, `id="mode-g1"`) {
		t.Error("a describer is offered the read-only form")
	}
	if !strings.Contains(bs["admin"].must(Prefix+"groups"), `id="mode-g1"`) {
		t.Error("admin is not offered the read-only form")
	}
}

func groupInfo(t *testing.T, e *env, name string) api.GroupInfo {
	t.Helper()
	groups, err := e.admin.Groups(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		if g.Name == name {
			return g
		}
	}
	t.Fatalf("no group %s", name)
	return api.GroupInfo{}
}

// Marking a group read-only from the page is the registry's admin mark
// (the group turns RO with reason admin) and marking it writable clears
// it; a describer's form is refused and changes nothing.
func TestGroupsSetReadOnly(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	bs := kindBrowsers(t, e, "orders", "billing")
	viewer := bs["describe"]
	viewer.must(Prefix + "groups")
	if a := viewer.post(Prefix+"groups", url.Values{"group": {"g1"}, "mode": {"readonly"}}); a.status != http.StatusForbidden {
		t.Fatalf("a describer marking g1 read-only: status %d, want 403", a.status)
	}
	// A certificate session calls with the cluster token: the console's
	// own check refuses it, naming the principal (not the cluster).
	e.principal(t, "certviewer", "describe")
	cb := certBrowser(t, e, "certviewer")
	cb.get(Prefix + "groups")
	if a := cb.post(Prefix+"groups", url.Values{"group": {"g1"}, "mode": {"readonly"}}); a.status != http.StatusForbidden ||
		!strings.Contains(a.body, `principal &#34;certviewer&#34; lacks admin`) {
		t.Fatalf("a describer's certificate session marking g1 read-only: status %d, want 403 naming it:\n%s", a.status, a.body)
	}
	if g := groupInfo(t, e, "g1"); g.State != "RW" {
		t.Fatalf("after a refused form g1 is %s (%s)", g.State, g.Reason)
	}
	admin := bs["admin"]
	admin.must(Prefix + "groups")
	a := admin.post(Prefix+"groups", url.Values{"group": {"g1"}, "mode": {"readonly"}})
	if a.status != http.StatusSeeOther || a.location != Prefix+"groups?group=g1" {
		t.Fatalf("marking g1 read-only: status %d to %q:\n%s", a.status, a.location, a.body)
	}
	if g := groupInfo(t, e, "g1"); g.State != "RO" || !strings.Contains(g.Reason, "admin") {
		t.Fatalf("after marking read-only g1 is %s (%s)", g.State, g.Reason)
	}
	body := admin.must(a.location)
	if !strings.Contains(body, `class="reason">admin<`) || !strings.Contains(body, `name="mode" value="writable"`) {
		t.Fatalf("the page of a group marked read-only:\n%s", body)
	}
	if a := admin.post(Prefix+"groups", url.Values{"group": {"g1"}, "mode": {"writable"}}); a.status != http.StatusSeeOther {
		t.Fatalf("marking g1 writable: status %d:\n%s", a.status, a.body)
	}
	if g := groupInfo(t, e, "g1"); g.Reasons&routing.Admin != 0 || strings.Contains(g.Reason, "admin") {
		t.Fatalf("after marking writable g1 is %s (%s)", g.State, g.Reason)
	}
}

// Hostile input in the page's parameters and its form's fields is a 400
// (or shown escaped), never a 500; an unknown group is a 400 naming it.
func TestGroupsHostileInput(t *testing.T) {
	e := startEnv(t, envOpts{auth: true, edit: unlimited})
	admin := e.browser(t)
	admin.login(e.adminTok)
	admin.must(Prefix + "groups")
	for _, v := range hostile {
		for _, param := range []string{"group", "page", "size", "q"} {
			a := admin.get(Prefix + "groups?" + url.Values{param: {v}}.Encode())
			noRawScript(t, "groups?"+param+"="+v, a)
		}
		for _, field := range []string{"group", "mode"} {
			form := url.Values{"group": {"g1"}, "mode": {"readonly"}}
			form.Set(field, v)
			a := admin.post(Prefix+"groups", form)
			noRawScript(t, "POST groups "+field+"="+v, a)
			if a.status != http.StatusBadRequest {
				t.Errorf("POST groups %s=%q: status %d, want 400", field, v, a.status)
			}
		}
	}
	if a := admin.get(Prefix + "groups?group=nope"); a.status != http.StatusBadRequest || !strings.Contains(a.body, "no broker group &#34;nope&#34;") {
		t.Errorf("an unknown group: status %d:\n%s", a.status, a.body)
	}
	if g := groupInfo(t, e, "g1"); g.State != "RW" {
		t.Fatalf("hostile forms changed g1: %s (%s)", g.State, g.Reason)
	}
}

// With authorization off every page is open, as the wire is, and its forms
// work without a login.
func TestPagesAuthorizationOff(t *testing.T) {
	e := startEnv(t, envOpts{edit: unlimited})
	billingSetup(t, e, false)
	b := e.browser(t)
	for _, path := range []string{"groups", "groups?group=g1", "topics", "topic?name=orders", "consumers", "consumer?group=billing",
		"consumer?group=billing&reset=orders", "consumer?group=billing&reset=orders&preview=1&to=latest"} {
		body := b.must(Prefix + path)
		if strings.Contains(body, "lacks") {
			t.Errorf("%s with authorization off says a permission lacks:\n%s", path, body)
		}
	}
	if a := b.get(Prefix + "principals"); a.status != http.StatusOK {
		t.Errorf("principals with authorization off: status %d", a.status)
	}
	if a := b.post(Prefix+"topics", url.Values{"name": {"made"}, "queues": {"1"}}); a.status != http.StatusSeeOther {
		t.Fatalf("create with authorization off: status %d:\n%s", a.status, a.body)
	}
}

// The broker groups page shows how much log the master holds on disk and
// its retention, from the master's heartbeats.
func TestGroupsPageShowsDiskAndRetention(t *testing.T) {
	e := startEnv(t, envOpts{broker: func(c *broker.Config) { c.RetentionBytes = 3 << 20 }})
	makeTopic(t, e, "orders", 1)
	end := sendTo(t, e, "orders", 0, 5)
	testwait.For(t, 10*time.Second, "the master's heartbeat with the log end", func() bool {
		return groupInfo(t, e, "g1").Last.LogEnd >= end
	})
	g := groupInfo(t, e, "g1")
	body := e.browser(t).must(Prefix + "groups?group=g1")
	want := fmt.Sprintf(`class="disk">%s (offsets 0 to %d); retention the last 3.0 MiB`, fmtBytes(g.Last.LogEnd), g.Last.LogEnd)
	if !strings.Contains(body, want) {
		t.Fatalf("the group's page lacks %q:\n%s", want, body)
	}
}
