package broker_test

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
	"github.com/ferrymq/ferrymq/storage/vfs"

	tc "github.com/ferrymq/ferrymq/internal/testcluster"
)

// releasedAfterProbe sends a delayed message due at due to topic/queue and
// waits for its release: the firer takes the earliest first, so by then
// everything due before it was released, if it was pending.
func releasedAfterProbe(t *testing.T, c *transport.Client, topic string, queue uint32, due time.Time) {
	t.Helper()
	probe := delayedMsg(topic, queue, protocol.Normal, "probe", due)
	if r := tc.Send(t, c, []protocol.Message{probe}); r[0].Status != protocol.StatusOK {
		t.Fatalf("probe: %v", r[0].Status)
	}
	testwait.For(t, 15*time.Second, "a probe due later to be released", func() bool {
		return slices.ContainsFunc(released(t, c, topic, queue), func(m protocol.StoredMessage) bool { return m.Message.ID == probe.ID })
	})
}

// timesReleased counts the released copies of message id in topic/queue.
func timesReleased(t *testing.T, c *transport.Client, topic string, queue uint32, id string) int {
	t.Helper()
	n := 0
	for _, m := range released(t, c, topic, queue) {
		if m.Message.ID == id {
			n++
		}
	}
	return n
}

// A delayed SEND names no other record: one whose schedule names another
// pending record (as only a broker's move may) is refused INVALID, so a
// producer of one topic cannot resolve another topic's message.
func TestDelayedForgedReferenceRefused(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{})
	meta.CreateTopic(t, "theirs", "g1", "g1")
	meta.CreateTopic(t, "mine", "g1", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "theirs", 0)
	warmRoute(t, c, "mine", 0)

	due := time.Now().Add(300 * time.Millisecond)
	victim := delayedMsg("theirs", 0, protocol.Normal, "victim", due)
	res := tc.Send(t, c, []protocol.Message{victim})
	if res[0].Status != protocol.StatusOK {
		t.Fatalf("victim: %v", res[0].Status)
	}
	forged := delayedMsg("mine", 0, protocol.Normal, "forged", due)
	forged.Schedule.Ref = res[0].LogOffset
	if r := tc.Send(t, c, []protocol.Message{forged}); r[0].Status != protocol.StatusInvalid {
		t.Fatalf("a delayed SEND naming another pending record: %v, want INVALID", r[0].Status)
	}
	testwait.For(t, 10*time.Second, "the other topic's message to be released", func() bool { return len(released(t, c, "theirs", 0)) == 1 })
}

// A failover's cut tail that holds retention's move of a pending record
// both logs hold is not appended again: this log's own index decides what
// became of that record (here: released), and it is released once.
func TestDelayedRecoveredMoveNotReleasedTwice(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{})
	meta.CreateTopic(t, "later", "g1", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "later", 0)

	p := delayedMsg("later", 0, protocol.Normal, "p", time.Now().Add(200*time.Millisecond))
	res := tc.Send(t, c, []protocol.Message{p})
	if res[0].Status != protocol.StatusOK {
		t.Fatalf("send: %v", res[0].Status)
	}
	cut := g.Master.Store().EndOffset() // where the old master's tail began
	testwait.For(t, 10*time.Second, "P to be released", func() bool { return len(released(t, c, "later", 0)) == 1 })

	// The old master's tail: retention's move of P, two hours ago (past the
	// window in which recovery looks for copies by message id).
	mv := p
	mv.Producer = protocol.ProducerStamp{}
	mv.Schedule.Ref = res[0].LogOffset
	raw := storage.EncodeRecord(storage.RecordInfo{Offset: cut, Topic: protocol.DelayTopic("later"), Queue: 0, QueueOffset: 1,
		StoreTime: time.Now().Add(-2 * time.Hour).UnixMilli(), Payload: protocol.AppendMessage(nil, &mv)})
	grp, _ := meta.Nodes[0].FSM().Group("g1")
	hc := transport.NewClient(g.Master.HAAddr(), transport.ClientConfig{})
	defer hc.Close()
	resp, err := hc.Call(context.Background(), protocol.CodeRecover, protocol.AppendRecoverRequest(nil,
		&protocol.RecoverRequest{Epoch: grp.Epoch, BrokerID: "g1-old", From: cut, Cut: cut, Records: raw}))
	if err != nil {
		t.Fatal(err)
	}
	if rr, err := protocol.DecodeRecoverResponse(resp.Body); err != nil || rr.Stored != 0 {
		t.Fatalf("recovered %+v %v: the move of a record both logs hold was stored", rr, err)
	}
	releasedAfterProbe(t, c, "later", 0, time.Now())
	if n := timesReleased(t, c, "later", 0, p.ID); n != 1 {
		t.Fatalf("P released %d times in one log after a recovered move", n)
	}
}

// One failed write of the timer index's files (a full disk for a moment)
// does not stop the delayer: the index is rebuilt from the log and the
// message is released.
func TestDelayedIndexWriteErrorRebuilds(t *testing.T) {
	efs := vfs.NewErrorFS(vfs.Default)
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Edit: func(c *broker.Config) { c.FS = efs }})
	meta.CreateTopic(t, "later", "g1", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "later", 0)

	rule := vfs.Fail(vfs.OpSync | vfs.OpWrite).Where(func(call vfs.Call) bool {
		return strings.HasSuffix(call.Path, string(filepath.Separator)+"delay"+string(filepath.Separator)+"checkpoint.tmp")
	}).Times(1).With(syscall.ENOSPC)
	efs.Inject(rule)
	testwait.For(t, 10*time.Second, "the index's checkpoint write to fail once", func() bool { return rule.Fired() == 1 })
	res := tc.Send(t, c, []protocol.Message{delayedMsg("later", 0, protocol.Normal, "m", time.Now().Add(100*time.Millisecond))})
	if res[0].Status != protocol.StatusOK {
		t.Fatalf("send: %v", res[0].Status)
	}
	testwait.For(t, 15*time.Second, "the message to be released after the failed write", func() bool { return len(released(t, c, "later", 0)) == 1 })
}

// retentionGroup starts group g1 of one master whose retention deletes
// 64 KiB segments past 256 KiB, with topic "later" (queues 0 and 1), and a
// connection to it with queue 0's route warm.
func retentionGroup(t *testing.T) (*tc.Group, *transport.Client) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Edit: func(c *broker.Config) {
		c.SegmentSize, c.RetentionBytes, c.RetentionCheck = 64<<10, 256<<10, 20*time.Millisecond
	}})
	meta.CreateTopic(t, "later", "g1", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "later", 0)
	return g, c
}

// retainPast sends ordinary messages to "later"/1 until retention has
// deleted the segment holding log offset off.
func retainPast(t *testing.T, g *tc.Group, c *transport.Client, off int64) {
	t.Helper()
	body := strings.Repeat("x", 4000)
	testwait.For(t, 20*time.Second, "retention to delete the segment that held the pending records", func() bool {
		batch := make([]protocol.Message, 16)
		for i := range batch {
			batch[i] = tc.Msg("later", 1, protocol.Normal, body)
		}
		tc.Send(t, c, batch)
		return g.Master.Store().StartOffset() > off
	})
}

// A message pending in a segment that retention deletes is moved first
// (appended again, due at the same time) and released once, on time; one
// due later is cancelled through its first handle after that segment is
// gone (the handle's due time finds where it was moved).
func TestDelayedSurvivesRetention(t *testing.T) {
	g, c := retentionGroup(t)

	due := time.Now().Add(3 * time.Second)
	m := delayedMsg("later", 0, protocol.Normal, "kept", due)
	gone := delayedMsg("later", 0, protocol.Normal, "cancelled", due.Add(time.Hour))
	res := tc.Send(t, c, []protocol.Message{m, gone})
	if res[0].Status != protocol.StatusOK || res[1].Status != protocol.StatusOK {
		t.Fatal(res[0].Status, res[1].Status)
	}
	retainPast(t, g, c, res[0].LogOffset)
	if g.Master.Stats().DelayedMoved.Load() < 1 {
		t.Fatal("the segment was deleted, but nothing was moved")
	}
	var st protocol.DelayedState
	oldRef := protocol.DelayedRef{Offset: res[1].LogOffset, DueAt: gone.Schedule.At}
	if err := callDelayed(t, c, protocol.CodeDelayedState, protocol.DelayedRef{Offset: oldRef.Offset}, &st); protocol.StatusOf(err) != protocol.StatusNotFound {
		t.Fatalf("the deleted record's state without its due time: %+v %v, want NOT_FOUND", st, err)
	}
	if err := callDelayed(t, c, protocol.CodeDelayedCancel, oldRef, &st); err != nil || st.State != protocol.DelayCancelled || st.Offset <= oldRef.Offset {
		t.Fatalf("cancel through the first handle: %+v %v, want cancelled at the moved record", st, err)
	}
	testwait.For(t, 20*time.Second, "the moved message to be released", func() bool { return len(released(t, c, "later", 0)) >= 1 })
	got := released(t, c, "later", 0)
	if len(got) != 1 || got[0].Message.ID != m.ID || got[0].StoreTime < m.Schedule.At || string(got[0].Message.Body) != "kept" {
		t.Fatalf("released %+v, want the message once, not before %d", got, m.Schedule.At)
	}
	if o := protocol.DelayedOrigin(&got[0].Message); o != res[0].LogOffset {
		t.Fatalf("the released copy names its first pending record %d, want %d (its handle's)", o, res[0].LogOffset)
	}
	if err := callDelayed(t, c, protocol.CodeDelayedState, oldRef, &st); err != nil || st.State != protocol.DelayCancelled {
		t.Fatalf("the cancelled message's state through its first handle: %+v %v", st, err)
	}
	if len(got) != 1 {
		t.Fatalf("released %+v, want the message once, not before %d", got, m.Schedule.At)
	}
}
