package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/consumer"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// TestMemberBoundThroughProcesses: the local cluster with FERRY_AUTH=1
// (real processes). alice and mallory may both consume orders in group
// billing; alice's consumer runs as member a1. mallory, with her own
// token, cannot commit offsets as a1, heartbeat as it or make it leave:
// each is NOT_AUTHORIZED and the group is as before (a1 alice's, its
// offsets hers); alice's consumer goes on.
func TestMemberBoundThroughProcesses(t *testing.T) {
	c := startLocalCluster(t, "FERRY_AUTH=1")
	adminFile := filepath.Join(c.home, "auth", "admin.token")
	if code, _, errOut := c.ctlExit("topic", "create", "orders", "--queues", "2", "--token-file", adminFile); code != 0 {
		t.Fatalf("topic create: exit %d: %s", code, errOut)
	}
	principal := func(name string) string {
		code, out, errOut := c.ctlExit("--json", "acl", "add", name, "--perm", "consume:orders:billing", "--token-file", adminFile)
		var made struct{ Token string }
		if code != 0 || json.Unmarshal([]byte(out), &made) != nil || made.Token == "" {
			t.Fatalf("acl add %s: exit %d: %s%s", name, code, out, errOut)
		}
		return made.Token
	}
	aliceTok, malloryTok := principal("alice"), principal("mallory")
	if code, _, errOut := c.ctlExit("send", "orders", "--body", "hello", "--key", "k", "--token-file", adminFile); code != 0 {
		t.Fatalf("send: exit %d: %s", code, errOut)
	}
	metaAddrs := strings.Split(c.meta, ",")
	adminTok, err := os.ReadFile(adminFile)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(token string) *client.Client {
		cl, err := client.New(client.Config{Addrs: metaAddrs, Token: token})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Close() })
		return cl
	}
	admin, mallory := dial(strings.TrimSpace(string(adminTok))), dial(malloryTok)

	// alice's member a1 consumes the message (and commits past it).
	cons, err := consumer.New("billing", []string{"orders"}, sdk.MetaAddrs(metaAddrs...), sdk.Token(aliceTok),
		consumer.MemberID("a1"), consumer.StartFrom(consumer.Earliest))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	runDone := make(chan error, 1)
	go func() {
		runDone <- cons.Run(context.Background(), func(_ context.Context, m *consumer.Message) error {
			select {
			case got <- string(m.Body):
			default:
			}
			return nil
		})
	}()
	select {
	case body := <-got:
		if body != "hello" {
			t.Fatalf("alice's a1 handled %q, want hello", body)
		}
	case err := <-runDone:
		t.Fatalf("alice's consumer ended: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("alice's a1 handled nothing in 30 s")
	}
	ctx := context.Background()
	describe := func() api.ConsumerGroupInfo {
		t.Helper()
		gs, err := admin.ConsumerGroups(ctx, "billing")
		if err != nil || len(gs) != 1 {
			t.Fatalf("describe billing: %+v %v", gs, err)
		}
		return gs[0]
	}
	var before api.ConsumerGroupInfo
	testwait.For(t, 30*time.Second, "a1 alone to hold both queues of billing", func() bool {
		before = describe()
		return len(before.Members) == 1 && before.Members[0].ID == "a1" && len(before.Members[0].Queues) == 2
	})

	refused := func(what string, err error) {
		t.Helper()
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Status != protocol.StatusNotAuthorized || !strings.Contains(pe.Message, `member "a1"`) {
			t.Fatalf("mallory %s: %v, want NOT_AUTHORIZED naming member a1", what, err)
		}
	}
	var offsets []api.QueueOffset
	for _, q := range before.Members[0].Queues {
		offsets = append(offsets, api.QueueOffset{Topic: q.Topic, Queue: q.Queue, Offset: 999})
	}
	for _, inc := range []uint64{0, 1} {
		_, err = mallory.CommitOffsets(ctx, api.CommitRequest{Group: "billing", Member: "a1", Generation: before.Generation,
			Incarnation: inc, Offsets: offsets})
		refused("commits as a1", err)
	}
	_, err = mallory.ConsumerHeartbeat(ctx, api.ConsumerHeartbeat{Group: "billing", Member: "a1", Topics: []string{"orders"}, Incarnation: 1 << 40})
	refused("heartbeats as a newer a1", err)
	_, err = mallory.ConsumerHeartbeat(ctx, api.ConsumerHeartbeat{Group: "billing", Member: "a1", Leave: true})
	refused("makes a1 leave", err)

	after := describe()
	if len(after.Members) != 1 || after.Members[0].ID != "a1" || after.Generation != before.Generation {
		t.Fatalf("billing changed on mallory's refused requests:\nbefore %+v\nafter  %+v", before, after)
	}
	for _, o := range after.Offsets {
		if o.Offset == 999 {
			t.Fatalf("mallory's offset was committed: %+v", after.Offsets)
		}
	}
	select {
	case err := <-runDone:
		t.Fatalf("alice's consumer ended after mallory's requests: %v", err)
	default:
	}
	if err := cons.Close(); err != nil {
		t.Errorf("Close of alice's consumer: %v", err)
	}
	if err := <-runDone; err != nil {
		t.Errorf("Run of alice's consumer after Close: %v", err)
	}
}
