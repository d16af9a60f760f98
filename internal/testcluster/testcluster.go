// Package testcluster starts in-process ferrymq clusters for tests: Raft
// metaserver nodes with shrunk timings, broker groups (a master and an
// optional slave) and the clients that talk to them, all on 127.0.0.1 with
// ports the kernel picks. Everything started is stopped by tb.Cleanup, in
// reverse order.
//
// It is imported only from tests (an import rule in internal/lint says so).
// Its layer is above the servers it starts and below the SDKs, whose
// in-package tests run it; packages at or below its layer (broker,
// metaserver, metaserver/client) import it from external test packages
// (package broker_test, package metaserver_test), never from their own.
package testcluster

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/testlog"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

// RaftSecret is the raft secret of every node MetaConfig makes: the same
// for all, so edits that turn authorization or TLS on (which need one)
// keep the nodes a cluster.
var RaftSecret = auth.NewToken()

// MetaConfig is a metaserver node's config with test timings: elections in
// a few hundred milliseconds, a 1 s broker session, a 50 ms judge; its
// raft port takes RaftSecret.
func MetaConfig(id, dir string) metaserver.Config {
	return metaserver.Config{
		ID: id, Dir: dir, RaftAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0", RaftSecret: RaftSecret,
		AutoCreateTopics: true, DefaultQueues: 4,
		SessionTimeout: time.Second, LagBytes: 64 << 20, LagTime: time.Second, RecoverHeartbeats: 2,
		ConsumerJoinWindow:   200 * time.Millisecond,
		JudgeInterval:        50 * time.Millisecond,
		RaftHeartbeatTimeout: 300 * time.Millisecond, RaftElectionTimeout: 300 * time.Millisecond,
		RaftLeaderLeaseTimeout: 150 * time.Millisecond,
		Logger:                 testlog.New(id),
	}
}

// Meta is a metaserver cluster of one or more nodes bootstrapped from one
// peer list. Nodes can be stopped and restarted on the ports they first got.
type Meta struct {
	tb    testing.TB
	Cfgs  []metaserver.Config
	Nodes []*metaserver.Server // nil while stopped
	Peers []metaserver.Peer
}

// StartMeta starts n nodes, edit (if not nil) adjusting each config, and
// waits until one of them leads.
func StartMeta(tb testing.TB, n int, edit func(*metaserver.Config)) *Meta {
	tb.Helper()
	m := &Meta{tb: tb}
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = tb.TempDir() // before StopAll's cleanup, which must run first
	}
	tb.Cleanup(m.StopAll)
	for i := range n {
		cfg := MetaConfig(fmt.Sprintf("m%d", i+1), dirs[i])
		if edit != nil {
			edit(&cfg)
		}
		s, err := metaserver.New(cfg)
		if err != nil {
			tb.Fatal(err)
		}
		// Restarts reuse the ports picked now.
		cfg.RaftAddr, cfg.RPCAddr = s.RaftAddr(), s.RPCAddr()
		m.Cfgs = append(m.Cfgs, cfg)
		m.Nodes = append(m.Nodes, s)
		m.Peers = append(m.Peers, metaserver.Peer{ID: cfg.ID, RaftAddr: cfg.RaftAddr, RPCAddr: cfg.RPCAddr})
	}
	for _, s := range m.Nodes {
		if err := s.Start(m.Peers); err != nil {
			tb.Fatal(err)
		}
	}
	m.Leader()
	return m
}

// Addr is the first node's RPC address.
func (m *Meta) Addr() string { return m.Peers[0].RPCAddr }

// Addrs are every node's RPC addresses.
func (m *Meta) Addrs() []string {
	out := make([]string, len(m.Peers))
	for i, p := range m.Peers {
		out[i] = p.RPCAddr
	}
	return out
}

// Stop closes node i (a no-op if it is stopped).
func (m *Meta) Stop(i int) {
	if m.Nodes[i] != nil {
		_ = m.Nodes[i].Close()
		m.Nodes[i] = nil
	}
}

// StopAll closes every running node.
func (m *Meta) StopAll() {
	for i := range m.Nodes {
		m.Stop(i)
	}
}

// Restart opens node i again from its data directory, on its old ports.
func (m *Meta) Restart(i int) *metaserver.Server {
	m.tb.Helper()
	cfg := m.Cfgs[i]
	cfg.Peers = m.Peers
	s, err := metaserver.Open(cfg)
	if err != nil {
		m.tb.Fatal(err)
	}
	m.Nodes[i] = s
	return s
}

// Leader waits for a running node whose leader work is ready.
func (m *Meta) Leader() (int, *metaserver.Server) {
	m.tb.Helper()
	idx := -1
	testwait.For(m.tb, 10*time.Second, "a metaserver leader", func() bool {
		for i, s := range m.Nodes {
			if s != nil && s.IsLeader() {
				idx = i
				return true
			}
		}
		return false
	})
	return idx, m.Nodes[idx]
}

// Client is a metaserver client of every node, closed by Cleanup.
func (m *Meta) Client(tb testing.TB) *client.Client {
	tb.Helper()
	cl, err := client.New(client.Config{Addrs: m.Addrs(), CallTimeout: 10 * time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cl.Close() })
	return cl
}

// CreateTopic creates a topic whose queue i lives on groups[i].
func (m *Meta) CreateTopic(tb testing.TB, name string, groups ...string) routing.Route {
	tb.Helper()
	r, err := m.Client(tb).CreateTopic(context.Background(), api.CreateTopicRequest{Name: name, Queues: len(groups), Groups: groups})
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// SteadyMeta and SteadyBroker keep the failure detector out of tests that
// are not about it (the SDKs' tests): the 1 s sessions, slave lag times and
// HIGH waits of MetaConfig and BrokerConfig can turn a group read-only, or
// refuse HIGH messages, when a run under -race on a busy machine stalls for
// a second. They set the brokers' defaults for HighWait and SlaveLagTime
// (the metaserver's LagTime is the masters' lag time for the sync set).
func SteadyMeta(c *metaserver.Config) {
	c.SessionTimeout = 2 * time.Second
	c.LagTime = time.Minute
}

// SteadyBroker: see SteadyMeta.
func SteadyBroker(c *broker.Config) {
	c.SessionTimeout = 2 * time.Second
	c.HighWait = 3 * time.Second
	c.SlaveLagTime = 5 * time.Second
}

// BrokerConfig is a broker's config with test timings: 100 ms heartbeats,
// a 1 s session and HIGH wait, 1 MiB segments.
func BrokerConfig(metaAddrs []string, group string, role routing.Role, dir string) broker.Config {
	id := group + "-" + string(role)
	return broker.Config{
		ID: id, Group: group, Role: role, Dir: dir, Addr: "127.0.0.1:0", MetaAddrs: metaAddrs,
		HeartbeatInterval: 100 * time.Millisecond, SessionTimeout: time.Second, HighWait: time.Second,
		SlaveLagTime: time.Second, HAFetchWait: 50 * time.Millisecond, SegmentSize: 1 << 20,
		Logger: testlog.New(id),
	}
}

// StartBroker starts a broker, closed by Cleanup.
func StartBroker(tb testing.TB, cfg broker.Config) *broker.Broker {
	tb.Helper()
	b, err := broker.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = b.Close() })
	return b
}

// Group is a broker group started by StartGroup.
type Group struct {
	Name                string
	Master, Slave       *broker.Broker
	MasterDir, SlaveDir string
	meta                []string
	edit                func(*broker.Config)
}

// GroupOpts shapes a group.
type GroupOpts struct {
	// Slave starts a slave and waits until the master sees it.
	Slave bool
	// Edit, if not nil, adjusts the master's and the slave's configs.
	Edit func(*broker.Config)
}

// StartGroup starts a group's master (and slave) and waits until the group
// is writable (and the slave in the sync set: HIGH is taken).
func StartGroup(tb testing.TB, metaAddrs []string, name string, o GroupOpts) *Group {
	tb.Helper()
	g := &Group{Name: name, MasterDir: tb.TempDir(), SlaveDir: tb.TempDir(), meta: metaAddrs, edit: o.Edit}
	g.Master = StartBroker(tb, g.Config(routing.RoleMaster))
	// Roles are the registry's: the first broker of a group to register
	// gets the master slot, so the slave starts only once the master holds it.
	testwait.For(tb, 10*time.Second, name+"'s master to take over", func() bool { return g.Master.Role().Kind == broker.RoleMaster })
	if o.Slave {
		g.StartSlave(tb)
		testwait.For(tb, 10*time.Second, name+"'s slave to join the sync set", g.Master.TakesHigh)
	}
	testwait.For(tb, 10*time.Second, name+" to be writable", g.Master.Writable)
	return g
}

// Config is the config StartGroup uses for the group's broker of role.
func (g *Group) Config(role routing.Role) broker.Config {
	dir := g.MasterDir
	if role == routing.RoleSlave {
		dir = g.SlaveDir
	}
	cfg := BrokerConfig(g.meta, g.Name, role, dir)
	if g.edit != nil {
		g.edit(&cfg)
	}
	return cfg
}

// StartSlave starts (or restarts) the group's slave on its directory.
func (g *Group) StartSlave(tb testing.TB) *broker.Broker {
	tb.Helper()
	g.Slave = StartBroker(tb, g.Config(routing.RoleSlave))
	return g.Slave
}

// Cluster is one metaserver node and broker groups.
type Cluster struct {
	Meta   *Meta
	Groups map[string]*Group
}

// Opts shapes a Cluster.
type Opts struct {
	// Groups names the broker groups to start.
	Groups []string
	// Slaves gives every group a slave.
	Slaves bool
	// MetaEdit and BrokerEdit, if not nil, adjust the configs.
	MetaEdit   func(*metaserver.Config)
	BrokerEdit func(*broker.Config)
}

// Start starts a one-node metaserver and the groups, and waits until every
// group is ready.
func Start(tb testing.TB, o Opts) *Cluster {
	tb.Helper()
	c := &Cluster{Meta: StartMeta(tb, 1, o.MetaEdit), Groups: map[string]*Group{}}
	for _, name := range o.Groups {
		c.Groups[name] = StartGroup(tb, c.Meta.Addrs(), name, GroupOpts{Slave: o.Slaves, Edit: o.BrokerEdit})
	}
	return c
}

// MetaAddr is the metaserver's RPC address.
func (c *Cluster) MetaAddr() string { return c.Meta.Addr() }

// Master is group's master.
func (c *Cluster) Master(group string) *broker.Broker { return c.Groups[group].Master }

// Dial is a transport client for addr, closed by Cleanup.
func Dial(tb testing.TB, addr string) *transport.Client {
	c := transport.NewClient(addr, transport.ClientConfig{})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Send sends one batch, naming no epoch, and returns its results, one per
// message.
func Send(tb testing.TB, c *transport.Client, msgs []protocol.Message) []protocol.SendResult {
	tb.Helper()
	return SendEpoch(tb, c, 0, msgs)
}

// SendEpoch sends one batch for a group at epoch and returns its results.
func SendEpoch(tb testing.TB, c *transport.Client, epoch uint32, msgs []protocol.Message) []protocol.SendResult {
	tb.Helper()
	resp, err := c.Call(context.Background(), protocol.CodeSend, protocol.AppendSendRequest(nil, epoch, msgs))
	if err != nil {
		tb.Fatal(err)
	}
	res, err := protocol.DecodeSendResponse(resp.Body, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if len(res) != len(msgs) {
		tb.Fatalf("%d results for %d messages", len(res), len(msgs))
	}
	return res
}

var msgSeq atomic.Int64

// Msg is a message with a fresh id.
func Msg(topic string, queue uint32, rel protocol.Reliability, body string) protocol.Message {
	return protocol.Message{ID: fmt.Sprintf("id-%d", msgSeq.Add(1)), Topic: topic, Queue: queue, Reliability: rel,
		Timestamp: time.Now().UnixMilli(), Body: []byte(body)}
}

// Pull reads up to maxBytes of a queue from offset.
func Pull(tb testing.TB, c *transport.Client, topic string, queue uint32, offset int64, maxBytes uint32) protocol.PullResponse {
	tb.Helper()
	resp, err := c.Call(context.Background(), protocol.CodePull, protocol.AppendPullRequest(nil,
		&protocol.PullRequest{Topic: topic, Queue: queue, Offset: offset, MaxBytes: maxBytes}))
	if err != nil {
		tb.Fatal(err)
	}
	pr, err := protocol.DecodePullResponse(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return pr
}

// PullAll reads a queue whole.
func PullAll(tb testing.TB, c *transport.Client, topic string, queue uint32) []protocol.StoredMessage {
	tb.Helper()
	var out []protocol.StoredMessage
	for offset := int64(0); ; {
		pr := Pull(tb, c, topic, queue, offset, 64<<10)
		if len(pr.Messages) == 0 {
			return out
		}
		out = append(out, pr.Messages...)
		offset = pr.NextOffset
	}
}

// LogBytes is a commit log's whole byte stream.
func LogBytes(tb testing.TB, l *storage.Log) []byte {
	tb.Helper()
	var out []byte
	for off := l.StartOffset(); off < l.EndOffset(); {
		raw, err := l.ReadRaw(off, 1<<20)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, raw...)
		off += int64(len(raw))
	}
	return out
}
