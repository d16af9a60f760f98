package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
)

// authServer serves AUTH, taking only the tokens known returns true for,
// and ADMIN_TOPICS.
func authServer(t *testing.T, known func(token string) bool) string {
	t.Helper()
	srv := transport.NewServer(transport.ServerConfig{Gate: auth.NewGate(auth.GateConfig{})})
	srv.Handle(protocol.CodeAuth, func(r *transport.Request) {
		if !known(string(r.Body)) {
			r.ReplyError(&protocol.Error{Status: protocol.StatusNotAuthorized, Message: "token not recognised"})
			return
		}
		r.Authenticate()
		_ = r.Reply(protocol.AppendAuthReply(nil, &protocol.AuthReply{Principal: "alice"}))
	})
	srv.Handle(protocol.CodeAdminTopics, func(r *transport.Request) { _ = r.Reply([]byte("[]")) })
	bound, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return bound.String()
}

// TestNewTokenAtANodeBehind: a metaserver that has not yet applied a new
// principal refuses its token; the client asks the other nodes (the
// leader, which applied it before acl add returned, among them) rather
// than failing, so a token works at once after `ferryctl acl add`. A token
// every node refuses fails with NOT_AUTHORIZED as soon as each has said
// so, without waiting out the call.
func TestNewTokenAtANodeBehind(t *testing.T) {
	tok := auth.NewToken()
	behind := authServer(t, func(string) bool { return false })
	leader := authServer(t, func(s string) bool { return s == tok })

	cl, err := client.New(client.Config{Addrs: []string{behind, leader}, Token: tok, CallTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Topics(context.Background()); err != nil {
		t.Fatalf("a token the node behind does not know yet: %v", err)
	}

	wrong, err := client.New(client.Config{Addrs: []string{behind, leader}, Token: auth.NewToken(), CallTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = wrong.Topics(ctx)
	var le *transport.LoginError
	if !errors.Is(err, protocol.ErrNotAuthorized) || !errors.As(err, &le) || ctx.Err() != nil {
		t.Fatalf("a token no node knows: %v (context: %v); want NOT_AUTHORIZED once every node refused it", err, ctx.Err())
	}
}
