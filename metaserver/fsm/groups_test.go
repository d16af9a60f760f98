package fsm

import (
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

func register(t *testing.T, f *FSM, group, id string, pending bool) {
	t.Helper()
	mustApply(t, f, &RegisterBroker{Group: group, Role: routing.RoleMaster, Broker: routing.Broker{ID: id, Addr: id + ":9000"}, At: 5, Pending: pending})
}

func group(t *testing.T, f *FSM, name string) routing.Group {
	t.Helper()
	g, ok := f.Group(name)
	if !ok {
		t.Fatalf("no group %q", name)
	}
	return g
}

// A group registered while the leader admits by hand is pending: it works
// as a group, but no topic creation or add-queues places a queue on it
// until AdmitGroup. Registrations that do not say pending (older leaders'
// log entries) admit, and Pending never changes a group that exists.
func TestAdmission(t *testing.T) {
	f := seeded(t)
	register(t, f, "gtypo", "typo-m", true)
	if g := group(t, f, "gtypo"); g.Admission != routing.Pending || g.Master.ID != "typo-m" || g.Epoch != 1 {
		t.Fatalf("pending group: %+v", g)
	}
	mustApply(t, f, &RegisterBroker{Group: "g1", Role: routing.RoleMaster, Broker: routing.Broker{ID: "g1-m", Addr: "moved:9000", HAAddr: "g1-m:9001"}, Pending: true})
	if g := group(t, f, "g1"); g.Admission != routing.Admitted {
		t.Fatalf("an existing group became %q", g.Admission)
	}
	_, err := apply(t, f, &CreateTopic{Name: "t", Queues: []string{"g1", "gtypo"}})
	wantStatus(t, err, protocol.ErrConflict, "a topic with a queue on a pending group")
	if !strings.Contains(err.Error(), "ferryctl broker add-group gtypo") {
		t.Fatalf("the refusal does not say what to do: %v", err)
	}
	_, err = apply(t, f, &AddQueues{Topic: "orders", Groups: []string{"gtypo"}})
	wantStatus(t, err, protocol.ErrConflict, "add-queues on a pending group")
	if _, ok := f.Route("t"); ok {
		t.Fatal("the refused topic exists")
	}
	if tp := f.Topics()[0]; len(tp.Queues) != 3 {
		t.Fatalf("the refused add-queues added: %v", tp.Queues)
	}

	_, err = apply(t, f, &AdmitGroup{Group: "nope", At: 6})
	wantStatus(t, err, protocol.ErrNotFound, "admitting a group that never registered")
	v := f.Version()
	if r := mustApply(t, f, &AdmitGroup{Group: "gtypo", At: 6}); !r.Changed || r.Version != v+1 {
		t.Fatalf("admit: %+v", r)
	}
	if g := group(t, f, "gtypo"); g.Admission != routing.Admitted || g.ChangedAt != 6 {
		t.Fatalf("admitted group: %+v", g)
	}
	if r := mustApply(t, f, &AdmitGroup{Group: "gtypo", At: 7}); r.Changed {
		t.Fatal("admitting twice changed something")
	}
	mustApply(t, f, &CreateTopic{Name: "t", Queues: []string{"g1", "gtypo"}})

	register(t, f, "g3", "g3-m", false) // a leader that admits by itself
	if g := group(t, f, "g3"); g.Admission != routing.Admitted {
		t.Fatalf("a registration without pending: %q", g.Admission)
	}
}

// retireSeeded: "orders" on g1, g2, g1; g3 admitted and empty; gp pending;
// a consumer group "cg" holding every queue of orders.
func retireSeeded(t *testing.T) *FSM {
	f := seeded(t)
	register(t, f, "g3", "g3-m", false)
	register(t, f, "gp", "gp-m", true)
	mustApply(t, f, &JoinGroup{Group: "cg", Member: "a", Topics: []string{"orders"}, At: 1})
	return f
}

func commit(t *testing.T, f *FSM, offs ...QueueOffset) {
	t.Helper()
	g := cgroup(t, f, "cg")
	mustApply(t, f, &CommitOffsets{Group: "cg", Member: "a", Generation: g.Generation, Offsets: offs})
}

// Retiring a group moves each of its queues, keeping its number, to the
// admitted group holding the fewest, at a base past every offset the
// registry knows (the ends its master reported, committed offsets); the
// consumer groups keep their offsets and lose the old group's epochs; the
// group keeps its name and epochs, loses its brokers, and refuses them
// until it is admitted again.
func TestRetireGroup(t *testing.T) {
	f := retireSeeded(t)
	mustApply(t, f, &RecordQueueEnds{Group: "g2", Ends: []QueueEnd{{Topic: "orders", Queue: 1, End: 50}, {Topic: "orders", Queue: 0, End: 99}}})
	commit(t, f, QueueOffset{Topic: "orders", Queue: 1, Offset: 40, Epoch: 3}, QueueOffset{Topic: "orders", Queue: 0, Offset: 7, Epoch: 1})
	mustApply(t, f, &CreateTopic{Name: "events", Queues: []string{"g2", "g2", "g3"}})
	mustApply(t, f, &ResetOffsets{Group: "idle", Offsets: []QueueOffset{{Topic: "events", Queue: 0, Offset: 80}}})

	plan, err := f.PlanRetire("g2", []string{"g1", "g2", "g3", "gp"})
	if err != nil {
		t.Fatal(err)
	}
	// events/0 and events/1 first (topics by name); g3 holds 1, g1 2.
	want := []PlannedMove{
		{QueueMove: QueueMove{Topic: "events", Queue: 0, To: "g3", Base: 80}, KnownEnd: 0, Committed: 80},
		{QueueMove: QueueMove{Topic: "events", Queue: 1, To: "g1", Base: 0}, KnownEnd: 0, Committed: -1},
		{QueueMove: QueueMove{Topic: "orders", Queue: 1, To: "g3", Base: 50}, KnownEnd: 50, Committed: 40},
	}
	if !reflect.DeepEqual(plan, want) {
		t.Fatalf("plan:\n got %+v\nwant %+v", plan, want)
	}
	mustApply(t, f, &SetGroupReasons{Group: "g2", Set: routing.HeartbeatLost, At: 8})
	g2 := group(t, f, "g2")
	var moves []QueueMove
	for _, m := range plan {
		moves = append(moves, m.QueueMove)
	}
	v := f.Version()
	r := mustApply(t, f, &RetireGroup{Group: "g2", Moves: moves, At: 9})
	if !r.Changed || r.Version != v+1 {
		t.Fatalf("retire: %+v", r)
	}
	route, _ := f.Route("orders")
	if got := []string{route.Queues[0].Group, route.Queues[1].Group, route.Queues[2].Group}; !reflect.DeepEqual(got, []string{"g1", "g3", "g1"}) {
		t.Fatalf("orders routes to %v", got)
	}
	if route.Queues[1].Base != 50 || route.Queues[0].Base != 0 || route.Version != r.Version {
		t.Fatalf("orders route after the move: %+v", route)
	}
	if ev, _ := f.Route("events"); ev.Queues[0].Base != 80 || ev.Queues[0].Group != "g3" || ev.Queues[1].Group != "g1" {
		t.Fatalf("events route after the move: %+v", ev)
	}
	if qs := f.QueueState("orders", 1); !reflect.DeepEqual(qs, QueueState{Base: 50, End: 50, Left: []string{"g2"}}) {
		t.Fatalf("queue state: %+v", qs)
	}
	g := group(t, f, "g2")
	if g.Admission != routing.Retired || g.Master.ID != "" || g.Slave.ID != "" || g.Epoch != g2.Epoch || g.ChangedAt != 9 || g.Reasons != 0 {
		t.Fatalf("retired group: %+v", g)
	}
	cg := cgroup(t, f, "cg")
	if cg.Offsets["orders"][1] != 40 || cg.Offsets["orders"][0] != 7 {
		t.Fatalf("committed offsets moved: %v", cg.Offsets)
	}
	if _, ok := cg.Epochs["orders"][1]; ok || cg.Epochs["orders"][0] != 1 {
		t.Fatalf("committed epochs: %v (the moved queue's must be gone, the other kept)", cg.Epochs)
	}

	// Its brokers are refused; a retry finds nothing to do.
	_, err = apply(t, f, &RegisterBroker{Group: "g2", Role: routing.RoleMaster, Broker: routing.Broker{ID: "g2-m", Addr: "g2-m:9000"}})
	wantStatus(t, err, protocol.ErrConflict, "a broker of a retired group")
	if !strings.Contains(err.Error(), "ferryctl broker add-group g2") {
		t.Fatalf("the refusal does not say what to do: %v", err)
	}
	if plan, err := f.PlanRetire("g2", []string{"g1"}); err != nil || len(plan) != 0 {
		t.Fatalf("planning again: %+v, %v", plan, err)
	}
	if r := mustApply(t, f, &RetireGroup{Group: "g2", At: 10}); r.Changed {
		t.Fatal("retiring a retired group changed something")
	}
	_, err = apply(t, f, &CreateTopic{Name: "x", Queues: []string{"g2"}})
	wantStatus(t, err, protocol.ErrConflict, "a topic on a retired group")

	// Admitted again, it takes brokers back in the next epoch.
	mustApply(t, f, &AdmitGroup{Group: "g2", At: 11})
	register(t, f, "g2", "g2-new", false)
	if g := group(t, f, "g2"); g.Master.ID != "g2-new" || g.Epoch != g2.Epoch+1 || g.Admission != routing.Admitted {
		t.Fatalf("g2 admitted again: %+v", g)
	}

	// A queue moves again from past the base it got, and not back to a
	// group it left while another can take it (that group's log holds its
	// older records): g2 holds nothing, but only events/2 never left it.
	mustApply(t, f, &RecordQueueEnds{Group: "g3", Ends: []QueueEnd{{Topic: "orders", Queue: 1, End: 65}}})
	plan, err = f.PlanRetire("g3", []string{"g1", "g2"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range plan {
		got = append(got, fmt.Sprintf("%s/%d->%s@%d", m.Topic, m.Queue, m.To, m.Base))
	}
	if want := []string{"events/0->g1@80", "events/2->g2@0", "orders/1->g1@65"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("second plan %v, want %v", got, want)
	}
	if plan, _ := f.PlanRetire("g3", []string{"g2"}); plan[0].To != "g2" {
		t.Fatalf("with only a group it left, a queue still moves there: %+v", plan)
	}
}

func TestRetireGroupRefusals(t *testing.T) {
	f := retireSeeded(t)
	one := []QueueMove{{Topic: "orders", Queue: 1, To: "g3"}}
	for _, c := range []struct {
		name string
		cmd  *RetireGroup
		want *protocol.Error
	}{
		{"unknown group", &RetireGroup{Group: "nope"}, protocol.ErrNotFound},
		{"a queue left out", &RetireGroup{Group: "g1", Moves: []QueueMove{{Topic: "orders", Queue: 0, To: "g3"}}}, protocol.ErrConflict},
		{"a queue it does not hold", &RetireGroup{Group: "g2", Moves: []QueueMove{{Topic: "orders", Queue: 0, To: "g3"}}}, protocol.ErrConflict},
		{"a queue twice", &RetireGroup{Group: "g2", Moves: append(one, one...)}, protocol.ErrConflict},
		{"to itself", &RetireGroup{Group: "g2", Moves: []QueueMove{{Topic: "orders", Queue: 1, To: "g2"}}}, protocol.ErrInvalid},
		{"to a pending group", &RetireGroup{Group: "g2", Moves: []QueueMove{{Topic: "orders", Queue: 1, To: "gp"}}}, protocol.ErrConflict},
		{"to no group", &RetireGroup{Group: "g2", Moves: []QueueMove{{Topic: "orders", Queue: 1, To: "g9"}}}, protocol.ErrNotFound},
	} {
		before := registry(f)
		_, err := apply(t, f, c.cmd)
		wantStatus(t, err, c.want, c.name)
		if !reflect.DeepEqual(registry(f), before) {
			t.Fatalf("%s: the refused retirement changed the registry", c.name)
		}
	}
	if _, err := f.PlanRetire("g2", []string{"gp", "g2"}); err == nil || !strings.Contains(err.Error(), "no other admitted") {
		t.Fatalf("a plan with no target: %v", err)
	}
	// A group that holds nothing retires with no target.
	mustApply(t, f, &RetireGroup{Group: "gp", At: 3})
	if g := group(t, f, "gp"); g.Admission != routing.Retired {
		t.Fatalf("gp: %+v", g)
	}
}

// Reported ends count only for the queues the reporting group holds, and
// only upwards, and move no route version.
func TestRecordQueueEnds(t *testing.T) {
	f := seeded(t)
	v := f.Version()
	if fresh := f.NewQueueEnds("g1", []QueueEnd{{Topic: "orders", Queue: 0, End: 10}, {Topic: "orders", Queue: 1, End: 5}, {Topic: "nope", Queue: 0, End: 1}, {Topic: "orders", Queue: 9, End: 1}}); !reflect.DeepEqual(fresh, []QueueEnd{{Topic: "orders", Queue: 0, End: 10}}) {
		t.Fatalf("new ends: %+v", fresh)
	}
	mustApply(t, f, &RecordQueueEnds{Group: "g1", Ends: []QueueEnd{{Topic: "orders", Queue: 0, End: 10}, {Topic: "orders", Queue: 1, End: 5}, {Topic: "orders", Queue: 2, End: 3}}})
	if r := mustApply(t, f, &RecordQueueEnds{Group: "g1", Ends: []QueueEnd{{Topic: "orders", Queue: 0, End: 4}}}); r.Changed {
		t.Fatal("a lower end was recorded")
	}
	if a, b, c := f.QueueState("orders", 0), f.QueueState("orders", 1), f.QueueState("orders", 2); a.End != 10 || b.End != 0 || c.End != 3 {
		t.Fatalf("ends: %+v %+v %+v", a, b, c)
	}
	if f.NewQueueEnds("g1", []QueueEnd{{Topic: "orders", Queue: 0, End: 10}}) != nil {
		t.Fatal("an end already known counts as new")
	}
	if f.Version() != v {
		t.Fatalf("recording ends moved the version from %d to %d", v, f.Version())
	}
}

// A commit of what was read in the group a queue left records no epoch
// (the new group would take it for one of its own), and no offset past the
// base the queue moved at: offsets the registry never heard of from the old
// group name other messages in the new one, which the consumer group must
// not skip.
func TestCommitReadInTheGroupAQueueLeft(t *testing.T) {
	f := retireSeeded(t)
	mustApply(t, f, &RecordQueueEnds{Group: "g2", Ends: []QueueEnd{{Topic: "orders", Queue: 1, End: 8}}})
	mustApply(t, f, &RetireGroup{Group: "g2", Moves: []QueueMove{{Topic: "orders", Queue: 1, To: "g3"}}, At: 4})
	commit(t, f, QueueOffset{Topic: "orders", Queue: 1, Offset: 5, Epoch: 7, EpochGroup: "g2"}, QueueOffset{Topic: "orders", Queue: 0, Offset: 5, Epoch: 2, EpochGroup: "g1"})
	cg := cgroup(t, f, "cg")
	if _, ok := cg.Epochs["orders"][1]; ok || cg.Epochs["orders"][0] != 2 || cg.Offsets["orders"][1] != 5 || cg.Offsets["orders"][0] != 5 {
		t.Fatalf("epochs %v offsets %v", cg.Epochs, cg.Offsets)
	}
	commit(t, f, QueueOffset{Topic: "orders", Queue: 1, Offset: 12, Epoch: 7, EpochGroup: "g2"})
	if cg := cgroup(t, f, "cg"); cg.Offsets["orders"][1] != 8 {
		t.Fatalf("a commit past the base, read in g2: recorded %d, want the base 8", cg.Offsets["orders"][1])
	}
	commit(t, f, QueueOffset{Topic: "orders", Queue: 1, Offset: 12, Epoch: 1, EpochGroup: "g3"})
	if cg := cgroup(t, f, "cg"); cg.Epochs["orders"][1] != 1 || cg.Offsets["orders"][1] != 12 {
		t.Fatalf("a commit read in the queue's group: epochs %v offsets %v", cg.Epochs, cg.Offsets)
	}
	// A queue that never moved is not clamped, whatever group a commit names.
	commit(t, f, QueueOffset{Topic: "orders", Queue: 0, Offset: 30, Epoch: 2, EpochGroup: "g9"})
	if cg := cgroup(t, f, "cg"); cg.Offsets["orders"][0] != 30 {
		t.Fatalf("queue 0 recorded %d, want 30", cg.Offsets["orders"][0])
	}
}

func TestGroupsSnapshotRoundTrip(t *testing.T) {
	f := retireSeeded(t)
	mustApply(t, f, &RecordQueueEnds{Group: "g2", Ends: []QueueEnd{{Topic: "orders", Queue: 1, End: 50}}})
	mustApply(t, f, &RecordQueueEnds{Group: "g1", Ends: []QueueEnd{{Topic: "orders", Queue: 0, End: 9}}})
	mustApply(t, f, &RetireGroup{Group: "g2", Moves: []QueueMove{{Topic: "orders", Queue: 1, To: "g3"}}, At: 4})
	r := restored(t, f)
	if !reflect.DeepEqual(r.State(), f.State()) {
		t.Fatalf("restored state differs:\n got %+v\nwant %+v", r.State(), f.State())
	}
	for name, want := range map[string]routing.Admission{"g1": routing.Admitted, "g2": routing.Retired, "gp": routing.Pending} {
		if g := group(t, r, name); g.Admission != want {
			t.Fatalf("restored %s is %q, want %q", name, g.Admission, want)
		}
	}
	if rt, _ := r.Route("orders"); rt.Queues[1].Base != 50 {
		t.Fatalf("restored route: %+v", rt)
	}
	// The restored node goes on as the original does.
	c := &RetireGroup{Group: "g3", Moves: []QueueMove{{Topic: "orders", Queue: 1, To: "g1"}}, At: 5}
	if a, b := mustApply(t, r, c), mustApply(t, f, c); !reflect.DeepEqual(a, b) || !reflect.DeepEqual(r.State(), f.State()) {
		t.Fatalf("after restore: %+v vs %+v", a, b)
	}
}

// A snapshot from before admission has every group admitted, and no bases.
func TestRestoreSnapshotFromBeforeAdmission(t *testing.T) {
	old := `{"version":3,"groups":{"g1":{"name":"g1","master":{"id":"m","addr":"a:1"},"epoch":1}},"topics":{"orders":{"name":"orders","queues":["g1","g1"],"version":2}},"members":{},"next_producer_id":1}`
	f := New()
	if err := f.Restore(io.NopCloser(strings.NewReader(old))); err != nil {
		t.Fatal(err)
	}
	if g := group(t, f, "g1"); g.Admission != routing.Admitted {
		t.Fatalf("g1 from an old snapshot: %q", g.Admission)
	}
	mustApply(t, f, &CreateTopic{Name: "t", Queues: []string{"g1"}})
	if r, _ := f.Route("orders"); r.Queues[0].Base != 0 || r.Queues[1].Base != 0 {
		t.Fatalf("bases from nowhere: %+v", r)
	}
}

func TestDecodeGroupCommands(t *testing.T) {
	for _, c := range []Command{
		&AdmitGroup{Group: "g", At: 1},
		&RetireGroup{Group: "g", Moves: []QueueMove{{Topic: "t", Queue: 1, To: "h", Base: 9}}, At: 2},
		&RecordQueueEnds{Group: "g", Ends: []QueueEnd{{Topic: "t", Queue: 1, End: 3}}},
		&RegisterBroker{Group: "g", Role: routing.RoleMaster, Broker: routing.Broker{ID: "b", Addr: "a"}, Pending: true},
	} {
		if c.Type()&IgnoreUnknown != 0 || (c.Type() < 40 && c.Type() != TypeRegisterBroker) {
			t.Fatalf("%T has type %d", c, c.Type())
		}
		b, err := Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(b)
		if err != nil || !reflect.DeepEqual(got, c) {
			t.Fatalf("%T: decoded %+v, %v", c, got, err)
		}
	}
}
