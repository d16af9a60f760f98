package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	tc "github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
)

// member joins consumer group of topic as the admin, and returns its
// generation once it holds every queue of the topic.
func member(t *testing.T, e *env, group, id, topic string, queues int) uint64 {
	t.Helper()
	var gen uint64
	testwait.For(t, 10*time.Second, id+" holds the queues", func() bool {
		r, err := e.admin.ConsumerHeartbeat(context.Background(), api.ConsumerHeartbeat{Group: group, Member: id, Topics: []string{topic}, Generation: gen})
		if err != nil {
			t.Fatal(err)
		}
		gen = r.Generation
		return len(r.Assignment) == queues
	})
	return gen
}

// storeTimes is the store time of every message of a queue, by offset.
func storeTimes(t *testing.T, e *env, topic string, queue uint32) []int64 {
	t.Helper()
	c := e.masterOf(t, topic, queue)
	var out []int64
	for _, m := range tc.PullAll(t, c, topic, queue) {
		out = append(out, m.StoreTime)
	}
	return out
}

// leave has the member leave its group.
func leave(t *testing.T, e *env, group, id, topic string) {
	t.Helper()
	if _, err := e.admin.ConsumerHeartbeat(context.Background(), api.ConsumerHeartbeat{Group: group, Member: id, Topics: []string{topic}, Leave: true}); err != nil {
		t.Fatal(err)
	}
}

// committed is the group's committed offsets of topic, by queue.
func committed(t *testing.T, e *env, group, topic string) map[uint32]int64 {
	t.Helper()
	infos, err := e.admin.ConsumerGroups(context.Background(), group)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint32]int64{}
	for _, o := range infos[0].Offsets {
		if o.Topic == topic {
			out[o.Queue] = o.Offset
		}
	}
	return out
}

// billing consumes orders (2 queues: 10 and 4 messages) and has committed
// 6 and 1; it has left the group when live is false.
func billingSetup(t *testing.T, e *env, live bool) {
	t.Helper()
	makeTopic(t, e, "orders", 2)
	sendTo(t, e, "orders", 0, 10)
	sendTo(t, e, "orders", 1, 4)
	gen := member(t, e, "billing", "m1", "orders", 2)
	if _, err := e.admin.CommitOffsets(context.Background(), api.CommitRequest{Group: "billing", Member: "m1", Generation: gen,
		Offsets: []api.QueueOffset{{Topic: "orders", Queue: 0, Offset: 6}, {Topic: "orders", Queue: 1, Offset: 1}}}); err != nil {
		t.Fatal(err)
	}
	if !live {
		leave(t, e, "billing", "m1", "orders")
	}
}

// The consumer group pages: the list for describe (a consumer sees the
// group its permission names), one group for who may describe or consume
// it; the committed offsets, ends and lags are the registry's and the
// brokers'.
func TestConsumersPagesAsEachKind(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	billingSetup(t, e, true)
	bs := kindBrowsers(t, e, "orders", "billing")
	wantStatus(t, bs, Prefix+"consumers", map[string]int{"admin": 200, "describe": 200, "consume": 200, "produce": 403, "none": 303})
	wantStatus(t, bs, Prefix+"consumer?group=billing", map[string]int{"admin": 200, "describe": 200, "consume": 200, "produce": 403, "none": 303})
	wantStatus(t, bs, Prefix+"consumer?group=other", map[string]int{"consume": 403, "produce": 403, "none": 303})

	for _, kind := range []string{"describe", "consume"} {
		list := bs[kind].must(Prefix + "consumers")
		row := `href="/console/consumer?group=billing">billing</a></td><td class="num">`
		if !strings.Contains(list, row) || !strings.Contains(list, `<td class="num">1</td>`+"\n<td>orders</td>\n"+`<td class="num">7</td>`) {
			t.Errorf("the consumer groups list as %s (want billing: 1 member, topic orders, lag 4+3=7):\n%s", kind, list)
		}
		one := bs[kind].must(Prefix + "consumer?group=billing")
		for _, want := range []string{`id="total-lag">7<`, `<td>m1</td>`,
			`<tr id="q-orders-0"><td>orders</td><td class="num">0</td><td>m1</td>` + "\n" + `<td class="num">6</td>` + "\n" + `<td class="num">0</td><td class="num">10</td><td class="num lag">4</td>`,
			`<tr id="q-orders-1"><td>orders</td><td class="num">1</td><td>m1</td>` + "\n" + `<td class="num">1</td>` + "\n" + `<td class="num">0</td><td class="num">4</td><td class="num lag">3</td>`} {
			if !strings.Contains(one, want) {
				t.Errorf("billing's page as %s lacks %q:\n%s", kind, want, one)
			}
		}
		if strings.Contains(one, "Reset offsets") {
			t.Errorf("%s is offered the reset", kind)
		}
	}
	if !strings.Contains(bs["admin"].must(Prefix+"consumer?group=billing"), `href="/console/consumer?group=billing&amp;reset=orders"`) {
		t.Error("admin is not offered the reset")
	}
	if a := bs["describe"].get(Prefix + "consumer?group=billing&reset=orders"); a.status != http.StatusForbidden {
		t.Errorf("the reset form to a describer: status %d, want 403", a.status)
	}
	// A consumer's certificate session: the console's check refuses
	// another group (the cluster token is refused group listings anyway).
	e.principal(t, "certreader", "consume:orders:billing")
	if a := certBrowser(t, e, "certreader").get(Prefix + "consumer?group=other"); a.status != http.StatusForbidden ||
		!strings.Contains(a.body, `principal &#34;certreader&#34; lacks`) {
		t.Errorf("another group to a consumer's certificate session: status %d, want 403", a.status)
	}
}

var previewRow = regexp.MustCompile(`<tr id="preview-(\d+)"><td class="num">\d+</td><td class="num">(-|\d+)</td><td class="num">(\d+)</td><td class="num">(\d+)</td>\s*<td class="num new">(\d+)</td><td class="num skips">(\d+)</td><td class="num rereads">(\d+)</td>`)

// preview fetches the preview of a reset and returns its rows as
// "queue committed start end new skips rereads".
func preview(t *testing.T, b *browser, query url.Values) ([]string, string) {
	t.Helper()
	query.Set("group", "billing")
	query.Set("reset", "orders")
	query.Set("preview", "1")
	body := b.must(Prefix + "consumer?" + query.Encode())
	var rows []string
	for _, m := range previewRow.FindAllStringSubmatch(body, -1) {
		rows = append(rows, strings.Join(m[1:], " "))
	}
	return rows, body
}

// The reset, end to end against the cluster: the form is prefilled with
// the committed offsets; the preview shows each queue's committed offset,
// the new one and what it skips or reads again, and changes nothing; the
// confirm (a POST with the CSRF token) moves the offsets; a group with a
// live member is refused, with the registry's word.
func TestConsumerResetPreviewConfirm(t *testing.T) {
	e := startEnv(t, envOpts{auth: true, edit: unlimited})
	billingSetup(t, e, true)
	admin := e.browser(t)
	admin.login(e.adminTok)

	form := admin.must(Prefix + "consumer?group=billing&reset=orders")
	for _, want := range []string{`id="live-members"`, `name="o0" value="6"`, `name="o1" value="1"`, `id="reset-form"`} {
		if !strings.Contains(form, want) {
			t.Errorf("the reset form lacks %q:\n%s", want, form)
		}
	}
	rows, body := preview(t, admin, url.Values{"to": {"earliest"}})
	if want := []string{"0 6 0 10 0 0 6", "1 1 0 4 0 0 1"}; fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Fatalf("the preview to earliest: %q, want %q:\n%s", rows, want, body)
	}
	if c := committed(t, e, "billing", "orders"); c[0] != 6 || c[1] != 1 {
		t.Fatalf("the preview changed the offsets: %v", c)
	}
	confirm := url.Values{"topic": {"orders"}, "to": {"earliest"}, "n0": {"0"}, "n1": {"0"}}
	a := admin.post(Prefix+"consumer?group=billing", confirm)
	if a.status != http.StatusBadRequest || !strings.Contains(a.body, "live members") || !strings.Contains(a.body, "GROUP_ACTIVE") {
		t.Fatalf("a reset with a live member: status %d, want 400 with the registry's word:\n%s", a.status, a.body)
	}
	if c := committed(t, e, "billing", "orders"); c[0] != 6 || c[1] != 1 {
		t.Fatalf("a refused reset changed the offsets: %v", c)
	}

	leave(t, e, "billing", "m1", "orders")
	rows, _ = preview(t, admin, url.Values{"to": {"latest"}})
	if want := []string{"0 6 0 10 10 4 0", "1 1 0 4 4 3 0"}; fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Fatalf("the preview to latest: %q, want %q", rows, want)
	}
	rows, _ = preview(t, admin, url.Values{"to": {"offset"}, "o0": {"8"}, "o1": {"99"}})
	if want := []string{"0 6 0 10 8 2 0", "1 1 0 4 4 3 0"}; fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Fatalf("the preview to offsets 8 and 99: %q, want %q", rows, want)
	}
	rows, _ = preview(t, admin, url.Values{"to": {"time"}, "at": {"0"}})
	if want := []string{"0 6 0 10 0 0 6", "1 1 0 4 0 0 1"}; fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Fatalf("the preview to time 0: %q, want %q", rows, want)
	}
	// To the store time of queue 0's 8th message: the first message
	// stored at or after it, by the broker's own times.
	stored := storeTimes(t, e, "orders", 0)
	at := stored[7]
	first := 0
	for first < len(stored) && stored[first] < at {
		first++
	}
	rows, body = preview(t, admin, url.Values{"to": {"time"}, "at": {fmt.Sprint(at)}})
	if len(rows) != 2 || rows[0] != fmt.Sprintf("0 6 0 10 %d %d %d", first, max(first-6, 0), max(6-first, 0)) {
		t.Fatalf("the preview to %d (queue 0 stored at %v): %q:\n%s", at, stored, rows, body)
	}
	rows, _ = preview(t, admin, url.Values{"to": {"time"}, "at": {"2999-01-01T00:00:00Z"}})
	if want := []string{"0 6 0 10 10 4 0", "1 1 0 4 4 3 0"}; fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Fatalf("the preview to a time to come: %q, want %q", rows, want)
	}

	// The confirm carries the previewed offsets: to offsets 8 and 2.
	_, body = preview(t, admin, url.Values{"to": {"offset"}, "o0": {"8"}, "o1": {"2"}})
	for _, want := range []string{`id="reset-confirm"`, `name="n0" value="8"`, `name="n1" value="2"`, `name="csrf"`} {
		if !strings.Contains(body, want) {
			t.Fatalf("the preview's confirm lacks %q:\n%s", want, body)
		}
	}
	if a := admin.post(Prefix+"consumer?group=billing", url.Values{"topic": {"orders"}, "to": {"offset"}, "o0": {"8"}, "o1": {"2"},
		"n0": {"8"}, "n1": {"2"}, "csrf": {"forged"}}); a.status != http.StatusForbidden {
		t.Fatalf("a confirm with a forged CSRF token: status %d, want 403", a.status)
	}
	a = admin.post(Prefix+"consumer?group=billing", url.Values{"topic": {"orders"}, "to": {"offset"}, "o0": {"8"}, "o1": {"2"}, "n0": {"8"}, "n1": {"2"}})
	if a.status != http.StatusSeeOther {
		t.Fatalf("the confirm: status %d:\n%s", a.status, a.body)
	}
	if c := committed(t, e, "billing", "orders"); c[0] != 8 || c[1] != 2 {
		t.Fatalf("after the confirm the offsets are %v, want 8 and 2", c)
	}
	if body := admin.must(a.location); !strings.Contains(body, `id="total-lag">4<`) || !strings.Contains(body, `id="reset-done">The offsets of orders were reset.<`) {
		t.Errorf("after the reset the lag is not 2+2:\n%s", body)
	}

	// A describer may not confirm.
	viewer := e.browser(t)
	viewer.login(e.principal(t, "viewer", "describe"))
	viewer.must(Prefix + "consumer?group=billing")
	if a := viewer.post(Prefix+"consumer?group=billing", url.Values{"topic": {"orders"}, "to": {"earliest"}, "n0": {"0"}, "n1": {"0"}}); a.status != http.StatusForbidden {
		t.Fatalf("a describer's confirm: status %d, want 403", a.status)
	}
	e.principal(t, "certviewer", "describe")
	cb := certBrowser(t, e, "certviewer")
	cb.get(Prefix + "consumers")
	if a := cb.post(Prefix+"consumer?group=billing", url.Values{"topic": {"orders"}, "to": {"earliest"}, "n0": {"0"}, "n1": {"0"}}); a.status != http.StatusForbidden ||
		!strings.Contains(a.body, `principal &#34;certviewer&#34; lacks admin`) {
		t.Fatalf("a describer's certificate session's confirm: status %d, want 403 naming it:\n%s", a.status, a.body)
	}
	if c := committed(t, e, "billing", "orders"); c[0] != 8 || c[1] != 2 {
		t.Fatalf("refused confirms changed the offsets: %v", c)
	}
}

// Hostile input in every parameter and field of the consumer pages and the
// reset is a 400 (or shown escaped), never a 500, and changes nothing.
func TestConsumersHostileInput(t *testing.T) {
	e := startEnv(t, envOpts{auth: true, edit: unlimited})
	billingSetup(t, e, false)
	admin := e.browser(t)
	admin.login(e.adminTok)
	admin.must(Prefix + "consumers")
	for _, v := range hostile {
		hostilePaging(t, admin, "consumers", nil, v)
		hostilePaging(t, admin, "consumer", url.Values{"group": {"billing"}}, v)
		for _, param := range []string{"group", "reset", "reset-done"} {
			q := url.Values{"group": {"billing"}, "reset": {"orders"}}
			q.Set(param, v)
			a := admin.get(Prefix + "consumer?" + q.Encode())
			noRawScript(t, "consumer?"+param+"="+v, a)
			if param == "reset-done" && protocol.ValidateTopic(v) == nil {
				continue // a name, shown escaped in the notice
			}
			if a.status != http.StatusBadRequest {
				t.Errorf("consumer?%s=%q: status %d, want 400", param, v, a.status)
			}
		}
		for _, param := range []string{"to", "at", "o0", "o1"} {
			q := url.Values{"group": {"billing"}, "reset": {"orders"}, "preview": {"1"}, "to": {"offset"}}
			if param == "at" {
				q.Set("to", "time")
			}
			q.Set(param, v)
			a := admin.get(Prefix + "consumer?" + q.Encode())
			noRawScript(t, "preview "+param+"="+v, a)
			if a.status != http.StatusBadRequest {
				t.Errorf("preview %s=%q: status %d, want 400", param, v, a.status)
			}
		}
		for _, field := range []string{"topic", "to", "at", "n0", "n1", "o0"} {
			// Accepted, this form would change nothing.
			form := url.Values{"topic": {"orders"}, "to": {"offset"}, "n0": {"6"}, "n1": {"1"}}
			if field == "at" {
				form.Set("to", "time")
			}
			form.Set(field, v)
			a := admin.post(Prefix+"consumer?group=billing", form)
			noRawScript(t, "POST consumer "+field+"="+v, a)
			if a.status != http.StatusBadRequest {
				t.Errorf("POST consumer %s=%q: status %d, want 400:\n%s", field, v, a.status, a.body)
			}
		}
		a := admin.post(Prefix+"consumer?"+url.Values{"group": {v}}.Encode(), url.Values{"topic": {"orders"}, "to": {"earliest"}, "n0": {"0"}, "n1": {"0"}})
		noRawScript(t, "POST consumer?group="+v, a)
		if a.status != http.StatusBadRequest {
			t.Errorf("POST consumer?group=%q: status %d, want 400", v, a.status)
		}
	}
	if a := admin.get(Prefix + "consumer?group=nosuch"); a.status != http.StatusBadRequest {
		t.Errorf("an unknown group: status %d, want 400:\n%s", a.status, a.body)
	}
	if c := committed(t, e, "billing", "orders"); c[0] != 6 || c[1] != 1 {
		t.Fatalf("hostile input changed the offsets: %v", c)
	}
}
