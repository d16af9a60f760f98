package fsm

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

func broker(id string) routing.Broker { return routing.Broker{ID: id, Addr: id + ":9000"} }

// three is a group g1 of master m, first slave s1 (registered) and s2
// (joined), at epoch 1.
func three(t *testing.T) *FSM {
	t.Helper()
	f := New()
	mustApply(t, f, &RegisterBroker{Group: "g1", Role: routing.RoleMaster, Broker: broker("m"), At: 1})
	mustApply(t, f, &RegisterBroker{Group: "g1", Role: routing.RoleSlave, Broker: broker("s1"), At: 1})
	mustApply(t, f, &JoinSlave{Group: "g1", Broker: broker("s2"), At: 2})
	return f
}

func ids(bs []routing.Broker) []string {
	out := []string{}
	for _, b := range bs {
		out = append(out, b.ID)
	}
	return out
}

func wantErr(t *testing.T, err error, status protocol.Status, what string) {
	t.Helper()
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Status != status {
		t.Fatalf("%s: %v, want %v", what, err, status)
	}
}

// alter is the group's master changing the set from the version it has.
func alter(t *testing.T, f *FSM, set ...string) error {
	t.Helper()
	g := group(t, f, "g1")
	_, err := apply(t, f, &AlterSyncSet{Group: "g1", Epoch: g.Epoch, Master: g.Master.ID, ExpectVersion: g.SyncVersion, InSync: set, At: 3})
	return err
}

// A third broker cannot register (the group's two places are taken) but
// joins as a slave, outside the sync set; joining again changes nothing,
// new addresses replace the old; the master cannot join as a slave; a
// group with a free place is filled by RegisterBroker, not JoinSlave; no
// group has more than MaxSlaves slaves.
func TestJoinSlave(t *testing.T) {
	f := New()
	mustApply(t, f, &RegisterBroker{Group: "g1", Role: routing.RoleMaster, Broker: broker("m"), At: 1})
	_, err := apply(t, f, &JoinSlave{Group: "g1", Broker: broker("s1"), At: 1})
	wantErr(t, err, protocol.StatusConflict, "joining a group with no slave")
	mustApply(t, f, &RegisterBroker{Group: "g1", Role: routing.RoleSlave, Broker: broker("s1"), At: 1})
	_, err = apply(t, f, &RegisterBroker{Group: "g1", Role: routing.RoleSlave, Broker: broker("s2"), At: 2})
	wantErr(t, err, protocol.StatusConflict, "registering a third broker")

	v := mustApply(t, f, &JoinSlave{Group: "g1", Broker: broker("s2"), At: 2}).Version
	g := group(t, f, "g1")
	if got := ids(g.Slaves); !slices.Equal(got, []string{"s1", "s2"}) || g.Slave.ID != "s1" || len(g.InSync) != 0 || g.ChangedAt != 2 {
		t.Fatalf("after s2 joined: slaves %v, mirror %q, in sync %v, changed at %d", got, g.Slave.ID, g.InSync, g.ChangedAt)
	}
	if role, ok := g.RoleOf("s2"); !ok || role != routing.RoleSlave {
		t.Fatalf("s2's role: %q %v", role, ok)
	}
	if r := mustApply(t, f, &JoinSlave{Group: "g1", Broker: broker("s2"), At: 3}); r.Version != v {
		t.Fatalf("joining again moved the version %d -> %d", v, r.Version)
	}
	moved := routing.Broker{ID: "s2", Addr: "elsewhere:9000"}
	mustApply(t, f, &JoinSlave{Group: "g1", Broker: moved, At: 4})
	if b, _ := group(t, f, "g1").SlaveByID("s2"); b != moved || len(group(t, f, "g1").Slaves) != 2 {
		t.Fatalf("s2 after it moved: %+v in %v", b, group(t, f, "g1").Slaves)
	}
	_, err = apply(t, f, &JoinSlave{Group: "g1", Broker: broker("m"), At: 5})
	wantErr(t, err, protocol.StatusConflict, "the master joining as a slave")
	_, err = apply(t, f, &JoinSlave{Group: "g1", Broker: routing.Broker{ID: "x"}, At: 5})
	wantErr(t, err, protocol.StatusInvalid, "a broker without an address")
	_, err = apply(t, f, &JoinSlave{Group: "nope", Broker: broker("x"), At: 5})
	wantErr(t, err, protocol.StatusNotFound, "joining a group that does not exist")

	for i := len(group(t, f, "g1").Slaves); i < routing.MaxSlaves; i++ {
		mustApply(t, f, &JoinSlave{Group: "g1", Broker: broker("s" + string(rune('a'+i))), At: 6})
	}
	_, err = apply(t, f, &JoinSlave{Group: "g1", Broker: broker("one-too-many"), At: 7})
	wantErr(t, err, protocol.StatusConflict, "a slave past MaxSlaves")
	if n := len(group(t, f, "g1").Slaves); n != routing.MaxSlaves {
		t.Fatalf("%d slaves, want %d", n, routing.MaxSlaves)
	}
}

// The sync set changes only by its master, in its epoch, from the version
// it read; every id is a slave, named once; Slave mirrors the set's first
// member.
func TestAlterSyncSet(t *testing.T) {
	f := three(t)
	g := group(t, f, "g1")
	for _, tc := range []struct {
		name   string
		c      AlterSyncSet
		status protocol.Status
	}{
		{"an earlier epoch", AlterSyncSet{Group: "g1", Epoch: 0, Master: "m", InSync: []string{"s1"}}, protocol.StatusConflict},
		{"not the master", AlterSyncSet{Group: "g1", Epoch: 1, Master: "s1", InSync: []string{"s2"}}, protocol.StatusConflict},
		{"no master named", AlterSyncSet{Group: "g1", Epoch: 1, InSync: []string{"s2"}}, protocol.StatusConflict},
		{"a stale version", AlterSyncSet{Group: "g1", Epoch: 1, Master: "m", ExpectVersion: 7, InSync: []string{"s1"}}, protocol.StatusConflict},
		{"not a slave", AlterSyncSet{Group: "g1", Epoch: 1, Master: "m", InSync: []string{"s1", "x"}}, protocol.StatusConflict},
		{"the master in its set", AlterSyncSet{Group: "g1", Epoch: 1, Master: "m", InSync: []string{"m"}}, protocol.StatusConflict},
		{"named twice", AlterSyncSet{Group: "g1", Epoch: 1, Master: "m", InSync: []string{"s2", "s2"}}, protocol.StatusInvalid},
		{"no group", AlterSyncSet{Group: "nope", Epoch: 1, Master: "m"}, protocol.StatusNotFound},
	} {
		_, err := apply(t, f, &tc.c)
		wantErr(t, err, tc.status, tc.name)
	}
	if now := group(t, f, "g1"); !reflect.DeepEqual(now, g) {
		t.Fatalf("refused changes changed the group:\n%+v\n%+v", now, g)
	}

	if err := alter(t, f, "s2"); err != nil {
		t.Fatal(err)
	}
	g = group(t, f, "g1")
	if !slices.Equal(g.InSync, []string{"s2"}) || g.SyncVersion != 1 || g.Slave.ID != "s2" || g.HighAllowed() != true || g.ChangedAt != 3 {
		t.Fatalf("set {s2}: %+v", g)
	}
	if err := alter(t, f, "s1", "s2"); err != nil {
		t.Fatal(err)
	}
	if g = group(t, f, "g1"); g.SyncVersion != 2 || g.Slave.ID != "s1" {
		t.Fatalf("set {s1,s2}: version %d, mirror %q", g.SyncVersion, g.Slave.ID)
	}
	// The version the master read is stale once another change committed.
	_, err := apply(t, f, &AlterSyncSet{Group: "g1", Epoch: 1, Master: "m", ExpectVersion: 1, InSync: nil})
	wantErr(t, err, protocol.StatusConflict, "a change from version 1 after version 2")
	if err := alter(t, f); err != nil {
		t.Fatal(err)
	}
	if g = group(t, f, "g1"); len(g.InSync) != 0 || g.SyncVersion != 3 || g.Slave.ID != "s1" || g.HighAllowed() {
		t.Fatalf("empty set: %+v (HIGH allowed %v)", g, g.HighAllowed())
	}
}

// The policy: MinInSync and AckQuorum within bounds (an ack quorum of one
// copy is the master alone, which HIGH never means); HighAllowed follows
// the set against MinCopies.
func TestSetGroupPolicy(t *testing.T) {
	f := three(t)
	if err := alter(t, f, "s1"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []SetGroupPolicy{
		{Group: "g1", MinInSync: -1},
		{Group: "g1", MinInSync: MaxMinInSync + 1},
		{Group: "g1", AckQuorum: 1},
		{Group: "g1", AckQuorum: -2},
		{Group: "g1", AckQuorum: MaxMinInSync + 1},
	} {
		_, err := apply(t, f, &c)
		wantErr(t, err, protocol.StatusInvalid, fmt.Sprintf("policy %+v", c))
	}
	_, err := apply(t, f, &SetGroupPolicy{Group: "nope", MinInSync: 2})
	wantErr(t, err, protocol.StatusNotFound, "no group")
	if g := group(t, f, "g1"); g.MinCopies() != routing.DefaultMinInSync || !g.HighAllowed() {
		t.Fatalf("default policy with one member: min copies %d, HIGH allowed %v", g.MinCopies(), g.HighAllowed())
	}
	v := mustApply(t, f, &SetGroupPolicy{Group: "g1", MinInSync: 3, At: 9}).Version
	if g := group(t, f, "g1"); g.MinInSync != 3 || g.HighAllowed() || g.ChangedAt != 9 {
		t.Fatalf("min 3 with one member: %+v", g)
	}
	if r := mustApply(t, f, &SetGroupPolicy{Group: "g1", MinInSync: 3, At: 10}); r.Version != v {
		t.Fatal("setting the same policy again moved the version")
	}
	if err := alter(t, f, "s1", "s2"); err != nil {
		t.Fatal(err)
	}
	if g := group(t, f, "g1"); !g.HighAllowed() {
		t.Fatal("min 3 with two members and the master: HIGH refused")
	}
	mustApply(t, f, &SetGroupPolicy{Group: "g1", MinInSync: 2, AckQuorum: 2})
	if g := group(t, f, "g1"); g.AckQuorum != 2 || g.MinCopies() != 2 {
		t.Fatalf("quorum 2: %+v", g)
	}
	mustApply(t, f, &SetGroupPolicy{Group: "g1", MinInSync: 0, AckQuorum: 4})
	if g := group(t, f, "g1"); g.MinCopies() != 4 || g.HighAllowed() {
		t.Fatalf("a quorum of 4 copies with 3: min copies %d, HIGH allowed %v", g.MinCopies(), g.HighAllowed())
	}
}

// Removing a slave takes it out of the group and the set (the set's
// version moves only if it was a member); the master cannot be removed;
// removing a broker the group does not name changes nothing.
func TestRemoveGroupBroker(t *testing.T) {
	f := three(t)
	if err := alter(t, f, "s1", "s2"); err != nil {
		t.Fatal(err)
	}
	_, err := apply(t, f, &RemoveGroupBroker{Group: "g1", Broker: "m"})
	wantErr(t, err, protocol.StatusConflict, "removing the master")
	v := group(t, f, "g1").Version
	if r := mustApply(t, f, &RemoveGroupBroker{Group: "g1", Broker: "x"}); r.Version != v {
		t.Fatal("removing a stranger changed the group")
	}
	mustApply(t, f, &RemoveGroupBroker{Group: "g1", Broker: "s1", At: 8})
	g := group(t, f, "g1")
	if !slices.Equal(ids(g.Slaves), []string{"s2"}) || !slices.Equal(g.InSync, []string{"s2"}) || g.SyncVersion != 2 || g.Slave.ID != "s2" || g.ChangedAt != 8 {
		t.Fatalf("after removing s1: %+v", g)
	}
	if _, known := g.RoleOf("s1"); known {
		t.Fatal("s1 still has a role")
	}
	// A slave outside the set: the set's version stays.
	mustApply(t, f, &JoinSlave{Group: "g1", Broker: broker("s3")})
	mustApply(t, f, &RemoveGroupBroker{Group: "g1", Broker: "s3"})
	if g := group(t, f, "g1"); g.SyncVersion != 2 || len(g.Slaves) != 1 {
		t.Fatalf("after removing s3, outside the set: %+v", g)
	}
	// The old way to drop the slave (RemoveBroker of the slave's role)
	// removes the mirrored one the same way.
	mustApply(t, f, &RemoveBroker{Group: "g1", Role: routing.RoleSlave})
	if g := group(t, f, "g1"); len(g.Slaves) != 0 || len(g.InSync) != 0 || g.Slave.ID != "" {
		t.Fatalf("after removing every slave: %+v", g)
	}
	// With no slave the group has a free place again: a newcomer registers.
	mustApply(t, f, &RegisterBroker{Group: "g1", Role: routing.RoleSlave, Broker: broker("s4")})
	if g := group(t, f, "g1"); g.Slave.ID != "s4" {
		t.Fatalf("a newcomer after every slave left: %+v", g)
	}
}

// Promote takes any slave: the others stay slaves, and set members stay
// members (they hold what the old master acknowledged); the promoted one
// leaves the set; the set's version moves, so a change the old master
// decided before is refused. A broker that is not a slave is refused.
func TestPromoteAnySlave(t *testing.T) {
	f := three(t)
	mustApply(t, f, &JoinSlave{Group: "g1", Broker: broker("s3")})
	if err := alter(t, f, "s1", "s2"); err != nil {
		t.Fatal(err)
	}
	before := group(t, f, "g1")
	for _, c := range []Promote{
		{Group: "g1", Epoch: 1, Master: "m", Slave: "m"},
		{Group: "g1", Epoch: 1, Master: "m", Slave: "x"},
		{Group: "g1", Epoch: 1, Master: "m", Slave: ""},
		{Group: "g1", Epoch: 2, Master: "m", Slave: "s2"},
		{Group: "g1", Epoch: 1, Master: "s1", Slave: "s2"},
	} {
		_, err := apply(t, f, &c)
		wantErr(t, err, protocol.StatusConflict, "promote "+c.Slave+" by "+c.Master)
	}
	mustApply(t, f, &Promote{Group: "g1", Epoch: 1, Master: "m", Slave: "s2", Start: 700, At: 9})
	g := group(t, f, "g1")
	if g.Master.ID != "s2" || g.Epoch != 2 || !slices.Equal(ids(g.Slaves), []string{"s1", "s3"}) ||
		!slices.Equal(g.InSync, []string{"s1"}) || g.SyncVersion != before.SyncVersion+1 || g.Slave.ID != "s1" {
		t.Fatalf("after promoting s2: %+v", g)
	}
	if h := g.History[len(g.History)-1]; h.Master != "s2" || h.Start != 700 || h.Epoch != 2 {
		t.Fatalf("history %+v", g.History)
	}
	_, err := apply(t, f, &AlterSyncSet{Group: "g1", Epoch: 1, Master: "m", ExpectVersion: before.SyncVersion, InSync: []string{"s1"}})
	wantErr(t, err, protocol.StatusConflict, "the old master changing the set after the promotion")
	// The old master comes back: the group's two places are taken, so it
	// joins as a slave (a new place at the end), outside the set.
	_, err = apply(t, f, &RegisterBroker{Group: "g1", Role: routing.RoleMaster, Broker: broker("m"), At: 10})
	wantErr(t, err, protocol.StatusConflict, "the old master registering into a full group")
	mustApply(t, f, &JoinSlave{Group: "g1", Broker: broker("m"), At: 10})
	if g := group(t, f, "g1"); g.Master.ID != "s2" || !slices.Equal(ids(g.Slaves), []string{"s1", "s3", "m"}) || g.IsInSync("m") {
		t.Fatalf("the old master back: %+v", g)
	}
	// A slave outside the set may be promoted too (the judge decides who
	// is eligible): it leaves no set.
	mustApply(t, f, &Promote{Group: "g1", Epoch: 2, Master: "s2", Slave: "s3", Start: 800})
	if g := group(t, f, "g1"); g.Master.ID != "s3" || !slices.Equal(g.InSync, []string{"s1"}) || !slices.Equal(ids(g.Slaves), []string{"s1", "m"}) {
		t.Fatalf("after promoting s3: %+v", g)
	}
}

// RegisterBroker fills two places: a master and a first slave; a broker
// registering again with new addresses keeps its place (a slave in any
// position).
func TestRegisterBrokerKeepsPlaces(t *testing.T) {
	f := three(t)
	mustApply(t, f, &RegisterBroker{Group: "g1", Role: routing.RoleMaster, Broker: routing.Broker{ID: "s2", Addr: "new:1"}})
	g := group(t, f, "g1")
	if b, _ := g.SlaveByID("s2"); g.Master.ID != "m" || b.Addr != "new:1" || !slices.Equal(ids(g.Slaves), []string{"s1", "s2"}) {
		t.Fatalf("s2 re-registering with a new address, preferring master: %+v", g)
	}
}

// The set, the slaves and the policy survive a snapshot, and the restored
// node goes on as the original.
func TestSyncSetSnapshotRoundTrip(t *testing.T) {
	f := three(t)
	if err := alter(t, f, "s2"); err != nil {
		t.Fatal(err)
	}
	mustApply(t, f, &SetGroupPolicy{Group: "g1", MinInSync: 3, AckQuorum: 2})
	r := restored(t, f)
	if !reflect.DeepEqual(r.State(), f.State()) {
		t.Fatalf("restored state differs:\n got %+v\nwant %+v", r.State(), f.State())
	}
	c := &AlterSyncSet{Group: "g1", Epoch: 1, Master: "m", ExpectVersion: 1, InSync: []string{"s1", "s2"}}
	if a, b := mustApply(t, r, c), mustApply(t, f, c); !reflect.DeepEqual(a, b) || !reflect.DeepEqual(r.State(), f.State()) {
		t.Fatalf("after restore: %+v vs %+v", a, b)
	}
}

// A snapshot from before groups had several slaves names its one slave in
// "slave" only: restored, the group has it as its one slave, outside the
// (empty) sync set, and a third broker joins after it.
func TestRestoreSnapshotWithOnlySlave(t *testing.T) {
	old := `{"version":4,"groups":{"g1":{"name":"g1","master":{"id":"m","addr":"m:1"},"slave":{"id":"s1","addr":"s1:1"},"epoch":1,"version":4}},"topics":{},"members":{},"next_producer_id":1}`
	f := New()
	if err := f.Restore(io.NopCloser(strings.NewReader(old))); err != nil {
		t.Fatal(err)
	}
	g := group(t, f, "g1")
	if !slices.Equal(ids(g.Slaves), []string{"s1"}) || g.Slave.ID != "s1" || len(g.InSync) != 0 || g.SyncVersion != 0 {
		t.Fatalf("g1 from an old snapshot: %+v", g)
	}
	if role, ok := g.RoleOf("s1"); !ok || role != routing.RoleSlave {
		t.Fatalf("s1's role: %q %v", role, ok)
	}
	mustApply(t, f, &JoinSlave{Group: "g1", Broker: broker("s2")})
	mustApply(t, f, &Promote{Group: "g1", Epoch: 1, Master: "m", Slave: "s1", Start: 5})
	if g := group(t, f, "g1"); g.Master.ID != "s1" || !slices.Equal(ids(g.Slaves), []string{"s2"}) {
		t.Fatalf("promoting the old snapshot's slave: %+v", g)
	}
}

func TestDecodeSyncSetCommands(t *testing.T) {
	for _, c := range []Command{
		&JoinSlave{Group: "g", Broker: routing.Broker{ID: "b", Addr: "a", HAAddr: "h"}, At: 1},
		&AlterSyncSet{Group: "g", Epoch: 3, Master: "m", ExpectVersion: 4, InSync: []string{"a", "b"}, At: 2},
		&SetGroupPolicy{Group: "g", MinInSync: 3, AckQuorum: 2, At: 3},
		&RemoveGroupBroker{Group: "g", Broker: "b", At: 4},
	} {
		if c.Type()&IgnoreUnknown != 0 {
			t.Fatalf("%T may be skipped by a node that does not know it", c)
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
