package metaserver_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/protocol"
)

// auditOf lists the newest records of kind, through the wire.
func auditOf(t *testing.T, cl *client.Client, req api.AuditListRequest) api.AuditList {
	t.Helper()
	l, err := cl.AuditList(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A topic created by a principal shows in AUDIT_LIST, newest first, with
// the principal, the topic's name and the time; every node holds the same
// records; describe may list them, a producer may not; a page at a time.
func TestAuditListThroughTheWire(t *testing.T) {
	am := startAuthMeta(t, 3)
	ctx := context.Background()
	ops := am.principal(t, "ops", "admin")
	viewer := am.principal(t, "viewer", "describe")
	app := am.principal(t, "app", "produce:orders")
	before := time.Now().UnixMilli()
	if _, err := ops.CreateTopic(ctx, api.CreateTopicRequest{Name: "audited", Queues: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := ops.CreateTopic(ctx, api.CreateTopicRequest{Name: "audited-2", Queues: 1}); err != nil {
		t.Fatal(err)
	}
	l := auditOf(t, viewer, api.AuditListRequest{Kind: "create-topic", Limit: 1})
	if len(l.Records) != 1 || l.Next == 0 {
		t.Fatalf("first page: %+v", l)
	}
	r := l.Records[0]
	if r.Principal != "ops" || !r.Applied || !strings.Contains(r.Summary, `"audited-2"`) || r.AtMillis < before || r.AtMillis > time.Now().UnixMilli() {
		t.Fatalf("newest create-topic record: %+v", r)
	}
	l = auditOf(t, viewer, api.AuditListRequest{Kind: "create-topic", Limit: 1, Below: l.Next})
	if len(l.Records) != 1 || !strings.Contains(l.Records[0].Summary, `"audited"`) || l.Records[0].Index >= r.Index {
		t.Fatalf("second page: %+v", l)
	}
	// The principals the admin set are recorded too, without their hashes.
	l = auditOf(t, viewer, api.AuditListRequest{Kind: "set-principal", Principal: "admin"})
	if len(l.Records) != 3 || !strings.Contains(l.Records[0].Summary, `"app"`) {
		t.Fatalf("set-principal records: %+v", l)
	}
	_, err := app.AuditList(ctx, api.AuditListRequest{})
	wantNotAuthorized(t, "a producer lists the audit trail", err)
	for _, bad := range []api.AuditListRequest{{Limit: api.MaxAuditPage + 1}, {Limit: -1}, {Principal: strings.Repeat("p", 300)}} {
		if _, err := viewer.AuditList(ctx, bad); !errors.Is(err, protocol.ErrInvalid) {
			t.Fatalf("%+v: %v, want INVALID", bad, err)
		}
	}
	// Every node applies the same stamps.
	_, leader := am.Leader()
	want := leader.FSM().State().Audit
	for _, s := range am.Nodes {
		testwait.For(t, 10*time.Second, "node "+s.ID()+" to hold the leader's records", func() bool {
			a := s.FSM().State().Audit
			return len(a) >= len(want) && reflect.DeepEqual(a[:len(want)], want)
		})
	}
}

// The console acts for a certificate session with the cluster's token and
// names the person (client.Config.ActAs): the metaserver checks the request
// as that principal and stamps the record with it; nobody but the cluster
// may name one.
func TestAuditActor(t *testing.T) {
	am := startAuthMeta(t, 1)
	ctx := context.Background()
	token := func(name string, perms ...string) string {
		tok := auth.NewToken()
		if _, err := am.admin.SetPrincipal(ctx, api.ACLSetRequest{Name: name, TokenSHA256: auth.HashToken(tok).String(),
			Permissions: perms}); err != nil {
			t.Fatal(err)
		}
		return tok
	}
	token("viewer", "describe")
	opsTok := token("ops", "admin")
	appTok := token("app", "produce:orders")
	acting := func(token, actor string) *client.Client { // with the proof a metaserver's console makes
		cl, err := client.New(client.Config{Addrs: am.Addrs(), Token: token, ActAs: actor,
			ActProof: auth.ActorProof(testcluster.RaftSecret, actor)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Close() })
		return cl
	}
	asViewer := acting(am.clusterTok, "viewer")
	_, err := asViewer.CreateTopic(ctx, api.CreateTopicRequest{Name: "by-viewer", Queues: 1})
	wantNotAuthorized(t, "the cluster acting for a describe-only principal creates a topic", err)
	if _, ok := am.Nodes[0].FSM().Route("by-viewer"); ok {
		t.Fatal("the topic was created")
	}
	if _, err := asViewer.Topics(ctx); err != nil {
		t.Fatalf("acting for describe, listing topics: %v", err)
	}
	if _, err := acting(am.clusterTok, "ops").CreateTopic(ctx, api.CreateTopicRequest{Name: "by-ops", Queues: 1}); err != nil {
		t.Fatal(err)
	}
	l := auditOf(t, am.admin, api.AuditListRequest{Kind: "create-topic", Limit: 1})
	if len(l.Records) != 1 || l.Records[0].Principal != "ops" || l.Records[0].Via != "console" || !strings.Contains(l.Records[0].Summary, "by-ops") {
		t.Fatalf("record of the acted request: %+v", l.Records)
	}
	// Only the cluster may name an actor: not admin, not a producer; and
	// the actor must be a registry principal.
	_, err = acting(opsTok, "ops").CreateTopic(ctx, api.CreateTopicRequest{Name: "by-admin", Queues: 1})
	wantNotAuthorized(t, "admin naming an actor", err)
	_, err = acting(appTok, "ops").Topics(ctx)
	wantNotAuthorized(t, "a producer naming an actor", err)
	_, err = acting(am.clusterTok, "nobody").Topics(ctx)
	wantNotAuthorized(t, "the cluster acting for an unknown principal", err)
	_, err = acting(am.clusterTok, "admin").Topics(ctx)
	wantNotAuthorized(t, "the cluster acting for the built-in admin", err)
}

// The leader expires the records older than AuditRetention by its clock.
func TestAuditExpires(t *testing.T) {
	clk := fakeClock()
	m := testcluster.StartMeta(t, 1, func(c *metaserver.Config) {
		c.Clock, c.JudgeInterval, c.SessionTimeout, c.ConsumerSession = clk, 4*time.Minute, 5*time.Minute, 5*time.Minute
		c.AuditRetention = 2 * time.Hour
	})
	_, s := m.Leader()
	cl := m.Client(t)
	heartbeat(t, cl, "old", "master", nil) // a new group: a register-broker record
	judged(t, m, clk, s, time.Hour)
	heartbeat(t, cl, "new", "master", nil)
	groups := func() (out []string) {
		for _, r := range auditOf(t, cl, api.AuditListRequest{Kind: "register-broker"}).Records {
			out = append(out, r.Summary)
		}
		return out
	}
	if got := groups(); len(got) != 2 {
		t.Fatalf("after an hour: %v", got)
	}
	judged(t, m, clk, s, time.Hour+5*time.Minute)
	if got := groups(); len(got) != 1 || !strings.Contains(got[0], `"new"`) {
		t.Fatalf("after 2 hours 5 minutes: %v, want the newer group's only", got)
	}
	if cfg := (metaserver.Config{ID: "x", Dir: "d", RaftAddr: "a", RPCAddr: "b", AuditRetention: time.Minute}); cfg.Validate() == nil {
		t.Fatal("a retention of a minute validated")
	}
}

// The console's list of kinds is the registry's.
func TestAuditKindsListed(t *testing.T) {
	if !reflect.DeepEqual(api.AuditKinds, fsm.AuditKinds()) {
		t.Fatalf("api.AuditKinds %v, the registry's %v", api.AuditKinds, fsm.AuditKinds())
	}
}

// The records, stamps included, come back after a restart from a
// snapshot and the log after it.
func TestAuditSurvivesRestart(t *testing.T) {
	adminTok, clusterTok := auth.NewToken(), auth.NewToken()
	m := testcluster.StartMeta(t, 1, func(c *metaserver.Config) {
		c.SnapshotInterval, c.SnapshotThreshold = 20*time.Millisecond, 16
		c.ClusterToken = clusterTok
		c.Auth = auth.Builtins{Admin: auth.HashToken(adminTok), Cluster: auth.HashToken(clusterTok)}
	})
	ctx := context.Background()
	cl, err := client.New(client.Config{Addrs: m.Addrs(), Token: adminTok})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	set := func(name string) {
		if _, err := cl.SetPrincipal(ctx, api.ACLSetRequest{Name: name, Permissions: []string{"describe"}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		set("filler" + string(rune('a'+i)))
	}
	_, s := m.Leader()
	held := s.FSM().AuditLen()
	testwait.For(t, 10*time.Second, "a snapshot", func() bool { return snapshotIndex(m.Cfgs[0].Dir) > 0 })
	set("after-the-snapshot")
	want := s.FSM().State().Audit
	if len(want) != held+1 || want[len(want)-1].Principal != "admin" {
		t.Fatalf("records before the restart: %d, want %d, the last by admin: %+v", len(want), held+1, want[len(want)-1])
	}
	m.StopAll()
	m.Restart(0)
	_, s = m.Leader()
	testwait.For(t, 10*time.Second, "the restarted node to hold the records", func() bool {
		a := s.FSM().State().Audit
		return len(a) >= len(want) && reflect.DeepEqual(a[:len(want)], want)
	})
}
