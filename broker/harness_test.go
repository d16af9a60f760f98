package broker

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/internal/testlog"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChildBroker()
		return
	}
	goleak.VerifyTestMain(m)
}

// startMeta starts a one-node metaserver with test timings.
func startMeta(t testing.TB, edits ...func(*metaserver.Config)) *metaserver.Server {
	t.Helper()
	cfg := metaserver.Config{
		ID: "m1", Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0",
		AutoCreateTopics: true, DefaultQueues: 4,
		SessionTimeout: time.Second, LagBytes: 64 << 20, LagTime: time.Second, RecoverHeartbeats: 2,
		JudgeInterval: 50 * time.Millisecond, RaftHeartbeatTimeout: 200 * time.Millisecond,
		RaftElectionTimeout: 200 * time.Millisecond, RaftLeaderLeaseTimeout: 100 * time.Millisecond,
		Logger: testlog.New("meta"),
	}
	for _, e := range edits {
		e(&cfg)
	}
	s, err := metaserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start([]metaserver.Peer{{ID: "m1", RaftAddr: s.RaftAddr(), RPCAddr: s.RPCAddr()}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	waitFor(t, 10*time.Second, "a metaserver leader", s.IsLeader)
	return s
}

func brokerConfig(meta string, group string, role routing.Role, dir string) Config {
	return Config{
		ID: group + "-" + string(role), Group: group, Role: role, Dir: dir, Addr: "127.0.0.1:0", MetaAddrs: []string{meta},
		HeartbeatInterval: 100 * time.Millisecond, SessionTimeout: time.Second, HighWait: time.Second,
		SlaveLagTime: time.Second, HAFetchWait: 50 * time.Millisecond, SegmentSize: 1 << 20,
		Logger: testlog.New(group + "-" + string(role)),
	}
}

func startBroker(t testing.TB, cfg Config) *Broker {
	t.Helper()
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// group is a master and (optionally) a slave, both registered and writable.
type group struct {
	master, slave *Broker
	mdir, sdir    string
}

func startGroup(t testing.TB, meta *metaserver.Server, name string, withSlave bool, edit func(*Config)) *group {
	t.Helper()
	g := &group{mdir: t.TempDir(), sdir: t.TempDir()}
	mc := brokerConfig(meta.RPCAddr(), name, routing.RoleMaster, g.mdir)
	if edit != nil {
		edit(&mc)
	}
	g.master = startBroker(t, mc)
	if withSlave {
		sc := brokerConfig(meta.RPCAddr(), name, routing.RoleSlave, g.sdir)
		if edit != nil {
			edit(&sc)
		}
		g.slave = startBroker(t, sc)
		waitFor(t, 10*time.Second, name+"'s slave to connect", func() bool { return g.master.Slave().Connected })
	}
	waitFor(t, 10*time.Second, name+" to be writable", g.master.Writable)
	return g
}

func (g *group) startSlave(t testing.TB, meta *metaserver.Server, name string) {
	t.Helper()
	g.slave = startBroker(t, brokerConfig(meta.RPCAddr(), name, routing.RoleSlave, g.sdir))
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func metaClient(t testing.TB, meta *metaserver.Server) *client.Client {
	cl, err := client.New(client.Config{Addrs: []string{meta.RPCAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

func createTopic(t testing.TB, meta *metaserver.Server, name string, groups ...string) {
	t.Helper()
	if _, err := metaClient(t, meta).CreateTopic(context.Background(), api.CreateTopicRequest{Name: name, Queues: len(groups), Groups: groups}); err != nil {
		t.Fatal(err)
	}
}

func dial(t testing.TB, addr string) *transport.Client {
	c := transport.NewClient(addr, transport.ClientConfig{})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// send sends one batch and returns its results.
func send(t testing.TB, c *transport.Client, msgs []protocol.Message) []protocol.SendResult {
	t.Helper()
	resp, err := c.Call(context.Background(), protocol.CodeSend, protocol.AppendSendRequest(nil, msgs))
	if err != nil {
		t.Fatal(err)
	}
	res, err := protocol.DecodeSendResponse(resp.Body, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(msgs) {
		t.Fatalf("%d results for %d messages", len(res), len(msgs))
	}
	return res
}

var msgSeq atomic.Int64

func msg(topic string, queue uint32, rel protocol.Reliability, body string) protocol.Message {
	return protocol.Message{ID: fmt.Sprintf("id-%d", msgSeq.Add(1)), Topic: topic, Queue: queue, Reliability: rel,
		Timestamp: time.Now().UnixMilli(), Body: []byte(body)}
}

// pullAll reads a queue whole through PULL.
func pullAll(t testing.TB, c *transport.Client, topic string, queue uint32) []protocol.StoredMessage {
	t.Helper()
	var out []protocol.StoredMessage
	offset := int64(0)
	for {
		resp, err := c.Call(context.Background(), protocol.CodePull, protocol.AppendPullRequest(nil, &protocol.PullRequest{Topic: topic, Queue: queue, Offset: offset, MaxBytes: 64 << 10}))
		if err != nil {
			t.Fatal(err)
		}
		pr, err := protocol.DecodePullResponse(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if len(pr.Messages) == 0 {
			return out
		}
		out = append(out, pr.Messages...)
		offset = pr.NextOffset
	}
}

// logBytes is a commit log's whole byte stream.
func logBytes(t testing.TB, l *storage.Log) []byte {
	t.Helper()
	var out []byte
	for off := int64(0); off < l.EndOffset(); {
		raw, err := l.ReadRaw(off, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, raw...)
		off += int64(len(raw))
	}
	return out
}
