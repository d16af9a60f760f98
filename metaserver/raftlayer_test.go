package metaserver

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/testlog"
	"github.com/ferrymq/ferrymq/internal/testtls"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/tlsconf"
)

// tlsPair is a node's server and client TLS configs.
type tlsPair struct{ server, client *tls.Config }

func nodeTLS(t *testing.T, ca *tlsconf.CA, name, dir string) tlsPair {
	t.Helper()
	f := testtls.Cert(t, ca, name, dir)
	return tlsPair{testtls.ServerConfig(t, f), testtls.ClientConfig(t, f)}
}

// testRaftSecret is the raft secret of the tests' nodes over TLS.
var testRaftSecret = auth.NewToken()

func tlsNodeConfig(t *testing.T, id string, p tlsPair) Config {
	return Config{
		ID: id, Dir: filepath.Join(t.TempDir(), id), RaftAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0",
		RaftHeartbeatTimeout: 150 * time.Millisecond, RaftElectionTimeout: 150 * time.Millisecond,
		RaftLeaderLeaseTimeout: 150 * time.Millisecond,
		Logger:                 testlog.New(id), TLSServer: p.server, TLSClient: p.client, RaftSecret: testRaftSecret,
	}
}

// A 3-node cluster over TLS elects a leader and replicates what it applies
// (the leader records every member's RPC address through raft), and its
// RPC port serves clients over TLS.
func TestRaftOverTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testtls.CA(t, dir)
	var cfgs []Config
	for _, id := range []string{"m1", "m2", "m3"} {
		cfgs = append(cfgs, tlsNodeConfig(t, id, nodeTLS(t, ca, id, dir)))
	}
	nodes := startNodes(t, cfgs...)
	testwait.For(t, 20*time.Second, "a leader", func() bool { return leaderOf(nodes...) != nil })
	testwait.For(t, 20*time.Second, "every node to apply the members' addresses", func() bool {
		for _, s := range nodes {
			if len(s.FSM().Members()) != 3 {
				return false
			}
		}
		return true
	})

	cli := nodeTLS(t, ca, "admin", dir).client
	cl, err := client.New(client.Config{Addrs: []string{nodes[0].RPCAddr()}, Transport: transport.ClientConfig{TLS: cli}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Topics(context.Background()); err != nil {
		t.Fatalf("a TLS client of the RPC port: %v", err)
	}
}

// dialer is a raft transport that only dials, with the given TLS client
// config (nil: plaintext).
func dialer(t *testing.T, cfg *tls.Config) *raft.NetworkTransport {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sl := &streamLayer{ln: ln, conns: map[*trackedConn]struct{}{}}
	if cfg != nil {
		sl.dial = tlsDialer(cfg)
	}
	tr := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: sl, MaxPool: 1, Timeout: 5 * time.Second, Logger: testlog.New("dialer")})
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// A raft peer whose certificate comes from another CA, or that has none,
// or that speaks plaintext, or that has a certificate of the cluster's CA
// but not the raft secret, gets nothing from a node's raft port: its vote
// requests and appends fail, and the node counts the failed handshakes. A
// peer with a certificate of the cluster's CA and the secret is answered.
func TestRaftOverTLSRefusesStrangers(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	ca := testtls.CA(t, dir)
	ca2 := testtls.CA(t, other)
	s, err := New(tlsNodeConfig(t, "m1", nodeTLS(t, ca, "m1", dir)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Start([]Peer{{ID: "m1", RaftAddr: s.RaftAddr(), RPCAddr: s.RPCAddr()}}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 20*time.Second, "m1 to lead", s.IsLeader)
	target := raft.ServerAddress(s.RaftAddr())
	tl := s.stream.ln.(*handshakeListener)

	// The stranger trusts the cluster's CA (it could verify the node) but
	// its own certificate is from another CA.
	stranger := nodeTLS(t, ca2, "m9", other).client
	stranger.RootCAs = s.cfg.TLSClient.RootCAs
	noCert := nodeTLS(t, ca, "nocert", dir).client
	noCert.Certificates, noCert.GetClientCertificate = nil, nil
	good := nodeTLS(t, ca, "m2", dir).client

	vote := func(tr *raft.NetworkTransport) error {
		var resp raft.RequestVoteResponse
		return tr.RequestVote("m1", target, &raft.RequestVoteRequest{
			RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("m9"), Addr: []byte("127.0.0.1:1")}, Term: 1 << 40, LastLogIndex: 1 << 40, LastLogTerm: 1 << 40,
		}, &resp)
	}
	appendTo := func(tr *raft.NetworkTransport) error {
		var resp raft.AppendEntriesResponse
		return tr.AppendEntries("m1", target, &raft.AppendEntriesRequest{
			RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("m9"), Addr: []byte("127.0.0.1:1")}, Term: 1 << 40,
		}, &resp)
	}
	for _, c := range []struct {
		name string
		cfg  *tls.Config
	}{{"another CA", stranger}, {"no certificate", noCert}, {"plaintext", nil}, {"the cluster's CA without the raft secret", good}} {
		before := tl.failed.Load()
		tr := dialer(t, c.cfg)
		if err := vote(tr); err == nil {
			t.Fatalf("%s: a vote request was answered", c.name)
		}
		if err := appendTo(tr); err == nil {
			t.Fatalf("%s: an append was answered", c.name)
		}
		testwait.For(t, 10*time.Second, c.name+": the node to count the failed handshakes", func() bool { return tl.failed.Load() >= before+2 })
	}
	if !s.IsLeader() {
		t.Fatal("m1 lost its leadership to a stranger's vote request")
	}
	// The control: a peer of the cluster's CA with the secret is answered
	// (m1 refuses its vote, being the leader, but it answers).
	if err := vote(dialerWith(t, secretDialer(tlsDialer(good), raftKeys{raftSecretKey(testRaftSecret)}))); err != nil {
		t.Fatalf("a peer with a certificate of the cluster's CA and the raft secret: %v", err)
	}
}

// TLS settings that cannot work are refused by Validate, each by name.
func TestTLSConfigValidate(t *testing.T) {
	ca := testtls.CA(t, t.TempDir())
	p := nodeTLS(t, ca, "m1", t.TempDir())
	noCA := p.server.Clone()
	noCA.ClientCAs = nil
	for _, c := range []struct {
		name     string
		srv, cli *tls.Config
		want     string
	}{
		{"server only", p.server, nil, "go together"},
		{"no client CA", noCA, p.client, "ClientCAs"},
		{"client without a certificate", p.server, &tls.Config{RootCAs: p.client.RootCAs}, "TLSClient needs"},
	} {
		cfg := tlsNodeConfig(t, "m1", tlsPair{c.srv, c.cli})
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate said %v, want an error with %q", c.name, err, c.want)
		}
	}
	if err := tlsNodeConfig(t, "m1", p).Validate(); err != nil {
		t.Fatalf("a sound TLS config: %v", err)
	}
}
