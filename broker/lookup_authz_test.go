package broker_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// TestLookupShowsOnlyWhatThePrincipalMayRead: LOOKUP shows a message to a
// principal that may consume its topic and counts it hidden for one that
// may consume only another; a pending delayed message is shown to its
// producers and describe, not to consumers of its topic (it is not theirs
// to read until it is due).
func TestLookupShowsOnlyWhatThePrincipalMayRead(t *testing.T) {
	ac := startAuthCluster(t)
	ctx := context.Background()
	for _, topic := range []string{"orders", "payments"} {
		if _, err := ac.admin.CreateTopic(ctx, api.CreateTopicRequest{Name: topic, Queues: 1, Groups: []string{"g1"}}); err != nil {
			t.Fatal(err)
		}
	}
	prodTok := ac.addPrincipal(t, "prod", "produce:orders", "consume:payments:*")
	p, err := producer.New(sdk.MetaAddrs(ac.MetaAddr()), sdk.Token(prodTok))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var now, later producer.Result
	testwait.For(t, 10*time.Second, "the brokers to know prod", func() bool {
		now, err = p.Send(ctx, &producer.Message{Topic: "orders", Key: "order-1", Body: []byte("now")})
		return err == nil
	})
	if later, err = p.Send(ctx, &producer.Message{Topic: "orders", Key: "order-1", Body: []byte("later"), DeliverAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	lookup := func(tok string, q protocol.LookupRequest) protocol.LookupReply {
		t.Helper()
		var reply protocol.LookupReply
		testwait.For(t, 10*time.Second, "an answer", func() bool {
			resp, err := ac.dial(t, tok).data.Call(ctx, protocol.CodeLookup, js(q))
			return err == nil && json.Unmarshal(resp.Body, &reply) == nil
		})
		return reply
	}
	at := func(r producer.Result) protocol.LookupRequest {
		return protocol.LookupRequest{Offset: &r.Handle.Offset}
	}
	for _, c := range []struct {
		who, tok   string
		now, later bool // shown
	}{
		{"a consumer of orders", ac.addPrincipal(t, "cons", "consume:orders:*"), true, false},
		{"a consumer of payments only", ac.addPrincipal(t, "other", "consume:payments:*"), false, false},
		{"describe and a consumer of payments", ac.addPrincipal(t, "desc", "describe", "consume:payments:*"), false, true},
		{"the producer (a consumer of payments)", prodTok, false, true},
	} {
		if r := lookup(c.tok, at(now)); (len(r.Messages) == 1) != c.now || !c.now && r.Hidden != 1 {
			t.Errorf("%s, the message: %d shown, %d hidden; want shown %v", c.who, len(r.Messages), r.Hidden, c.now)
		}
		if r := lookup(c.tok, at(later)); (len(r.Messages) == 1) != c.later || !c.later && r.Hidden != 1 {
			t.Errorf("%s, the pending delayed message: %d shown, %d hidden; want shown %v", c.who, len(r.Messages), r.Hidden, c.later)
		}
		if r := lookup(c.tok, protocol.LookupRequest{Key: "order-1"}); len(r.Messages)+r.Hidden != 2 {
			t.Errorf("%s, by key: %d shown, %d hidden; want the 2 counted", c.who, len(r.Messages), r.Hidden)
		}
	}
}
