package console

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/consumer"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/sdk"
)

// runConsumer runs a consumer of group on topic with the admin's token,
// failing every message whose body is fail (no retries: it is
// dead-lettered at once), and returns the bodies it handled.
func (e *env) runConsumer(t *testing.T, group, topic, fail string) func() []string {
	t.Helper()
	c, err := consumer.New(group, []string{topic}, sdk.MetaAddrs(e.Meta.Addrs()...), sdk.Token(e.adminTok),
		consumer.MaxRetries(0), consumer.RetryBackoff(10*time.Millisecond, 10*time.Millisecond), consumer.Heartbeat(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Run(ctx, func(_ context.Context, m *consumer.Message) error {
			mu.Lock()
			got = append(got, string(m.Body))
			mu.Unlock()
			if string(m.Body) == fail {
				return errors.New("handler refused <b>" + fail + "</b>")
			}
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = c.Close()
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
}

// A message whose handler fails lands in the group's dead-letter topic;
// the page lists the topic, shows the dead letter with its original topic
// and error, and resends it from the form; the group receives it again
// from its original topic.
func TestDeadLettersResend(t *testing.T) {
	e := startEnv(t, envOpts{auth: true, edit: unlimited})
	e.topic(t, "orders")
	e.topic(t, "%DLQ%billing")
	handled := e.runConsumer(t, "billing", "orders", "poison")
	e.send(t, &producer.Message{Topic: "orders", Key: "k", Body: []byte("poison"), Properties: map[string]string{"p": "v"}})

	b := e.browserAs(t, kind{"admin", nil})
	dlq := Prefix + "deadletters?topic=" + url.QueryEscape("%DLQ%billing")
	testwait.For(t, 10*time.Second, "the dead letter on the page", func() bool {
		return strings.Contains(b.must(dlq), `name="offset" value="0"`)
	})
	if list := b.must(Prefix + "deadletters"); !strings.Contains(list, ">%DLQ%billing</a>") {
		t.Fatalf("the list lacks the dead-letter topic:\n%.3000s", list)
	}
	page := b.must(dlq)
	for _, want := range []string{"orders queue 0 offset 0", "handler refused &lt;b&gt;poison", `data-confirm=`} {
		if !strings.Contains(page, want) {
			t.Fatalf("the dead letter's page lacks %q:\n%.4000s", want, page)
		}
	}
	before := len(handled())
	a := b.post(Prefix+"deadletters", url.Values{"topic": {"%DLQ%billing"}, "queue": {"0"}, "offset": {"0"}})
	if a.status != http.StatusSeeOther {
		t.Fatalf("resend: status %d, want 303:\n%.2000s", a.status, a.body)
	}
	back := b.must(a.location)
	if !strings.Contains(back, `id="resent"`) || !strings.Contains(back, "→ orders queue 0 offset 1") {
		t.Fatalf("the page after the resend does not say where it was stored:\n%.3000s", back)
	}
	testwait.For(t, 10*time.Second, "the group receives the resent message", func() bool {
		got := handled()
		return len(got) > before && got[len(got)-1] == "poison"
	})
	// The resent message is the original: its key and properties, without
	// what the dead-lettering added.
	body := b.must(Prefix + "messages?topic=orders&offset=1")
	if !strings.Contains(body, ">k<") || !strings.Contains(body, "p=v") || strings.Contains(body, consumer.PropError) {
		t.Fatalf("the resent message is not the original:\n%.3000s", body)
	}
}

// The page and its form as each permission kind: the list needs describe,
// a dead-letter topic consume on it, a resend produce on the original
// topic too (checked before anything is sent).
func TestDeadLettersPermissions(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	e.topic(t, "orders")
	e.topic(t, "%DLQ%billing")
	e.send(t, &producer.Message{Topic: "%DLQ%billing", Body: []byte("dead-body"),
		Properties: map[string]string{consumer.PropOriginTopic: "orders", consumer.PropOriginQueue: "0", consumer.PropOriginOffset: "0"}})
	dlq := Prefix + "deadletters?topic=" + url.QueryEscape("%DLQ%billing")
	for _, c := range []struct {
		k            kind
		list, topic  int
		resend       int
		resendButton bool
	}{
		{kind{"admin", nil}, http.StatusOK, http.StatusOK, http.StatusSeeOther, true},
		{kind{"viewer", []string{"describe"}}, http.StatusOK, http.StatusForbidden, http.StatusForbidden, false},
		{kind{"dlq-reader", []string{"consume:%DLQ%billing:*"}}, http.StatusOK, http.StatusOK, http.StatusForbidden, false},
		{kind{"dlq-resender", []string{"consume:%DLQ%billing:*", "produce:orders"}}, http.StatusOK, http.StatusOK, http.StatusSeeOther, true},
		{kind{"app", []string{"produce:orders"}}, http.StatusForbidden, http.StatusForbidden, http.StatusForbidden, false},
		{kind{"", nil}, http.StatusSeeOther, http.StatusSeeOther, http.StatusSeeOther, false},
	} {
		t.Run(c.k.name, func(t *testing.T) {
			b := e.browserAs(t, c.k)
			b.wantStatus(Prefix+"deadletters", c.list)
			a := b.wantStatus(dlq, c.topic)
			if got := strings.Contains(a.body, `name="offset" value="0"`); got != c.resendButton {
				t.Fatalf("the resend box shown %v, want %v", got, c.resendButton)
			}
			if b.csrf == "" { // no page with a form was shown: take one
				b.get(Prefix + "messages")
			}
			a = b.post(Prefix+"deadletters", url.Values{"topic": {"%DLQ%billing"}, "queue": {"0"}, "offset": {"0"}})
			if a.status != c.resend {
				t.Fatalf("resend: status %d, want %d:\n%.2000s", a.status, c.resend, a.body)
			}
		})
	}
}

// Hostile input in every parameter and form field: a 400 (or 403, 404),
// never a 5xx or markup.
func TestDeadLettersHostile(t *testing.T) {
	e := startEnv(t, envOpts{auth: true, edit: unlimited})
	e.topic(t, "%DLQ%billing")
	b := e.browserAs(t, kind{"admin", nil})
	b.must(Prefix + "deadletters")
	for _, param := range []string{"topic", "queue", "offset", "n", "time", "q", "page", "size", "resent"} {
		for _, v := range hostileValues {
			q := url.Values{"topic": {"%DLQ%billing"}}
			if param == "q" || param == "page" || param == "size" {
				q = url.Values{}
			}
			q.Set(param, v)
			noRawMarkup(t, "GET "+param+"="+v, b.get(Prefix+"deadletters?"+q.Encode()))
		}
	}
	for _, field := range []string{"topic", "queue", "offset"} {
		for _, v := range hostileValues {
			f := url.Values{"topic": {"%DLQ%billing"}, "queue": {"0"}, "offset": {"0"}}
			f.Set(field, v)
			a := b.post(Prefix+"deadletters", f)
			noRawMarkup(t, "POST "+field+"="+v, a)
			if a.status != http.StatusBadRequest && a.status != http.StatusForbidden {
				t.Fatalf("POST %s=%q: status %d, want 400:\n%.1000s", field, v, a.status, a.body)
			}
		}
	}
	many := url.Values{"topic": {"%DLQ%billing"}}
	for i := range maxResend + 1 {
		many.Add("offset", strings.Repeat("1", 1+i%3))
	}
	if a := b.post(Prefix+"deadletters", many); a.status != http.StatusBadRequest {
		t.Fatalf("%d offsets: status %d, want 400", maxResend+1, a.status)
	}
	if a := b.post(Prefix+"deadletters", url.Values{"topic": {"orders"}, "offset": {"0"}}); a.status != http.StatusBadRequest {
		t.Fatalf("a topic that is no dead-letter topic: status %d, want 400", a.status)
	}
	if a := b.post(Prefix+"deadletters", url.Values{"topic": {"%DLQ%billing"}, "offset": {"0"}, "csrf": {"stale"}}); a.status != http.StatusForbidden {
		t.Fatalf("a stale CSRF token: status %d, want 403", a.status)
	}
}
