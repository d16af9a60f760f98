package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testlog"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

func TestBatchWithMixedOutcomes(t *testing.T) {
	meta := startMeta(t)
	g1 := startGroup(t, meta, "g1", true, nil)
	startGroup(t, meta, "g2", false, nil)
	createTopic(t, meta, "mixed", "g1", "g2") // queue 0 on g1, queue 1 on g2
	c := dial(t, g1.master.Addr())

	big := msg("mixed", 0, protocol.Normal, "")
	big.Body = make([]byte, protocol.MaxMessageSize+1)
	noID := msg("mixed", 0, protocol.Normal, "x")
	noID.ID = ""
	batch := []protocol.Message{
		msg("mixed", 0, protocol.Normal, "first"),
		big,
		msg("mixed", 1, protocol.Normal, "queue on g2"),
		noID,
		msg("mixed", 7, protocol.Normal, "no such queue"),
		msg("unknown-topic", 0, protocol.Normal, "x"),
		msg("mixed", 0, protocol.High, "high"),
		msg("mixed", 0, protocol.Normal, "last"),
	}
	res := send(t, c, batch)
	want := []protocol.Status{protocol.StatusOK, protocol.StatusMessageTooLarge, protocol.StatusNoRoute, protocol.StatusInvalid,
		protocol.StatusNoRoute, protocol.StatusNoRoute, protocol.StatusOK, protocol.StatusOK}
	for i, r := range res {
		if r.Status != want[i] {
			t.Errorf("message %d: %v, want %v", i, r.Status, want[i])
		}
	}
	if res[0].QueueOffset != 0 || res[6].QueueOffset != 1 || res[7].QueueOffset != 2 || res[7].LogOffset <= res[0].LogOffset {
		t.Fatalf("offsets: %+v", res)
	}
	got := pullAll(t, c, "mixed", 0)
	if len(got) != 3 || string(got[0].Message.Body) != "first" || string(got[1].Message.Body) != "high" || got[1].Message.Reliability != protocol.High {
		t.Fatalf("pulled %d messages: %+v", len(got), got)
	}
	if got[2].Message.ID != batch[7].ID || got[2].LogOffset != res[7].LogOffset {
		t.Fatalf("stored message differs: %+v", got[2])
	}
}

func TestNormalAndHighReplicate(t *testing.T) {
	meta := startMeta(t)
	g := startGroup(t, meta, "g1", true, nil)
	createTopic(t, meta, "rep", "g1", "g1")
	c := dial(t, g.master.Addr())
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				rel := protocol.Normal
				if (w+i)%2 == 0 {
					rel = protocol.High
				}
				batch := []protocol.Message{msg("rep", uint32(w%2), rel, fmt.Sprintf("w%d-%d-a", w, i)), msg("rep", uint32(w%2), rel, fmt.Sprintf("w%d-%d-b", w, i))}
				for _, r := range send(t, c, batch) {
					if r.Status != protocol.StatusOK {
						t.Errorf("%v message: %v", rel, r.Status)
					}
				}
			}
		}()
	}
	wg.Wait()
	// Every HIGH answer came after the slave had the bytes.
	end := g.master.Store().EndOffset()
	waitFor(t, 5*time.Second, "the slave to catch up", func() bool { return g.slave.Store().EndOffset() == end })
	if !bytes.Equal(logBytes(t, g.master.Store()), logBytes(t, g.slave.Store())) {
		t.Fatal("the slave's log differs from the master's")
	}
	sc := dial(t, g.slave.Addr())
	for q := range uint32(2) {
		fromMaster, fromSlave := pullAll(t, c, "rep", q), pullAll(t, sc, "rep", q)
		if len(fromMaster) != 100 || len(fromSlave) != 100 {
			t.Fatalf("queue %d: %d messages on the master, %d on the slave, want 100", q, len(fromMaster), len(fromSlave))
		}
	}
	if g.master.Stats().HighAcked.Load() != 100 {
		t.Fatalf("%d HIGH messages confirmed, want 100", g.master.Stats().HighAcked.Load())
	}
	// The slave refuses writes.
	if r := send(t, sc, []protocol.Message{msg("rep", 0, protocol.Normal, "x")}); r[0].Status != protocol.StatusNotMaster {
		t.Fatalf("send to a slave: %v", r[0].Status)
	}
}

func TestHighWithoutSlave(t *testing.T) {
	// The metaserver would mark the group read-only for the missing slave
	// after its lag time; keep it out of the way to test the broker's own checks.
	meta := startMeta(t, func(c *metaserver.Config) { c.LagTime = time.Minute })
	g := startGroup(t, meta, "g1", true, nil)
	createTopic(t, meta, "high", "g1")
	c := dial(t, g.master.Addr())
	if r := send(t, c, []protocol.Message{msg("high", 0, protocol.High, "before")}); r[0].Status != protocol.StatusOK {
		t.Fatalf("HIGH with a slave: %v", r[0].Status)
	}
	_ = g.slave.Close()
	start := time.Now()
	var last protocol.Status
	for range 5 {
		r := send(t, c, []protocol.Message{msg("high", 0, protocol.High, "while down"), msg("high", 0, protocol.Normal, "normal")})
		last = r[0].Status
		if last != protocol.StatusSlaveLagging && last != protocol.StatusSlaveSyncTimeout {
			t.Fatalf("HIGH with the slave stopped: %v", last)
		}
		if r[1].Status != protocol.StatusOK {
			t.Fatalf("NORMAL with the slave stopped: %v", r[1].Status)
		}
	}
	if took := time.Since(start); took > 5*(g.master.cfg.HighWait+time.Second) {
		t.Fatalf("HIGH sends took %v: they must not hang", took)
	}
	if last != protocol.StatusSlaveLagging {
		t.Fatalf("once the slave is known gone, HIGH must be refused at once, got %v", last)
	}
	g.startSlave(t, meta, "g1")
	waitFor(t, 10*time.Second, "HIGH to succeed again", func() bool {
		return send(t, c, []protocol.Message{msg("high", 0, protocol.High, "after")})[0].Status == protocol.StatusOK
	})
	if !bytes.Equal(logBytes(t, g.master.Store()), logBytes(t, g.slave.Store())[:g.master.Store().EndOffset()]) {
		t.Fatal("the restarted slave's log is not the master's")
	}
}

func TestReadOnlyGroupRefusesWrites(t *testing.T) {
	meta := startMeta(t)
	g := startGroup(t, meta, "g1", false, nil)
	createTopic(t, meta, "ro", "g1")
	c := dial(t, g.master.Addr())
	mc := metaClient(t, meta)
	if _, err := mc.SetGroupReadOnly(context.Background(), "g1", true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the broker to enforce RO", func() bool { return !g.master.Writable() })
	if r := send(t, c, []protocol.Message{msg("ro", 0, protocol.Normal, "x")}); r[0].Status != protocol.StatusReadOnly {
		t.Fatalf("send to a read-only group: %v", r[0].Status)
	}
	if _, err := mc.SetGroupReadOnly(context.Background(), "g1", false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the broker to be writable", g.master.Writable)
	if r := send(t, c, []protocol.Message{msg("ro", 0, protocol.Normal, "x")}); r[0].Status != protocol.StatusOK {
		t.Fatalf("send after RW: %v", r[0].Status)
	}
}

func TestCutOffFromMetaserverTurnsReadOnly(t *testing.T) {
	meta := startMeta(t)
	g := startGroup(t, meta, "g1", false, nil)
	createTopic(t, meta, "cut", "g1")
	c := dial(t, g.master.Addr())
	if r := send(t, c, []protocol.Message{msg("cut", 0, protocol.Normal, "x")}); r[0].Status != protocol.StatusOK {
		t.Fatalf("before: %v", r[0].Status)
	}
	_ = meta.Close()
	cut := time.Now()
	waitFor(t, 5*time.Second, "the broker to fence itself", func() bool { return !g.master.Writable() })
	t.Logf("cut off broker read-only after %v (session %v)", time.Since(cut), g.master.cfg.SessionTimeout)
	if took := time.Since(cut); took > g.master.cfg.SessionTimeout+time.Second {
		t.Fatalf("fenced after %v, over one session", took)
	}
	if r := send(t, c, []protocol.Message{msg("cut", 0, protocol.Normal, "x")}); r[0].Status != protocol.StatusReadOnly {
		t.Fatalf("after: %v", r[0].Status)
	}
}

// A master killed with SIGKILL keeps every message it acknowledged in
// flush=sync mode.
func TestKilledMasterKeepsAcknowledged(t *testing.T) {
	meta := startMeta(t)
	dir := t.TempDir()
	cfg := brokerConfig(meta.RPCAddr(), "g1", routing.RoleMaster, dir)
	cfg.Flush = storage.FlushSync
	addr, proc := startChild(t, cfg)
	waitFor(t, 10*time.Second, "the child to register", func() bool { _, ok := meta.FSM().Group("g1"); return ok })
	createTopic(t, meta, "durable", "g1", "g1")
	c := dial(t, addr)
	waitFor(t, 10*time.Second, "the child to be writable", func() bool {
		return send(t, c, []protocol.Message{msg("durable", 0, protocol.Normal, "probe")})[0].Status == protocol.StatusOK
	})

	type acked struct {
		queue  uint32
		offset int64
		body   string
	}
	var mu sync.Mutex
	var ack []acked
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				batch := []protocol.Message{msg("durable", uint32(w%2), protocol.Normal, fmt.Sprintf("w%d-%d", w, i))}
				resp, err := c.Call(context.Background(), protocol.CodeSend, protocol.AppendSendRequest(nil, batch))
				if err != nil {
					return // the broker died
				}
				res, _ := protocol.DecodeSendResponse(resp.Body, nil)
				if len(res) == 1 && res[0].Status == protocol.StatusOK {
					mu.Lock()
					ack = append(ack, acked{batch[0].Queue, res[0].QueueOffset, string(batch[0].Body)})
					mu.Unlock()
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	kill9(t, proc)
	close(stop)
	wg.Wait()
	if len(ack) < 10 {
		t.Fatalf("only %d messages acknowledged before the kill", len(ack))
	}

	cfg.Logger = testlog.New("restarted")
	b := startBroker(t, cfg)
	rc := dial(t, b.Addr())
	stored := map[uint32][]protocol.StoredMessage{0: pullAll(t, rc, "durable", 0), 1: pullAll(t, rc, "durable", 1)}
	for _, a := range ack {
		q := stored[a.queue]
		if a.offset >= int64(len(q)) || string(q[a.offset].Message.Body) != a.body {
			t.Fatalf("acknowledged message %q at queue %d offset %d lost after kill -9", a.body, a.queue, a.offset)
		}
	}
	t.Logf("%d acknowledged messages all survived kill -9", len(ack))
}

func TestBadInputKeepsServing(t *testing.T) {
	meta := startMeta(t)
	g := startGroup(t, meta, "g1", false, func(c *Config) { c.MaxInflightBytes = 1 << 20 })
	createTopic(t, meta, "bad", "g1")
	c := dial(t, g.master.Addr())
	ctx := context.Background()
	if _, err := c.Call(ctx, protocol.CodeSend, []byte{0, 0, 0, 9, 1, 2}); !errors.Is(err, protocol.ErrInvalid) {
		t.Fatalf("garbage batch: %v", err)
	}
	if _, err := c.Call(ctx, protocol.CodePull, []byte{1}); !errors.Is(err, protocol.ErrInvalid) {
		t.Fatalf("garbage pull: %v", err)
	}
	// A batch over the broker's in-flight bytes is refused whole with BUSY.
	huge := make([]protocol.Message, 3)
	for i := range huge {
		huge[i] = msg("bad", 0, protocol.Normal, "")
		huge[i].Body = make([]byte, 512<<10)
	}
	if _, err := c.Call(ctx, protocol.CodeSend, protocol.AppendSendRequest(nil, huge)); !errors.Is(err, protocol.ErrBusy) {
		t.Fatalf("batch over the in-flight bytes: %v", err)
	}
	// A frame over the cap closes that connection only.
	raw, err := net.Dial("tcp", g.master.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_, _ = raw.Write([]byte{0x7f, 0xff, 0xff, 0xff, 0xfe, 0x77, 1, 0})
	_ = raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := raw.Read(make([]byte, 1)); err == nil || n != 0 {
		t.Fatalf("connection with an oversized frame stayed open (%d, %v)", n, err)
	}
	if r := send(t, c, []protocol.Message{msg("bad", 0, protocol.Normal, "still here")}); r[0].Status != protocol.StatusOK {
		t.Fatalf("good send after bad input: %v", r[0].Status)
	}
}

func TestRetentionKeepsQueuesReadable(t *testing.T) {
	meta := startMeta(t)
	g := startGroup(t, meta, "g1", true, func(c *Config) {
		c.SegmentSize = 64 << 10
		c.RetentionBytes = 256 << 10
		c.RetentionCheck = 20 * time.Millisecond
	})
	createTopic(t, meta, "ret", "g1")
	c := dial(t, g.master.Addr())
	for i := range 100 {
		batch := make([]protocol.Message, 10)
		for j := range batch {
			batch[j] = msg("ret", 0, protocol.Normal, fmt.Sprintf("%d-%d-%s", i, j, bytes.Repeat([]byte("x"), 1000)))
		}
		for _, r := range send(t, c, batch) {
			if r.Status != protocol.StatusOK {
				t.Fatal(r.Status)
			}
		}
	}
	for _, b := range []*Broker{g.master, g.slave} {
		waitFor(t, 5*time.Second, "retention to trim the log", func() bool {
			return b.Store().EndOffset()-b.Store().StartOffset() < 400<<10
		})
	}
	// PULL from 0 starts at the queue's first kept message.
	resp, err := c.Call(context.Background(), protocol.CodePull, protocol.AppendPullRequest(nil, &protocol.PullRequest{Topic: "ret", Queue: 0, Offset: 0, MaxBytes: 4096}))
	if err != nil {
		t.Fatal(err)
	}
	pr, err := protocol.DecodePullResponse(resp.Body)
	if err != nil || pr.MinOffset == 0 || pr.MaxOffset != 1000 || len(pr.Messages) == 0 || pr.Messages[0].QueueOffset != pr.MinOffset {
		t.Fatalf("pull after retention: min %d max %d, %d messages, %v", pr.MinOffset, pr.MaxOffset, len(pr.Messages), err)
	}
	// Sends go on at the right queue offset.
	if r := send(t, c, []protocol.Message{msg("ret", 0, protocol.Normal, "after")}); r[0].Status != protocol.StatusOK || r[0].QueueOffset != 1000 {
		t.Fatalf("send after retention: %+v", r[0])
	}
}
