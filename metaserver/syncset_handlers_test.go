package metaserver_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// Groups of several brokers through the RPC port: registration, the
// master's sync set changes, and the operator's policy and removals.

// slaveNamed heartbeats as g1's broker id, preferring role.
func slaveNamed(id string, role routing.Role) func(*api.Heartbeat) {
	return func(hb *api.Heartbeat) { hb.BrokerID, hb.Role, hb.Addr = id, role, "127.0.0.1:3"+id[len(id)-1:] }
}

func wantStatus(t *testing.T, what string, err error, status protocol.Status) *protocol.Error {
	t.Helper()
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Status != status {
		t.Fatalf("%s: %v, want %v", what, err, status)
	}
	return pe
}

// A broker heartbeating into a group with a master and a slave joins as
// one more slave, whatever role it prefers, and the reply names it so; up
// to MaxSlaves, past which its heartbeat is refused (CONFLICT) and the
// group is unchanged.
func TestThirdBrokerJoinsAsSlave(t *testing.T) {
	m := startMeta(t, 1, fakeClock())
	cl := m.Client(t)
	heartbeat(t, cl, "g1", routing.RoleMaster, nil)
	heartbeat(t, cl, "g1", routing.RoleSlave, nil)
	g := heartbeat(t, cl, "g1", routing.RoleMaster, slaveNamed("g1-x3", routing.RoleMaster))
	if role, ok := g.RoleOf("g1-x3"); !ok || role != routing.RoleSlave || g.Master.ID != "g1-master" || len(g.Slaves) != 2 || len(g.InSync) != 0 {
		t.Fatalf("a third broker preferring master: %+v", g)
	}
	// Heartbeating again, and with a new address, keeps its place.
	heartbeat(t, cl, "g1", routing.RoleSlave, slaveNamed("g1-x3", routing.RoleSlave))
	g = heartbeat(t, cl, "g1", routing.RoleSlave, func(hb *api.Heartbeat) {
		slaveNamed("g1-x3", routing.RoleSlave)(hb)
		hb.Addr = "127.0.0.1:49"
	})
	if b, _ := g.SlaveByID("g1-x3"); b.Addr != "127.0.0.1:49" || len(g.Slaves) != 2 {
		t.Fatalf("the third broker at a new address: %+v", g)
	}
	for i := len(g.Slaves); i < routing.MaxSlaves; i++ {
		heartbeat(t, cl, "g1", routing.RoleSlave, slaveNamed("g1-y"+string(rune('a'+i)), routing.RoleSlave))
	}
	_, err := cl.Heartbeat(context.Background(), api.Heartbeat{Group: "g1", Role: routing.RoleSlave, BrokerID: "g1-z", Addr: "127.0.0.1:50"})
	wantStatus(t, "a slave past the most a group has", err, protocol.StatusConflict)
	_, leader := m.Leader()
	if g := groupOf(t, leader, "g1"); len(g.Slaves) != routing.MaxSlaves {
		t.Fatalf("%d slaves, want %d", len(g.Slaves), routing.MaxSlaves)
	}
}

// ALTER_SYNC_SET: the master of the group's epoch changes its set from the
// version it read and is answered the group; a broker that is not the
// master, a stale epoch or a stale version is refused CONFLICT and the set
// stays.
func TestAlterSyncSetHandler(t *testing.T) {
	m := startMeta(t, 1, fakeClock())
	cl := m.Client(t)
	ctx := context.Background()
	heartbeat(t, cl, "g1", routing.RoleMaster, nil)
	heartbeat(t, cl, "g1", routing.RoleSlave, nil)
	g := heartbeat(t, cl, "g1", routing.RoleSlave, slaveNamed("g1-s2", routing.RoleSlave))

	req := api.AlterSyncSetRequest{Group: "g1", Epoch: g.Epoch, Master: "g1-master", ExpectVersion: g.SyncVersion, InSync: []string{"g1-s2", "g1-slave"}}
	got, err := cl.AlterSyncSet(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.InSync, req.InSync) || got.SyncVersion != g.SyncVersion+1 || got.Slave.ID != "g1-s2" || !got.HighAllowed() {
		t.Fatalf("answered %+v", got)
	}
	for _, tc := range []struct {
		name string
		edit func(*api.AlterSyncSetRequest)
	}{
		{"a slave", func(r *api.AlterSyncSetRequest) { r.Master = "g1-slave" }},
		{"a stale epoch", func(r *api.AlterSyncSetRequest) { r.Epoch-- }},
		{"a stale version", func(r *api.AlterSyncSetRequest) {}}, // the version req read was moved by the change above
		{"a stranger in the set", func(r *api.AlterSyncSetRequest) { r.ExpectVersion = got.SyncVersion; r.InSync = []string{"g1-x"} }},
	} {
		r := req
		r.InSync = nil
		tc.edit(&r)
		_, err := cl.AlterSyncSet(ctx, r)
		wantStatus(t, tc.name, err, protocol.StatusConflict)
	}
	_, leader := m.Leader()
	if now := groupOf(t, leader, "g1"); !slices.Equal(now.InSync, req.InSync) || now.SyncVersion != got.SyncVersion {
		t.Fatalf("refused changes moved the set: %v at %d", now.InSync, now.SyncVersion)
	}
	_, err = cl.AlterSyncSet(ctx, api.AlterSyncSetRequest{Group: "", Master: "g1-master"})
	wantStatus(t, "no group", err, protocol.StatusInvalid)
	_, err = cl.AlterSyncSet(ctx, api.AlterSyncSetRequest{Group: "nope", Master: "m"})
	wantStatus(t, "a group that does not exist", err, protocol.StatusNotFound)
}

// ADMIN_GROUP_POLICY sets the copies HIGH needs; bad values are INVALID.
// ADMIN_REMOVE_SLAVE refuses the master, a stranger, and a slave heard
// within the session (it would join again); a silent one leaves the group
// and the set.
func TestGroupPolicyAndRemoveSlave(t *testing.T) {
	clk := fakeClock()
	m := startMeta(t, 1, clk)
	cl := m.Client(t)
	ctx := context.Background()
	heartbeat(t, cl, "g1", routing.RoleMaster, nil)
	heartbeat(t, cl, "g1", routing.RoleSlave, nil)
	g := heartbeat(t, cl, "g1", routing.RoleSlave, slaveNamed("g1-s2", routing.RoleSlave))
	g, err := cl.AlterSyncSet(ctx, api.AlterSyncSetRequest{Group: "g1", Epoch: g.Epoch, Master: "g1-master", ExpectVersion: g.SyncVersion,
		InSync: []string{"g1-slave", "g1-s2"}})
	if err != nil {
		t.Fatal(err)
	}

	if g, err = cl.SetGroupPolicy(ctx, api.GroupPolicyRequest{Group: "g1", MinInSync: 3, AckQuorum: 2}); err != nil {
		t.Fatal(err)
	}
	if g.MinInSync != 3 || g.AckQuorum != 2 || !g.HighAllowed() {
		t.Fatalf("policy: %+v", g)
	}
	_, err = cl.SetGroupPolicy(ctx, api.GroupPolicyRequest{Group: "g1", AckQuorum: 1})
	wantStatus(t, "an ack quorum of the master alone", err, protocol.StatusInvalid)
	_, err = cl.SetGroupPolicy(ctx, api.GroupPolicyRequest{Group: "nope", MinInSync: 2})
	wantStatus(t, "no such group", err, protocol.StatusNotFound)

	// Under a quorum a member of the set is its master's to remove (fsm's
	// TestQuorumKeepsItsMembers); every member counts from here.
	if _, err = cl.SetGroupPolicy(ctx, api.GroupPolicyRequest{Group: "g1", MinInSync: 3}); err != nil {
		t.Fatal(err)
	}
	_, err = cl.RemoveSlave(ctx, api.RemoveSlaveRequest{Group: "g1", Broker: "g1-master"})
	wantStatus(t, "removing the master", err, protocol.StatusConflict)
	pe := wantStatus(t, "removing a stranger", func() error {
		_, err := cl.RemoveSlave(ctx, api.RemoveSlaveRequest{Group: "g1", Broker: "g1-x"})
		return err
	}(), protocol.StatusNotFound)
	if !strings.Contains(pe.Message, "g1-slave, g1-s2") {
		t.Fatalf("the refusal does not list the slaves: %q", pe.Message)
	}
	_, err = cl.RemoveSlave(ctx, api.RemoveSlaveRequest{Group: "g1", Broker: "g1-s2"})
	wantStatus(t, "removing a live slave", err, protocol.StatusGroupActive)

	// g1-s2 stops; the master and the other slave go on past a session.
	session := m.Cfgs[0].SessionTimeout
	for range 3 {
		clk.Advance(session / 2)
		heartbeat(t, cl, "g1", routing.RoleMaster, nil)
		heartbeat(t, cl, "g1", routing.RoleSlave, nil)
	}
	g, err = cl.RemoveSlave(ctx, api.RemoveSlaveRequest{Group: "g1", Broker: "g1-s2"})
	if err != nil {
		t.Fatal(err)
	}
	if _, known := g.RoleOf("g1-s2"); known || !slices.Equal(g.InSync, []string{"g1-slave"}) || g.HighAllowed() {
		t.Fatalf("after removing g1-s2 (min 3 copies): %+v", g)
	}
}

// ALTER_SYNC_SET is the cluster's (a group's master speaks with the
// cluster token), not an application's; the group policy and a slave's
// removal are admin's alone.
func TestSyncSetCodesNeedTheirPermission(t *testing.T) {
	am := startAuthMeta(t, 1)
	ctx := context.Background()
	cluster := am.dial(t, am.clusterTok)
	app := am.principal(t, "app", "produce:*", "describe")
	g, err := am.admin.SetGroupPolicy(ctx, api.GroupPolicyRequest{Group: "g1", MinInSync: 2})
	if err != nil {
		t.Fatal(err)
	}
	alter := api.AlterSyncSetRequest{Group: "g1", Epoch: g.Epoch, Master: g.Master.ID, ExpectVersion: g.SyncVersion}
	_, err = app.AlterSyncSet(ctx, alter)
	wantNotAuthorized(t, "an application changing a sync set", err)
	if _, err := cluster.AlterSyncSet(ctx, alter); err != nil {
		t.Fatalf("the cluster changing a sync set: %v", err)
	}
	for _, who := range []struct {
		name string
		cl   *client.Client
	}{{"cluster", cluster}, {"app", app}} {
		_, err := who.cl.SetGroupPolicy(ctx, api.GroupPolicyRequest{Group: "g1", MinInSync: 3})
		wantNotAuthorized(t, who.name+" setting a group policy", err)
		_, err = who.cl.RemoveSlave(ctx, api.RemoveSlaveRequest{Group: "g1", Broker: "g1-slave"})
		wantNotAuthorized(t, who.name+" removing a slave", err)
	}
	if g, _ := am.admin.Groups(ctx); g[0].MinInSync != 2 {
		t.Fatalf("refused requests changed the policy: %+v", g[0].Group)
	}
}
