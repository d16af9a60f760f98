package broker_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	tc "github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

// stamped is message id m<seq> of producer id at seq, to topic rt queue 0.
func stampedMsg(id uint64, seq int64, msgID string) protocol.Message {
	m := tc.Msg("rt", 0, protocol.Normal, "body of "+msgID)
	m.ID = msgID
	m.Producer = protocol.ProducerStamp{ID: id, Seq: seq}
	return m
}

func sendAll(t *testing.T, c *transport.Client, want protocol.Status, msgs ...protocol.Message) {
	t.Helper()
	for i, r := range tc.Send(t, c, msgs) {
		if r.Status != want {
			t.Fatalf("message %s: %v, want %v", msgs[i].ID, r.Status, want)
		}
	}
}

// A failover's cut tail is appended again through the new master, each
// message once. The old master acknowledged m10..m19 alone; meanwhile
// the producer retried m10 at the new master with its stamp, and sent m11
// again under a new identity (as after OUT_OF_ORDER_SEQUENCE). When the old
// master rejoins, m12..m19 are appended again, flagged, and m10 and m11 are
// not; handing the same tail over again stores nothing; both logs end
// byte-identical and the tail's marker is gone.
func TestFailoverTailIsRecoveredOnce(t *testing.T) {
	meta := tc.StartMeta(t, 1, func(c *metaserver.Config) { c.FailoverMargin = 200 * time.Millisecond })
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true})
	meta.CreateTopic(t, "rt", "g1")
	mc := tc.Dial(t, g.Master.Addr())
	warmRoute(t, mc, "rt", 0)
	var msgs []protocol.Message
	for s := range 20 {
		msgs = append(msgs, stampedMsg(7, int64(s), fmt.Sprintf("m%d", s)))
	}
	sendAll(t, mc, protocol.StatusOK, msgs[:10]...)
	testwait.For(t, 10*time.Second, "the slave to copy m0..m9", func() bool {
		return g.Slave.Store().EndOffset() == g.Master.Store().EndOffset()
	})
	_ = g.Slave.Close()
	sendAll(t, mc, protocol.StatusOK, msgs[10:]...) // acknowledged by the master alone
	_ = g.Master.Close()

	nm := tc.StartBroker(t, g.Config(routing.RoleSlave))
	testwait.For(t, 15*time.Second, "the slave to be promoted", func() bool { return nm.IsMaster() && nm.Writable() })
	nc := tc.Dial(t, nm.Addr())
	warmRoute(t, nc, "rt", 0)
	sendAll(t, nc, protocol.StatusOK, msgs[10])                       // the producer's retry, same stamp
	again := stampedMsg(8, 0, "m11")                                  // sent again under a new identity
	sendAll(t, nc, protocol.StatusOK, again, stampedMsg(8, 1, "m20")) // and the producer goes on

	old := tc.StartBroker(t, g.Config(routing.RoleMaster))
	testwait.For(t, 15*time.Second, "the old master to hand its tail over", func() bool {
		return old.Stats().TailsHandedOver.Load() == 1
	})
	if r, d := nm.Stats().Recovered.Load(), nm.Stats().RecoverDuplicates.Load(); r != 8 || d != 2 {
		t.Fatalf("the new master appended %d again and found %d held already; want 8 and 2", r, d)
	}
	ids := map[string]int{}
	recovered := map[string]string{}
	for _, m := range tc.PullAll(t, nc, "rt", 0) {
		ids[m.Message.ID]++
		for _, p := range m.Message.Properties {
			if p.Key == protocol.RecoveredProperty {
				recovered[m.Message.ID] = p.Value
			}
		}
	}
	for i := range 21 {
		if id := fmt.Sprintf("m%d", i); ids[id] != 1 {
			t.Errorf("%s is stored %d times", id, ids[id])
		}
	}
	for i := 12; i < 20; i++ {
		if v := recovered[fmt.Sprintf("m%d", i)]; v == "" {
			t.Errorf("m%d is not flagged recovered", i)
		}
	}
	if len(recovered) != 8 {
		t.Errorf("flagged recovered: %v", recovered)
	}
	// m12..m19 followed a gap in producer 7's sequences there (m11 went
	// under another identity), so their stamps joined no state: a late retry
	// of m12 is refused OUT_OF_ORDER_SEQUENCE and stores nothing.
	sendAll(t, nc, protocol.StatusOutOfOrderSequence, msgs[12])

	testwait.For(t, 10*time.Second, "the old master to copy what was recovered", func() bool {
		return old.Store().EndOffset() == nm.Store().EndOffset()
	})
	if !bytes.Equal(tc.LogBytes(t, old.Store()), tc.LogBytes(t, nm.Store())) {
		t.Fatal("the logs differ")
	}
	markers, _ := filepath.Glob(filepath.Join(g.MasterDir, "truncated", "*.recover"))
	sides, _ := filepath.Glob(filepath.Join(g.MasterDir, "truncated", "*.log"))
	if len(markers) != 0 || len(sides) != 1 {
		t.Fatalf("markers %v, side files %v", markers, sides)
	}

	// The same tail again (a restart between the append and the marker's
	// removal): nothing more is stored.
	var raw []byte
	if err := storage.ReadRecordFile(sides[0], func(ri storage.RecordInfo) error {
		raw = append(raw, storage.EncodeRecord(ri)...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	base, _ := storage.RecordFileBase(sides[0])
	grp, _ := meta.Nodes[0].FSM().Group("g1")
	hc := transport.NewClient(nm.HAAddr(), transport.ClientConfig{})
	defer hc.Close()
	resp, err := hc.Call(context.Background(), protocol.CodeRecover, protocol.AppendRecoverRequest(nil,
		&protocol.RecoverRequest{Epoch: grp.Epoch, BrokerID: "g1-master", From: base, Cut: base, Records: raw}))
	if err != nil {
		t.Fatal(err)
	}
	if rr, err := protocol.DecodeRecoverResponse(resp.Body); err != nil || rr.Stored != 0 || rr.Duplicates != 10 {
		t.Fatalf("the same tail again: %+v %v; want nothing stored, 10 held", rr, err)
	}

	// A restarted old master finds no marker and hands nothing over.
	_ = old.Close()
	if _, err := os.Stat(sides[0]); err != nil {
		t.Fatalf("the side file is gone: %v", err)
	}
}
