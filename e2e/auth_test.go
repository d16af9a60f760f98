package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
)

// TestAuthThroughProcesses: the local cluster with FERRY_AUTH=1 (real
// processes, tokens made by cluster.sh). ferryctl acl add makes a
// principal; with its token a send to its topic is stored and read back,
// a send to a topic it lacks is refused naming the permission (exit 1),
// and without a token ferryctl is told to authenticate first.
func TestAuthThroughProcesses(t *testing.T) {
	c := startLocalCluster(t, "FERRY_AUTH=1")
	admin := []string{"--token-file", filepath.Join(c.home, "auth", "admin.token")}
	as := func(tokenFile string, args ...string) (int, string, string) {
		return c.ctlExit(append(args, "--token-file", tokenFile)...)
	}
	if code, _, errOut := c.ctlExit("topics"); code != 1 || !strings.Contains(errOut, "NOT_AUTHORIZED: authenticate first") {
		t.Fatalf("topics without a token: exit %d: %s", code, errOut)
	}
	for _, topic := range []string{"orders", "payments"} {
		if code, _, errOut := as(admin[1], "topic", "create", topic, "--queues", "2"); code != 0 {
			t.Fatalf("topic create %s: exit %d: %s", topic, code, errOut)
		}
	}
	code, out, errOut := as(admin[1], "--json", "acl", "add", "app1", "--perm", "produce:orders", "--perm", "consume:orders:*")
	if code != 0 {
		t.Fatalf("acl add: exit %d: %s", code, errOut)
	}
	var made struct{ Token string }
	if err := json.Unmarshal([]byte(out), &made); err != nil || made.Token == "" {
		t.Fatalf("acl add printed %q: %v", out, err)
	}
	appFile := filepath.Join(t.TempDir(), "app1.token")
	if err := os.WriteFile(appFile, []byte(made.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The brokers load the new table within a heartbeat (1 s here).
	testwait.For(t, 20*time.Second, "app1 to send to orders", func() bool {
		code, _, _ := as(appFile, "send", "orders", "--body", "hello", "--key", "k")
		return code == 0
	})
	code, _, errOut = as(appFile, "send", "payments", "--body", "no")
	if code != 1 || !strings.Contains(errOut, "NOT_AUTHORIZED") || !strings.Contains(errOut, `principal "app1" lacks produce:payments`) {
		t.Fatalf("app1 sending to payments: exit %d: %s", code, errOut)
	}
	// What app1 sent is there, read with its consume permission.
	found := false
	for q := range 2 {
		code, out, errOut := as(appFile, "read", "orders", "--queue", string(rune('0'+q)), "--from", "0")
		if code != 0 {
			t.Fatalf("read orders queue %d: exit %d: %s", q, code, errOut)
		}
		found = found || strings.Contains(out, "hello")
	}
	if !found {
		t.Fatal("the message app1 sent is in no queue of orders")
	}
	if code, _, errOut := as(appFile, "read", "payments", "--queue", "0", "--from", "0"); code != 1 || !strings.Contains(errOut, `principal "app1" lacks `) || !strings.Contains(errOut, "consume:payments:<group>") {
		t.Fatalf("app1 reading payments: exit %d: %s", code, errOut)
	}
	consoleThroughProcesses(t, c, made.Token)
}

// consoleThroughProcesses: the web console of each metaserver process (on
// its metrics port) logs in with a token; app1, which may not describe,
// is refused the overview; the admin creates a topic with the topics
// page's form on a metaserver that may be a follower, ferryctl lists it,
// and the audit page names the admin as who made it.
func consoleThroughProcesses(t *testing.T, c *localCluster, appToken string) {
	adminTok, err := os.ReadFile(filepath.Join(c.home, "auth", "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	for i := 1; i <= 3; i++ {
		base := fmt.Sprintf("http://127.0.0.1:%d/console/", c.base+20+i)
		jar, _ := cookiejar.New(nil)
		hc := &http.Client{Jar: jar, Timeout: 10 * time.Second}
		do := func(method, path string, form url.Values) (int, string) {
			t.Helper()
			req, err := http.NewRequest(method, base+path, strings.NewReader(form.Encode()))
			if err != nil {
				t.Fatal(err)
			}
			if method == http.MethodPost {
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", method, base+path, err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		if code, body := do(http.MethodPost, "login", url.Values{"token": {appToken}}); code != http.StatusForbidden || !strings.Contains(body, "lacks describe") {
			t.Fatalf("metaserver m%d's console for app1: %d, want 403 naming describe", i, code)
		}
		hc.Jar, _ = cookiejar.New(nil)
		code, body := do(http.MethodPost, "login", url.Values{"token": {strings.TrimSpace(string(adminTok))}})
		if code != http.StatusOK || !strings.Contains(body, `id="meta-leader"`) {
			t.Fatalf("metaserver m%d's console overview for the admin: %d:\n%s", i, code, body)
		}
		if i != 2 {
			continue
		}
		_, body = do(http.MethodGet, "topics", nil)
		m := csrf.FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("the topics page has no form:\n%s", body)
		}
		if code, body := do(http.MethodPost, "topics", url.Values{"csrf": {m[1]}, "name": {"made-in-console"}, "queues": {"2"}}); code != http.StatusOK || !strings.Contains(body, "made-in-console") {
			t.Fatalf("creating a topic in the console: %d:\n%s", code, body)
		}
		// ferryctl reads from any metaserver: a follower shows the topic
		// once it applied the creation.
		testwait.For(t, 10*time.Second, "ferryctl topics to list the console's topic", func() bool {
			code, out, _ := c.ctlExit("topics", "--token-file", filepath.Join(c.home, "auth", "admin.token"))
			return code == 0 && strings.Contains(out, "made-in-console")
		})
		if _, body := do(http.MethodGet, "audit?kind=create-topic", nil); !strings.Contains(body, "made-in-console") || !strings.Contains(body, "<td>admin</td>") {
			t.Fatalf("the audit page lacks the admin's topic:\n%s", body)
		}
	}
}
