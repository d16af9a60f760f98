package metaserver_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// The leader stamps its admission mode into a new group's registration;
// a retirement is refused while a member may be alive (heard within the
// session, or not heard by a leader that has led for less than one), unless
// forced; masters' reported queue ends are recorded for the queues their
// group holds, and the retirement continues the queues past them.
func TestRetireGroupHandler(t *testing.T) {
	clk := fakeClock()
	m := testcluster.StartMeta(t, 1, func(c *metaserver.Config) { c.Clock = clk; c.AdmitGroups = metaserver.AdmitManual })
	_, leader := m.Leader()
	cl := m.Client(t)
	ctx := context.Background()
	session := m.Cfgs[0].SessionTimeout

	for _, g := range []string{"g1", "g2", "g3"} {
		if got := heartbeat(t, cl, g, routing.RoleMaster, nil); got.Admission != routing.Pending {
			t.Fatalf("%s registered under manual admission: %q", g, got.Admission)
		}
	}
	heartbeat(t, cl, "g2", routing.RoleSlave, nil)
	for _, g := range []string{"g1", "g2"} {
		if _, err := cl.AdmitGroup(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "orders", Queues: 1, Groups: []string{"g2"}}); err != nil {
		t.Fatal(err)
	}
	end := func(e int64) func(*api.Heartbeat) {
		return func(hb *api.Heartbeat) {
			hb.Epoch = 1
			hb.QueueEnds = []api.QueueEnd{{Topic: "orders", Queue: 0, End: e}, {Topic: "nope", End: 99}}
		}
	}
	heartbeat(t, cl, "g2", routing.RoleMaster, end(40))
	heartbeat(t, cl, "g2", routing.RoleSlave, func(hb *api.Heartbeat) { // a slave's word counts for nothing
		hb.QueueEnds = []api.QueueEnd{{Topic: "orders", Queue: 0, End: 90}}
	})
	heartbeat(t, cl, "g1", routing.RoleMaster, func(hb *api.Heartbeat) { // nor a group's that does not hold the queue
		hb.Epoch = 1
		hb.QueueEnds = []api.QueueEnd{{Topic: "orders", Queue: 0, End: 80}}
	})
	heartbeat(t, cl, "g2", routing.RoleMaster, end(30)) // an end only grows
	if qs := leader.FSM().QueueState("orders", 0); qs.End != 40 {
		t.Fatalf("recorded end %d, want 40", qs.End)
	}

	_, err := cl.RetireGroup(ctx, api.RetireGroupRequest{Group: "g2"})
	if !errors.Is(err, protocol.ErrGroupActive) || !strings.Contains(err.Error(), "heartbeated") {
		t.Fatalf("retiring a group heard a moment ago: %v", err)
	}
	if r, err := cl.RetireGroup(ctx, api.RetireGroupRequest{Group: "g2", DryRun: true}); err != nil || len(r.Moved) != 1 ||
		r.Moved[0] != (api.MovedQueue{Topic: "orders", Queue: 0, To: "g1", Base: 40, KnownEnd: 40, Committed: -1}) {
		t.Fatalf("dry run: %+v, %v", r, err)
	}

	// After a restart the leader has heard nobody: it cannot tell before a
	// session has passed.
	m.Stop(0)
	m.Restart(0)
	_, leader = m.Leader()
	_, err = cl.RetireGroup(ctx, api.RetireGroupRequest{Group: "g2"})
	if !errors.Is(err, protocol.ErrGroupActive) || !strings.Contains(err.Error(), "took over") {
		t.Fatalf("retiring a group a new leader has not heard: %v", err)
	}
	for passed := time.Duration(0); passed <= session; passed += session / 5 { // g1 heartbeats, g2 is silent
		heartbeat(t, cl, "g1", routing.RoleMaster, nil)
		judged(t, m, clk, leader, session/5)
	}
	r, err := cl.RetireGroup(ctx, api.RetireGroupRequest{Group: "g2"})
	if err != nil || len(r.Moved) != 1 || r.Moved[0].Base != 40 || r.Group.Admission != routing.Retired {
		t.Fatalf("retiring g2 after a silent session: %+v, %v", r, err)
	}
	if rt, _ := leader.FSM().Route("orders"); rt.Queues[0].Group != "g1" || rt.Queues[0].Base != 40 {
		t.Fatalf("orders after the retirement: %+v", rt)
	}

	// --force retires a group heard a moment ago.
	heartbeat(t, cl, "g3", routing.RoleMaster, nil)
	if _, err := cl.RetireGroup(ctx, api.RetireGroupRequest{Group: "g3", Force: true}); err != nil {
		t.Fatalf("a forced retirement: %v", err)
	}
	if g := groupOf(t, leader, "g3"); g.Admission != routing.Retired {
		t.Fatalf("g3 after a forced retirement: %+v", g)
	}
}
