package metaserver

import (
	"fmt"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/routing"
)

// applyAll applies commands to f as committed raft entries.
func applyAll(t *testing.T, f *fsm.FSM, cmds ...fsm.Command) {
	t.Helper()
	for i, c := range cmds {
		b, err := fsm.Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		if err, ok := f.Apply(&raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: b}).(error); ok {
			t.Fatalf("apply %T: %v", c, err)
		}
	}
}

// One ROUTE_WATCH answer is bounded: at most maxPushTopics topics and
// maxPushQueues of their queue ids, the newest changes, with Partial set
// when older ones were left out; a watch from a version newer than the
// registry's starts over.
func TestRouteWatchAnswerBounds(t *testing.T) {
	f := fsm.New()
	applyAll(t, f,
		&fsm.RegisterBroker{Group: "g1", Role: routing.RoleMaster, Broker: routing.Broker{ID: "b1", Addr: "127.0.0.1:1"}},
		&fsm.RegisterBroker{Group: "g2", Role: routing.RoleMaster, Broker: routing.Broker{ID: "b2", Addr: "127.0.0.1:2"}})
	// g1: maxPushTopics+10 small topics; g2: five topics of 4096 queues.
	for i := range maxPushTopics + 10 {
		applyAll(t, f, &fsm.CreateTopic{Name: fmt.Sprintf("small-%03d", i), Queues: []string{"g1", "g2"}})
	}
	big := make([]string, 4096)
	for i := range big {
		big[i] = "g2"
	}
	for i := range 5 {
		applyAll(t, f, &fsm.CreateTopic{Name: fmt.Sprintf("big-%d", i), Queues: big})
	}
	p := &routePush{}
	p.init(DefaultConfig(), f, hclog.NewNullLogger())

	r := p.changes("g1", 0)
	if len(r.Topics) != maxPushTopics || !r.Partial || r.Version != f.Version() {
		t.Fatalf("g1 from 0: %d topics, partial %v, version %d (registry %d)", len(r.Topics), r.Partial, r.Version, f.Version())
	}
	if first, last := r.Topics[0].Name, r.Topics[len(r.Topics)-1].Name; first != "small-010" || last != fmt.Sprintf("small-%03d", maxPushTopics+9) {
		t.Fatalf("g1 from 0: topics %s to %s, want the newest", first, last)
	}
	if pt := r.Topics[0]; pt.Queues != 2 || len(pt.Mine) != 1 || pt.Mine[0] != 0 {
		t.Fatalf("g1's queues of %s: %+v", pt.Name, pt)
	}

	small, _ := f.Topic("small-100")
	r = p.changes("g1", small.Version)
	if len(r.Topics) != maxPushTopics+9-100 || r.Partial || r.Topics[0].Name != "small-101" {
		t.Fatalf("g1 from small-100's version: %d topics from %s, partial %v", len(r.Topics), r.Topics[0].Name, r.Partial)
	}

	// Four big topics fill maxPushQueues; the fifth (the oldest) and the
	// small ones are left out.
	r = p.changes("g2", 0)
	if len(r.Topics) != maxPushQueues/4096 || !r.Partial || r.Topics[0].Name != "big-1" || len(r.Topics[0].Mine) != 4096 {
		t.Fatalf("g2 from 0: %d topics from %s, partial %v", len(r.Topics), r.Topics[0].Name, r.Partial)
	}

	if r := p.changes("g1", f.Version()); len(r.Topics) != 0 || r.Partial {
		t.Fatalf("g1 up to date: %+v", r)
	}
	if r := p.changes("g1", f.Version()+5); len(r.Topics) != maxPushTopics || !r.Partial || r.Version != f.Version() {
		t.Fatalf("g1 from a version past the registry's: %d topics, partial %v, version %d", len(r.Topics), r.Partial, r.Version)
	}
}
