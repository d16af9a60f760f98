package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
)

// ferryctl acl through a cluster with authorization on: a principal made
// with acl add sends with its token where its permissions allow and is
// refused, naming the permission, where they do not; grant, rotate and rm
// take effect; without a token nothing is served.
func TestACLCommands(t *testing.T) {
	t.Setenv("FERRY_TOKEN", "")
	adminTok, clusterTok := auth.NewToken(), auth.NewToken()
	c := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1"},
		MetaEdit: func(c *metaserver.Config) {
			c.ClusterToken = clusterTok
			c.Auth.Admin = auth.HashToken(adminTok)
		},
		BrokerEdit: func(c *broker.Config) { c.ClusterToken = clusterTok },
	})
	adminFile := filepath.Join(t.TempDir(), "admin.token")
	if err := os.WriteFile(adminFile, []byte(adminTok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	meta := []string{"--meta", c.MetaAddr(), "--timeout", "5s"}
	admin := append(append([]string{}, meta...), "--token-file", adminFile)
	as := func(tok string, args ...string) (int, string, string) {
		t.Setenv("FERRY_TOKEN", tok)
		defer t.Setenv("FERRY_TOKEN", "")
		return ctl(append(append([]string{}, meta...), args...)...)
	}

	code, _, errOut := ctl(append(meta, "topics")...)
	if code != exitError || !strings.Contains(errOut, "NOT_AUTHORIZED: authenticate first") {
		t.Fatalf("topics without a token: exit %d: %s", code, errOut)
	}
	mustCtl(t, append(admin, "topic", "create", "orders", "--queues", "1")...)
	mustCtl(t, append(admin, "topic", "create", "payments", "--queues", "1")...)

	var made tokenResult
	if err := json.Unmarshal([]byte(mustCtl(t, append(admin, "--json", "acl", "add", "app1", "--perm", "produce:orders")...)), &made); err != nil {
		t.Fatal(err)
	}
	if made.Name != "app1" || auth.ValidateToken(made.Token) != nil || strings.Join(made.Permissions, ",") != "produce:orders" {
		t.Fatalf("acl add printed %+v", made)
	}
	if code, _, errOut := ctl(append(admin, "acl", "add", "app1")...); code != exitError || !strings.Contains(errOut, `principal "app1" already exists`) {
		t.Fatalf("acl add of an existing principal: exit %d: %s", code, errOut)
	}
	testwait.For(t, 10*time.Second, "app1 to send to orders", func() bool {
		code, _, _ := as(made.Token, "send", "orders", "--body", "hi")
		return code == exitOK
	})
	code, _, errOut = as(made.Token, "send", "payments", "--body", "no")
	if code != exitError || !strings.Contains(errOut, `NOT_AUTHORIZED`) || !strings.Contains(errOut, `principal "app1" lacks produce:payments`) {
		t.Fatalf("app1 sending to payments: exit %d: %s", code, errOut)
	}

	mustCtl(t, append(admin, "acl", "grant", "app1", "--perm", "produce:payments", "--perm", "describe")...)
	testwait.For(t, 10*time.Second, "app1 to send to payments once granted", func() bool {
		code, _, _ := as(made.Token, "send", "payments", "--body", "yes")
		return code == exitOK
	})
	mustCtl(t, append(admin, "acl", "revoke", "app1", "--perm", "describe")...)
	var acl api.ACL
	if err := json.Unmarshal([]byte(mustCtl(t, append(admin, "--json", "acl", "list")...)), &acl); err != nil {
		t.Fatal(err)
	}
	if len(acl.Principals) != 1 || strings.Join(acl.Principals[0].Permissions, ",") != "produce:orders,produce:payments" ||
		acl.Principals[0].TokenSHA256 != auth.HashToken(made.Token).String() {
		t.Fatalf("acl list: %+v", acl)
	}

	var rotated tokenResult
	if err := json.Unmarshal([]byte(mustCtl(t, append(admin, "--json", "acl", "rotate", "app1")...)), &rotated); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = as(made.Token, "routes", "orders")
	if code != exitError || !strings.Contains(errOut, "token not recognised") {
		t.Fatalf("the old token after rotate: exit %d: %s", code, errOut)
	}
	if code, _, errOut := as(rotated.Token, "routes", "orders"); code != exitOK {
		t.Fatalf("the new token after rotate: exit %d: %s", code, errOut)
	}
	mustCtl(t, append(admin, "acl", "rm", "app1")...)
	if code, _, errOut := as(rotated.Token, "routes", "orders"); code != exitError || !strings.Contains(errOut, "token not recognised") {
		t.Fatalf("a removed principal: exit %d: %s", code, errOut)
	}
	if code, _, errOut := as("short", "topics"); code != exitUsage || !strings.Contains(errOut, "FERRY_TOKEN: a token must be") {
		t.Fatalf("a malformed FERRY_TOKEN: exit %d: %s", code, errOut)
	}
}

// rm and rotate say when the old credential stops working: at the
// metaservers from the next request, at the brokers about a heartbeat later.
func TestACLRemoveAndRotateHelpSayWhen(t *testing.T) {
	out := mustCtl(t, "acl", "--help")
	for _, cmd := range []string{"rm", "rotate"} {
		var line string
		for _, l := range strings.Split(out, "\n") {
			if f := strings.Fields(l); len(f) > 0 && f[0] == cmd {
				line = l
			}
		}
		if !strings.Contains(line, "by the metaservers from the next request on, by the brokers within about a heartbeat") {
			t.Errorf("acl %s's help %q does not say the brokers take about a heartbeat", cmd, line)
		}
	}
}
