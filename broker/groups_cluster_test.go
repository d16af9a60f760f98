package broker_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/sdk"
)

// With -admit-groups=manual a group that registers (a broker started with
// a mistyped -group) works but gets no queue until an admin admits it; a
// dead group is retired: its queues move, keeping their numbers, to the
// other group, whose broker continues each at the end the registry heard
// (so offsets only grow), consumer groups keep their committed offsets and
// lose the old group's epoch, and the retired group's brokers are refused.
func TestAdmitAndRetireGroups(t *testing.T) {
	m := testcluster.StartMeta(t, 1, func(c *metaserver.Config) {
		testcluster.SteadyMeta(c)
		c.AdmitGroups = metaserver.AdmitManual
	})
	mc := m.Client(t)
	ctx := context.Background()
	steady := testcluster.GroupOpts{Edit: testcluster.SteadyBroker}
	g1 := testcluster.StartGroup(t, m.Addrs(), "g1", steady)
	g2 := testcluster.StartGroup(t, m.Addrs(), "g2", steady)
	testcluster.StartGroup(t, m.Addrs(), "gtypo", steady)
	for _, name := range []string{"g1", "g2", "gtypo"} {
		g, ok := groupOf(t, mc, name)
		if !ok || g.Admission != routing.Pending || g.State != "RW" {
			t.Fatalf("%s under manual admission: %+v", name, g)
		}
	}
	// NO_ROUTE is retriable: the client asks again until its deadline.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := mc.CreateTopic(short, api.CreateTopicRequest{Name: "orders", Queues: 4})
	cancel()
	if !errors.Is(err, protocol.ErrNoRoute) || !strings.Contains(err.Error(), "no admitted, writable broker group") {
		t.Fatalf("a topic with only pending groups: %v", err)
	}
	for _, name := range []string{"g1", "g2"} {
		if g, err := mc.AdmitGroup(ctx, name); err != nil || g.Admission != routing.Admitted {
			t.Fatalf("admit %s: %+v, %v", name, g, err)
		}
	}
	if _, err := mc.AdmitGroup(ctx, "g9"); !errors.Is(err, protocol.ErrNotFound) {
		t.Fatalf("admitting a group that never registered: %v", err)
	}
	route, err := mc.CreateTopic(ctx, api.CreateTopicRequest{Name: "orders", Queues: 4})
	if err != nil {
		t.Fatal(err)
	}
	if got := route.Groups(); fmt.Sprint(got) != "[g1 g2]" {
		t.Fatalf("orders is on %v; the pending gtypo must get nothing", got)
	}
	if _, err := mc.CreateTopic(ctx, api.CreateTopicRequest{Name: "typo", Queues: 1, Groups: []string{"gtypo"}}); !errors.Is(err, protocol.ErrConflict) {
		t.Fatalf("a topic placed on the pending group: %v", err)
	}

	// Five messages to a queue of g2; a consumer group commits 3 of them,
	// read in g2's epoch.
	var q uint32
	var hb api.ConsumerHeartbeatReply
	for _, qr := range route.Queues {
		if qr.Group == "g2" {
			q = qr.Queue
		}
	}
	c2 := testcluster.Dial(t, g2.Master.Addr())
	sendTo(t, c2, q, 5, 0)
	hb, err = mc.ConsumerHeartbeat(ctx, api.ConsumerHeartbeat{Group: "cg", Member: "m1", Topics: []string{"orders"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mc.CommitOffsets(ctx, api.CommitRequest{Group: "cg", Member: "m1", Generation: hb.Generation,
		Offsets: []api.QueueOffset{{Topic: "orders", Queue: q, Offset: 3, Epoch: g2.Master.Epoch(), EpochGroup: "g2"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := mc.ConsumerHeartbeat(ctx, api.ConsumerHeartbeat{Group: "cg", Member: "m1", Leave: true}); err != nil {
		t.Fatal(err)
	}
	// The registry hears the queue's end from g2's heartbeats.
	testwait.For(t, 10*time.Second, "the registry to know the queue's end", func() bool {
		r, err := mc.RetireGroup(ctx, api.RetireGroupRequest{Group: "g2", DryRun: true})
		return err == nil && len(r.Moved) == 2 && movedOf(r, q).KnownEnd == 5
	})
	if _, err := mc.RetireGroup(ctx, api.RetireGroupRequest{Group: "g2"}); !errors.Is(err, protocol.ErrGroupActive) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("retiring a live group: %v", err)
	}

	// g2 dies; a producer's keyed send to the queue waits; once g2's
	// session has passed it is retired.
	p, err := producer.New(sdk.MetaAddrs(m.Addr()), producer.DeliveryTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	key := keyOf(q, uint32(len(route.Queues)))
	if r, err := p.Send(ctx, &producer.Message{Topic: "orders", Key: key, Body: []byte("m5")}); err != nil || r.Group != "g2" || r.QueueOffset != 5 {
		t.Fatalf("a keyed send to g2: %+v, %v", r, err)
	}
	testwait.For(t, 10*time.Second, "the registry to know the queue's end 6", func() bool {
		r, err := mc.RetireGroup(ctx, api.RetireGroupRequest{Group: "g2", DryRun: true})
		return err == nil && movedOf(r, q).KnownEnd == 6
	})
	if err := g2.Master.Close(); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		r   producer.Result
		err error
	}
	waiting := make(chan outcome, 1)
	p.SendAsync(ctx, &producer.Message{Topic: "orders", Key: key, Body: []byte("during the outage")},
		func(r producer.Result, err error) { waiting <- outcome{r, err} })
	var r api.RetireGroupReply
	testwait.For(t, 10*time.Second, "g2 to be retired once its master is silent for a session", func() bool {
		r, err = mc.RetireGroup(ctx, api.RetireGroupRequest{Group: "g2"})
		if errors.Is(err, protocol.ErrGroupActive) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		return true
	})
	if mq := movedOf(r, q); mq.To != "g1" || mq.Base != 6 || mq.KnownEnd != 6 || mq.Committed != 3 {
		t.Fatalf("queue %d moved: %+v", q, mq)
	}
	if r.Group.Admission != routing.Retired || r.Group.Master.ID != "" {
		t.Fatalf("the retired group: %+v", r.Group)
	}
	after, err := mc.RouteExisting(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(after.Groups()) != "[g1]" || after.Queues[q].Base != 6 || after.Queues[q].Queue != q {
		t.Fatalf("orders after the retirement: %+v", after)
	}
	gs, err := mc.ConsumerGroups(ctx, "cg")
	if err != nil || len(gs) != 1 || len(gs[0].Offsets) != 1 || gs[0].Offsets[0].Offset != 3 || gs[0].Offsets[0].Epoch != 0 {
		t.Fatalf("the consumer group after the move: %+v, %v", gs, err)
	}

	// g1 takes the queue up at 6: the waiting send is stored there, sends
	// continue after it, and a reader at the committed 3 goes on from 6.
	select {
	case o := <-waiting:
		if o.err != nil || o.r.Group != "g1" || o.r.Queue != q || o.r.QueueOffset != 6 {
			t.Fatalf("the keyed send made while g2 was dead: %+v, %v; want g1, queue %d, offset 6", o.r, o.err, q)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the keyed send made while g2 was dead did not complete within 20 s of the retirement")
	}
	c1 := testcluster.Dial(t, g1.Master.Addr())
	sendTo(t, c1, q, 2, 7)
	pr := testcluster.Pull(t, c1, "orders", q, 3, 1<<20)
	if pr.MinOffset != 6 || len(pr.Messages) != 3 || pr.Messages[0].QueueOffset != 6 || pr.NextOffset != 9 {
		t.Fatalf("a PULL from the committed offset: min %d next %d, %d messages", pr.MinOffset, pr.NextOffset, len(pr.Messages))
	}

	// g2's broker, back, is refused until g2 is admitted again.
	_, err = mc.Heartbeat(ctx, api.Heartbeat{Group: "g2", Role: routing.RoleMaster, BrokerID: "g2-master", Addr: "127.0.0.1:1", LogEnd: 1})
	if !errors.Is(err, protocol.ErrConflict) || !strings.Contains(err.Error(), "retired") {
		t.Fatalf("a heartbeat of the retired group: %v", err)
	}
	if g, _ := groupOf(t, mc, "g2"); g.Master.ID != "" || g.Admission != routing.Retired {
		t.Fatalf("g2 after its broker's heartbeat: %+v", g)
	}
}

func groupOf(t *testing.T, mc interface {
	Groups(context.Context) ([]api.GroupInfo, error)
}, name string) (api.GroupInfo, bool) {
	t.Helper()
	gs, err := mc.Groups(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gs {
		if g.Name == name {
			return g, true
		}
	}
	return api.GroupInfo{}, false
}

// keyOf is a key the producer sends to queue q of a topic of n queues
// (FNV-1a, as the producer hashes keys).
func keyOf(q, n uint32) string {
	for i := 0; ; i++ {
		k := fmt.Sprint("key-", i)
		h := fnv.New32a()
		h.Write([]byte(k))
		if h.Sum32()%n == q {
			return k
		}
	}
}

func movedOf(r api.RetireGroupReply, q uint32) api.MovedQueue {
	for _, m := range r.Moved {
		if m.Topic == "orders" && m.Queue == q {
			return m
		}
	}
	return api.MovedQueue{Committed: -2}
}

// sendTo sends n messages to queue q of orders and checks they get offsets
// from first on.
func sendTo(t *testing.T, c *transport.Client, q uint32, n int, first int64) {
	t.Helper()
	var msgs []protocol.Message
	for i := range n {
		msgs = append(msgs, testcluster.Msg("orders", q, protocol.Normal, fmt.Sprint("m", first+int64(i))))
	}
	var res []protocol.SendResult
	// A broker's first message of a topic is NO_ROUTE (nothing stored)
	// while it looks the route up.
	testwait.For(t, 10*time.Second, "the broker to know the route", func() bool {
		res = testcluster.Send(t, c, msgs)
		return res[0].Status != protocol.StatusNoRoute
	})
	for i, r := range res {
		if r.Status != protocol.StatusOK || r.QueueOffset != first+int64(i) {
			t.Fatalf("message %d: %+v, want OK at %d", i, r, first+int64(i))
		}
	}
}
