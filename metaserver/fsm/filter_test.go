package fsm

import (
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/protocol"
)

// TestGroupFilter: the first member sets a group's filter, every later
// member must ask for the same one or none, members already in are not
// checked again, and only SetGroupFilter changes it once set.
func TestGroupFilter(t *testing.T) {
	f := consumerSeeded(t)
	invalid := &protocol.Error{Status: protocol.StatusInvalid}
	join := func(member, filter string) error {
		_, err := apply(t, f, &JoinGroup{Group: "cg", Member: member, Topics: []string{"orders"}, SessionMillis: 1000, At: 1, Filter: filter})
		return err
	}
	if err := join("a", "A OR B"); err != nil {
		t.Fatalf("the first member's filter: %v", err)
	}
	if g := cgroup(t, f, "cg"); g.Filter != "A OR B" || g.FilterBy != "member a" {
		t.Fatalf("group filter %q by %q, want the first member's", g.Filter, g.FilterBy)
	}
	if err := join("b", "A OR B"); err != nil {
		t.Fatalf("a member asking for the group's filter: %v", err)
	}
	if err := join("c", ""); err != nil {
		t.Fatalf("a member asking for no filter takes the group's: %v", err)
	}
	err := join("d", "A")
	wantStatus(t, err, invalid, "a member asking for another filter")
	if !strings.Contains(err.Error(), `"A OR B"`) || !strings.Contains(err.Error(), "set-filter") {
		t.Fatalf("the refusal does not say the group's filter and how to change it: %v", err)
	}
	if g := cgroup(t, f, "cg"); g.Members["d"] != nil || g.Filter != "A OR B" {
		t.Fatalf("a refused member joined or moved the filter: %+v", g)
	}
	// Alone in the group with the filter set, a member still cannot change it.
	for _, m := range []string{"b", "c"} {
		mustApply(t, f, &LeaveGroup{Group: "cg", Member: m, At: 2})
	}
	wantStatus(t, join("e", "C"), invalid, "a second member with another filter, the first alone")
	mustApply(t, f, &LeaveGroup{Group: "cg", Member: "a", At: 3})
	wantStatus(t, join("e", "C"), invalid, "a member of an empty group whose filter was set")

	// The operator changes it; a member already in keeps its place (it
	// follows the group's filter from its next heartbeat).
	if err := join("a", "A OR B"); err != nil {
		t.Fatal(err)
	}
	if r := mustApply(t, f, &SetGroupFilter{Group: "cg", Filter: "C", Principal: "ops", At: 4}); !r.Changed {
		t.Fatalf("set-filter changed nothing: %+v", r)
	}
	if g := cgroup(t, f, "cg"); g.Filter != "C" || g.FilterBy != "set-filter by ops" || g.Members["a"] == nil {
		t.Fatalf("after set-filter: %+v", g)
	}
	if err := join("e", "C"); err != nil {
		t.Fatalf("a member asking for the new filter: %v", err)
	}
	wantStatus(t, join("f", "A OR B"), invalid, "a member asking for the old filter")
	// The servers canonicalize; Apply bounds the length and wants one.
	_, err = apply(t, f, &SetGroupFilter{Group: "cg", Filter: strings.Repeat("A", protocol.MaxFilterLen+1), At: 5})
	wantStatus(t, err, invalid, "a filter over the cap")
	_, err = apply(t, f, &SetGroupFilter{Group: "cg", Filter: "", At: 5})
	wantStatus(t, err, invalid, "no filter")

	// A group whose first members asked for none receives every message:
	// a member asking for one is refused, "*" is the same as none.
	if err := func() error {
		_, err := apply(t, f, &JoinGroup{Group: "all", Member: "a", Topics: []string{"orders"}, At: 1})
		return err
	}(); err != nil {
		t.Fatal(err)
	}
	_, err = apply(t, f, &JoinGroup{Group: "all", Member: "b", Topics: []string{"orders"}, At: 1, Filter: "A"})
	wantStatus(t, err, invalid, "a filter in a group of every message")
	if _, err := apply(t, f, &JoinGroup{Group: "all", Member: "b", Topics: []string{"orders"}, At: 1, Filter: "*"}); err != nil {
		t.Fatalf(`"*" in a group of every message: %v`, err)
	}
	// One owner at a time: a newer incarnation is checked like a new member.
	if _, err := apply(t, f, &JoinMember{Group: "coop", Member: "a", Incarnation: 1, Topics: []string{"orders"}, At: 1, Filter: "X"}); err != nil {
		t.Fatal(err)
	}
	_, err = apply(t, f, &JoinMember{Group: "coop", Member: "a", Incarnation: 2, Topics: []string{"orders"}, At: 2, Filter: "Y"})
	wantStatus(t, err, invalid, "a new incarnation asking for another filter")
	if _, err := apply(t, f, &JoinMember{Group: "coop", Member: "a", Incarnation: 2, Topics: []string{"orders"}, At: 2, Filter: "X"}); err != nil {
		t.Fatal(err)
	}
	// A refusal changes nothing: an eager group stays eager.
	_, err = apply(t, f, &JoinMember{Group: "all", Member: "c", Incarnation: 1, Topics: []string{"orders"}, At: 3, Filter: "Y"})
	wantStatus(t, err, invalid, "a cooperative member asking for another filter")
	if g := cgroup(t, f, "all"); g.Cooperative || g.Members["c"] != nil {
		t.Fatalf("a refused JoinMember changed the group: cooperative %v, members %v", g.Cooperative, g.Members)
	}
}
