package console

import (
	"net/url"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/producer"
)

// With authorization off every message page is open, with bodies, and its
// forms act.
func TestMessagePagesAuthOff(t *testing.T) {
	e := startEnv(t, envOpts{})
	e.topic(t, "orders")
	e.topic(t, "%DLQ%billing")
	e.send(t, &producer.Message{Topic: "orders", Key: "k", Body: []byte("open-body")},
		&producer.Message{Topic: "%DLQ%billing", Body: []byte("dead"), Properties: map[string]string{"DLQ_ORIGIN_TOPIC": "orders"}})
	b := e.browser(t)
	for path, want := range map[string]string{
		"messages?topic=orders": "open-body", "messages?key=k": "open-body", "deadletters": "%DLQ%billing",
		"deadletters?topic=" + url.QueryEscape("%DLQ%billing"): `name="offset" value="0"`, "delayed": `id="delayed-groups"`, "txns": `id="decisions"`,
	} {
		if body := b.must(Prefix + path); !strings.Contains(body, want) {
			t.Fatalf("%s lacks %q:\n%.3000s", path, want, body)
		}
	}
	a := b.post(Prefix+"deadletters", url.Values{"topic": {"%DLQ%billing"}, "offset": {"0"}})
	if a.status != 303 || !strings.Contains(b.must(a.location), "→ orders queue 0 offset 1") {
		t.Fatalf("resend with authorization off: status %d", a.status)
	}
}
