package metaserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// Within permissions: what one principal may do is not what another's
// members, groups or tokens are.

// authMeta is an n-node registry with authorization on, a broker group
// (heartbeating with the cluster token) and the topics "orders" and
// "payments" of two queues each.
type authMeta struct {
	*testcluster.Meta
	clusterTok string
	admin      *client.Client
}

func startAuthMeta(t *testing.T, n int) *authMeta {
	t.Helper()
	am := &authMeta{clusterTok: auth.NewToken()}
	adminTok := auth.NewToken()
	am.Meta = testcluster.StartMeta(t, n, func(c *metaserver.Config) {
		c.ClusterToken = am.clusterTok
		c.Auth = auth.Builtins{Admin: auth.HashToken(adminTok), Cluster: auth.HashToken(am.clusterTok)}
	})
	am.admin = am.dial(t, adminTok)
	heartbeat(t, am.dial(t, am.clusterTok), "g1", routing.RoleMaster, nil)
	for _, topic := range []string{"orders", "payments"} {
		if _, err := am.admin.CreateTopic(context.Background(), api.CreateTopicRequest{Name: topic, Queues: 2}); err != nil {
			t.Fatal(err)
		}
	}
	return am
}

func (am *authMeta) dial(t *testing.T, token string) *client.Client {
	t.Helper()
	cl, err := client.New(client.Config{Addrs: am.Addrs(), Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// principal makes a principal with perms and returns a client that
// authenticates as it.
func (am *authMeta) principal(t *testing.T, name string, perms ...string) *client.Client {
	t.Helper()
	tok := auth.NewToken()
	if _, err := am.admin.SetPrincipal(context.Background(), api.ACLSetRequest{Name: name, TokenSHA256: auth.HashToken(tok).String(),
		Permissions: perms}); err != nil {
		t.Fatal(err)
	}
	return am.dial(t, tok)
}

func wantNotAuthorized(t *testing.T, what string, err error) {
	t.Helper()
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Status != protocol.StatusNotAuthorized {
		t.Fatalf("%s: %v, want NOT_AUTHORIZED", what, err)
	}
}

// TestMemberBoundToPrincipal: a member id is bound to the principal that
// joined it, in the registry (it holds across a leader change): another
// principal allowed the same group cannot heartbeat, commit, release or
// leave as it, in either kind of group, and nothing of its attempts is
// recorded; the member's own principal can; once the member left, its id
// is free.
func TestMemberBoundToPrincipal(t *testing.T) {
	am := startAuthMeta(t, 3)
	ctx := context.Background()
	alice := am.principal(t, "alice", "consume:orders:billing*")
	mallory := am.principal(t, "mallory", "consume:orders:billing*")

	// An eager group (members name no incarnation) and a cooperative one.
	for _, tc := range []struct {
		group string
		inc   uint64
	}{{"billing", 0}, {"billing-coop", 1}} {
		hb := api.ConsumerHeartbeat{Group: tc.group, Member: "a1", Topics: []string{"orders"}, Incarnation: tc.inc}
		var joined api.ConsumerHeartbeatReply
		// A cooperative group assigns once its join window closed.
		testwait.For(t, 10*time.Second, "alice's a1 to hold both queues of "+tc.group, func() bool {
			var err error
			if joined, err = alice.ConsumerHeartbeat(ctx, hb); err != nil {
				t.Fatalf("%s: alice joins as a1: %v", tc.group, err)
			}
			return len(joined.Assignment) == 2
		})
		if tc.inc == 0 {
			// The eager group's first commit by its member.
			if _, err := alice.CommitOffsets(ctx, api.CommitRequest{Group: tc.group, Member: "a1", Generation: joined.Generation,
				Offsets: offsetsOf(joined, 5)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The binding is the registry's: a new leader keeps it.
	i, _ := am.Leader()
	am.Stop(i)
	am.Leader()

	for _, tc := range []struct {
		group string
		inc   uint64
	}{{"billing", 0}, {"billing-coop", 1}} {
		before := describe(t, am.admin, tc.group)
		hb := api.ConsumerHeartbeat{Group: tc.group, Member: "a1", Topics: []string{"orders"}, Incarnation: tc.inc}
		_, err := mallory.ConsumerHeartbeat(ctx, hb)
		wantNotAuthorized(t, tc.group+": mallory heartbeats as alice's a1", err)
		if !strings.Contains(err.Error(), `member "a1"`) {
			t.Fatalf("the refusal does not name the member: %v", err)
		}
		newer := hb
		newer.Incarnation = tc.inc + 1 // a newer incarnation would replace alice's
		_, err = mallory.ConsumerHeartbeat(ctx, newer)
		wantNotAuthorized(t, tc.group+": mallory joins a newer a1", err)
		commit := api.CommitRequest{Group: tc.group, Member: "a1", Generation: before.Generation, Incarnation: tc.inc,
			Offsets: []api.QueueOffset{{Topic: "orders", Queue: 0, Offset: 999}, {Topic: "orders", Queue: 1, Offset: 999}}}
		_, err = mallory.CommitOffsets(ctx, commit)
		wantNotAuthorized(t, tc.group+": mallory commits as a1", err)
		released := hb
		released.Released = []api.QueueRef{{Topic: "orders", Queue: 0}}
		if tc.inc != 0 {
			_, err = mallory.ConsumerHeartbeat(ctx, released)
			wantNotAuthorized(t, tc.group+": mallory releases a1's queue", err)
		}
		leave := hb
		leave.Leave = true
		_, err = mallory.ConsumerHeartbeat(ctx, leave)
		wantNotAuthorized(t, tc.group+": mallory makes a1 leave", err)

		after := describe(t, am.admin, tc.group)
		if mustJSON(t, ages(before)) != mustJSON(t, ages(after)) {
			t.Fatalf("%s changed on refused requests:\nbefore %+v\nafter  %+v", tc.group, before, after)
		}

		// Alice still acts as her member.
		if _, err := alice.CommitOffsets(ctx, api.CommitRequest{Group: tc.group, Member: "a1", Generation: after.Generation,
			Incarnation: tc.inc, Offsets: []api.QueueOffset{{Topic: "orders", Queue: 0, Offset: 7}}}); err != nil {
			t.Fatalf("%s: alice commits as a1: %v", tc.group, err)
		}
		if _, err := alice.ConsumerHeartbeat(ctx, leave); err != nil {
			t.Fatalf("%s: alice leaves: %v", tc.group, err)
		}
		// Gone, the id is free.
		if _, err := mallory.ConsumerHeartbeat(ctx, hb); err != nil {
			t.Fatalf("%s: mallory joins as a1 once alice's a1 left: %v", tc.group, err)
		}
		_, err = alice.ConsumerHeartbeat(ctx, hb)
		wantNotAuthorized(t, tc.group+": alice heartbeats as mallory's a1", err)
	}
}

// TestConsumerGroupsShowsOnlyDescribableTopics: CONSUMER_GROUPS answers a
// consumer of a group with the topics it may consume in that group only
// (the group's topics, offsets and members); describe sees everything.
func TestConsumerGroupsShowsOnlyDescribableTopics(t *testing.T) {
	am := startAuthMeta(t, 1)
	ctx := context.Background()
	both := am.principal(t, "both", "consume:*:billing")
	orders := am.principal(t, "orders-only", "consume:orders:billing")
	describer := am.principal(t, "ops", "describe")

	hb := func(member string, topics ...string) api.ConsumerHeartbeatReply {
		r, err := both.ConsumerHeartbeat(ctx, api.ConsumerHeartbeat{Group: "billing", Member: member, Topics: topics})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	hb("m-both", "orders", "payments")
	hb("m-payments", "payments")
	r := hb("m-both", "orders", "payments")
	if _, err := both.CommitOffsets(ctx, api.CommitRequest{Group: "billing", Member: "m-both", Generation: r.Generation,
		Offsets: offsetsOf(r, 3)}); err != nil {
		t.Fatal(err)
	}

	topicsIn := func(gi api.ConsumerGroupInfo) []string {
		seen := map[string]bool{}
		for _, tp := range gi.Topics {
			seen[tp] = true
		}
		for _, o := range gi.Offsets {
			seen[o.Topic] = true
		}
		for _, m := range gi.Members {
			for _, tp := range m.Topics {
				seen[tp] = true
			}
			for _, q := range m.Queues {
				seen[q.Topic] = true
			}
		}
		return slices.Sorted(maps.Keys(seen))
	}
	full := describe(t, describer, "billing")
	if got := topicsIn(full); !slices.Equal(got, []string{"orders", "payments"}) || len(full.Members) != 2 {
		t.Fatalf("describe sees topics %v and %d members, want orders and payments, 2 members: %+v", got, len(full.Members), full)
	}
	cut := describe(t, orders, "billing")
	if got := topicsIn(cut); !slices.Equal(got, []string{"orders"}) {
		t.Fatalf("consume:orders:billing sees topics %v of billing, want orders only: %+v", got, cut)
	}
	if len(cut.Members) != 1 || cut.Members[0].ID != "m-both" || len(cut.Offsets) != 2 {
		t.Fatalf("consume:orders:billing sees %+v, want m-both (its orders part) and the 2 orders offsets", cut)
	}
	// Every group (no group named) stays describe's.
	_, err := orders.ConsumerGroups(ctx, "")
	wantNotAuthorized(t, "consume:orders:billing lists every group", err)
}

// TestACLGetGivesNoTokenHashes: ACL_GET, which the cluster principal (every
// broker's) may make, gives the principals' names and permissions but no
// token hash; of the hashes asked it says whose each is, and nothing of
// those it was not asked about. ADMIN_ACL_LIST stays admin's.
func TestACLGetGivesNoTokenHashes(t *testing.T) {
	am := startAuthMeta(t, 1)
	ctx := context.Background()
	aliceTok, bobTok := auth.NewToken(), auth.NewToken()
	for name, tok := range map[string]string{"alice": aliceTok, "bob": bobTok} {
		if _, err := am.admin.SetPrincipal(ctx, api.ACLSetRequest{Name: name, TokenSHA256: auth.HashToken(tok).String(),
			Permissions: []string{"produce:orders"}}); err != nil {
			t.Fatal(err)
		}
	}
	cluster := am.dial(t, am.clusterTok)
	acl, err := cluster.ClusterACL(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(acl.Principals) != 2 || len(acl.Tokens) != 0 || acl.AdminSHA256 != "" {
		t.Fatalf("ACL_GET asking about nothing: %+v, want 2 principals, no token", acl)
	}
	for _, p := range acl.Principals {
		if p.TokenSHA256 != "" || !slices.Equal(p.Permissions, []string{"produce:orders"}) {
			t.Fatalf("ACL_GET gives principal %+v, want its permissions without its token hash", p)
		}
	}
	stranger := auth.HashToken(auth.NewToken()).String()
	acl, err = cluster.ClusterACL(ctx, []string{auth.HashToken(aliceTok).String(), stranger})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{auth.HashToken(aliceTok).String(): "alice"}; !maps.Equal(acl.Tokens, want) {
		t.Fatalf("ACL_GET asking about alice's token and an unknown one: tokens %v, want %v", acl.Tokens, want)
	}
	if strings.Contains(mustJSON(t, acl), auth.HashToken(bobTok).String()) {
		t.Fatalf("ACL_GET's answer holds bob's hash, which it was not asked about: %s", mustJSON(t, acl))
	}
	_, err = cluster.ACL(ctx)
	wantNotAuthorized(t, "the cluster lists the ACL (with hashes)", err)
	_, err = cluster.ClusterACL(ctx, []string{"not hex"})
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Status != protocol.StatusInvalid {
		t.Fatalf("ACL_GET of a bad hash: %v, want INVALID", err)
	}
}

// ages is gi without its members' heartbeat ages (which move by themselves).
func ages(gi api.ConsumerGroupInfo) api.ConsumerGroupInfo {
	gi.Members = slices.Clone(gi.Members)
	for i := range gi.Members {
		gi.Members[i].HeartbeatAgeMillis = 0
	}
	return gi
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
