package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/consumer"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// TestErrorsSayTheirCauseOnce: the errors an operator meets most, through
// the real SDKs and client against a cluster of three metaserver nodes (so
// that a follower forwards to the leader), name their status exactly once
// and still match its sentinel: an unknown topic sent to, routed and read,
// an unknown consumer group, a topic that exists, a refused name.
func TestErrorsSayTheirCauseOnce(t *testing.T) {
	m := testcluster.StartMeta(t, 3, func(c *metaserver.Config) {
		testcluster.SteadyMeta(c)
		c.AutoCreateTopics = false
	})
	testcluster.StartGroup(t, m.Addrs(), "g1", testcluster.GroupOpts{Edit: testcluster.SteadyBroker})
	m.CreateTopic(t, "orders", "g1")
	ctx := context.Background()
	cl := m.Client(t)

	p, err := producer.New(sdk.MetaAddrs(m.Addrs()...), producer.DeliveryTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cons, err := consumer.New("billing", []string{"nope"}, sdk.MetaAddrs(m.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()

	type check struct {
		name   string
		err    error
		status *protocol.Error
		says   string
	}
	var checks []check
	add := func(name string, err error, status *protocol.Error, says string) {
		checks = append(checks, check{name, err, status, says})
	}
	_, err = p.Send(ctx, &producer.Message{Topic: "nope", Body: []byte("x")})
	add("send to an unknown topic", err, protocol.ErrUnknownTopic, `topic "nope" does not exist`)
	for i, addr := range m.Addrs() { // the leader and the followers
		one := newClient(t, 10*time.Second, addr)
		_, err = one.RouteExisting(ctx, "nope")
		add("routes of an unknown topic, node "+string(rune('1'+i)), err, protocol.ErrUnknownTopic, `topic "nope" does not exist`)
	}
	_, err = cl.Route(ctx, "nope")
	add("route lookup of an unknown topic", err, protocol.ErrUnknownTopic, `topic "nope" does not exist`)
	_, err = cons.Poll(ctx)
	add("read an unknown topic", err, protocol.ErrUnknownTopic, `topic "nope" does not exist`)
	_, err = cl.ConsumerGroups(ctx, "nogroup")
	add("describe an unknown consumer group", err, protocol.ErrNotFound, `consumer group "nogroup" does not exist`)
	_, err = cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "orders", Queues: 1})
	add("create a topic that exists", err, protocol.ErrConflict, `topic "orders" already exists`)
	_, err = cl.AddQueues(ctx, "nope", 1)
	add("add queues to an unknown topic", err, protocol.ErrUnknownTopic, `topic "nope" does not exist`)
	_, err = cl.SetGroupReadOnly(ctx, "nog", true)
	add("mark an unknown broker group read-only", err, protocol.ErrNotFound, `broker group "nog" does not exist`)
	_, err = cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "主题-ü", Queues: 1})
	add("create a topic of a refused name", err, protocol.ErrInvalid, `topic name "主题-ü": character '主' (U+4E3B) at position 1 is not allowed`)
	_, err = p.Send(ctx, &producer.Message{Topic: "主题-ü", Body: []byte("x")})
	add("send to a refused name", err, protocol.ErrInvalid, `character '主' (U+4E3B) at position 1`)

	for _, c := range checks {
		if c.err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		msg := c.err.Error()
		if !errors.Is(c.err, c.status) {
			t.Errorf("%s: %q does not match %v", c.name, msg, c.status.Status)
		}
		if n := strings.Count(msg, c.status.Status.String()); n != 1 {
			t.Errorf("%s: %q names %v %d times", c.name, msg, c.status.Status, n)
		}
		for _, layer := range []string{"ferrymq: ", "producer: ", "consumer: "} {
			if n := strings.Count(msg, layer); n > 1 || layer == "ferrymq: " && n != 1 {
				t.Errorf("%s: %q says %q %d times", c.name, msg, layer, n)
			}
		}
		if !strings.Contains(msg, c.says) {
			t.Errorf("%s: %q does not say %q", c.name, msg, c.says)
		}
		t.Logf("%s: %s", c.name, msg)
	}
}

// TestNamesNotUTF8: a name that is not UTF-8 is refused by the client,
// saying so, before JSON would turn its bytes into U+FFFD.
func TestNamesNotUTF8(t *testing.T) {
	cl := newClient(t, time.Second, closedAddr(t)) // never reached
	ctx := context.Background()
	_, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "orders-\xfc", Queues: 1})
	if want := `ferrymq: INVALID: topic name "orders-\xfc" is not valid UTF-8 (at character 8, byte 0xfc)`; err == nil || err.Error() != want {
		t.Errorf("create: %v, want %s", err, want)
	}
	_, err = cl.InitProducer(ctx, "bill\xc3")
	if !errors.Is(err, protocol.ErrInvalid) || !strings.Contains(err.Error(), `producer name "bill\xc3" is not valid UTF-8`) {
		t.Errorf("init producer: %v", err)
	}
	_, err = cl.ConsumerHeartbeat(ctx, api.ConsumerHeartbeat{Group: "ok", Member: "m\xff", Topics: []string{"orders"}})
	if !errors.Is(err, protocol.ErrInvalid) || !strings.Contains(err.Error(), `member name "m\xff" is not valid UTF-8`) {
		t.Errorf("consumer heartbeat: %v", err)
	}
}
