package broker_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/broker"
	tc "github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testlog"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

// A failover in one process: the master goes away holding NORMAL messages
// its slave never copied; the slave is promoted (epoch 2) and keeps every
// HIGH message; the old master comes back preferring to be master, is made
// the slave, cuts the tail the new master never had into a side file, and
// copies until both logs are byte-identical. It acknowledges nothing on the
// way.
func TestFailoverPromotesTheSlaveAndTheOldMasterRejoins(t *testing.T) {
	meta := tc.StartMeta(t, 1, func(c *metaserver.Config) { c.FailoverMargin = 200 * time.Millisecond })
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true})
	meta.CreateTopic(t, "fo", "g1", "g1")
	mc := tc.Dial(t, g.Master.Addr())
	warmRoute(t, mc, "fo", 0, 1)

	var high []protocol.Message
	for i := range 20 {
		high = append(high, tc.Msg("fo", uint32(i%2), protocol.High, "high"))
	}
	for i, r := range tc.Send(t, mc, high) {
		if r.Status != protocol.StatusOK {
			t.Fatalf("HIGH message %d: %v", i, r.Status)
		}
	}

	// The slave goes away; the master takes NORMAL messages alone, and
	// reports its log end before it goes away too.
	slaveEnd := g.Slave.Store().EndOffset()
	_ = g.Slave.Close()
	var normal []protocol.Message
	for range 10 {
		normal = append(normal, tc.Msg("fo", 0, protocol.Normal, "normal, on the master alone"))
	}
	for i, r := range tc.Send(t, mc, normal) {
		if r.Status != protocol.StatusOK {
			t.Fatalf("NORMAL message %d: %v", i, r.Status)
		}
	}
	masterEnd := g.Master.Store().EndOffset()
	mcl := meta.Client(t)
	testwait.For(t, 10*time.Second, "the master to report its log end", func() bool {
		groups, err := mcl.Groups(context.Background())
		return err == nil && len(groups) == 1 && groups[0].Last.LogEnd == masterEnd
	})
	_ = g.Master.Close()

	// The slave comes back: it is alive, holds every HIGH message, and
	// lacks less than the failover limit, so it is promoted.
	slave := tc.StartBroker(t, g.Config(routing.RoleSlave))
	testwait.For(t, 15*time.Second, "the slave to be promoted and take writes", func() bool { return slave.IsMaster() && slave.Writable() })
	grp, _ := meta.Nodes[0].FSM().Group("g1")
	if grp.Epoch != 2 || grp.Master.ID != "g1-slave" || grp.Slave.ID != "" || len(grp.History) != 2 ||
		grp.History[1] != (routing.EpochRecord{Epoch: 2, Master: "g1-slave", Start: slaveEnd, At: grp.History[1].At, Fixed: grp.History[1].Fixed}) {
		t.Fatalf("after the promotion: %+v", grp)
	}
	testwait.For(t, 10*time.Second, "the new master's heartbeats to reach the registry", func() bool {
		groups, err := mcl.Groups(context.Background())
		return err == nil && len(groups) == 1 && groups[0].Master.ID == "g1-slave" && groups[0].MasterHeartbeatAgeMillis >= 0 &&
			groups[0].Last.BrokerID == "g1-slave"
	})
	if fs := meta.Nodes[0].Failovers(); fs.Promotions != 1 || fs.LostBytes != masterEnd-slaveEnd {
		t.Fatalf("failover stats %+v; want 1 promotion losing %d bytes", fs, masterEnd-slaveEnd)
	}
	sc := tc.Dial(t, slave.Addr())
	for q := range uint32(2) {
		n := 0
		for _, m := range tc.PullAll(t, sc, "fo", q) {
			if m.Message.Reliability == protocol.High {
				n++
			}
		}
		if n != 10 {
			t.Fatalf("queue %d: %d HIGH messages on the new master, want 10", q, n)
		}
	}
	// A reader that read queue 0 from the old master to its end (the NORMAL
	// tail included) in epoch 1 is sent back to where epoch 2 took the
	// queue up: past it, the new master's offsets hold others.
	_, took := slave.Store().QueueRange("fo", 0)
	req := protocol.PullRequest{Topic: "fo", Queue: 0, Offset: took + int64(len(normal)), MaxBytes: 1 << 20, Epoch: 1}
	resp, err := sc.Call(context.Background(), protocol.CodePull, protocol.AppendPullRequest(nil, &req))
	if err != nil {
		t.Fatal(err)
	}
	if pr, err := protocol.DecodePullResponse(resp.Body); err != nil || len(pr.Messages) != 0 || pr.NextOffset != took || pr.Epoch != 2 {
		t.Fatalf("a PULL past the new epoch's start, read in epoch 1: %+v %v; want no message, next offset %d, epoch 2", pr, err, took)
	}
	if pr := tc.Pull(t, sc, "fo", 0, took, 1<<20); pr.NextOffset != took || pr.Epoch != 2 {
		t.Fatalf("a PULL at the new epoch's queue end: %+v", pr)
	}
	warmRoute(t, sc, "fo", 0, 1)
	if r := tc.SendEpoch(t, sc, 1, []protocol.Message{tc.Msg("fo", 0, protocol.Normal, "stale route")}); r[0].Status != protocol.StatusOK {
		t.Fatalf("a send naming the old epoch, to the new master: %v", r[0].Status)
	}

	// The old master comes back, preferring to be master: the registry makes
	// it the slave, and it cuts the NORMAL tail the new master never had.
	old := tc.StartBroker(t, g.Config(routing.RoleMaster))
	testwait.For(t, 15*time.Second, "the old master to rejoin as the slave", func() bool { return old.Role().Kind == broker.RoleSlave })
	if old.Epoch() != 2 || old.IsMaster() || old.Stats().Truncations.Load() != 1 || old.Stats().TruncatedBytes.Load() != masterEnd-slaveEnd {
		t.Fatalf("rejoined at epoch %d, master %v, %d truncations of %d bytes", old.Epoch(), old.IsMaster(),
			old.Stats().Truncations.Load(), old.Stats().TruncatedBytes.Load())
	}
	side, _ := filepath.Glob(filepath.Join(g.MasterDir, "truncated", "*.log"))
	if len(side) != 1 {
		t.Fatalf("side files %v", side)
	}
	var cut int
	if err := storage.ReadRecordFile(side[0], func(r storage.RecordInfo) error {
		if r.Offset < slaveEnd {
			t.Errorf("a cut record at %d, before the new epoch's start %d", r.Offset, slaveEnd)
		}
		cut++
		return nil
	}); err != nil || cut != len(normal) {
		t.Fatalf("side file holds %d records (%v), want the %d NORMAL messages", cut, err, len(normal))
	}
	testwait.For(t, 10*time.Second, "the registry to hear of the cut", func() bool {
		return meta.Nodes[0].Failovers().CutBytes == masterEnd-slaveEnd
	})
	if groups, err := mcl.Groups(context.Background()); err != nil || !strings.Contains(groups[0].Failover, "g1-master rejoined as a slave and cut") {
		t.Fatalf("the failover word does not tell the cut: %+v %v", groups, err)
	}
	oc := tc.Dial(t, old.Addr())
	if r := tc.Send(t, oc, []protocol.Message{tc.Msg("fo", 0, protocol.Normal, "to the old master")}); r[0].Status != protocol.StatusNotMaster {
		t.Fatalf("a send to the old master: %v, want NOT_MASTER", r[0].Status)
	}

	// HIGH messages are acknowledged again once the old master copies.
	testwait.For(t, 15*time.Second, "the new master to take its slave into the sync set", slave.TakesHigh)
	if r := tc.Send(t, sc, []protocol.Message{tc.Msg("fo", 1, protocol.High, "after the rejoin")}); r[0].Status != protocol.StatusOK {
		t.Fatalf("HIGH after the rejoin: %v", r[0].Status)
	}
	testwait.For(t, 15*time.Second, "the logs to converge", func() bool {
		return old.Store().EndOffset() == slave.Store().EndOffset()
	})
	if !bytes.Equal(tc.LogBytes(t, old.Store()), tc.LogBytes(t, slave.Store())) {
		t.Fatal("the rejoined slave's log differs from the new master's")
	}

	// A send naming a newer epoch than the broker's is refused; the broker
	// stays writable (a client's epoch fences nothing by itself).
	if r := tc.SendEpoch(t, sc, 3, []protocol.Message{tc.Msg("fo", 0, protocol.Normal, "from the future")}); r[0].Status != protocol.StatusNotMaster {
		t.Fatalf("a send naming epoch 3 to the master of epoch 2: %v, want NOT_MASTER", r[0].Status)
	}
	testwait.For(t, 10*time.Second, "the new master to stay writable", slave.Writable)
}

// A client that names a made-up huge epoch, in a SEND or a PULL, cannot
// stop the master's writes: its own SEND is refused with nothing stored,
// and another client's SEND right after it is stored.
func TestClientEpochDoesNotFenceTheMaster(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{})
	meta.CreateTopic(t, "t", "g1")
	attacker := tc.Dial(t, g.Master.Addr())
	app := tc.Dial(t, g.Master.Addr())
	warmRoute(t, app, "t", 0)
	const huge = 0xFFFFFFF0
	stored := len(tc.PullAll(t, app, "t", 0)) // the probes
	for i := range 5 {
		r := tc.SendEpoch(t, attacker, huge, []protocol.Message{tc.Msg("t", 0, protocol.Normal, "from the future")})
		if r[0].Status != protocol.StatusNotMaster {
			t.Fatalf("round %d: a SEND naming epoch %#x: %v, want NOT_MASTER", i, huge, r[0].Status)
		}
		if r := tc.Send(t, app, []protocol.Message{tc.Msg("t", 0, protocol.Normal, "after a SEND")}); r[0].Status != protocol.StatusOK {
			t.Fatalf("round %d: a SEND right after another client's huge-epoch SEND: %v, want OK", i, r[0].Status)
		}
		stored++

		resp, err := attacker.Call(context.Background(), protocol.CodePull, protocol.AppendPullRequest(nil,
			&protocol.PullRequest{Topic: "t", Queue: 0, Epoch: huge, MaxBytes: 1 << 10}))
		if err != nil {
			t.Fatalf("round %d: PULL naming epoch %#x: %v", i, huge, err)
		}
		if _, err := protocol.DecodePullResponse(resp.Body); err != nil {
			t.Fatalf("round %d: PULL naming epoch %#x: %v", i, huge, err)
		}
		if r := tc.Send(t, app, []protocol.Message{tc.Msg("t", 0, protocol.Normal, "after a PULL")}); r[0].Status != protocol.StatusOK {
			t.Fatalf("round %d: a SEND right after another client's huge-epoch PULL: %v, want OK", i, r[0].Status)
		}
		stored++
	}
	got := tc.PullAll(t, app, "t", 0)
	if len(got) != stored {
		t.Fatalf("the queue holds %d messages, want the %d OK ones (nothing of the refused SENDs)", len(got), stored)
	}
	for _, m := range got {
		if strings.Contains(string(m.Message.Body), "from the future") {
			t.Fatalf("a refused SEND was stored: %q", m.Message.Body)
		}
	}
}

// A broker restarted with a local epoch file it cannot read refuses to
// start, rather than guess where its log stands.
func TestBrokerRefusesAnUnreadableEpochFile(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	cfg := tc.BrokerConfig(meta.Addrs(), "g1", routing.RoleMaster, t.TempDir())
	cfg.Logger = testlog.New("epoch")
	if err := os.WriteFile(filepath.Join(cfg.Dir, "epoch"), []byte("not a number\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := broker.New(cfg); err == nil {
		_ = b.Close()
		t.Fatal("started with a garbled epoch file")
	}
}
