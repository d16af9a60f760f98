package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
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
}
