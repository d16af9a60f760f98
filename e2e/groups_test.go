package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/sdk"
)

// TestGroupAdmissionAndRetirement, through real processes, with the
// metaservers admitting groups by hand (FERRY_ADMIT_GROUPS=manual; the
// script admits g1 and g2):
//
//   - a broker started with a mistyped -group registers, shows as PENDING,
//     and a new topic gets no queue on it;
//   - g2 dies (master and slave killed) while a producer's keyed send to
//     one of its queues waits; once `ferryctl broker retire-group g2` moved
//     the queues to g1, that send and the next ones succeed on g1, in the
//     same queues, at offsets that continue past g2's end (which the
//     registry heard from g2's heartbeats);
//   - a consumer group that had committed g2's messages goes on from its
//     committed offsets: it gets the new messages, once each, in order, and
//     none of the old ones again;
//   - `ferryctl read` of a moved queue starts at the offset g1 took it up.
func TestGroupAdmissionAndRetirement(t *testing.T) {
	c := startLocalCluster(t, "FERRY_ADMIT_GROUPS=manual")
	ctx := context.Background()

	// A broker with a mistyped group, started with g2's master's command
	// line and its own id, group, directory and ports.
	args := slices.Clone(c.cmdline("g2-master"))
	set := func(flag, value string) {
		i := slices.Index(args, flag)
		if i < 0 || i+1 >= len(args) {
			t.Fatalf("g2-master's command line has no %s: %q", flag, args)
		}
		args[i+1] = value
	}
	set("-id", "gtypo-master")
	set("-group", "gtypo")
	set("-dir", filepath.Join(c.home, "data", "gtypo-master"))
	set("-addr", fmt.Sprintf("127.0.0.1:%d", c.base+35))
	set("-ha-addr", fmt.Sprintf("127.0.0.1:%d", c.base+45))
	set("-metrics-addr", fmt.Sprintf("127.0.0.1:%d", c.base+55))
	c.restart("gtypo-master", args)
	testwait.For(t, 20*time.Second, "gtypo to register, pending", func() bool {
		g, ok := c.group("gtypo")
		return ok && g.Admission == routing.Pending && g.Master.ID == "gtypo-master"
	})
	if row := rowStarting(t, c.ctl("brokers"), "gtypo "); !strings.HasSuffix(strings.TrimSpace(row), "PENDING") {
		t.Fatalf("ferryctl brokers shows gtypo as %q", row)
	}
	c.ctl("topic", "create", "orders", "--queues", "4")
	route, err := c.mc.RouteExisting(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if got := route.Groups(); !slices.Equal(got, []string{"g1", "g2"}) {
		t.Fatalf("orders is on %v; the pending gtypo must get nothing", got)
	}

	// Keyed sends to g2's queues, consumed and committed by a group.
	keys := map[uint32]string{} // g2's queues, a key of each
	for _, q := range route.Queues {
		if q.Group == "g2" {
			keys[q.Queue] = keyFor(q.Queue, uint32(len(route.Queues)))
		}
	}
	p, err := producer.New(sdk.MetaAddrs(strings.Split(c.meta, ",")...), producer.DeliveryTimeout(90*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const before = 10
	for q, key := range keys {
		for i := range before {
			r, err := p.Send(ctx, &producer.Message{Topic: "orders", Key: key, Body: []byte(fmt.Sprintf("before %d/%d", q, i))})
			if err != nil || r.Group != "g2" || r.Queue != q || r.QueueOffset != int64(i) {
				t.Fatalf("send %d to queue %d: %+v, %v", i, q, r, err)
			}
		}
	}
	rec := newRecorder()
	startMember(t, c, rec, "cg", "orders", "m1")
	waitCommitted(t, c, keys, before)
	// The registry has heard the queues' ends from g2's master.
	testwait.For(t, 20*time.Second, "the registry to know g2's queue ends", func() bool {
		code, out, _ := c.ctlExit("--json", "broker", "retire-group", "g2", "--dry-run")
		var r api.RetireGroupReply
		if code != 0 || json.Unmarshal([]byte(out), &r) != nil || len(r.Moved) != len(keys) {
			return false
		}
		for _, m := range r.Moved {
			if m.KnownEnd != before {
				return false
			}
		}
		return true
	})

	// g2 dies, and so does gtypo. A keyed send to one of g2's queues waits.
	c.kill9("g2-master")
	c.kill9("g2-slave")
	c.kill9("gtypo-master")
	var waitingQ uint32
	for q := range keys {
		waitingQ = q
		break
	}
	type outcome struct {
		r   producer.Result
		err error
	}
	waiting := make(chan outcome, 1)
	p.SendAsync(ctx, &producer.Message{Topic: "orders", Key: keys[waitingQ], Body: []byte("during the outage")},
		func(r producer.Result, err error) { waiting <- outcome{r, err} })

	var r api.RetireGroupReply
	testwait.For(t, 30*time.Second, "retire-group g2 to be taken once g2 is silent for a session", func() bool {
		code, out, stderr := c.ctlExit("--json", "broker", "retire-group", "g2")
		if code != 0 {
			if !strings.Contains(stderr, "GROUP_ACTIVE") {
				t.Fatalf("retire-group g2: exit %d: %s", code, stderr)
			}
			return false
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		return true
	})
	for _, m := range r.Moved {
		if m.Topic != "orders" || m.To != "g1" || m.Base != before || keys[m.Queue] == "" {
			t.Fatalf("moved %+v, want each of g2's queues to g1 at %d", m, before)
		}
	}
	testwait.For(t, 30*time.Second, "retire-group gtypo", func() bool {
		code, _, _ := c.ctlExit("broker", "retire-group", "gtypo")
		return code == 0
	})

	select {
	case o := <-waiting:
		if o.err != nil || o.r.Group != "g1" || o.r.Queue != waitingQ || o.r.QueueOffset != before {
			t.Fatalf("the keyed send made during the outage: %+v, %v; want g1, queue %d, offset %d", o.r, o.err, waitingQ, before)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the keyed send made during the outage did not complete within 30 s of the retirement")
	}
	const after = 5
	for q, key := range keys {
		first := int64(before)
		if q == waitingQ {
			first++
		}
		for i := range after {
			r, err := p.Send(ctx, &producer.Message{Topic: "orders", Key: key, Body: []byte(fmt.Sprintf("after %d/%d", q, i))})
			if err != nil || r.Group != "g1" || r.Queue != q || r.QueueOffset != first+int64(i) {
				t.Fatalf("send %d to moved queue %d: %+v, %v; want g1 at %d", i, q, r, err, first+int64(i))
			}
		}
	}

	// The consumer group goes on from its committed offsets: every new
	// message once, in offset order, none of the old ones again.
	newCount := len(keys)*after + 1
	testwait.For(t, 30*time.Second, "the consumer to get the messages sent after the move", func() bool {
		return rec.count() == len(keys)*before+newCount
	})
	last := map[uint32]int64{}
	for _, d := range rec.snapshot() {
		if keys[d.queue] == "" {
			t.Fatalf("a delivery from queue %d, which nothing was sent to: %+v", d.queue, d)
		}
		if prev, ok := last[d.queue]; ok && d.offset != prev+1 {
			t.Fatalf("queue %d: offset %d delivered after %d", d.queue, d.offset, prev)
		}
		last[d.queue] = d.offset
	}
	for q := range keys {
		end := int64(before + after)
		if q == waitingQ {
			end++
		}
		if last[q] != end-1 {
			t.Fatalf("queue %d: last delivery at %d, want %d", q, last[q], end-1)
		}
	}
	waitCommitted(t, c, map[uint32]string{waitingQ: keys[waitingQ]}, before+after+1)

	// ferryctl read of a moved queue starts where g1 took it up.
	out := c.ctl("--json", "read", "orders", "--queue", fmt.Sprint(waitingQ), "--from", "0")
	var read []struct {
		QueueOffset int64 `json:"queue_offset"`
	}
	if err := json.Unmarshal([]byte(out), &read); err != nil {
		t.Fatalf("read --json %q: %v", out, err)
	}
	var offs []int64
	for _, m := range read {
		offs = append(offs, m.QueueOffset)
	}
	if len(offs) != after+1 || offs[0] != before {
		t.Fatalf("read of moved queue %d: offsets %v, want %d from %d", waitingQ, offs, after+1, before)
	}
	brokers := c.ctl("brokers")
	for _, g := range []string{"g2 ", "gtypo "} {
		if row := rowStarting(t, brokers, g); !strings.HasSuffix(strings.TrimSpace(row), "retired") {
			t.Fatalf("ferryctl brokers shows %q", row)
		}
	}
}

// keyFor is a key the producer sends to queue q of a topic of n queues.
func keyFor(q, n uint32) string {
	for i := 0; ; i++ {
		k := fmt.Sprint("key-", i)
		h := fnv.New32a()
		h.Write([]byte(k))
		if h.Sum32()%n == q {
			return k
		}
	}
}

// waitCommitted waits until consumer group cg has committed offset n for
// each of the queues.
func waitCommitted(t *testing.T, c *localCluster, queues map[uint32]string, n int64) {
	t.Helper()
	testwait.For(t, 30*time.Second, fmt.Sprintf("cg to commit %d on queues %v", n, queues), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		gs, err := c.mc.ConsumerGroups(ctx, "cg")
		if err != nil || len(gs) != 1 {
			return false
		}
		done := 0
		for _, o := range gs[0].Offsets {
			if queues[o.Queue] != "" && o.Offset == n {
				done++
			}
		}
		return done == len(queues)
	})
}

// rowStarting is the line of a table that starts with prefix.
func rowStarting(t *testing.T, table, prefix string) string {
	t.Helper()
	for _, l := range strings.Split(table, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	t.Fatalf("no line starting %q in:\n%s", prefix, table)
	return ""
}
