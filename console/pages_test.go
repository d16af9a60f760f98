package console

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/sdk"
)

// Helpers of the message pages' tests (Messages, Dead letters, Delayed,
// Transactions).

// topic creates a topic of one queue (in g1).
func (e *env) topic(t *testing.T, name string) {
	t.Helper()
	if _, err := e.admin.CreateTopic(context.Background(), api.CreateTopicRequest{Name: name, Queues: 1}); err != nil {
		t.Fatal(err)
	}
}

// producer is a producer with the admin's token.
func (e *env) producer(t *testing.T) *producer.Client {
	t.Helper()
	p, err := producer.New(sdk.MetaAddrs(e.Meta.Addrs()...), sdk.Token(e.adminTok))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// send sends the messages and returns their results.
func (e *env) send(t *testing.T, msgs ...*producer.Message) []producer.Result {
	t.Helper()
	p := e.producer(t)
	var out []producer.Result
	for _, m := range msgs {
		r, err := p.Send(context.Background(), m)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// kind is a permission kind a page is tried as: the permissions its
// principal gets ("" name: no session at all).
type kind struct {
	name  string
	perms []string
}

// browserAs is a browser logged in as a new principal of kind k (not
// logged in for the kind without a name; admin: the admin's token).
func (e *env) browserAs(t *testing.T, k kind) *browser {
	t.Helper()
	b := e.browser(t)
	switch k.name {
	case "":
	case "admin":
		b.login(e.adminTok)
	default:
		b.login(e.principal(t, k.name, k.perms...))
	}
	return b
}

// wantStatus fetches path and fails unless it answered status.
func (b *browser) wantStatus(path string, status int) pageAnswer {
	b.t.Helper()
	a := b.get(path)
	if a.status != status {
		b.t.Fatalf("GET %s: status %d, want %d:\n%.2000s", path, a.status, status, a.body)
	}
	return a
}

// hostileValues are what every query parameter and form field is tried
// with: not numbers, huge numbers, long strings, markup.
var hostileValues = []string{"-1", "x", "99999999999999999999999", strings.Repeat("a", 300), "<script>alert(1)</script>", "%00", "1e9", " "}

// noRawMarkup fails if a page holds the hostile markup unescaped.
func noRawMarkup(t *testing.T, where string, a pageAnswer) {
	t.Helper()
	if strings.Contains(a.body, "<script>alert(1)") {
		t.Fatalf("%s: the page holds unescaped markup:\n%.2000s", where, a.body)
	}
	if a.status >= 500 {
		t.Fatalf("%s: status %d, want no 5xx:\n%.2000s", where, a.status, a.body)
	}
	if a.status != http.StatusOK && a.status != http.StatusBadRequest && a.status != http.StatusNotFound && a.status != http.StatusForbidden {
		t.Fatalf("%s: status %d, want 200, 400, 403 or 404", where, a.status)
	}
}
