package metaserver_test

import (
	"context"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
)

// Review of issue 31. The console's client for a certificate session calls
// with the cluster token and names the session's principal (ActAs); a body
// that is not a JSON object goes without the name (client.withActor), and
// the route handlers are not registered through handle, so a route lookup
// made for an actor is checked as the cluster: a principal that may not
// see a topic gets its route anyway (the console's own check is the only
// one left).
func TestReview31ActorRouteLookupCheckedAsActor(t *testing.T) {
	am := startAuthMeta(t, 1)
	ctx := context.Background()
	tok := auth.NewToken()
	if _, err := am.admin.SetPrincipal(ctx, api.ACLSetRequest{Name: "app", TokenSHA256: auth.HashToken(tok).String(),
		Permissions: []string{"produce:orders"}}); err != nil {
		t.Fatal(err)
	}
	asApp, err := client.New(client.Config{Addrs: am.Addrs(), Token: am.clusterTok, ActAs: "app"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = asApp.Close() })
	// As itself, app may not look up payments' route.
	_, err = am.principal(t, "app2", "produce:orders").RouteExisting(ctx, "payments")
	wantNotAuthorized(t, "a producer of orders looks up payments' route", err)
	// Acting for app, a route lookup (whose body has no room for an actor)
	// is not made as the cluster: the client refuses it.
	if _, err = asApp.RouteExisting(ctx, "payments"); err == nil || !strings.Contains(err.Error(), "cannot look routes up") {
		t.Fatalf("the cluster acting for a producer of orders looks up payments' route: %v, want the client's refusal", err)
	}
}

// Every server holds the cluster token, brokers too (docs/security.md:
// "every server holds it"). With act_as, the cluster may act for any
// registry principal, an admin one included: whoever holds a broker's
// cluster token (a broker host) acts as the registry's admins and gives
// itself admin for good. Before act_as the cluster token could not change
// the permission table. Acting should need a credential only the console
// holds (the metaservers'), not the one every broker has.
func TestReview31ClusterTokenActsAsAdmin(t *testing.T) {
	am := startAuthMeta(t, 1)
	ctx := context.Background()
	am.principal(t, "ops", "admin")
	asOps, err := client.New(client.Config{Addrs: am.Addrs(), Token: am.clusterTok, ActAs: "ops"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = asOps.Close() })
	_, err = asOps.SetPrincipal(ctx, api.ACLSetRequest{Name: "backdoor", TokenSHA256: auth.HashToken(auth.NewToken()).String(),
		Permissions: []string{"admin"}})
	wantNotAuthorized(t, "the cluster token (a broker's) acting for an admin principal sets a new admin", err)
}
