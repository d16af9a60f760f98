package broker_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/broker"
	tc "github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testlog"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

func TestBatchWithMixedOutcomes(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g1 := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true})
	tc.StartGroup(t, meta.Addrs(), "g2", tc.GroupOpts{Slave: false})
	meta.CreateTopic(t, "mixed", "g1", "g2") // queue 0 on g1, queue 1 on g2
	c := tc.Dial(t, g1.Master.Addr())
	warmRoute(t, c, "mixed", 0)

	big := tc.Msg("mixed", 0, protocol.Normal, "")
	big.Body = make([]byte, protocol.MaxMessageSize+1)
	noID := tc.Msg("mixed", 0, protocol.Normal, "x")
	noID.ID = ""
	batch := []protocol.Message{
		tc.Msg("mixed", 0, protocol.Normal, "first"),
		big,
		tc.Msg("mixed", 1, protocol.Normal, "queue on g2"),
		noID,
		tc.Msg("mixed", 7, protocol.Normal, "no such queue"),
		tc.Msg("unknown-topic", 0, protocol.Normal, "x"),
		tc.Msg("mixed", 0, protocol.High, "high"),
		tc.Msg("mixed", 0, protocol.Normal, "last"),
	}
	res := tc.Send(t, c, batch)
	want := []protocol.Status{protocol.StatusOK, protocol.StatusMessageTooLarge, protocol.StatusNoRoute, protocol.StatusInvalid,
		protocol.StatusNoRoute, protocol.StatusNoRoute, protocol.StatusOK, protocol.StatusOK}
	for i, r := range res {
		if r.Status != want[i] {
			t.Errorf("message %d: %v, want %v", i, r.Status, want[i])
		}
	}
	if res[0].QueueOffset != 1 || res[6].QueueOffset != 2 || res[7].QueueOffset != 3 || res[7].LogOffset <= res[0].LogOffset {
		t.Fatalf("offsets: %+v", res)
	}
	got := tc.PullAll(t, c, "mixed", 0)[1:] // after the probe
	if len(got) != 3 || string(got[0].Message.Body) != "first" || string(got[1].Message.Body) != "high" || got[1].Message.Reliability != protocol.High {
		t.Fatalf("pulled %d messages: %+v", len(got), got)
	}
	if got[2].Message.ID != batch[7].ID || got[2].LogOffset != res[7].LogOffset {
		t.Fatalf("stored message differs: %+v", got[2])
	}
}

func TestNormalAndHighReplicate(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true})
	meta.CreateTopic(t, "rep", "g1", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "rep", 0, 1)
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
				batch := []protocol.Message{tc.Msg("rep", uint32(w%2), rel, fmt.Sprintf("w%d-%d-a", w, i)), tc.Msg("rep", uint32(w%2), rel, fmt.Sprintf("w%d-%d-b", w, i))}
				for _, r := range tc.Send(t, c, batch) {
					if r.Status != protocol.StatusOK {
						t.Errorf("%v message: %v", rel, r.Status)
					}
				}
			}
		}()
	}
	wg.Wait()
	// Every HIGH answer came after the slave had the bytes.
	end := g.Master.Store().EndOffset()
	testwait.For(t, 5*time.Second, "the slave to catch up", func() bool { return g.Slave.Store().EndOffset() == end })
	if !bytes.Equal(tc.LogBytes(t, g.Master.Store()), tc.LogBytes(t, g.Slave.Store())) {
		t.Fatal("the slave's log differs from the master's")
	}
	sc := tc.Dial(t, g.Slave.Addr())
	// A slave's reads stop at what the sync set held at the master's last
	// report, which comes with a heartbeat reply after the bytes.
	testwait.For(t, 5*time.Second, "the slave's reads to reach the end", func() bool {
		return len(tc.PullAll(t, sc, "rep", 0)) == 101 && len(tc.PullAll(t, sc, "rep", 1)) == 101
	})
	for q := range uint32(2) {
		if fromMaster := tc.PullAll(t, c, "rep", q); len(fromMaster) != 101 {
			t.Fatalf("queue %d: %d messages on the master, want 101 (100 and a probe)", q, len(fromMaster))
		}
	}
	if g.Master.Stats().HighAcked.Load() != 100 {
		t.Fatalf("%d HIGH messages confirmed, want 100", g.Master.Stats().HighAcked.Load())
	}
	// The slave refuses writes.
	if r := tc.Send(t, sc, []protocol.Message{tc.Msg("rep", 0, protocol.Normal, "x")}); r[0].Status != protocol.StatusNotMaster {
		t.Fatalf("send to a slave: %v", r[0].Status)
	}
}

// A master whose only slave stops takes it out of the sync set after its
// lag time and refuses HIGH (one copy is below the minimum of two) while
// NORMAL is stored; once the slave is back and caught up, HIGH is taken.
func TestHighWithoutSlave(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true})
	meta.CreateTopic(t, "high", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "high", 0)
	if r := tc.Send(t, c, []protocol.Message{tc.Msg("high", 0, protocol.High, "before")}); r[0].Status != protocol.StatusOK {
		t.Fatalf("HIGH with a slave: %v", r[0].Status)
	}
	_ = g.Slave.Close()
	// Until the master takes the slave out of the sync set (its lag time),
	// a HIGH message waits and times out, or learns of the removal while it
	// waits; from then on HIGH is refused before it is stored. NORMAL
	// messages are stored all along.
	testwait.For(t, 10*time.Second, "HIGH to be refused at once", func() bool {
		r := tc.Send(t, c, []protocol.Message{tc.Msg("high", 0, protocol.High, "while down"), tc.Msg("high", 0, protocol.Normal, "normal")})
		switch r[0].Status {
		case protocol.StatusSlaveSyncTimeout, protocol.StatusNotEnoughReplicasAfterAppend, protocol.StatusNotEnoughReplicas:
		default:
			t.Fatalf("HIGH with the slave stopped: %v", r[0].Status)
		}
		if r[1].Status != protocol.StatusOK {
			t.Fatalf("NORMAL with the slave stopped: %v", r[1].Status)
		}
		return r[0].Status == protocol.StatusNotEnoughReplicas
	})
	g.StartSlave(t)
	testwait.For(t, 10*time.Second, "HIGH to succeed again", func() bool {
		return tc.Send(t, c, []protocol.Message{tc.Msg("high", 0, protocol.High, "after")})[0].Status == protocol.StatusOK
	})
	if !bytes.Equal(tc.LogBytes(t, g.Master.Store()), tc.LogBytes(t, g.Slave.Store())[:g.Master.Store().EndOffset()]) {
		t.Fatal("the restarted slave's log is not the master's")
	}
}

func TestReadOnlyGroupRefusesWrites(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: false})
	meta.CreateTopic(t, "ro", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "ro", 0)
	mc := meta.Client(t)
	if _, err := mc.SetGroupReadOnly(context.Background(), "g1", true); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "the broker to enforce RO", func() bool { return !g.Master.Writable() })
	if r := tc.Send(t, c, []protocol.Message{tc.Msg("ro", 0, protocol.Normal, "x")}); r[0].Status != protocol.StatusReadOnly {
		t.Fatalf("send to a read-only group: %v", r[0].Status)
	}
	if _, err := mc.SetGroupReadOnly(context.Background(), "g1", false); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "the broker to be writable", g.Master.Writable)
	if r := tc.Send(t, c, []protocol.Message{tc.Msg("ro", 0, protocol.Normal, "x")}); r[0].Status != protocol.StatusOK {
		t.Fatalf("send after RW: %v", r[0].Status)
	}
}

// A broker that hears nothing from the metaserver for one session stops
// taking writes by itself, and not before: its clock is moved by hand.
func TestCutOffFromMetaserverTurnsReadOnly(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	clock := clockwork.NewFakeClock()
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Edit: func(c *broker.Config) { c.Clock = clock }})
	meta.CreateTopic(t, "cut", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "cut", 0)
	meta.StopAll()
	session := g.Config(routing.RoleMaster).SessionTimeout
	// Heartbeats fire as the clock moves, and fail: nothing renews the lease.
	clock.Advance(session - time.Millisecond)
	if !g.Master.Writable() {
		t.Fatal("read-only before its session ran out")
	}
	if r := tc.Send(t, c, []protocol.Message{tc.Msg("cut", 0, protocol.Normal, "y")}); r[0].Status != protocol.StatusOK {
		t.Fatalf("within the session: %v", r[0].Status)
	}
	clock.Advance(2 * time.Millisecond)
	if g.Master.Writable() {
		t.Fatal("still writable one session after the last accepted heartbeat")
	}
	if r := tc.Send(t, c, []protocol.Message{tc.Msg("cut", 0, protocol.Normal, "z")}); r[0].Status != protocol.StatusReadOnly {
		t.Fatalf("after the session: %v", r[0].Status)
	}
}

// A master killed with SIGKILL keeps every message it acknowledged in
// flush=sync mode.
func TestKilledMasterKeepsAcknowledged(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	dir := t.TempDir()
	cfg := tc.BrokerConfig(meta.Addrs(), "g1", routing.RoleMaster, dir)
	cfg.Flush = storage.FlushSync
	addr, proc := startChild(t, cfg)
	testwait.For(t, 10*time.Second, "the child to register", func() bool { _, ok := meta.Nodes[0].FSM().Group("g1"); return ok })
	meta.CreateTopic(t, "durable", "g1", "g1")
	c := tc.Dial(t, addr)
	testwait.For(t, 10*time.Second, "the child to be writable", func() bool {
		return tc.Send(t, c, []protocol.Message{tc.Msg("durable", 0, protocol.Normal, "probe")})[0].Status == protocol.StatusOK
	})

	// Four idempotent producers (ids 1 to 4), two per queue, each sending
	// one message at a time with its next sequence.
	type acked struct {
		msg protocol.Message
		res protocol.SendResult
	}
	var mu sync.Mutex
	var ack []acked
	lastAcked := make([]*acked, 4)
	unknown := make([]*protocol.Message, 4) // the message whose call failed at the kill
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int64(0); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				m := stamped("durable", uint32(w%2), protocol.Normal, uint64(w+1), 0, i)
				resp, err := c.Call(context.Background(), protocol.CodeSend, protocol.AppendSendRequest(nil, 0, []protocol.Message{m}))
				if err != nil {
					unknown[w] = &m
					return // the broker died
				}
				res, _ := protocol.DecodeSendResponse(resp.Body, nil)
				if len(res) != 1 || res[0].Status != protocol.StatusOK {
					t.Errorf("producer %d seq %d: %+v", w+1, i, res)
					return
				}
				mu.Lock()
				ack = append(ack, acked{m, res[0]})
				lastAcked[w] = &ack[len(ack)-1]
				mu.Unlock()
			}
		}()
	}
	testwait.For(t, 10*time.Second, "200 acknowledgements before the kill", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ack) >= 200
	})
	kill9(t, proc)
	close(stop)
	wg.Wait()

	cfg.Logger = testlog.New("restarted")
	b := tc.StartBroker(t, cfg)
	rc := tc.Dial(t, b.Addr())
	stored := map[uint32][]protocol.StoredMessage{0: tc.PullAll(t, rc, "durable", 0), 1: tc.PullAll(t, rc, "durable", 1)}
	for _, a := range ack {
		q := stored[a.msg.Queue]
		if a.res.QueueOffset >= int64(len(q)) || string(q[a.res.QueueOffset].Message.Body) != string(a.msg.Body) {
			t.Fatalf("acknowledged message %q at queue %d offset %d lost after kill -9", a.msg.Body, a.msg.Queue, a.res.QueueOffset)
		}
	}
	t.Logf("%d acknowledged messages all survived kill -9", len(ack))

	// The restarted broker rebuilt every producer's sequences from its log:
	// the last acknowledged message, resent, is a duplicate with its
	// original offsets; the one in flight at the kill is stored at most once.
	testwait.For(t, 10*time.Second, "the restarted broker to be writable", b.Writable)
	warmRoute(t, rc, "durable", 0, 1)
	for w, last := range lastAcked {
		if last == nil {
			continue
		}
		r := tc.Send(t, rc, []protocol.Message{last.msg})[0]
		if r.Status != protocol.StatusDuplicate || r.QueueOffset != last.res.QueueOffset || r.LogOffset != last.res.LogOffset {
			t.Fatalf("producer %d's last acknowledged message resent after the restart: %+v, first answer %+v", w+1, r, last.res)
		}
		if m := unknown[w]; m != nil {
			testwait.For(t, 5*time.Second, "the in-flight message to be stored", func() bool {
				st := tc.Send(t, rc, []protocol.Message{*m})[0].Status
				return st == protocol.StatusOK || st == protocol.StatusDuplicate
			})
		}
	}
	for q := range uint32(2) {
		seen := map[protocol.ProducerStamp]int{}
		for _, m := range tc.PullAll(t, rc, "durable", q) {
			if !m.Message.Producer.IsZero() {
				seen[m.Message.Producer]++
				if seen[m.Message.Producer] > 1 {
					t.Fatalf("queue %d holds %+v twice", q, m.Message.Producer)
				}
			}
		}
	}
}

func TestBadInputKeepsServing(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Edit: func(c *broker.Config) { c.MaxInflightBytes = 1 << 20 }})
	meta.CreateTopic(t, "bad", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "bad", 0)
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
		huge[i] = tc.Msg("bad", 0, protocol.Normal, "")
		huge[i].Body = make([]byte, 512<<10)
	}
	if _, err := c.Call(ctx, protocol.CodeSend, protocol.AppendSendRequest(nil, 0, huge)); !errors.Is(err, protocol.ErrBusy) {
		t.Fatalf("batch over the in-flight bytes: %v", err)
	}
	// A frame over the cap closes that connection only.
	raw, err := net.Dial("tcp", g.Master.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_, _ = raw.Write([]byte{0x7f, 0xff, 0xff, 0xff, 0xfe, 0x77, 1, 0})
	_ = raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := raw.Read(make([]byte, 1)); err == nil || n != 0 {
		t.Fatalf("connection with an oversized frame stayed open (%d, %v)", n, err)
	}
	if r := tc.Send(t, c, []protocol.Message{tc.Msg("bad", 0, protocol.Normal, "still here")}); r[0].Status != protocol.StatusOK {
		t.Fatalf("good send after bad input: %v", r[0].Status)
	}
}

func TestRetentionKeepsQueuesReadable(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true, Edit: func(c *broker.Config) {
		c.SegmentSize = 64 << 10
		c.RetentionBytes = 256 << 10
		c.RetentionCheck = 20 * time.Millisecond
	}})
	meta.CreateTopic(t, "ret", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "ret", 0)
	for i := range 100 {
		batch := make([]protocol.Message, 10)
		for j := range batch {
			batch[j] = tc.Msg("ret", 0, protocol.Normal, fmt.Sprintf("%d-%d-%s", i, j, bytes.Repeat([]byte("x"), 1000)))
		}
		for _, r := range tc.Send(t, c, batch) {
			if r.Status != protocol.StatusOK {
				t.Fatal(r.Status)
			}
		}
	}
	for _, b := range []*broker.Broker{g.Master, g.Slave} {
		testwait.For(t, 5*time.Second, "retention to trim the log", func() bool {
			return b.Store().EndOffset()-b.Store().StartOffset() < 400<<10
		})
	}
	// PULL from 0 starts at the queue's first kept message.
	resp, err := c.Call(context.Background(), protocol.CodePull, protocol.AppendPullRequest(nil, &protocol.PullRequest{Topic: "ret", Queue: 0, Offset: 0, MaxBytes: 4096}))
	if err != nil {
		t.Fatal(err)
	}
	pr, err := protocol.DecodePullResponse(resp.Body)
	if err != nil || pr.MinOffset == 0 || pr.MaxOffset != 1001 || len(pr.Messages) == 0 || pr.Messages[0].QueueOffset != pr.MinOffset {
		t.Fatalf("pull after retention: min %d max %d, %d messages, %v", pr.MinOffset, pr.MaxOffset, len(pr.Messages), err)
	}
	// Sends go on at the right queue offset.
	if r := tc.Send(t, c, []protocol.Message{tc.Msg("ret", 0, protocol.Normal, "after")}); r[0].Status != protocol.StatusOK || r[0].QueueOffset != 1001 {
		t.Fatalf("send after retention: %+v", r[0])
	}
}

// warmRoute sends a probe to each queue until it is stored: a broker
// answers a topic it has not looked up yet with NO_ROUTE (retriable) and
// looks it up in the background.
func warmRoute(t *testing.T, c *transport.Client, topic string, queues ...uint32) {
	t.Helper()
	for _, q := range queues {
		testwait.For(t, 5*time.Second, fmt.Sprintf("the route of %s/%d to reach the broker", topic, q), func() bool {
			st := tc.Send(t, c, []protocol.Message{tc.Msg(topic, q, protocol.Normal, "probe")})[0].Status
			if st != protocol.StatusOK && st != protocol.StatusNoRoute {
				t.Fatalf("probe of %s/%d: %v", topic, q, st)
			}
			return st == protocol.StatusOK
		})
	}
}

// A client that stops reading its answers holds up nobody. One connection
// pipelines PULLs with large answers and SENDs, and never reads; meanwhile
// other producers' HIGH sends, which need the commit log's goroutines and
// the slave's fetches, all complete while that connection is still open
// and stuck (its write timeout is a minute: nothing cut it to free the
// others); and with a short write timeout the stuck connection is closed
// with one clear log line.
func TestStuckReaderStallsNobody(t *testing.T) {
	t.Run("others complete while it is stuck", func(t *testing.T) {
		logs := stuckReader(t, time.Minute)
		if cut := logs.Lines("did not read"); len(cut) != 0 {
			t.Fatalf("the stuck connection was cut before the others finished: %s", cut[0])
		}
	})
	t.Run("it is cut after the write timeout", func(t *testing.T) {
		logs := stuckReader(t, 300*time.Millisecond)
		testwait.For(t, 10*time.Second, "the stuck connection to be closed", func() bool { return len(logs.Lines("did not read")) > 0 })
		t.Logf("broker said: %s", logs.Lines("did not read")[0])
	})
}

// stuckReader starts a group whose connections time out after
// writeTimeout, makes one connection that sends and never reads, and
// returns once 100 HIGH sends on another connection all succeeded.
func stuckReader(t *testing.T, writeTimeout time.Duration) *testlog.Capture {
	logs := testlog.NewCapture("g1-master", hclog.Warn)
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true, Edit: func(c *broker.Config) {
		c.WriteTimeout = writeTimeout
		if c.Role == routing.RoleMaster {
			c.Logger = logs
		}
	}})
	meta.CreateTopic(t, "stuck", "g1", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "stuck", 0, 1)
	body := strings.Repeat("x", 4<<10)
	for range 64 { // 4 MiB in queue 0 to pull
		batch := make([]protocol.Message, 16)
		for i := range batch {
			batch[i] = tc.Msg("stuck", 0, protocol.Normal, body)
		}
		tc.Send(t, c, batch)
	}

	raw, err := net.Dial("tcp", g.Master.Addr())
	if err != nil {
		t.Fatal(err)
	}
	writerDone := make(chan struct{})
	t.Cleanup(func() {
		_ = raw.Close()
		<-writerDone
	})
	go func() {
		defer close(writerDone)
		_ = raw.SetWriteDeadline(time.Now().Add(10 * time.Second))
		pull := protocol.AppendPullRequest(nil, &protocol.PullRequest{Topic: "stuck", Queue: 0, MaxBytes: 1 << 20})
		send := protocol.AppendSendRequest(nil, 0, []protocol.Message{tc.Msg("stuck", 1, protocol.Normal, "from the stuck client")})
		for i := range uint32(200) {
			code, b := protocol.CodePull, pull
			if i%2 == 1 {
				code, b = protocol.CodeSend, send
			}
			frame, _ := protocol.AppendFrame(nil, &protocol.Frame{Code: code, Opaque: i + 1, Body: b})
			if _, err := raw.Write(frame); err != nil {
				return // the broker stopped reading, or closed the connection
			}
		}
	}()

	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				r := tc.Send(t, c, []protocol.Message{tc.Msg("stuck", 1, protocol.High, fmt.Sprintf("w%d-%d", w, i))})
				if r[0].Status != protocol.StatusOK {
					t.Errorf("HIGH send beside a stuck reader: %v", r[0].Status)
				}
			}
		}()
	}
	wg.Wait()
	return logs
}

// SENDs pipelined on one connection are appended in the order they
// arrived, whatever the number of workers: every queue holds its messages
// in send order.
func TestPipelinedSendsKeepArrivalOrder(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Edit: func(c *broker.Config) { c.Workers = 8 }})
	meta.CreateTopic(t, "order", "g1", "g1", "g1", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "order", 0, 1, 2, 3)

	// 200 batches written in one go on one connection, each with messages
	// for every queue; then every answer is read.
	const batches = 200
	var wire []byte
	for i := range batches {
		batch := make([]protocol.Message, 8)
		for j := range batch {
			batch[j] = tc.Msg("order", uint32(j%4), protocol.Normal, fmt.Sprintf("%05d-%d", i, j))
		}
		wire, _ = protocol.AppendFrame(wire, &protocol.Frame{Code: protocol.CodeSend, Opaque: uint32(i + 1),
			Body: protocol.AppendSendRequest(nil, 0, batch)})
	}
	raw, err := net.Dial("tcp", g.Master.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Write(wire); err != nil {
		t.Fatal(err)
	}
	_ = raw.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(raw)
	for range batches {
		prefix, err := br.Peek(4)
		if err != nil {
			t.Fatal(err)
		}
		n, err := protocol.FrameLength(prefix)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, n)
		if _, err := io.ReadFull(br, buf); err != nil {
			t.Fatal(err)
		}
		f, err := protocol.DecodeFrame(buf)
		if err != nil || f.Status != protocol.StatusOK {
			t.Fatalf("answer %+v: %v", f.Status, err)
		}
		res, err := protocol.DecodeSendResponse(f.Body, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Status != protocol.StatusOK {
				t.Fatalf("batch %d: %v", f.Opaque, r.Status)
			}
		}
	}
	for q := range uint32(4) {
		got := tc.PullAll(t, c, "order", q)[1:] // after the probe
		if len(got) != 2*batches {
			t.Fatalf("queue %d: %d messages, want %d", q, len(got), 2*batches)
		}
		for i := 1; i < len(got); i++ {
			if string(got[i].Message.Body) < string(got[i-1].Message.Body) {
				t.Fatalf("queue %d: %q stored after %q", q, got[i].Message.Body, got[i-1].Message.Body)
			}
		}
	}
}

// stamped is a message of producer id (epoch) with sequence seq.
func stamped(topic string, queue uint32, rel protocol.Reliability, id uint64, epoch uint16, seq int64) protocol.Message {
	m := tc.Msg(topic, queue, rel, fmt.Sprintf("p%d-e%d-s%d", id, epoch, seq))
	m.Producer = protocol.ProducerStamp{ID: id, Epoch: epoch, Seq: seq}
	return m
}

func stampedBatch(topic string, queue uint32, rel protocol.Reliability, id uint64, epoch uint16, from, n int64) []protocol.Message {
	out := make([]protocol.Message, n)
	for i := range out {
		out[i] = stamped(topic, queue, rel, id, epoch, from+int64(i))
	}
	return out
}

// A resent batch is answered DUPLICATE with its original offsets and stored
// once; a gap is refused OUT_OF_ORDER_SEQUENCE and stores nothing; an
// earlier instance of a producer is fenced once a later one wrote.
func TestIdempotentSends(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{})
	meta.CreateTopic(t, "idem", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "idem", 0)

	first := tc.Send(t, c, stampedBatch("idem", 0, protocol.Normal, 7, 0, 0, 5))
	end := g.Master.Store().EndOffset()
	again := tc.Send(t, c, stampedBatch("idem", 0, protocol.Normal, 7, 0, 0, 5))
	for i := range first {
		if first[i].Status != protocol.StatusOK || again[i].Status != protocol.StatusDuplicate ||
			again[i].QueueOffset != first[i].QueueOffset || again[i].LogOffset != first[i].LogOffset {
			t.Fatalf("message %d: first %+v, resent %+v", i, first[i], again[i])
		}
	}
	if g.Master.Store().EndOffset() != end {
		t.Fatal("a resent batch was stored again")
	}
	// A batch that overlaps: the known part is a duplicate, the rest new.
	mixed := tc.Send(t, c, stampedBatch("idem", 0, protocol.Normal, 7, 0, 3, 4))
	if mixed[0].Status != protocol.StatusDuplicate || mixed[1].Status != protocol.StatusDuplicate ||
		mixed[2].Status != protocol.StatusOK || mixed[3].Status != protocol.StatusOK || mixed[2].QueueOffset != first[4].QueueOffset+1 {
		t.Fatalf("overlapping batch: %+v", mixed)
	}
	// A gap: seq 9 after 6.
	if r := tc.Send(t, c, stampedBatch("idem", 0, protocol.Normal, 7, 0, 9, 2)); r[0].Status != protocol.StatusOutOfOrderSequence ||
		r[1].Status != protocol.StatusOutOfOrderSequence {
		t.Fatalf("a batch after a gap: %+v", r)
	}
	// Epoch 1 starts at 0 and fences epoch 0.
	if r := tc.Send(t, c, stampedBatch("idem", 0, protocol.Normal, 7, 1, 0, 1)); r[0].Status != protocol.StatusOK {
		t.Fatalf("a new epoch at seq 0: %v", r[0].Status)
	}
	if r := tc.Send(t, c, stampedBatch("idem", 0, protocol.Normal, 7, 0, 7, 1)); r[0].Status != protocol.StatusProducerFenced {
		t.Fatalf("the old epoch after the new one wrote: %v", r[0].Status)
	}
	stored := tc.PullAll(t, c, "idem", 0)[1:] // after the probe
	if len(stored) != 8 {
		t.Fatalf("%d messages stored, want 8 (5 + 2 + 1)", len(stored))
	}
	for i, m := range stored[:7] {
		if m.Message.Producer.Seq != int64(i) {
			t.Fatalf("stored message %d has seq %d", i, m.Message.Producer.Seq)
		}
	}
	if st := g.Master.Store().ProducerStats(); st.Duplicates != 7 || st.Tracked != 1 {
		t.Fatalf("producer stats %+v, want 7 duplicates and 1 tracked pair", st)
	}
}

// A HIGH message answered SLAVE_SYNC_TIMEOUT was stored on the master;
// resent once the slave is back, it is answered with its original offsets
// when the slave has it, and stored once.
func TestHighRetryAfterSyncTimeoutIsStoredOnce(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true})
	meta.CreateTopic(t, "high-once", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "high-once", 0)
	_ = g.Slave.Close()
	// The master has not noticed yet: the first HIGH waits and times out.
	var first protocol.SendResult
	seq := int64(0)
	testwait.For(t, 10*time.Second, "a HIGH message answered SLAVE_SYNC_TIMEOUT or NOT_ENOUGH_REPLICAS_AFTER_APPEND", func() bool {
		first = tc.Send(t, c, []protocol.Message{stamped("high-once", 0, protocol.High, 9, 0, seq)})[0]
		switch first.Status {
		case protocol.StatusSlaveSyncTimeout, protocol.StatusNotEnoughReplicasAfterAppend:
			return true // stored, perhaps
		case protocol.StatusNotEnoughReplicas:
			t.Skip("the master saw the slave gone before any HIGH message waited; nothing to retry")
		case protocol.StatusOK:
			seq++ // stored and confirmed before the slave went
		default:
			t.Fatalf("HIGH with the slave stopping: %v", first.Status)
		}
		return false
	})
	g.StartSlave(t)
	var again protocol.SendResult
	testwait.For(t, 10*time.Second, "the resent HIGH message to be confirmed", func() bool {
		again = tc.Send(t, c, []protocol.Message{stamped("high-once", 0, protocol.High, 9, 0, seq)})[0]
		return again.Status == protocol.StatusDuplicate
	})
	stored := tc.PullAll(t, tc.Dial(t, g.Slave.Addr()), "high-once", 0)
	n := 0
	for _, m := range stored {
		if m.Message.Producer == (protocol.ProducerStamp{ID: 9, Seq: seq}) {
			n++
			if m.QueueOffset != again.QueueOffset {
				t.Fatalf("the slave has it at %d, the answer says %d", m.QueueOffset, again.QueueOffset)
			}
		}
	}
	if n != 1 {
		t.Fatalf("the message is stored %d times on the slave", n)
	}
}

// A stamped message refused by a check (here HIGH with no slave: fewer
// copies than the default minimum of two) is never
// overtaken: the producer's later messages to that queue in the same batch
// are refused OUT_OF_ORDER_SEQUENCE, even though the commit log has no
// state for the producer yet; other producers and unstamped messages go on.
func TestRefusedStampedMessageIsNotOvertaken(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{})
	meta.CreateTopic(t, "gap", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "gap", 0)
	r := tc.Send(t, c, []protocol.Message{
		stamped("gap", 0, protocol.High, 5, 0, 0),
		stamped("gap", 0, protocol.Normal, 5, 0, 1),
		tc.Msg("gap", 0, protocol.Normal, "unstamped"),
		stamped("gap", 0, protocol.Normal, 6, 0, 0),
	})
	want := []protocol.Status{protocol.StatusNotEnoughReplicas, protocol.StatusOutOfOrderSequence, protocol.StatusOK, protocol.StatusOK}
	for i := range want {
		if r[i].Status != want[i] {
			t.Fatalf("message %d: %v, want %v", i, r[i].Status, want[i])
		}
	}
	// Resent from the refused one on, as NORMAL, both are stored in order.
	r = tc.Send(t, c, []protocol.Message{stamped("gap", 0, protocol.Normal, 5, 0, 0), stamped("gap", 0, protocol.Normal, 5, 0, 1)})
	if r[0].Status != protocol.StatusOK || r[1].Status != protocol.StatusOK || r[1].QueueOffset != r[0].QueueOffset+1 {
		t.Fatalf("resent: %+v", r)
	}
}
