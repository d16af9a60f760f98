package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/auth"
	tc "github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// makeTopic makes a topic of n queues on g1 as the admin.
func makeTopic(t *testing.T, e *env, name string, n int) routing.Route {
	t.Helper()
	r, err := e.admin.CreateTopic(context.Background(), api.CreateTopicRequest{Name: name, Queues: n})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// masterOf is a connection, as the admin, to the master of a topic's
// queue; the test's end closes it.
func (e *env) masterOf(t *testing.T, topic string, queue uint32) *transport.Client {
	t.Helper()
	r, err := e.admin.RouteExisting(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	c := transport.NewClient(r.Queues[queue].Master, transport.ClientConfig{Login: auth.TokenLogin(e.adminTok)})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// sendTo stores n messages in a queue of topic through its master, as the
// admin, and returns the offset after the last.
func sendTo(t *testing.T, e *env, topic string, queue uint32, n int) int64 {
	t.Helper()
	c := e.masterOf(t, topic, queue)
	msgs := make([]protocol.Message, n)
	for i := range msgs {
		msgs[i] = tc.Msg(topic, queue, protocol.Normal, fmt.Sprintf("body %d", i))
	}
	var last int64
	for _, res := range tc.Send(t, c, msgs) {
		if res.Status != protocol.StatusOK {
			t.Fatalf("send to %s/%d: %v", topic, queue, res.Status)
		}
		last = res.QueueOffset
	}
	return last + 1
}

// The topics list is for describe (and admin); a topic's page for who may
// look its route up: describe, a consumer or a producer of the topic, but
// not of another; its queues' log ranges for who may count its messages
// (describe, consume).
func TestTopicsPagesAsEachKind(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	makeTopic(t, e, "orders", 2)
	makeTopic(t, e, "other", 1)
	end := sendTo(t, e, "orders", 1, 3)
	bs := kindBrowsers(t, e, "orders", "billing")
	wantStatus(t, bs, Prefix+"topics", map[string]int{"admin": 200, "describe": 200, "consume": 403, "produce": 403, "none": 303})
	wantStatus(t, bs, Prefix+"topic?name=orders", map[string]int{"admin": 200, "describe": 200, "consume": 200, "produce": 200, "none": 303})
	wantStatus(t, bs, Prefix+"topic?name=other", map[string]int{"admin": 200, "describe": 200, "consume": 403, "produce": 403, "none": 303})

	// A certificate session (calls with the cluster token, which may look
	// any route up) sees only the topics its principal may.
	e.principal(t, "certreader", "consume:orders:billing")
	cb := certBrowser(t, e, "certreader")
	if a := cb.get(Prefix + "topic?name=other"); a.status != http.StatusForbidden {
		t.Errorf("another topic's page to a consumer's certificate session: status %d, want 403", a.status)
	}

	list := bs["describe"].must(Prefix + "topics")
	for _, want := range []string{`href="/console/topic?name=orders">orders</a></td><td class="num">2</td>`, `>g1</a>`} {
		if !strings.Contains(list, want) {
			t.Errorf("the topics list lacks %q:\n%s", want, list)
		}
	}
	if strings.Contains(list, `id="create-topic"`) {
		t.Error("a describer is offered the create form")
	}
	if !strings.Contains(bs["admin"].must(Prefix+"topics"), `id="create-topic"`) {
		t.Error("admin is not offered the create form")
	}
	// A filter and a page size keep the rows they select.
	if body := bs["describe"].must(Prefix + "topics?q=oth&size=1"); strings.Contains(body, ">orders</a>") || !strings.Contains(body, ">other</a>") {
		t.Errorf("the filter oth:\n%s", body)
	}

	held := fmt.Sprintf(`<td class="num">0</td><td class="num">%d</td><td class="num">%d</td>`, end, end)
	for kind, ranges := range map[string]bool{"admin": true, "consume": true, "describe": true, "produce": false} {
		body := bs[kind].must(Prefix + "topic?name=orders")
		if got := strings.Contains(body, held); got != ranges {
			t.Errorf("the topic's page as %s shows the log range: %v, want %v:\n%s", kind, got, ranges, body)
		}
		if got := strings.Contains(body, "for who may describe the cluster or consume the topic"); got == ranges {
			t.Errorf("the topic's page as %s says the ranges need consume: %v", kind, got)
		}
		if !strings.Contains(body, `id="topic-name">orders<`) {
			t.Errorf("the topic's page as %s does not name it", kind)
		}
		if got := strings.Contains(body, `id="add-queues"`); got != (kind == "admin") {
			t.Errorf("the add-queues form shown to %s: %v", kind, got)
		}
	}
}

// Creating a topic and adding queues from the pages makes them in the
// registry; who is not admin is refused, by the console itself for a
// certificate session (whose calls carry the cluster token, which may
// create topics).
func TestTopicsCreateAndAddQueues(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	admin := e.browser(t)
	admin.login(e.adminTok)
	admin.must(Prefix + "topics")
	a := admin.post(Prefix+"topics", url.Values{"name": {"fresh"}, "queues": {"3"}, "groups": {"g1"}})
	if a.status != http.StatusSeeOther || a.location != Prefix+"topic?name=fresh" {
		t.Fatalf("create: status %d to %q:\n%s", a.status, a.location, a.body)
	}
	if r, err := e.admin.RouteExisting(context.Background(), "fresh"); err != nil || len(r.Queues) != 3 {
		t.Fatalf("after create: %v, %d queues", err, len(r.Queues))
	}
	admin.must(a.location)
	if a := admin.post(Prefix+"topic?name=fresh", url.Values{"name": {"fresh"}, "count": {"2"}}); a.status != http.StatusSeeOther {
		t.Fatalf("add queues: status %d:\n%s", a.status, a.body)
	}
	if r, _ := e.admin.RouteExisting(context.Background(), "fresh"); len(r.Queues) != 5 {
		t.Fatalf("after adding 2 queues: %d", len(r.Queues))
	}
	if a := admin.post(Prefix+"topics", url.Values{"name": {"fresh"}, "queues": {"1"}}); a.status != http.StatusBadRequest {
		t.Fatalf("creating a topic that exists: status %d, want 400:\n%s", a.status, a.body)
	}

	e.principal(t, "pub", "describe", "produce:*")
	cb := certBrowser(t, e, "pub")
	cb.get(Prefix + "topic?name=fresh")
	for _, c := range []struct {
		path string
		form url.Values
	}{
		{Prefix + "topics", url.Values{"name": {"sneaky"}, "queues": {"1"}}},
		{Prefix + "topic?name=fresh", url.Values{"name": {"fresh"}, "count": {"1"}}},
	} {
		if a := cb.post(c.path, c.form); a.status != http.StatusForbidden || !strings.Contains(a.body, `principal &#34;pub&#34; lacks admin`) {
			t.Errorf("POST %s as a producer's certificate session: status %d, want 403 naming pub:\n%s", c.path, a.status, a.body)
		}
	}
	if _, err := e.admin.RouteExisting(context.Background(), "sneaky"); err == nil {
		t.Fatal("a producer's certificate session created a topic")
	}
	if r, _ := e.admin.RouteExisting(context.Background(), "fresh"); len(r.Queues) != 5 {
		t.Fatalf("a producer's certificate session added queues: %d", len(r.Queues))
	}
}

// Hostile input in every parameter and field is a 400 with a clear
// message (or shown escaped), never a 500.
func TestTopicsHostileInput(t *testing.T) {
	e := startEnv(t, envOpts{auth: true, edit: unlimited})
	makeTopic(t, e, "orders", 1)
	admin := e.browser(t)
	admin.login(e.adminTok)
	admin.must(Prefix + "topics")
	for _, v := range hostile {
		hostilePaging(t, admin, "topics", nil, v)
		hostilePaging(t, admin, "topic", url.Values{"name": {"orders"}}, v)
		if a := admin.get(Prefix + "topic?" + url.Values{"name": {v}}.Encode()); a.status != http.StatusBadRequest {
			t.Errorf("topic?name=%q: status %d, want 400", v, a.status)
		}
		for _, field := range []string{"name", "queues", "groups"} {
			form := url.Values{"name": {"made"}, "queues": {"1"}, "groups": {"g1"}}
			form.Set(field, v)
			a := admin.post(Prefix+"topics", form)
			noRawScript(t, "POST topics "+field+"="+v, a)
			if field == "name" && protocol.ValidateNewTopic(v) == nil {
				continue // a name like any other: the topic is made
			}
			if a.status != http.StatusBadRequest {
				t.Errorf("POST topics %s=%q: status %d, want 400:\n%s", field, v, a.status, a.body)
			}
		}
		for _, field := range []string{"name", "count"} {
			form := url.Values{"name": {"orders"}, "count": {"1"}}
			form.Set(field, v)
			a := admin.post(Prefix+"topic?name=orders", form)
			noRawScript(t, "POST topic "+field+"="+v, a)
			if field == "name" && protocol.ValidateNewTopic(v) == nil {
				continue // made above
			}
			if a.status != http.StatusBadRequest {
				t.Errorf("POST topic %s=%q: status %d, want 400:\n%s", field, v, a.status, a.body)
			}
		}
	}
	for _, bad := range []url.Values{{"name": {"x"}, "queues": {"0"}}, {"name": {"x"}, "queues": {"4097"}}, {"name": {"a%b"}}, {"name": {".."}}} {
		if a := admin.post(Prefix+"topics", bad); a.status != http.StatusBadRequest {
			t.Errorf("POST topics %v: status %d, want 400", bad, a.status)
		}
	}
	if a := admin.get(Prefix + "topic?name=nosuch"); a.status != http.StatusBadRequest {
		t.Errorf("an unknown topic: status %d, want 400:\n%s", a.status, a.body)
	}
	if r, _ := e.admin.RouteExisting(context.Background(), "orders"); len(r.Queues) != 1 {
		t.Fatalf("hostile forms added queues: %d", len(r.Queues))
	}
	if _, err := e.admin.RouteExisting(context.Background(), "made"); err == nil {
		t.Fatal("a hostile form created a topic")
	}
}
