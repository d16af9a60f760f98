package fsm

import (
	"bytes"
	"errors"
	"go/parser"
	"go/token"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

func apply(t *testing.T, f *FSM, c Command) (*Result, error) {
	t.Helper()
	b, err := Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	switch r := f.Apply(&raft.Log{Type: raft.LogCommand, Data: b, Index: 1}).(type) {
	case *Result:
		return r, nil
	case error:
		return nil, r
	default:
		t.Fatalf("Apply returned %T", r)
		return nil, nil
	}
}

func mustApply(t *testing.T, f *FSM, c Command) *Result {
	t.Helper()
	r, err := apply(t, f, c)
	if err != nil {
		t.Fatalf("%T: %v", c, err)
	}
	return r
}

func seeded(t *testing.T) *FSM {
	f := New()
	for _, g := range []string{"g1", "g2"} {
		mustApply(t, f, &RegisterBroker{Group: g, Role: routing.RoleMaster, Broker: routing.Broker{ID: g + "-m", Addr: g + "-m:9000", HAAddr: g + "-m:9001"}, At: 1})
		mustApply(t, f, &RegisterBroker{Group: g, Role: routing.RoleSlave, Broker: routing.Broker{ID: g + "-s", Addr: g + "-s:9000"}, At: 1})
	}
	mustApply(t, f, &CreateTopic{Name: "orders", Queues: []string{"g1", "g2", "g1"}})
	mustApply(t, f, &SetMember{ID: "n1", RPCAddr: "127.0.0.1:7000"})
	mustApply(t, f, &InitProducer{})
	mustApply(t, f, &InitProducer{Name: "billing"})
	mustApply(t, f, &InitProducer{Name: "billing"})
	mustApply(t, f, &InitProducer{Name: "audit"})
	return f
}

func TestCommands(t *testing.T) {
	f := seeded(t)
	r, ok := f.Route("orders")
	if !ok || len(r.Queues) != 3 || r.Queues[1].Group != "g2" || r.Queues[1].Master != "g2-m:9000" || !r.Queues[1].Writable {
		t.Fatalf("route: %+v", r)
	}
	v := f.Version()

	// Registering what is there changes nothing.
	if res := mustApply(t, f, &RegisterBroker{Group: "g1", Role: routing.RoleMaster, Broker: routing.Broker{ID: "g1-m", Addr: "g1-m:9000", HAAddr: "g1-m:9001"}, At: 5}); res.Changed || f.Version() != v {
		t.Fatal("a repeated registration changed the state")
	}

	g1, _ := f.Group("g1")
	res := mustApply(t, f, &SetGroupReasons{Group: "g1", Set: routing.HeartbeatLost, ExpectVersion: g1.Version, At: 100})
	if !res.Changed {
		t.Fatal("setting a reason changed nothing")
	}
	g1b, _ := f.Group("g1")
	if g1b.Writable() || g1b.ChangedAt != 100 || g1b.Version <= g1.Version {
		t.Fatalf("group after RO: %+v", g1b)
	}
	r, _ = f.Route("orders")
	if r.Queues[0].Writable || !r.Queues[1].Writable || r.Version <= v {
		t.Fatalf("route after RO: %+v", r)
	}
	// A stale decision (made on the old version) is refused harmlessly.
	if _, err := apply(t, f, &SetGroupReasons{Group: "g1", Clear: routing.HeartbeatLost, ExpectVersion: g1.Version}); !errors.Is(err, protocol.ErrConflict) {
		t.Fatalf("stale command: %v", err)
	}
	if g, _ := f.Group("g1"); g.Writable() {
		t.Fatal("a stale command changed the state")
	}

	cases := []struct {
		name string
		cmd  Command
		want error
	}{
		{"topic exists with other queues", &CreateTopic{Name: "orders", Queues: []string{"g1"}}, protocol.ErrConflict},
		{"topic on an unknown group", &CreateTopic{Name: "x", Queues: []string{"g9"}}, protocol.ErrNotFound},
		{"topic with no queues", &CreateTopic{Name: "y"}, protocol.ErrInvalid},
		{"bad topic name", &CreateTopic{Name: "a b", Queues: []string{"g1"}}, protocol.ErrInvalid},
		{"add queues to a stale version", &AddQueues{Topic: "orders", Groups: []string{"g2"}, ExpectVersion: 1}, protocol.ErrConflict},
		{"add queues to an unknown topic", &AddQueues{Topic: "nope", Groups: []string{"g2"}}, protocol.ErrNotFound},
		{"remove a group in use", &RemoveGroup{Group: "g2"}, protocol.ErrConflict},
		{"bad role", &RegisterBroker{Group: "g1", Role: "boss", Broker: routing.Broker{ID: "x", Addr: "y"}}, protocol.ErrInvalid},
		{"state of an unknown group", &SetGroupReasons{Group: "g9", Set: routing.Admin}, protocol.ErrNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := registry(f)
			if _, err := apply(t, f, tc.cmd); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if !reflect.DeepEqual(before, registry(f)) {
				t.Fatal("a refused command changed the state")
			}
		})
	}

	// A retried create is harmless.
	if res := mustApply(t, f, &CreateTopic{Name: "orders", Queues: []string{"g1", "g2", "g1"}}); res.Changed {
		t.Fatal("a retried create changed the state")
	}
	topic := f.Topics()[0]
	mustApply(t, f, &AddQueues{Topic: "orders", Groups: []string{"g2"}, ExpectVersion: topic.Version})
	if r, _ := f.Route("orders"); len(r.Queues) != 4 || r.Queues[3].Queue != 3 {
		t.Fatalf("after add queues: %+v", r)
	}
	mustApply(t, f, &RegisterBroker{Group: "g3", Role: routing.RoleMaster, Broker: routing.Broker{ID: "g3-m", Addr: "a"}})
	mustApply(t, f, &RemoveGroup{Group: "g3"})
	if _, ok := f.Group("g3"); ok {
		t.Fatal("group not removed")
	}
	mustApply(t, f, &RemoveBroker{Group: "g2", Role: routing.RoleSlave})
	if g, _ := f.Group("g2"); g.Slave.ID != "" {
		t.Fatal("slave not removed")
	}
}

type memSink struct {
	bytes.Buffer
	canceled bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.canceled = true; return nil }
func (s *memSink) Close() error  { return nil }

// fataler is what restored needs of a test: *testing.T and *rapid.T both
// are one.
type fataler interface {
	Helper()
	Fatal(args ...any)
}

// restored returns a new FSM restored from a snapshot of f.
func restored(tb fataler, f *FSM) *FSM {
	tb.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		tb.Fatal(err)
	}
	return persisted(tb, snap)
}

// persisted returns a new FSM restored from what snap persists.
func persisted(tb fataler, snap raft.FSMSnapshot) *FSM {
	tb.Helper()
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		tb.Fatal(err)
	}
	snap.Release()
	r := New()
	if err := r.Restore(io.NopCloser(&sink)); err != nil {
		tb.Fatal(err)
	}
	return r
}

func TestSnapshotRestoreRoundTrip(t *testing.T) {
	f := seeded(t)
	mustApply(t, f, &SetGroupReasons{Group: "g2", Set: routing.Admin | routing.SlaveLag, At: 7})
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Changes after Snapshot do not leak into it.
	mustApply(t, f, &CreateTopic{Name: "later", Queues: []string{"g1"}})
	g := persisted(t, snap)
	want := seeded(t)
	mustApply(t, want, &SetGroupReasons{Group: "g2", Set: routing.Admin | routing.SlaveLag, At: 7})
	if !reflect.DeepEqual(g.State(), want.State()) {
		t.Fatalf("restored state differs:\n got %+v\nwant %+v", g.State(), want.State())
	}
	// The producer counter and names came back: the restored node goes on
	// where the snapshot left off, as the node it was taken from did.
	if st := g.State(); st.NextProducerID != 4 || len(st.Producers) != 2 ||
		st.Producers["billing"] != (ProducerIdentity{ID: 2, Epoch: 1}) || st.Producers["audit"] != (ProducerIdentity{ID: 3}) {
		t.Fatalf("restored producers: next %d, %+v", st.NextProducerID, st.Producers)
	}
	for _, c := range []*InitProducer{{}, {Name: "billing"}, {Name: "new"}} {
		got, wanted := mustApply(t, g, c), mustApply(t, want, c)
		if !reflect.DeepEqual(got, wanted) {
			t.Fatalf("%+v after restore: %+v, want %+v", c, got, wanted)
		}
	}
	if err := New().Restore(io.NopCloser(strings.NewReader("{not json"))); err == nil {
		t.Fatal("restoring garbage succeeded")
	}
}

func TestRestoreSnapshotFromBeforeProducerIDs(t *testing.T) {
	old := `{"version":3,"groups":{},"topics":{},"members":{"n1":"a:1"}}`
	f := New()
	if err := f.Restore(io.NopCloser(strings.NewReader(old))); err != nil {
		t.Fatal(err)
	}
	if r := mustApply(t, f, &InitProducer{Name: "p"}); r.Producer != (ProducerIdentity{ID: 1}) {
		t.Fatalf("first producer after an old snapshot: %+v", r.Producer)
	}
}

func TestInitProducer(t *testing.T) {
	f := New()
	alloc := func(name string) ProducerIdentity {
		t.Helper()
		r := mustApply(t, f, &InitProducer{Name: name})
		if !r.Changed {
			t.Fatalf("InitProducer(%q) changed nothing", name)
		}
		return r.Producer
	}
	// Anonymous: a fresh id each time, epoch 0, nothing stored.
	for want := uint64(1); want <= 3; want++ {
		if p := alloc(""); p != (ProducerIdentity{ID: want}) {
			t.Fatalf("anonymous producer %d: %+v", want, p)
		}
	}
	if st := f.State(); len(st.Producers) != 0 || st.NextProducerID != 4 {
		t.Fatalf("anonymous producers left state: %+v", st)
	}
	// Named: a fresh id the first time, then the same id at the next epoch.
	a0 := alloc("orders-writer")
	if a0 != (ProducerIdentity{ID: 4}) {
		t.Fatalf("first named instance: %+v", a0)
	}
	b0 := alloc("other")
	if b0 != (ProducerIdentity{ID: 5}) {
		t.Fatalf("second name: %+v", b0)
	}
	for e := uint16(1); e <= 3; e++ {
		if p := alloc("orders-writer"); p != (ProducerIdentity{ID: 4, Epoch: e}) {
			t.Fatalf("named instance %d: %+v", e, p)
		}
	}
	if p := alloc(""); p.ID != 6 {
		t.Fatalf("anonymous after named: %+v", p)
	}
	if p, ok := f.Producer("orders-writer"); !ok || p != (ProducerIdentity{ID: 4, Epoch: 3}) {
		t.Fatalf("Producer: %+v %v", p, ok)
	}
	if f.Version() != 0 {
		t.Fatalf("producer identities moved the registry version to %d", f.Version())
	}

	// Bad names are refused and change nothing.
	for _, name := range []string{"a b", "naïve", "x/y", "tab\t", strings.Repeat("n", MaxProducerName+1)} {
		before := f.State()
		if _, err := apply(t, f, &InitProducer{Name: name}); !errors.Is(err, protocol.ErrInvalid) {
			t.Fatalf("name %q: %v", name, err)
		}
		if !reflect.DeepEqual(before, f.State()) {
			t.Fatalf("refused name %q changed the state", name)
		}
	}
	if p := alloc(strings.Repeat("n", MaxProducerName)); p.Epoch != 0 || p.ID != 7 {
		t.Fatalf("longest name: %+v", p)
	}

	// The same log gives the same identities on every node.
	g := New()
	for _, name := range []string{"", "", "", "orders-writer", "other", "orders-writer", "orders-writer", "orders-writer", "", strings.Repeat("n", MaxProducerName)} {
		mustApply(t, g, &InitProducer{Name: name})
	}
	if !reflect.DeepEqual(f.State(), g.State()) {
		t.Fatalf("replaying the log gave another state:\n got %+v\nwant %+v", g.State(), f.State())
	}
}

// TestInitProducerEpochWrap: a name whose epoch would pass 65535 gets a
// fresh id at epoch 0, so no (id, epoch) is ever handed out twice.
func TestInitProducerEpochWrap(t *testing.T) {
	f := New()
	mustApply(t, f, &InitProducer{Name: "p"})
	mustApply(t, f, &InitProducer{}) // id 2
	f.s.Producers["p"] = ProducerIdentity{ID: 1, Epoch: math.MaxUint16 - 1}
	if r := mustApply(t, f, &InitProducer{Name: "p"}); r.Producer != (ProducerIdentity{ID: 1, Epoch: math.MaxUint16}) {
		t.Fatalf("last epoch: %+v", r.Producer)
	}
	if r := mustApply(t, f, &InitProducer{Name: "p"}); r.Producer != (ProducerIdentity{ID: 3}) {
		t.Fatalf("past the last epoch: %+v", r.Producer)
	}
	if r := mustApply(t, f, &InitProducer{Name: "p"}); r.Producer != (ProducerIdentity{ID: 3, Epoch: 1}) {
		t.Fatalf("after the wrap: %+v", r.Producer)
	}
	if r := mustApply(t, f, &InitProducer{}); r.Producer.ID != 4 {
		t.Fatalf("anonymous after the wrap: %+v", r.Producer)
	}
	// The counter never wraps to 0 ("no producer").
	f.s.NextProducerID = math.MaxUint64
	before := f.State()
	if _, err := apply(t, f, &InitProducer{}); !errors.Is(err, protocol.ErrInternal) {
		t.Fatalf("exhausted ids: %v", err)
	}
	if !reflect.DeepEqual(before, f.State()) {
		t.Fatal("a refused allocation changed the state")
	}
}

func TestDecodeUnknown(t *testing.T) {
	if c, err := Decode([]byte{byte(IgnoreUnknown | 0x3f), '{', '}'}); c != nil || err != nil {
		t.Fatalf("ignorable unknown: %v %v", c, err)
	}
	if _, err := Decode([]byte{0x3f, '{', '}'}); err == nil {
		t.Fatal("unknown command without the ignore bit decoded")
	}
	if _, err := Decode(nil); err == nil {
		t.Fatal("empty command decoded")
	}
}

// TestDeterministic fails if the FSM package can read a clock, draw random
// numbers or do I/O of its own.
func TestDeterministic(t *testing.T) {
	forbidden := map[string]bool{"time": true, "math/rand": true, "math/rand/v2": true, "crypto/rand": true,
		"os": true, "net": true, "net/http": true, "io/ioutil": true, "syscall": true, "os/exec": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		af, err := parser.ParseFile(token.NewFileSet(), name, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if forbidden[p] {
				t.Errorf("%s imports %q: the FSM must be deterministic (the leader stamps times into commands)", name, p)
			}
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no source files checked")
	}
}

// SetEpochStart moves the current epoch's start up to the new master's
// takeover end, never down, and never for another epoch.
func TestSetEpochStart(t *testing.T) {
	f := New()
	mustApply(t, f, &RegisterBroker{Group: "g", Role: routing.RoleMaster, Broker: routing.Broker{ID: "a", Addr: "a:1"}, LogEnd: 0, At: 1})
	mustApply(t, f, &RegisterBroker{Group: "g", Role: routing.RoleSlave, Broker: routing.Broker{ID: "b", Addr: "b:1"}, At: 1})
	mustApply(t, f, &Promote{Group: "g", Epoch: 1, Master: "a", Slave: "b", Start: 100, At: 2})
	mustApply(t, f, &SetEpochStart{Group: "g", Epoch: 2, Start: 150})
	g, _ := f.Group("g")
	if g.History[1].Start != 150 || g.History[0].Start != 0 {
		t.Fatalf("history %+v", g.History)
	}
	if res := mustApply(t, f, &SetEpochStart{Group: "g", Epoch: 2, Start: 120}); res.Changed {
		t.Fatal("moved an epoch's start down")
	}
	b, _ := Encode(&SetEpochStart{Group: "g", Epoch: 1, Start: 500})
	if _, ok := f.Apply(&raft.Log{Type: raft.LogCommand, Data: b}).(error); !ok {
		t.Fatal("moved the start of an epoch that is not the current one")
	}
	if g, _ := f.Group("g"); g.History[1].Start != 150 {
		t.Fatalf("history %+v", g.History)
	}
}
