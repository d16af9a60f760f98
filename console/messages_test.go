package console

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/broker"
	tc "github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/producer"
)

// The Messages page as each permission kind: a queue's messages only to
// who may consume its topic; a describer sees the forms but is refused a
// topic's messages (the brokers would refuse its PULL and LOOKUP), as are
// a consumer of another topic and a producer, who may not open the page.
func TestMessagesPermissions(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	e.topic(t, "orders")
	e.send(t, &producer.Message{Topic: "orders", Key: "k1", Body: []byte("secret-body-1")})
	path := Prefix + "messages?topic=orders&queue=0"
	for _, c := range []struct {
		k            kind
		status       int
		body, listed bool
		find         int  // a lookup by key's status
		found        bool // its body shown
	}{
		{kind{"admin", nil}, http.StatusOK, true, true, http.StatusOK, true},
		{kind{"viewer", []string{"describe"}}, http.StatusForbidden, false, false, http.StatusForbidden, false},
		{kind{"reader", []string{"consume:orders:*"}}, http.StatusOK, true, true, http.StatusForbidden, false},
		{kind{"viewer-reader", []string{"describe", "consume:orders:*"}}, http.StatusOK, true, true, http.StatusOK, true},
		{kind{"viewer-other", []string{"describe", "consume:payments:*"}}, http.StatusForbidden, false, false, http.StatusOK, false},
		{kind{"other", []string{"consume:payments:*"}}, http.StatusForbidden, false, false, http.StatusForbidden, false},
		{kind{"app", []string{"produce:orders"}}, http.StatusForbidden, false, false, http.StatusForbidden, false},
		{kind{"", nil}, http.StatusSeeOther, false, false, http.StatusSeeOther, false},
	} {
		t.Run(c.k.name, func(t *testing.T) {
			b := e.browserAs(t, c.k)
			a := b.wantStatus(path, c.status)
			if got := strings.Contains(a.body, "secret-body-1"); got != c.body {
				t.Fatalf("body shown %v, want %v:\n%.3000s", got, c.body, a.body)
			}
			if got := strings.Contains(a.body, ">k1<"); got != c.listed {
				t.Fatalf("the message's key listed %v, want %v:\n%.3000s", got, c.listed, a.body)
			}
			// A lookup by key shows the same; the page's forms are shown to
			// who may describe or consume.
			if a := b.get(Prefix + "messages"); (a.status == http.StatusOK) != (c.k.name != "" && c.k.name != "app") {
				t.Fatalf("the page's forms: status %d", a.status)
			}
			a = b.wantStatus(Prefix+"messages?key=k1", c.find)
			if got := strings.Contains(a.body, "secret-body-1"); got != c.found {
				t.Fatalf("find by key: body shown %v, want %v", got, c.found)
			}
			if c.find == http.StatusOK && !c.found && !strings.Contains(a.body, `id="hidden">1 more`) {
				t.Fatalf("find by key: the message hidden is not counted:\n%.3000s", a.body)
			}
		})
	}
}

// HideBodies hides every body, from admin too.
func TestMessagesHideBodies(t *testing.T) {
	e := startEnv(t, envOpts{auth: true, hideBodies: true})
	e.topic(t, "orders")
	r := e.send(t, &producer.Message{Topic: "orders", Key: "k1", Body: []byte("secret-body-1")})
	b := e.browserAs(t, kind{"admin", nil})
	for _, path := range []string{"messages?topic=orders", "messages?key=k1", "messages?handle=" + url.QueryEscape(r[0].Handle.String()) + "&whole=1",
		"messages?journey=" + r[0].ID} {
		body := b.must(Prefix + path)
		if strings.Contains(body, "secret-body-1") || !strings.Contains(body, r[0].ID) {
			t.Fatalf("%s: a body shown, or the message not listed:\n%.3000s", path, body)
		}
	}
}

// A body is shown escaped, as text, JSON (pretty) or hex; a long one as a
// 4 KiB preview with a link to the whole of it.
func TestMessagesBodies(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	e.topic(t, "orders")
	long := strings.Repeat("x", 10<<10)
	rs := e.send(t,
		&producer.Message{Topic: "orders", Body: []byte("<script>alert(1)</script>")},
		&producer.Message{Topic: "orders", Body: []byte(`{"a":1,"b":[2]}`)},
		&producer.Message{Topic: "orders", Body: []byte{0, 1, 2, 0xff}},
		&producer.Message{Topic: "orders", Body: []byte(long)})
	b := e.browserAs(t, kind{"admin", nil})
	a := b.wantStatus(Prefix+"messages?topic=orders", http.StatusOK)
	noRawMarkup(t, "bodies", a)
	for _, want := range []string{`data-kind="text">&lt;script&gt;alert(1)&lt;/script&gt;`, "data-kind=\"json\">{\n  &#34;a&#34;: 1,",
		`data-kind="hex">00000000  00 01 02 ff`, `class="whole"`} {
		if !strings.Contains(a.body, want) {
			t.Fatalf("the page lacks %q:\n%.3000s", want, a.body)
		}
	}
	if strings.Contains(a.body, long[:5<<10]) {
		t.Fatal("a long body is shown whole on the list")
	}
	whole := b.must(Prefix + "messages?whole=1&handle=" + url.QueryEscape(rs[3].Handle.String()))
	if !strings.Contains(whole, long) {
		t.Fatal("the whole-body link does not show the whole body")
	}
}

var nextLink = regexp.MustCompile(`<a href="([^"]+)" rel="next" id="next">`)

// follow reads a search's pages, following its "go on" links (at most
// max pages), and returns every page's body.
func (b *browser) follow(path string, max int) []string {
	b.t.Helper()
	var pages []string
	for range max {
		body := b.must(path)
		pages = append(pages, body)
		m := nextLink.FindStringSubmatch(body)
		if m == nil {
			return pages
		}
		path = html.UnescapeString(m[1])
	}
	b.t.Fatalf("more than %d pages", max)
	return nil
}

var offsetCell = regexp.MustCompile(`<tr class="message"><td>[^<]*</td><td>\d+</td><td>(\d+)</td>`)

// A queue read over more than the bytes budget stops with a link to go on;
// following the links reads every message once.
func TestMessagesByteBudget(t *testing.T) {
	old := searchBytes
	searchBytes = 3000
	t.Cleanup(func() { searchBytes = old })
	e := startEnv(t, envOpts{auth: true})
	e.topic(t, "orders")
	const n = 12
	var msgs []*producer.Message
	for i := range n {
		msgs = append(msgs, &producer.Message{Topic: "orders", Body: []byte(fmt.Sprintf("%04d%s", i, strings.Repeat("b", 1000)))})
	}
	e.send(t, msgs...)
	b := e.browserAs(t, kind{"admin", nil})
	pages := b.follow(Prefix+"messages?topic=orders&queue=0&n=200", 50)
	if len(pages) < 4 {
		t.Fatalf("%d pages of 12 KB under a 3000-byte budget, want at least 4", len(pages))
	}
	if !strings.Contains(pages[0], `id="stopped"`) {
		t.Fatalf("the first page does not say why it stopped:\n%.2000s", pages[0])
	}
	seen := map[int]int{}
	for _, p := range pages {
		for _, m := range offsetCell.FindAllStringSubmatch(p, -1) {
			off, _ := strconv.Atoi(m[1])
			seen[off]++
		}
	}
	for i := range n {
		if seen[i] != 1 {
			t.Fatalf("offset %d read %d times over the pages, want once (seen %v)", i, seen[i], seen)
		}
	}
}

// Find by key goes a page at a time, newest first, each message once;
// by time starts at the first message stored at or after it; a handle
// shows its message; a journey traces it.
func TestMessagesFind(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	e.topic(t, "orders")
	var msgs []*producer.Message
	for i := range 5 {
		msgs = append(msgs, &producer.Message{Topic: "orders", Key: "same", Body: []byte(fmt.Sprintf("body-%d", i))})
	}
	rs := e.send(t, msgs...)
	b := e.browserAs(t, kind{"viewer-reader", []string{"describe", "consume:orders:*"}})
	pages := b.follow(Prefix+"messages?key=same&n=2", 10)
	if len(pages) != 3 {
		t.Fatalf("%d pages of 5 messages by 2, want 3", len(pages))
	}
	var order []string
	for _, p := range pages {
		for _, m := range regexp.MustCompile(`body-(\d)`).FindAllStringSubmatch(p, -1) {
			order = append(order, m[1])
		}
	}
	if strings.Join(order, "") != "43210" {
		t.Fatalf("bodies in order %v, want newest first, each once", order)
	}
	t0 := rs[3].Handle // a handle is GROUP@LOGOFFSET
	body := b.must(Prefix + "messages?handle=" + url.QueryEscape(t0.String()))
	if !strings.Contains(body, "body-3") || strings.Contains(body, "body-2") {
		t.Fatalf("the handle's page does not show its message alone:\n%.2000s", body)
	}
	body = b.must(Prefix + "messages?topic=orders&time=0")
	if !strings.Contains(body, "body-0") {
		t.Fatal("from time 0: the first message is not shown")
	}
	body = b.must(Prefix + "messages?topic=orders&time=" + strconv.FormatInt(1<<50, 10))
	if !strings.Contains(body, `id="no-messages"`) {
		t.Fatal("from a time after every message: messages are shown")
	}
	body = b.must(Prefix + "messages?journey=" + rs[1].ID)
	if !strings.Contains(body, `id="journey"`) || !strings.Contains(body, "stored") {
		t.Fatalf("the journey is not shown:\n%.2000s", body)
	}
}

// Hostile input in every parameter is a 400 (or an empty answer), never a
// 5xx, and never comes back as markup.
func TestMessagesHostile(t *testing.T) {
	e := startEnv(t, envOpts{auth: true, edit: unlimited})
	e.topic(t, "orders")
	b := e.browserAs(t, kind{"admin", nil})
	base := map[string]string{"topic": "orders", "queue": "0"}
	for _, param := range []string{"topic", "queue", "offset", "time", "n", "handle", "id", "key", "cursor", "journey", "whole"} {
		for _, v := range hostileValues {
			q := url.Values{}
			if param != "handle" && param != "id" && param != "key" && param != "cursor" && param != "journey" {
				for k, bv := range base {
					q.Set(k, bv)
				}
			}
			if param == "cursor" {
				q.Set("key", "k")
			}
			q.Set(param, v)
			where := param + "=" + v
			noRawMarkup(t, where, b.get(Prefix+"messages?"+q.Encode()))
		}
	}
	for _, path := range []string{"messages?topic=orders&queue=7", "messages?topic=nosuch", "messages?queue=-1&topic=orders",
		"messages?topic=orders&n=0", "messages?topic=orders&n=201", "messages?handle=g1@x", "messages?id=a&key=b", "messages?key=k&cursor=g1:-5"} {
		a := b.get(Prefix + path)
		if a.status != http.StatusBadRequest && a.status != http.StatusNotFound {
			t.Fatalf("%s: status %d, want 400 or 404:\n%.1000s", path, a.status, a.body)
		}
	}
}

// A lookup over two broker groups past the bytes budget stops after the
// first group and goes on with a cursor; following the cursors finds every
// message of the key once.
func TestMessagesFindByteBudget(t *testing.T) {
	old := searchBytes
	searchBytes = 1
	t.Cleanup(func() { searchBytes = old })
	e := startEnv(t, envOpts{auth: true})
	tc.StartGroup(t, e.Meta.Addrs(), "g2", tc.GroupOpts{Edit: func(c *broker.Config) {
		tc.SteadyBroker(c)
		c.ClusterToken = e.clusterTok
	}})
	e.topic(t, "orders")
	if _, err := e.admin.CreateTopic(context.Background(), api.CreateTopicRequest{Name: "orders2", Queues: 1, Groups: []string{"g2"}}); err != nil {
		t.Fatal(err)
	}
	var msgs []*producer.Message
	for i := range 6 {
		topic := "orders"
		if i%2 == 1 {
			topic = "orders2"
		}
		msgs = append(msgs, &producer.Message{Topic: topic, Key: "same", Body: []byte(fmt.Sprintf("body-%d", i))})
	}
	e.send(t, msgs...)
	b := e.browserAs(t, kind{"admin", nil})
	// A page may hold 200: only the budget makes more than one.
	pages := b.follow(Prefix+"messages?key=same&n=200", 20)
	if len(pages) < 2 || !strings.Contains(pages[0], `id="stopped"`) {
		t.Fatalf("%d pages; the first does not say the budget stopped it:\n%.3000s", len(pages), pages[0])
	}
	seen := map[string]int{}
	for _, p := range pages {
		for _, m := range regexp.MustCompile(`body-(\d)`).FindAllStringSubmatch(p, -1) {
			seen[m[1]]++
		}
	}
	for i := range 6 {
		if seen[strconv.Itoa(i)] != 1 {
			t.Fatalf("body-%d found %d times over %d pages, want once (%v)", i, seen[strconv.Itoa(i)], len(pages), seen)
		}
	}
}

// A queue read whose time budget runs out answers what it read (here
// nothing) and a link that goes on from where it stopped, not an error.
func TestMessagesTimeBudget(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	e.topic(t, "orders")
	e.send(t, &producer.Message{Topic: "orders", Body: []byte("b")})
	old := searchTime
	searchTime = time.Nanosecond
	t.Cleanup(func() { searchTime = old })
	b := e.browserAs(t, kind{"admin", nil})
	body := b.must(Prefix + "messages?topic=orders&queue=0")
	if !strings.Contains(body, `id="stopped"`) || !strings.Contains(body, `messages?offset=0&amp;queue=0&amp;topic=orders" rel="next"`) {
		t.Fatalf("a read out of time: no cursor to go on from offset 0:\n%.3000s", body)
	}
}
