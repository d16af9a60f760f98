package e2e

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/testlog"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/tlsconf"
)

// TestRaftForgedLeaderRefused replays, against the local cluster's real
// processes, the attack of a host that holds what a broker or ferryctl
// holds: the cluster token (every broker's -auth-cluster-token-file) and a
// certificate of the cluster's CA (a broker's, or ferryctl's client
// certificate). It dials each metaserver's raft port, runs the handshake
// those credentials allow (TLS with the certificate; the cluster-key
// challenge keyed from the cluster token, as the metaservers once keyed
// it), and sends raft's own AppendEntries (hashicorp/raft's
// NetworkTransport) from a made-up leader one term ahead, carrying a
// SetPrincipal that makes "rogue" an admin and commits it at once.
//
// Raft's port opens only to the metaservers' own credential
// (-raft-secret-file): every such connection is refused before raft reads
// a byte, no metaserver's term moves, and rogue's token authenticates on
// no metaserver and no broker. In a token cluster, a TLS and token
// cluster, and a TLS-only cluster alike.
func TestRaftForgedLeaderRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	cases := []struct {
		name  string
		env   []string
		creds []forgeCred // the certificate's name under $FERRY_HOME/tls ("": no TLS); whether the cluster token is used
	}{
		{"token cluster", []string{"FERRY_AUTH=1"}, []forgeCred{{token: true}}},
		{"TLS and token cluster", []string{"FERRY_AUTH=1", "FERRY_TLS=1"}, []forgeCred{{cert: "g1-master", token: true}, {cert: "ctl", token: true}}},
		{"TLS-only cluster", []string{"FERRY_TLS=1"}, []forgeCred{{cert: "g1-master"}, {cert: "ctl"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := startLocalCluster(t, tc.env...)
			for _, cred := range tc.creds {
				t.Run(cred.String(), func(t *testing.T) { forgeLeader(t, c, cred) })
			}
		})
	}
}

// forgeCred is what the attacker holds: a certificate of the cluster's CA
// (by its name under $FERRY_HOME/tls) and the cluster token.
type forgeCred struct {
	cert  string
	token bool
}

func (f forgeCred) String() string {
	var s []string
	if f.token {
		s = append(s, "a broker's token")
	}
	switch f.cert {
	case "ctl":
		s = append(s, "ferryctl's certificate")
	case "":
	default:
		s = append(s, "a broker's certificate")
	}
	return strings.Join(s, " and ")
}

func forgeLeader(t *testing.T, c *localCluster, cred forgeCred) {
	stream := &forgeStream{}
	var err error
	if cred.cert != "" {
		dir := filepath.Join(c.home, "tls")
		if stream.tls, err = tlsconf.ClientConfig(filepath.Join(dir, "ca.pem"), filepath.Join(dir, cred.cert+".pem"), filepath.Join(dir, cred.cert+"-key.pem")); err != nil {
			t.Fatal(err)
		}
	}
	if cred.token {
		b, err := os.ReadFile(filepath.Join(c.home, "auth", "cluster.token"))
		if err != nil {
			t.Fatal(err)
		}
		stream.token = strings.TrimSpace(string(b))
	}
	if stream.Listener, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	tr := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: stream, MaxPool: 1, Timeout: 10 * time.Second, Logger: testlog.New("forger")})
	defer tr.Close()

	rogueToken := auth.NewToken()
	entry, err := fsm.Encode(&fsm.SetPrincipal{Name: "rogue", TokenHash: auth.HashToken(rogueToken), Permissions: []string{"admin"}})
	if err != nil {
		t.Fatal(err)
	}
	header := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("m9"), Addr: []byte(stream.Addr().String())}
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("m%d", i)
		target := raft.ServerAddress(fmt.Sprintf("127.0.0.1:%d", c.base+10+i))
		// An append of an older term changes nothing and is answered with
		// the node's term and last index: what the forger needs.
		var probe raft.AppendEntriesResponse
		dialed := stream.connected.Load()
		if err := tr.AppendEntries(raft.ServerID(id), target, &raft.AppendEntriesRequest{RPCHeader: header}, &probe); err != nil {
			if stream.connected.Load() == dialed {
				t.Fatalf("%s's raft port %s took no connection: %v", id, target, err)
			}
			t.Logf("%s refused the connection: %v", id, err)
			continue
		}
		t.Errorf("%s answered raft over a connection opened with %s (term %d, last index %d)", id, cred, probe.Term, probe.LastLog)
		next := probe.LastLog + 1
		forged := &raft.AppendEntriesRequest{
			RPCHeader: header, Term: probe.Term + 1, LeaderCommitIndex: next,
			Entries: []*raft.Log{{Index: next, Term: probe.Term + 1, Type: raft.LogCommand, Data: entry}},
		}
		var resp raft.AppendEntriesResponse
		if err := tr.AppendEntries(raft.ServerID(id), target, forged, &resp); err == nil && resp.Success {
			t.Errorf("%s accepted an AppendEntries from the made-up leader m9 at term %d carrying SetPrincipal{rogue, admin}", id, forged.Term)
		}
	}

	if !cred.token {
		return // a TLS-only cluster checks no token: rogue's entry would lie in wait for authorization
	}
	for _, addr := range c.authAddrs() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		tc := transport.NewClient(addr, transport.ClientConfig{TLS: c.tls})
		_, err := tc.Call(ctx, protocol.CodeAuth, []byte(rogueToken))
		tc.Close()
		cancel()
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Status != protocol.StatusNotAuthorized {
			t.Errorf("rogue's token at %s: %v, want NOT_AUTHORIZED", addr, err)
		}
	}
}

// authAddrs are the metaservers' RPC addresses and the brokers' data
// addresses: every port that takes AUTH.
func (c *localCluster) authAddrs() []string {
	addrs := strings.Split(c.meta, ",")
	for j := 1; j <= c.groupN*(c.slaveN+1); j++ {
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", brokerPortOf(c.base, j, portData)))
	}
	return addrs
}

// forgeStream is raft's stream layer for the forger: it dials with TLS
// when it has a certificate and then, with the cluster token, answers the
// cluster-key challenge keyed from that token (HMAC-SHA256 of "ferrymq raft
// key v1" keyed with it). Its listener is never dialed.
type forgeStream struct {
	net.Listener
	tls       *tls.Config
	token     string
	connected atomic.Int64 // TCP connections made (the port was there)
}

func (s *forgeStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", string(addr), timeout)
	if err != nil {
		return nil, err
	}
	s.connected.Add(1)
	_ = c.SetDeadline(time.Now().Add(timeout))
	if s.tls != nil {
		cfg := s.tls.Clone()
		cfg.ServerName, _, _ = net.SplitHostPort(string(addr))
		tc := tls.Client(c, cfg)
		if err := tc.Handshake(); err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("tls: %w", err)
		}
		c = tc
	}
	if s.token != "" {
		if err := clusterKeyAnswer(c, s.token); err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("cluster-key handshake: %w", err)
		}
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// clusterKeyAnswer is the dialer's side of the metaservers' raft
// challenge, keyed from the cluster token: read the listener's hello
// (magic, version, its nonce, its ID), answer with a nonce and the MAC,
// read the listener's confirmation.
func clusterKeyAnswer(c net.Conn, token string) error {
	const magic = "\xc1fmqraft"
	km := hmac.New(sha256.New, []byte(token))
	km.Write([]byte("ferrymq raft key v1"))
	key := km.Sum(nil)

	hello := make([]byte, len(magic)+1+32+1)
	if _, err := io.ReadFull(c, hello); err != nil {
		return fmt.Errorf("reading the hello: %w", err)
	}
	if !bytes.HasPrefix(hello, []byte(magic)) {
		return errors.New("no hello")
	}
	nonceL := hello[len(magic)+1 : len(magic)+33]
	id := make([]byte, hello[len(hello)-1])
	if _, err := io.ReadFull(c, id); err != nil {
		return fmt.Errorf("reading the hello's ID: %w", err)
	}
	nonceD := make([]byte, 32)
	_, _ = rand.Read(nonceD)
	m := hmac.New(sha256.New, key)
	m.Write([]byte("ferrymq-raft\x00dialer\x00"))
	m.Write(nonceL)
	m.Write(nonceD)
	m.Write(id)
	answer := append(append(append([]byte(magic), hello[len(magic)]), nonceD...), m.Sum(nil)...)
	if _, err := c.Write(answer); err != nil {
		return fmt.Errorf("sending the answer: %w", err)
	}
	confirm := make([]byte, sha256.Size)
	if _, err := io.ReadFull(c, confirm); err != nil {
		return fmt.Errorf("the node refused the answer: %w", err)
	}
	return nil
}
