package broker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
)

// TestBrokerTokenChecksAskTheRegistry: the broker's copy of the table has
// no token hash it was not presented (ACL_GET gives none); it asks the
// registry whose a presented token is, so a principal's token, the
// bootstrap admin's and a token shown to Broker.Authenticate (the HTTP
// port's check) are taken at once; a rotated token is refused on the
// connection that presented it within a second of the rotation, and the
// new one taken.
func TestBrokerTokenChecksAskTheRegistry(t *testing.T) {
	ac := startAuthCluster(t)
	ctx := context.Background()
	if _, err := ac.admin.CreateTopic(ctx, api.CreateTopicRequest{Name: "orders", Queues: 1, Groups: []string{"g1"}}); err != nil {
		t.Fatal(err)
	}
	reqs := requests()
	tok := ac.addPrincipal(t, "app1", "produce:orders")
	old := ac.dial(t, tok)
	if err := call(old, protocol.CodeSend, reqs[protocol.CodeSend], ""); err != nil {
		t.Fatalf("app1's SEND at the broker: %v", err)
	}
	if err := call(ac.dial(t, ac.adminTok), protocol.CodeSend, reqs[protocol.CodeSend], ""); err != nil {
		t.Fatalf("the bootstrap admin's SEND at the broker: %v", err)
	}
	ops := ac.addPrincipal(t, "ops", "describe")
	p, ok, err := ac.Master("g1").Authenticate(ctx, ops)
	if err != nil || !ok || p.Name != "ops" {
		t.Fatalf("Authenticate of a token not presented before: %+v %v %v, want ops", p, ok, err)
	}
	if _, ok, err := ac.Master("g1").Authenticate(ctx, auth.NewToken()); ok || err != nil {
		t.Fatalf("Authenticate of an unknown token: %v %v, want not found", ok, err)
	}

	// Rotate app1's token.
	rotated := auth.NewToken()
	if _, err := ac.admin.SetPrincipal(ctx, api.ACLSetRequest{Name: "app1", TokenSHA256: auth.HashToken(rotated).String(),
		Permissions: []string{"produce:orders"}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	testwait.For(t, 10*time.Second, "the broker to refuse app1's old token", func() bool {
		err := call(old, protocol.CodeSend, reqs[protocol.CodeSend], "")
		return errors.Is(err, protocol.ErrNotAuthorized) && strings.Contains(err.Error(), "token not recognised")
	})
	if took := time.Since(start); took > time.Second {
		t.Fatalf("the broker took %v to refuse a rotated token, want under 1 s", took)
	} else {
		t.Logf("a rotated token refused at the broker %v after the rotation", took.Round(time.Millisecond))
	}
	if err := call(ac.dial(t, rotated), protocol.CodeSend, reqs[protocol.CodeSend], ""); err != nil {
		t.Fatalf("app1's new token at the broker: %v", err)
	}
}
