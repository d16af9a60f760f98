package metaserver

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testtls"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// On a 3-node cluster over TLS, a follower forwards what it cannot answer
// to the leader over TLS: an auto-created topic's creation, and the lookup
// of a topic it does not know (only the leader's "unknown" is the
// cluster's; without TLS on that link the follower answers a handshake
// failure instead).
func TestFollowerForwardsOverTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testtls.CA(t, dir)
	var cfgs []Config
	for _, id := range []string{"m1", "m2", "m3"} {
		cfg := tlsNodeConfig(t, id, nodeTLS(t, ca, id, dir))
		cfg.AutoCreateTopics, cfg.DefaultQueues = true, 2
		cfgs = append(cfgs, cfg)
	}
	nodes := startNodes(t, cfgs...)
	var follower *Server
	testwait.For(t, 20*time.Second, "a leader, and a follower that knows it", func() bool {
		for _, s := range nodes {
			if l := s.leaderRPC(); !s.IsLeader() && l != "" && l != s.addr {
				follower = s
				return true
			}
		}
		return false
	})

	clientTLS := nodeTLS(t, ca, "admin", dir).client
	all := make([]string, len(nodes))
	for i, s := range nodes {
		all[i] = s.RPCAddr()
	}
	newClient := func(addrs ...string) *client.Client {
		cl, err := client.New(client.Config{Addrs: addrs, Transport: transport.ClientConfig{TLS: clientTLS}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Close() })
		return cl
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// A writable group, so that a topic can be created.
	if _, err := newClient(all...).Heartbeat(ctx, api.Heartbeat{Group: "g1", Role: routing.RoleMaster, BrokerID: "g1-master",
		Addr: "127.0.0.1:1", HAAddr: "127.0.0.1:2"}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, "the follower to apply g1", func() bool {
		g, ok := follower.FSM().Group("g1")
		return ok && g.Writable()
	})

	// Straight to the follower (a client would go to the leader it knows).
	raw := transport.NewClient(follower.RPCAddr(), transport.ClientConfig{TLS: clientTLS})
	defer raw.Close()
	// A lookup that never creates: the follower does not know the topic and
	// asks the leader, whose answer is UNKNOWN_TOPIC.
	_, err := raw.Call(ctx, protocol.CodeRouteGet, []byte("nowhere"))
	if !errors.Is(err, protocol.ErrUnknownTopic) {
		t.Fatalf("a follower's lookup of an unknown topic, forwarded to the leader: got %v, want UNKNOWN_TOPIC", err)
	}
	// A route lookup with auto-create: the follower has the leader create it.
	resp, err := raw.Call(ctx, protocol.CodeRouteLookup, []byte("auto"))
	if err != nil {
		t.Fatalf("auto-create through a follower over TLS: %v", err)
	}
	if r, err := routing.DecodeRoute(resp.Body); err != nil || len(r.Queues) != 2 {
		t.Fatalf("auto-create through a follower over TLS: %+v, %v", r, err)
	}
}
