package console

import (
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/auth"
)

// The principals page is admin's alone; it lists each principal with its
// permissions and no more of its token's hash than 8 hex characters.
func TestPrincipalsPage(t *testing.T) {
	e := startEnv(t, envOpts{auth: true, edit: unlimited})
	bs := kindBrowsers(t, e, "orders", "billing")
	wantStatus(t, bs, Prefix+"principals", map[string]int{"admin": 200, "describe": 403, "consume": 403, "produce": 403, "none": 303})
	// (A principal's name and permissions are plain letters, digits and
	// ._-:* by the registry's rule: nothing there to escape.)
	tok := e.principal(t, "odd.name-1", "consume:orders:billing", "describe")
	body := bs["admin"].must(Prefix + "principals")
	hash := auth.HashToken(tok).String()
	for _, want := range []string{"<td>viewer</td>", "<code>describe</code>", "<code>consume:orders:billing</code>", "<code>produce:orders</code>",
		`<code class="token">` + hash[:8] + "…</code>", "<td>odd.name-1</td>"} {
		if !strings.Contains(body, want) {
			t.Errorf("the principals page lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, hash[:9]) || strings.Contains(body, tok) {
		t.Error("the page holds more of a token's hash than 8 characters, or the token")
	}
	if !strings.Contains(bs["admin"].must(Prefix), `href="/console/principals"`) {
		t.Error("admin's navigation lacks the principals page")
	}
	if strings.Contains(bs["describe"].must(Prefix), `href="/console/principals"`) {
		t.Error("a describer's navigation shows the principals page")
	}
	for _, v := range hostile {
		hostilePaging(t, bs["admin"], "principals", nil, v)
	}
	if body := bs["admin"].must(Prefix + "principals?q=view"); !strings.Contains(body, "<td>viewer</td>") || strings.Contains(body, "<td>reader</td>") {
		t.Errorf("the filter view:\n%s", body)
	}
}
