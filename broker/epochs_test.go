package broker_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/broker"
	tc "github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

// sendOK sends n NORMAL messages to topic/queue through c and fails unless
// every one is stored.
func sendOK(t *testing.T, c *transport.Client, topic string, queue uint32, n int, body string) {
	t.Helper()
	var msgs []protocol.Message
	for range n {
		msgs = append(msgs, tc.Msg(topic, queue, protocol.Normal, body))
	}
	for i, r := range tc.Send(t, c, msgs) {
		if r.Status != protocol.StatusOK {
			t.Fatalf("message %d of %q: %v", i, body, r.Status)
		}
	}
}

// The issue-22 sequence in one process: the slave stops, the master takes
// messages alone and dies, the slave is promoted and takes three messages,
// then the new master restarts with its own config. The start of epoch 2
// stays where the promotion put it (the new master's log end at takeover),
// not where the restarted log ends; the old master, back, cuts there and
// ends byte-identical to the new master, every member recording the same
// epochs as the registry.
func TestRestartedNewMasterKeepsItsEpochStart(t *testing.T) {
	meta := tc.StartMeta(t, 1, func(c *metaserver.Config) { c.FailoverMargin = 200 * time.Millisecond })
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true})
	meta.CreateTopic(t, "ep", "g1")
	mc := tc.Dial(t, g.Master.Addr())
	warmRoute(t, mc, "ep", 0)
	sendOK(t, mc, "ep", 0, 20, "both have it")
	testwait.For(t, 10*time.Second, "the slave to copy everything", func() bool {
		return g.Slave.Store().EndOffset() == g.Master.Store().EndOffset()
	})
	_ = g.Slave.Close()
	sendOK(t, mc, "ep", 0, 10, "on the master alone")
	_ = g.Master.Close()

	slave := tc.StartBroker(t, g.Config(routing.RoleSlave))
	testwait.For(t, 15*time.Second, "the slave to be promoted and take writes", func() bool { return slave.IsMaster() && slave.Writable() })
	start := slave.Store().EndOffset()
	fsm := meta.Nodes[0].FSM()
	testwait.For(t, 10*time.Second, "the new master to fix where epoch 2 began", func() bool {
		grp, _ := fsm.Group("g1")
		r, ok := grp.Record(2)
		return ok && r.Fixed
	})
	if grp, _ := fsm.Group("g1"); grp.History[1].Start != start {
		t.Fatalf("epoch 2 fixed at %d, the new master took over at %d", grp.History[1].Start, start)
	}
	sc := tc.Dial(t, slave.Addr())
	warmRoute(t, sc, "ep", 0)
	sendOK(t, sc, "ep", 0, 3, "epoch 2")

	// The new master restarts, in any way: its log now ends past the start.
	_ = slave.Close()
	again := tc.StartBroker(t, g.Config(routing.RoleSlave))
	testwait.For(t, 15*time.Second, "the restarted new master to take writes", func() bool { return again.IsMaster() && again.Writable() })
	testwait.For(t, 10*time.Second, "a heartbeat of the restarted master", func() bool {
		groups, err := meta.Client(t).Groups(context.Background())
		return err == nil && groups[0].Last.BrokerID == "g1-slave" && groups[0].Last.LogEnd == again.Store().EndOffset()
	})
	if grp, _ := fsm.Group("g1"); grp.History[1].Start != start || !grp.History[1].Fixed {
		t.Fatalf("after the new master's restart, epoch 2 is %+v; it began at %d", grp.History[1], start)
	}

	// The old master returns: it cuts exactly its own tail and copies.
	old := tc.StartBroker(t, g.Config(routing.RoleMaster))
	testwait.For(t, 15*time.Second, "the old master to rejoin and catch up", func() bool {
		return old.Role().Kind == broker.RoleSlave && old.Store().EndOffset() == again.Store().EndOffset()
	})
	if cut := old.Stats().TruncatedBytes.Load(); cut <= 0 || old.Stats().Truncations.Load() != 1 {
		t.Fatalf("the old master cut %d bytes in %d truncations", cut, old.Stats().Truncations.Load())
	}
	if !bytes.Equal(tc.LogBytes(t, old.Store()), tc.LogBytes(t, again.Store())) {
		t.Fatal("the old master's log is not the new master's")
	}
	grp, _ := fsm.Group("g1")
	for _, dir := range []string{g.MasterDir, g.SlaveDir} {
		local, err := broker.LocalEpochs(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(local) != len(grp.History) {
			t.Fatalf("%s records epochs %+v, the registry %+v", dir, local, grp.History)
		}
		for i, r := range local {
			if reg := grp.History[i]; r.Epoch != reg.Epoch || r.Start != reg.Start || r.Master != reg.Master || !r.Fixed {
				t.Fatalf("%s records epoch %+v, the registry %+v", dir, r, reg)
			}
		}
	}
}

// A slave whose log left its master's (here: a record the master never had,
// written into its log while it was down) is refused by the master's
// prefix check, reports itself broken, and does not hold its group
// read-only however long it lags. An operator's resync sets its log aside
// and it copies the master's again, byte for byte.
func TestDivergedSlaveIsBrokenUntilResynced(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true})
	meta.CreateTopic(t, "dv", "g1")
	mc := tc.Dial(t, g.Master.Addr())
	warmRoute(t, mc, "dv", 0)
	sendOK(t, mc, "dv", 0, 10, "both")
	testwait.For(t, 10*time.Second, "the slave to copy everything", func() bool {
		return g.Slave.Store().EndOffset() == g.Master.Store().EndOffset()
	})
	_ = g.Slave.Close()
	sendOK(t, mc, "dv", 0, 10, "the master's own")

	// A record the master never had, at the slave's end.
	lg, err := storage.Open(storage.Config{Dir: g.SlaveDir, SegmentSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lg.Append([]storage.Entry{{Topic: "dv", Queue: 0, Payload: []byte("a stranger's record")}}, true); err != nil {
		t.Fatal(err)
	}
	if err := lg.Close(); err != nil {
		t.Fatal(err)
	}

	slave := tc.StartBroker(t, g.Config(routing.RoleSlave))
	testwait.For(t, 10*time.Second, "the slave to find its log diverged", func() bool { return slave.Role().Kind == broker.RoleBroken })
	if g.Master.Stats().HADiverged.Load() == 0 {
		t.Fatal("the master counted no refused prefix")
	}
	mcl := meta.Client(t)
	lagTime := time.Second.Milliseconds() // tc.MetaConfig's LagTime
	testwait.For(t, 15*time.Second, "the master to report its slave behind for longer than the lag time, with the slave broken", func() bool {
		groups, err := mcl.Groups(context.Background())
		return err == nil && groups[0].LastSlave.Broken != "" && groups[0].Last.LagMillis > 2*lagTime
	})
	if grp, _ := meta.Nodes[0].FSM().Group("g1"); !grp.Writable() {
		t.Fatalf("a broken slave holds its group read-only: %q", grp.Reasons)
	}
	sendOK(t, mc, "dv", 0, 5, "while the slave is broken")

	if _, err := mcl.ResyncBroker(context.Background(), "g1-master"); err == nil {
		t.Fatal("the master took a resync order")
	}
	if _, err := mcl.ResyncBroker(context.Background(), "g1-slave"); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 15*time.Second, "the resynced slave to copy the master's log", func() bool {
		return slave.Role().Kind == broker.RoleSlave && slave.Store().EndOffset() == g.Master.Store().EndOffset()
	})
	if !bytes.Equal(tc.LogBytes(t, slave.Store()), tc.LogBytes(t, g.Master.Store())) {
		t.Fatal("after the resync the slave's log is not the master's")
	}
	if slave.Stats().Resyncs.Load() != 1 {
		t.Fatalf("%d resyncs", slave.Stats().Resyncs.Load())
	}
	testwait.For(t, 10*time.Second, "the registry to clear the carried-out order", func() bool {
		grp, _ := meta.Nodes[0].FSM().Group("g1")
		return grp.Resync == nil && grp.LastResync == 1
	})
}
