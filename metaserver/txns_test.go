package metaserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testmetrics"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

func txnReq(n uint64, commit bool, by string, groups ...string) api.TxnDecideRequest {
	return api.TxnDecideRequest{Producer: 7, Epoch: 1, Number: n, Commit: commit, By: by, Groups: groups}
}

func wantStatusOf(t *testing.T, what string, err error, want protocol.Status) {
	t.Helper()
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Status != want {
		t.Fatalf("%s: %v, want %v", what, err, want)
	}
}

// txnMetric is the value of a transaction metric of s with the labels
// given (name=value pairs).
func txnMetric(t *testing.T, s *metaserver.Server, name string, labels ...string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.TxnCollectors()...)
	for _, m := range testmetrics.Gather(t, reg)[name].GetMetric() {
		l := testmetrics.Labels(m)
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			match = match && l[labels[i]] == labels[i+1]
		}
		if match {
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return 0
}

// A decision is one write at the leader, asked through a follower too; the
// first wins, whatever later requests ask; every node holds it; it goes
// once every group reported done.
func TestTxnDecideThroughTheCluster(t *testing.T) {
	clk := fakeClock()
	m := startMeta(t, 3, clk)
	li, leader := m.Leader()
	fi := (li + 1) % 3
	viaFollower, err := client.New(client.Config{Addrs: []string{m.Peers[fi].RPCAddr}, CallTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = viaFollower.Close() })
	ctx := context.Background()

	// A follower answers NOT_LEADER naming the leader.
	conn := transport.NewClient(m.Peers[fi].RPCAddr, transport.ClientConfig{})
	t.Cleanup(func() { _ = conn.Close() })
	body, _ := json.Marshal(txnReq(1, true, protocol.TxnByProducer, "g1"))
	resp, err := conn.Call(ctx, protocol.CodeTxnDecide, body)
	if !errors.Is(err, protocol.ErrNotLeader) || string(resp.Body) != m.Peers[li].RPCAddr {
		t.Fatalf("TXN_DECIDE at a follower: %v %q, want NOT_LEADER naming %s", err, resp.Body, m.Peers[li].RPCAddr)
	}

	req := txnReq(1, true, protocol.TxnByProducer, "g1", "g2")
	req.Time = 42 // a client's time is ignored
	d, err := viaFollower.DecideTxn(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	want := api.TxnDecision{Producer: 7, Epoch: 1, Number: 1, Committed: true, By: protocol.TxnByProducer, At: clk.Now().UnixMilli(),
		Groups: []string{"g1", "g2"}, Pending: []string{"g1", "g2"}}
	if !reflect.DeepEqual(d, want) {
		t.Fatalf("decision: %+v, want %+v", d, want)
	}
	// The first decision wins: a broker's abort at its timeout learns the
	// commit.
	clk.Advance(time.Second)
	if d, err := m.Client(t).DecideTxn(ctx, txnReq(1, false, protocol.TxnByTimeout, "g2")); err != nil || !reflect.DeepEqual(d, want) {
		t.Fatalf("a later abort: %+v %v, want the commit %+v", d, err, want)
	}
	for i, s := range m.Nodes {
		testwait.For(t, 10*time.Second, fmt.Sprintf("node %d to hold the decision", i), func() bool {
			r, ok := s.FSM().Txn(fsm.TxnKey{Producer: 7, Epoch: 1, Number: 1})
			return ok && r.Committed
		})
	}
	if got := txnMetric(t, leader, "ferrymq_metaserver_txn_decisions_total", "outcome", "commit"); got != 1 {
		t.Fatalf("commit decisions counted %v, want 1", got)
	}
	if got := txnMetric(t, leader, "ferrymq_metaserver_txn_decisions"); got != 1 {
		t.Fatalf("decisions held %v, want 1", got)
	}

	list, err := viaFollower.TxnDecisions(ctx, api.TxnDecisionsRequest{})
	if err != nil || len(list.Records) != 1 || list.More || !reflect.DeepEqual(list.Records[0], want) {
		t.Fatalf("decisions: %+v %v", list, err)
	}
	if err := viaFollower.TxnDone(ctx, api.TxnDoneRequest{Producer: 7, Epoch: 1, Number: 1, Groups: []string{"g1"}}); err != nil {
		t.Fatal(err)
	}
	list, _ = viaFollower.TxnDecisions(ctx, api.TxnDecisionsRequest{})
	if len(list.Records) != 1 || !reflect.DeepEqual(list.Records[0].Pending, []string{"g2"}) {
		t.Fatalf("after g1 done: %+v", list)
	}
	if err := viaFollower.TxnDone(ctx, api.TxnDoneRequest{Producer: 7, Epoch: 1, Number: 1, Groups: []string{"g2"}}); err != nil {
		t.Fatal(err)
	}
	if list, _ = viaFollower.TxnDecisions(ctx, api.TxnDecisionsRequest{}); len(list.Records) != 0 {
		t.Fatalf("after every group done: %+v", list)
	}
	// Done again, or of a transaction never decided: harmless.
	if err := viaFollower.TxnDone(ctx, api.TxnDoneRequest{Producer: 7, Epoch: 1, Number: 1, Groups: []string{"g2"}}); err != nil {
		t.Fatal(err)
	}
}

// TXN_DECISIONS: oldest first, of one producer or all, bounded by Limit.
func TestTxnDecisionsList(t *testing.T) {
	clk := fakeClock()
	m := startMeta(t, 1, clk)
	cl := m.Client(t)
	ctx := context.Background()
	for i, p := range []uint64{3, 1, 2, 1} {
		clk.Advance(time.Second)
		if _, err := cl.DecideTxn(ctx, api.TxnDecideRequest{Producer: p, Number: uint64(10 - i), Commit: i%2 == 0, By: protocol.TxnByProducer,
			Groups: []string{"g1"}}); err != nil {
			t.Fatal(err)
		}
	}
	all, err := cl.TxnDecisions(ctx, api.TxnDecisionsRequest{})
	if err != nil || len(all.Records) != 4 || all.More {
		t.Fatalf("all: %+v %v", all, err)
	}
	for i := 1; i < 4; i++ {
		if all.Records[i].At <= all.Records[i-1].At {
			t.Fatalf("not oldest first: %+v", all.Records)
		}
	}
	one, _ := cl.TxnDecisions(ctx, api.TxnDecisionsRequest{Producer: 1})
	if len(one.Records) != 2 || one.Records[0].Number != 9 || one.Records[1].Number != 7 {
		t.Fatalf("producer 1: %+v", one.Records)
	}
	two, _ := cl.TxnDecisions(ctx, api.TxnDecisionsRequest{Limit: 2})
	if len(two.Records) != 2 || !two.More || two.Records[0].Producer != 3 {
		t.Fatalf("limit 2: %+v", two)
	}
	_, err = cl.TxnDecisions(ctx, api.TxnDecisionsRequest{Limit: -1})
	wantStatusOf(t, "limit -1", err, protocol.StatusInvalid)
}

// Hostile or malformed requests are refused INVALID and record nothing.
func TestTxnDecideHostileInput(t *testing.T) {
	m := startMeta(t, 1, nil)
	_, s := m.Leader()
	cl := m.Client(t)
	ctx := context.Background()
	groups257 := make([]string, api.MaxTxnGroups+1)
	for i := range groups257 {
		groups257[i] = fmt.Sprintf("g%d", i)
	}
	offs := &api.CommitRequest{Group: "cg", Member: "m", Generation: 1, Offsets: []api.QueueOffset{{Topic: "orders", Offset: 1}}}
	edit := func(f func(*api.TxnDecideRequest)) api.TxnDecideRequest {
		r := txnReq(1, true, protocol.TxnByProducer, "g1")
		f(&r)
		return r
	}
	for name, req := range map[string]api.TxnDecideRequest{
		"producer 0":              edit(func(r *api.TxnDecideRequest) { r.Producer = 0 }),
		"number 0":                edit(func(r *api.TxnDecideRequest) { r.Number = 0 }),
		"no decider":              edit(func(r *api.TxnDecideRequest) { r.By = "" }),
		"an unknown decider":      edit(func(r *api.TxnDecideRequest) { r.By = strings.Repeat("x", 5000) }),
		"no group":                edit(func(r *api.TxnDecideRequest) { r.Groups = nil }),
		"257 groups":              edit(func(r *api.TxnDecideRequest) { r.Groups = groups257 }),
		"a group with a space":    edit(func(r *api.TxnDecideRequest) { r.Groups = []string{"g 1"} }),
		"a group not UTF-8":       edit(func(r *api.TxnDecideRequest) { r.Groups = []string{"g\xff"} }),
		"a group of 256 bytes":    edit(func(r *api.TxnDecideRequest) { r.Groups = []string{strings.Repeat("g", 256)} }),
		"a group twice":           edit(func(r *api.TxnDecideRequest) { r.Groups = []string{"g1", "g1"} }),
		"offsets with an abort":   edit(func(r *api.TxnDecideRequest) { r.Commit = false; r.Offsets = offs }),
		"offsets of a bad member": edit(func(r *api.TxnDecideRequest) { o := *offs; o.Member = "m\n"; r.Offsets = &o }),
		"offsets of no queue":     edit(func(r *api.TxnDecideRequest) { o := *offs; o.Offsets = nil; r.Offsets = &o }),
		"a negative offset": edit(func(r *api.TxnDecideRequest) {
			o := *offs
			o.Offsets = []api.QueueOffset{{Topic: "orders", Offset: -1}}
			r.Offsets = &o
		}),
	} {
		_, err := cl.DecideTxn(ctx, req)
		wantStatusOf(t, name, err, protocol.StatusInvalid)
	}
	for name, req := range map[string]api.TxnDoneRequest{
		"done of producer 0": {Number: 1, Groups: []string{"g1"}},
		"done of no group":   {Producer: 7, Number: 1},
		"done of 257 groups": {Producer: 7, Number: 1, Groups: groups257},
	} {
		wantStatusOf(t, name, cl.TxnDone(ctx, req), protocol.StatusInvalid)
	}
	if n := s.FSM().TxnCount(); n != 0 {
		t.Fatalf("refused requests recorded %d decisions", n)
	}
	if got := txnMetric(t, s, "ferrymq_metaserver_txn_decisions_refused_total", "status", "INVALID"); got != 14 {
		t.Fatalf("refusals counted %v, want 14", got)
	}
}

// Offsets committed with a decision: as a member's commit, all or nothing
// with the decision.
func TestTxnDecideWithOffsets(t *testing.T) {
	m := startMeta(t, 1, nil)
	_, s := m.Leader()
	cl := m.Client(t)
	ctx := context.Background()
	heartbeat(t, cl, "g1", routing.RoleMaster, nil)
	m.CreateTopic(t, "orders", "g1", "g1")
	hb, err := cl.ConsumerHeartbeat(ctx, api.ConsumerHeartbeat{Group: "cg", Member: "m", Topics: []string{"orders"}})
	if err != nil {
		t.Fatal(err)
	}
	committed := func() []api.QueueOffset {
		gs, err := cl.ConsumerGroups(ctx, "cg")
		if err != nil || len(gs) != 1 {
			t.Fatalf("consumer groups: %+v %v", gs, err)
		}
		return gs[0].Offsets
	}
	withOffsets := func(n, gen uint64, offset int64) api.TxnDecideRequest {
		r := txnReq(n, true, protocol.TxnByProducer, "g1", "g2")
		r.Offsets = &api.CommitRequest{Group: "cg", Member: "m", Generation: gen, Offsets: []api.QueueOffset{{Topic: "orders", Queue: 1, Offset: offset}}}
		return r
	}
	// A stale generation: refused, nothing recorded, no offset moved.
	_, err = cl.DecideTxn(ctx, withOffsets(1, hb.Generation+1, 5))
	wantStatusOf(t, "stale generation", err, protocol.StatusStaleGeneration)
	if n := s.FSM().TxnCount(); n != 0 || len(committed()) != 0 {
		t.Fatalf("a refused commit recorded %d decisions, offsets %+v", n, committed())
	}
	if got := txnMetric(t, s, "ferrymq_metaserver_txn_decisions_refused_total", "status", "STALE_GENERATION"); got != 1 {
		t.Fatalf("refusals counted %v, want 1", got)
	}
	d, err := cl.DecideTxn(ctx, withOffsets(1, hb.Generation, 5))
	if err != nil || !d.Committed || !d.Offsets {
		t.Fatalf("commit with offsets: %+v %v", d, err)
	}
	if c := committed(); len(c) != 1 || c[0].Queue != 1 || c[0].Offset != 5 {
		t.Fatalf("committed %+v, want orders/1 at 5", c)
	}
	// A retry answers the decision and commits nothing again.
	if d, err := cl.DecideTxn(ctx, withOffsets(1, hb.Generation, 9)); err != nil || !d.Committed {
		t.Fatalf("retry: %+v %v", d, err)
	}
	if c := committed(); c[0].Offset != 5 {
		t.Fatalf("a retry moved the offset to %d", c[0].Offset)
	}
}

// With authorization on: producers and brokers decide, consumers and
// describe do not; offsets need the consumer group's permission too; the
// member is bound to its principal; describe lists.
func TestTxnDecideAuthorization(t *testing.T) {
	am := startAuthMeta(t, 1)
	ctx := context.Background()
	_, s := am.Leader()
	prod := am.principal(t, "prod", "produce:orders")
	app := am.principal(t, "app", "produce:orders", "consume:orders:billing")
	cons := am.principal(t, "cons", "consume:orders:billing")
	desc := am.principal(t, "desc", "describe")
	broker := am.dial(t, am.clusterTok)

	if _, err := prod.DecideTxn(ctx, txnReq(1, true, protocol.TxnByProducer, "g1")); err != nil {
		t.Fatalf("a producer decides: %v", err)
	}
	if d, err := broker.DecideTxn(ctx, txnReq(1, false, protocol.TxnByTimeout, "g1")); err != nil || !d.Committed {
		t.Fatalf("a broker's abort: %+v %v", d, err)
	}
	for name, cl := range map[string]*client.Client{"cons": cons, "desc": desc} {
		_, err := cl.DecideTxn(ctx, txnReq(2, true, protocol.TxnByProducer, "g1"))
		wantNotAuthorized(t, name+" decides", err)
		wantNotAuthorized(t, name+" reports done", cl.TxnDone(ctx, api.TxnDoneRequest{Producer: 7, Epoch: 1, Number: 1, Groups: []string{"g1"}}))
	}
	_, err := prod.TxnDecisions(ctx, api.TxnDecisionsRequest{})
	wantNotAuthorized(t, "prod lists", err)
	if list, err := desc.TxnDecisions(ctx, api.TxnDecisionsRequest{}); err != nil || len(list.Records) != 1 {
		t.Fatalf("describe lists: %+v %v", list, err)
	}

	hb, err := app.ConsumerHeartbeat(ctx, api.ConsumerHeartbeat{Group: "billing", Member: "m", Topics: []string{"orders"}})
	if err != nil {
		t.Fatal(err)
	}
	withOffsets := func(n uint64, group string) api.TxnDecideRequest {
		r := txnReq(n, true, protocol.TxnByProducer, "g1")
		r.Offsets = &api.CommitRequest{Group: group, Member: "m", Generation: hb.Generation, Offsets: []api.QueueOffset{{Topic: "orders", Queue: 0, Offset: 3}}}
		return r
	}
	// prod may not commit billing's offsets; app may not commit another
	// group's; a principal with both commits its own member's.
	_, err = prod.DecideTxn(ctx, withOffsets(3, "billing"))
	wantNotAuthorized(t, "prod commits billing's offsets", err)
	_, err = app.DecideTxn(ctx, withOffsets(3, "other"))
	wantNotAuthorized(t, "app commits other's offsets", err)
	// Another principal allowed the group may not act as app's member.
	app2 := am.principal(t, "app2", "produce:orders", "consume:orders:billing")
	_, err = app2.DecideTxn(ctx, withOffsets(3, "billing"))
	wantNotAuthorized(t, "app2 acts as app's member", err)
	if _, ok := s.FSM().Txn(fsm.TxnKey{Producer: 7, Epoch: 1, Number: 3}); ok {
		t.Fatal("a refused decision was recorded")
	}
	if d, err := app.DecideTxn(ctx, withOffsets(3, "billing")); err != nil || !d.Committed {
		t.Fatalf("app commits its member's offsets: %+v %v", d, err)
	}
}

// The leader expires a decision whose groups never reported, once it is
// older than fsm.TxnRetentionMillis by its clock, and only then.
func TestTxnDecisionsExpire(t *testing.T) {
	clk := fakeClock()
	// A judge tick of minutes: moving the fake clock by days fires every
	// tick on the way.
	m := testcluster.StartMeta(t, 1, func(c *metaserver.Config) {
		c.Clock, c.JudgeInterval, c.SessionTimeout, c.ConsumerSession = clk, 4*time.Minute, 5*time.Minute, 5*time.Minute
	})
	_, s := m.Leader()
	cl := m.Client(t)
	ctx := context.Background()
	held := func(n uint64) bool {
		_, ok := s.FSM().Txn(fsm.TxnKey{Producer: 7, Epoch: 1, Number: n})
		return ok
	}
	if _, err := cl.DecideTxn(ctx, txnReq(1, true, protocol.TxnByProducer, "g1", "never-reports")); err != nil {
		t.Fatal(err)
	}
	if err := cl.TxnDone(ctx, api.TxnDoneRequest{Producer: 7, Epoch: 1, Number: 1, Groups: []string{"g1"}}); err != nil {
		t.Fatal(err)
	}
	half := time.Duration(fsm.TxnRetentionMillis) * time.Millisecond / 2
	judged(t, m, clk, s, half)
	if !held(1) {
		t.Fatal("a decision expired half its retention after it was made")
	}
	if _, err := cl.DecideTxn(ctx, txnReq(2, false, protocol.TxnByTimeout, "never-reports")); err != nil {
		t.Fatal(err)
	}
	judged(t, m, clk, s, half+2*time.Minute)
	if held(1) || !held(2) {
		t.Fatalf("after 7 days: the first decision held %v (want expired), the second %v (want held)", held(1), held(2))
	}
	if got := txnMetric(t, s, "ferrymq_metaserver_txn_decisions_expired_total"); got != 1 {
		t.Fatalf("expired counted %v, want 1", got)
	}
}
