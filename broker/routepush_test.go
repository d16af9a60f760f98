package broker_test

import (
	"context"
	"fmt"
	"testing"

	tc "github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// A topic is writable as soon as its creation is answered: a SEND to any
// of its queues, right after, is stored by the queue's master, whose route
// cache never looked the topic up (the leader pushed it before answering).
// The same holds for queues added to a topic, and for a topic auto-created
// by a route lookup. The creations go through a metaserver follower, which
// forwards them to the leader.
func TestNewTopicIsWritableAtOnce(t *testing.T) {
	meta := tc.StartMeta(t, 3, func(c *metaserver.Config) { c.DefaultQueues = 6 })
	groups := map[string]*tc.Group{
		"g1": tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{}),
		"g2": tc.StartGroup(t, meta.Addrs(), "g2", tc.GroupOpts{}),
	}
	leader, _ := meta.Leader()
	follower, err := client.New(client.Config{Addrs: []string{meta.Addrs()[(leader+1)%3]}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = follower.Close() })
	conns := map[string]*transport.Client{}
	for name, g := range groups {
		conns[name] = tc.Dial(t, g.Master.Addr())
	}
	ctx := context.Background()

	// sendEach sends one message to each of queues of route at once, each
	// to its group's master, and checks that every one was stored.
	sendEach := func(t *testing.T, route routing.Route, from int) {
		t.Helper()
		batches := map[string][]protocol.Message{}
		for _, q := range route.Queues[from:] {
			batches[q.Group] = append(batches[q.Group], tc.Msg(route.Topic, q.Queue, protocol.Normal, fmt.Sprint("to ", q.Queue)))
		}
		if len(batches) != 2 {
			t.Fatalf("the queues are not on both groups: %+v", route.Queues[from:])
		}
		noRoute := 0
		for group, msgs := range batches {
			for i, r := range tc.Send(t, conns[group], msgs) {
				if r.Status == protocol.StatusNoRoute {
					noRoute++
				}
				if r.Status != protocol.StatusOK {
					t.Errorf("%s/%d on %s: %v", route.Topic, msgs[i].Queue, group, r.Status)
				}
			}
		}
		if noRoute > 0 {
			t.Fatalf("%d of %d messages answered NO_ROUTE", noRoute, len(route.Queues)-from)
		}
	}

	t.Run("create", func(t *testing.T) {
		route, err := follower.CreateTopic(ctx, api.CreateTopicRequest{Name: "created", Queues: 8})
		if err != nil {
			t.Fatal(err)
		}
		sendEach(t, route, 0)
	})
	t.Run("add queues", func(t *testing.T) {
		before, err := follower.CreateTopic(ctx, api.CreateTopicRequest{Name: "grown", Queues: 2})
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range before.Queues { // the brokers hold a route of the topic's first two queues
			warmRoute(t, conns[q.Group], "grown", q.Queue)
		}
		after, err := follower.AddQueues(ctx, "grown", 6)
		if err != nil {
			t.Fatal(err)
		}
		sendEach(t, after, len(before.Queues))
	})
	t.Run("auto-created by a route lookup", func(t *testing.T) {
		route, err := follower.Route(ctx, "looked-up")
		if err != nil {
			t.Fatal(err)
		}
		if len(route.Queues) != 6 {
			t.Fatalf("auto-created with %d queues, want the default 6", len(route.Queues))
		}
		sendEach(t, route, 0)
	})
}
