package metaserver_test

import (
	"context"
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
	_, err = asApp.RouteExisting(ctx, "payments")
	wantNotAuthorized(t, "the cluster acting for a producer of orders looks up payments' route", err)
}
