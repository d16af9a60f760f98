package metaserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/testlog"
	"github.com/ferrymq/ferrymq/internal/testtls"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
)

// testClusterToken is the cluster token of the tests' nodes with a raft
// secret: the brokers' token, which opens nothing on raft's port.
var testClusterToken = auth.NewToken()

// keyNodeConfig is a node with authorization on (testClusterToken) and the
// raft secret secret.
func keyNodeConfig(t *testing.T, id, secret string) Config {
	return Config{
		ID: id, Dir: filepath.Join(t.TempDir(), id), RaftAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0",
		RaftHeartbeatTimeout: 150 * time.Millisecond, RaftElectionTimeout: 150 * time.Millisecond,
		RaftLeaderLeaseTimeout: 150 * time.Millisecond,
		Logger:                 testlog.New(id), ClusterToken: testClusterToken, RaftSecret: secret,
	}
}

// startNodes starts one node per config, all bootstrapped with one peer
// list, closed by Cleanup.
func startNodes(t *testing.T, cfgs ...Config) []*Server {
	t.Helper()
	var nodes []*Server
	var peers []Peer
	for _, cfg := range cfgs {
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		nodes = append(nodes, s)
		peers = append(peers, Peer{ID: cfg.ID, RaftAddr: s.RaftAddr(), RPCAddr: s.RPCAddr()})
	}
	for _, s := range nodes {
		if err := s.Start(peers); err != nil {
			t.Fatal(err)
		}
	}
	return nodes
}

func raftListener(t *testing.T, s *Server) *handshakeListener {
	t.Helper()
	hl, ok := s.stream.ln.(*handshakeListener)
	if !ok {
		t.Fatalf("%s's raft port has no handshake: %T", s.cfg.ID, s.stream.ln)
	}
	return hl
}

func leaderOf(nodes ...*Server) *Server {
	for _, s := range nodes {
		if s.IsLeader() {
			return s
		}
	}
	return nil
}

// A 3-node cluster with a raft secret elects a leader and replicates what
// it applies over raft connections that passed the raft-secret handshake;
// no handshake between its members fails.
func TestRaftSecret(t *testing.T) {
	secret := auth.NewToken()
	nodes := startNodes(t, keyNodeConfig(t, "m1", secret), keyNodeConfig(t, "m2", secret), keyNodeConfig(t, "m3", secret))
	testwait.For(t, 20*time.Second, "a leader", func() bool { return leaderOf(nodes...) != nil })
	testwait.For(t, 20*time.Second, "every node to apply the members' addresses", func() bool {
		for _, s := range nodes {
			if len(s.FSM().Members()) != 3 {
				return false
			}
		}
		return true
	})
	for _, s := range nodes {
		if n := raftListener(t, s).failed.Load(); n != 0 {
			t.Errorf("%s: %d raft handshakes between members failed", s.cfg.ID, n)
		}
	}
}

// A node whose raft secret differs, though it is in the bootstrap list and
// holds the same cluster token, cannot join: the two nodes that share the
// secret elect a leader and keep it, the odd node never learns a leader
// nor applies anything, and both sides count the other's failed
// handshakes.
func TestRaftSecretWrongSecretCannotJoin(t *testing.T) {
	secret, other := auth.NewToken(), auth.NewToken()
	nodes := startNodes(t, keyNodeConfig(t, "m1", secret), keyNodeConfig(t, "m2", secret), keyNodeConfig(t, "m3", other))
	good, odd := nodes[:2], nodes[2]
	testwait.For(t, 20*time.Second, "m1 or m2 to lead", func() bool { return leaderOf(good...) != nil })
	testwait.For(t, 20*time.Second, "m1 and m2 to apply the members' addresses", func() bool {
		return len(good[0].FSM().Members()) == 3 && len(good[1].FSM().Members()) == 3
	})
	leader := leaderOf(good...)
	if leader == nil {
		t.Fatal("m1 and m2 lost their leader")
	}
	term := leader.raftStatus().Term

	// The odd node campaigns (its pre-votes and votes dial m1 and m2), the
	// leader sends it appends (dialing m3): every one of those handshakes
	// fails.
	base := map[*Server]int64{}
	for _, s := range nodes {
		base[s] = raftListener(t, s).failed.Load()
	}
	testwait.For(t, 30*time.Second, "m1, m2 and m3 each to refuse several handshakes", func() bool {
		for _, s := range nodes {
			if raftListener(t, s).failed.Load() < base[s]+3 {
				return false
			}
		}
		return true
	})
	if now := leaderOf(good...); now != leader {
		t.Fatalf("the leader changed from %s to %v while m3 campaigned", leader.cfg.ID, now)
	}
	if st := leader.raftStatus(); st.Term != term {
		t.Fatalf("the leader's term moved from %d to %d while m3 campaigned", term, st.Term)
	}
	if st := odd.raftStatus(); st.LeaderID != "" || st.State == raft.Leader.String() {
		t.Fatalf("m3, with another secret, %s, leader %q", st.State, st.LeaderID)
	}
	if m := odd.FSM().Members(); len(m) != 0 {
		t.Fatalf("m3, with another secret, applied the members %v", m)
	}
}

// dialerWith is a raft transport that only dials, with dial.
func dialerWith(t *testing.T, dial dialFunc) *raft.NetworkTransport {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sl := &streamLayer{ln: ln, conns: map[*trackedConn]struct{}{}, dial: dial}
	tr := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: sl, MaxPool: 1, Timeout: 5 * time.Second, Logger: testlog.New("dialer")})
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// voteFrame is what raft's transport sends for a vote request: captured
// from the transport itself, through a pipe.
func voteFrame(t *testing.T) []byte {
	t.Helper()
	frame := make(chan []byte, 1)
	tr := dialerWith(t, func(string, time.Duration) (net.Conn, error) {
		a, b := net.Pipe()
		go func() {
			buf := make([]byte, 64<<10)
			n, _ := b.Read(buf)
			frame <- buf[:n]
			_ = b.Close()
		}()
		return a, nil
	})
	var resp raft.RequestVoteResponse
	_ = tr.RequestVote("m1", "pipe", strangerVote(), &resp)
	return <-frame
}

func strangerVote() *raft.RequestVoteRequest {
	return &raft.RequestVoteRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("m9"), Addr: []byte("127.0.0.1:1")},
		Term:      1 << 40, LastLogIndex: 1 << 40, LastLogTerm: 1 << 40,
	}
}

// A stranger on the raft port of a node with a raft secret gets nothing
// but the challenge: raft's own vote requests and appends from a peer
// without the secret fail, whatever it holds of what brokers and clients
// hold (the cluster token, as the key it once gave raft or as a secret;
// the secret's hash), and a raw connection that sends a vote request
// reads the challenge and then the end of the connection; the node counts
// them and keeps its leadership. A peer holding the secret (the control)
// is answered.
func TestRaftSecretRefusesStrangers(t *testing.T) {
	secret := auth.NewToken()
	s := startNodes(t, keyNodeConfig(t, "m1", secret))[0]
	testwait.For(t, 20*time.Second, "m1 to lead", s.IsLeader)
	hl := raftListener(t, s)
	target := raft.ServerAddress(s.RaftAddr())

	vote := func(tr *raft.NetworkTransport) error {
		var resp raft.RequestVoteResponse
		return tr.RequestVote("m1", target, strangerVote(), &resp)
	}
	before := hl.failed.Load()
	plain := dialer(t, nil)
	if err := vote(plain); err == nil {
		t.Fatal("a plaintext vote request was answered")
	}
	var resp raft.AppendEntriesResponse
	if err := plain.AppendEntries("m1", target, &raft.AppendEntriesRequest{RPCHeader: strangerVote().RPCHeader, Term: 1 << 40}, &resp); err == nil {
		t.Fatal("a plaintext append was answered")
	}
	hash := auth.HashToken(secret)
	for _, k := range []struct {
		name string
		key  []byte
	}{
		{"another secret", raftSecretKey(auth.NewToken())},
		// What a broker holds: the cluster token, as the key it gave raft
		// before the raft secret, or taken for the secret.
		{"the cluster token's key", clusterTokenKey(testClusterToken)},
		{"the cluster token as the secret", raftSecretKey(testClusterToken)},
		{"the secret's hash", hash[:]},
	} {
		tr := dialerWith(t, secretDialer(plainDial, raftKeys{k.key}))
		if err := vote(tr); err == nil || !strings.Contains(err.Error(), "refused this node's raft key") {
			t.Fatalf("a vote request keyed with %s: %v, want an error saying the key was refused", k.name, err)
		}
		if err := tr.AppendEntries("m1", target, &raft.AppendEntriesRequest{RPCHeader: strangerVote().RPCHeader, Term: 1 << 40}, &resp); err == nil {
			t.Fatalf("an append keyed with %s was answered", k.name)
		}
	}
	testwait.For(t, 10*time.Second, "m1 to count the failed handshakes", func() bool { return hl.failed.Load() >= before+10 })

	frame := voteFrame(t)
	c, err := net.Dial("tcp", s.RaftAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second)) // the test's bound, not the node's
	got, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the node kept a stranger's connection open (read %d bytes)", len(got))
	}
	if want := raftHelloFixed + len("m1"); len(got) != want || !bytes.HasPrefix(got, []byte(raftSecretMagic)) {
		t.Fatalf("a stranger's vote request read %d bytes (%q), want only the %d-byte challenge", len(got), got, want)
	}
	if !s.IsLeader() {
		t.Fatal("m1 lost its leadership to a stranger")
	}

	// The control: with the secret, m1 answers (it refuses the vote, being
	// the leader, but it answers).
	member := dialerWith(t, secretDialer(plainDial, raftKeys{raftSecretKey(secret)}))
	if err := vote(member); err != nil {
		t.Fatalf("a peer holding the raft secret: %v", err)
	}
}

// With TLS, a certificate of the cluster's CA is not enough: a broker's or
// a client's certificate, with or without the cluster token's key, gets
// nothing, since the raft-secret handshake runs inside TLS. A peer with a
// certificate and the secret is answered.
func TestRaftOverTLSWithRaftSecret(t *testing.T) {
	dir := t.TempDir()
	ca := testtls.CA(t, dir)
	cfg := tlsNodeConfig(t, "m1", nodeTLS(t, ca, "m1", dir))
	cfg.ClusterToken = testClusterToken
	s := startNodes(t, cfg)[0]
	testwait.For(t, 20*time.Second, "m1 to lead", s.IsLeader)
	hl := raftListener(t, s)
	target := raft.ServerAddress(s.RaftAddr())
	vote := func(tr *raft.NetworkTransport) error {
		var resp raft.RequestVoteResponse
		return tr.RequestVote("m1", target, strangerVote(), &resp)
	}
	broker := nodeTLS(t, ca, "g1-master", dir).client
	client := nodeTLS(t, ca, "ctl", dir).client
	for _, c := range []struct {
		name string
		tr   *raft.NetworkTransport
	}{
		{"a broker's certificate", dialer(t, broker)},
		{"a client's certificate", dialer(t, client)},
		{"a broker's certificate and the cluster token's key", dialerWith(t, secretDialer(tlsDialer(broker), raftKeys{clusterTokenKey(testClusterToken)}))},
		{"a client's certificate and the cluster token's key", dialerWith(t, secretDialer(tlsDialer(client), raftKeys{clusterTokenKey(testClusterToken)}))},
	} {
		before := hl.failed.Load()
		if err := vote(c.tr); err == nil {
			t.Fatalf("a vote request over TLS with %s was answered", c.name)
		}
		testwait.For(t, 10*time.Second, c.name+": m1 to count the failed handshake", func() bool { return hl.failed.Load() > before })
	}

	member := dialerWith(t, secretDialer(tlsDialer(nodeTLS(t, ca, "m2", dir).client), raftKeys{raftSecretKey(testRaftSecret)}))
	if err := vote(member); err != nil {
		t.Fatalf("a peer with a certificate and the raft secret: %v", err)
	}
}

// A flood of half-open connections (each sends a few bytes of a raft frame
// and waits) holds at most raftMaxHandshakes handshakes at once: each
// connection over the cap evicts the oldest, and each one held is closed at
// the handshake deadline; the node allocates little for them. (That the
// cluster keeps electing leaders through a flood:
// TestRaftElectsThroughHandshakeFlood.)
func TestRaftClusterKeyFlood(t *testing.T) {
	const flood = 500
	cfg := keyNodeConfig(t, "m1", auth.NewToken())
	// Long against the time it takes to dial 65 loopback connections, so
	// the cap is reached; short for the test.
	cfg.raftHandshakeTimeout = 2 * time.Second
	s := startNodes(t, cfg)[0]
	testwait.For(t, 20*time.Second, "m1 to lead", s.IsLeader)
	hl := raftListener(t, s)
	base := hl.failed.Load() + hl.evicted.Load()

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	var ended atomic.Int64 // connections the node closed
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range flood {
		c, err := net.Dial("tcp", s.RaftAddr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		_, _ = c.Write([]byte{0x01, 0x8f, 0xa4}) // a vote request's first bytes
		go func() {
			buf := make([]byte, 256)
			for {
				if _, err := c.Read(buf); err != nil {
					ended.Add(1)
					return
				}
			}
		}()
	}
	testwait.For(t, 60*time.Second, "the node to close every connection of the flood", func() bool {
		return ended.Load() == flood && hl.failed.Load()+hl.evicted.Load() == base+flood
	})
	var after runtime.MemStats
	runtime.ReadMemStats(&after)

	if peak := hl.peak.Load(); peak > raftMaxHandshakes {
		t.Errorf("%d handshakes ran at once, over the cap of %d", peak, raftMaxHandshakes)
	}
	if hl.evicted.Load() == 0 {
		t.Errorf("the cap of %d evicted none of %d connections dialed at once", raftMaxHandshakes, flood)
	}
	// The test's own connections and readers count too: the bound is
	// generous, far under what raft's decoder allocated for such input.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
		t.Errorf("the flood allocated %d MiB", alloc>>20)
	}
	t.Logf("flood of %d: %d evicted, %d held to the deadline, at most %d at once, %d KiB allocated",
		flood, hl.evicted.Load(), hl.failed.Load(), hl.peak.Load(), (after.TotalAlloc-before.TotalAlloc)>>10)
}

// A socket that sends nothing is closed once raftFirstBytesTimeout has
// passed, though the handshake's own deadline is far off: an idle stranger
// holds a slot for half a second, not for the whole handshake.
func TestRaftHandshakeFirstBytesDeadline(t *testing.T) {
	cfg := keyNodeConfig(t, "m1", auth.NewToken())
	cfg.raftHandshakeTimeout = 10 * time.Minute
	s := startNodes(t, cfg)[0]
	testwait.For(t, 20*time.Second, "m1 to lead", s.IsLeader)
	hl := raftListener(t, s)
	before := hl.failed.Load()
	c, err := net.Dial("tcp", s.RaftAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(time.Minute)) // the test's bound, not the node's
	got, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the node held a socket that sent nothing for a minute (read %d bytes)", len(got))
	}
	if want := raftHelloFixed + len("m1"); len(got) != want {
		t.Fatalf("an idle socket read %d bytes, want the %d-byte challenge", len(got), want)
	}
	testwait.For(t, 10*time.Second, "m1 to count the failed handshake", func() bool { return hl.failed.Load() > before })
}

// floodRaft keeps the raft handshake slots of every address full of idle
// sockets (connect, send nothing) until the test ends: idlers per address,
// each redialing at once when the node closed its socket after holding it
// (a deadline: the freed slot is taken again before a member's dial can
// come), and otherwise (refused, evicted, no listener) at most newPerSec
// times a second per address in all.
func floodRaft(t *testing.T, addrs []string, idlers, newPerSec int) {
	t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	open := map[net.Conn]struct{}{}
	t.Cleanup(func() {
		close(stop)
		mu.Lock()
		for c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	const held = 400 * time.Millisecond // a socket kept this long was held to a deadline
	for _, addr := range addrs {
		tokens := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(time.Second / time.Duration(newPerSec))
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				select {
				case tokens <- struct{}{}:
				case <-stop:
					return
				}
			}
		}()
		for range idlers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				again := false // redial at once
				for {
					if !again {
						select {
						case <-tokens:
						case <-stop:
							return
						}
					}
					start := time.Now()
					if c, err := net.Dial("tcp", addr); err == nil {
						mu.Lock()
						select {
						case <-stop:
							mu.Unlock()
							_ = c.Close()
							return
						default:
						}
						open[c] = struct{}{}
						mu.Unlock()
						_, _ = io.Copy(io.Discard, c) // until the node closes it
						mu.Lock()
						delete(open, c)
						mu.Unlock()
						_ = c.Close()
					}
					again = time.Since(start) >= held
				}
			}()
		}
	}
}

// A stranger with neither certificate nor key cannot keep a cluster
// leaderless by holding the raft port's handshake slots: with a flood of
// idle sockets keeping every node's slots full (sockets closed at a
// deadline are redialed at once, and hundreds more come each second), the
// leader stops and the two others, whose connections to each other are
// new dials (the test breaks those the first election left), elect a
// leader.
func TestRaftElectsThroughHandshakeFlood(t *testing.T) {
	t.Run("raft-secret", func(t *testing.T) {
		secret := auth.NewToken()
		electsThroughFlood(t, keyNodeConfig(t, "m1", secret), keyNodeConfig(t, "m2", secret), keyNodeConfig(t, "m3", secret))
	})
	t.Run("tls", func(t *testing.T) {
		dir := t.TempDir()
		ca := testtls.CA(t, dir)
		var cfgs []Config
		for _, id := range []string{"m1", "m2", "m3"} {
			cfgs = append(cfgs, tlsNodeConfig(t, id, nodeTLS(t, ca, id, dir)))
		}
		electsThroughFlood(t, cfgs...)
	})
}

func electsThroughFlood(t *testing.T, cfgs ...Config) {
	nodes := startNodes(t, cfgs...)
	testwait.For(t, 20*time.Second, "a leader", func() bool { return leaderOf(nodes...) != nil })
	var addrs []string
	for _, s := range nodes {
		addrs = append(addrs, s.RaftAddr())
	}
	floodRaft(t, addrs, raftMaxHandshakes+32, 1000)
	testwait.For(t, 20*time.Second, "the flood to fill every node's handshake slots", func() bool {
		for _, s := range nodes {
			if raftListener(t, s).peak.Load() < raftMaxHandshakes {
				return false
			}
		}
		return true
	})
	testwait.For(t, 20*time.Second, "a leader under the flood", func() bool { return leaderOf(nodes...) != nil })
	old := leaderOf(nodes...)
	if old == nil {
		t.Fatal("the leader lost its leadership as it was found")
	}
	var rest []*Server
	for _, s := range nodes {
		if s != old {
			rest = append(rest, s)
		}
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	// Without a connection pooled between them the two must dial each
	// other anew (as when they never spoke while m1 led, or one restarts):
	// break the ones the first election left.
	for _, s := range rest {
		s.stream.mu.Lock()
		var conns []net.Conn
		for c := range s.stream.conns {
			conns = append(conns, c.Conn)
		}
		s.stream.mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	}
	testwait.For(t, 30*time.Second, "the two other nodes to elect a leader during the flood", func() bool {
		return leaderOf(rest...) != nil
	})
	for _, s := range rest {
		hl := raftListener(t, s)
		t.Logf("%s: %d handshakes evicted, %d failed, at most %d at once", s.cfg.ID, hl.evicted.Load(), hl.failed.Load(), hl.peak.Load())
	}
}

// An ID too long for the handshake's one length byte is refused with a
// raft secret (and allowed without).
func TestRaftSecretIDLength(t *testing.T) {
	long := strings.Repeat("m", raftMaxIDLen+1)
	cfg := keyNodeConfig(t, long, auth.NewToken())
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "at most 255") {
		t.Fatalf("Validate with a %d-byte ID and a raft secret: %v", len(long), err)
	}
	cfg.ClusterToken, cfg.RaftSecret = "", ""
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate with a %d-byte ID and no secret: %v", len(long), err)
	}
}

// Raft's port needs the metaservers' own secret whenever authorization or
// TLS is on, in token clusters and TLS-only clusters alike, and the secret
// must be a secret of its own: a token's strength, neither the cluster's
// token (every broker holds it) nor the bootstrap admin's.
func TestRaftSecretValidate(t *testing.T) {
	p := nodeTLS(t, testtls.CA(t, t.TempDir()), "m1", t.TempDir())
	admin := auth.NewToken()
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string // "": valid
	}{
		{"dev mode needs none", func(*Config) {}, ""},
		{"a secret alone", func(c *Config) { c.RaftSecret = auth.NewToken() }, ""},
		{"a token cluster with a secret", func(c *Config) { c.ClusterToken, c.RaftSecret = testClusterToken, auth.NewToken() }, ""},
		{"a TLS-only cluster with a secret", func(c *Config) { c.TLSServer, c.TLSClient, c.RaftSecret = p.server, p.client, auth.NewToken() }, ""},
		{"a token cluster without a secret", func(c *Config) { c.ClusterToken = testClusterToken }, "RaftSecret (-raft-secret-file) is required with authorization or TLS on"},
		{"a TLS-only cluster without a secret", func(c *Config) { c.TLSServer, c.TLSClient = p.server, p.client }, "RaftSecret (-raft-secret-file) is required with authorization or TLS on"},
		{"a short secret", func(c *Config) { c.ClusterToken, c.RaftSecret = testClusterToken, "raft" }, "RaftSecret (-raft-secret-file): a token must be 32 to 512 characters"},
		{"the cluster token as the secret", func(c *Config) { c.ClusterToken, c.RaftSecret = testClusterToken, testClusterToken }, "is the cluster token, which every broker holds"},
		{"the admin's token as the secret", func(c *Config) {
			c.ClusterToken, c.Auth.Admin, c.RaftSecret = testClusterToken, auth.HashToken(admin), admin
		}, "is the bootstrap admin's token"},
		{"the move without a cluster token", func(c *Config) { c.RaftSecret, c.RaftAcceptClusterKey = auth.NewToken(), true }, "needs both RaftSecret and ClusterToken"},
		{"the move without a secret", func(c *Config) { c.ClusterToken, c.RaftAcceptClusterKey = testClusterToken, true }, "needs both RaftSecret and ClusterToken"},
		{"the move", func(c *Config) {
			c.ClusterToken, c.RaftSecret, c.RaftAcceptClusterKey = testClusterToken, auth.NewToken(), true
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{ID: "m1", Dir: "/tmp/m1", RaftAddr: "127.0.0.1:7201", RPCAddr: "127.0.0.1:7101"}
			tc.edit(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate said %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// The move of a running token cluster from the key the cluster token gave
// raft to the raft secret, as docs/security.md tells it: one node at a
// time, each restarts with the secret and RaftAcceptClusterKey, then each
// again with the secret alone. After every restart the restarted node
// follows the leader and applies what the leader commits, so the cluster
// keeps its quorum throughout; at the end the cluster token's key opens no
// node's raft port. Without RaftAcceptClusterKey, the first node restarted
// with the secret cannot rejoin the nodes still keyed by the cluster
// token: the move needs the flag.
func TestRaftSecretRollingMove(t *testing.T) {
	secret := auth.NewToken()
	var cfgs []Config
	for _, id := range []string{"m1", "m2", "m3"} {
		cfg := keyNodeConfig(t, id, secret)
		cfg.raftClusterKeyOnly = true // the nodes before the raft secret
		cfgs = append(cfgs, cfg)
	}
	nodes := startNodes(t, cfgs...)
	for i, s := range nodes {
		cfgs[i].RaftAddr, cfgs[i].RPCAddr = s.RaftAddr(), s.RPCAddr()
	}
	restart := func(i int, edit func(*Config)) {
		t.Helper()
		if err := nodes[i].Close(); err != nil {
			t.Fatal(err)
		}
		cfg := cfgs[i]
		edit(&cfg)
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		if err := s.Start(nil); err != nil { // it resumes from its raft state
			t.Fatal(err)
		}
		nodes[i], cfgs[i] = s, cfg
	}
	applied := 0
	whole := func(step string) {
		t.Helper()
		testwait.For(t, 30*time.Second, step+": a leader that commits an entry", func() bool {
			l := leaderOf(nodes...)
			if l == nil {
				return false
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := l.apply(ctx, &fsm.SetPrincipal{Name: fmt.Sprintf("p%d", applied), Permissions: []string{"describe"}})
			return err == nil
		})
		name := fmt.Sprintf("p%d", applied)
		applied++
		testwait.For(t, 30*time.Second, step+": every node to follow the leader and apply "+name, func() bool {
			for _, s := range nodes {
				has := slices.ContainsFunc(s.FSM().Principals(), func(p fsm.PrincipalRecord) bool { return p.Name == name })
				if !has || s.raftStatus().LeaderID == "" {
					return false
				}
			}
			return true
		})
	}
	whole("before the move")

	// Without the flag: m1 with the secret alone is refused by m2 and m3,
	// and refuses them.
	restart(0, func(c *Config) { c.raftClusterKeyOnly = false })
	hl := raftListener(t, nodes[0])
	testwait.For(t, 30*time.Second, "m1, with the secret alone, to refuse m2's and m3's dials", func() bool { return hl.failed.Load() >= 3 })
	if st := nodes[0].raftStatus(); st.LeaderID != "" {
		t.Fatalf("m1, with the secret alone among nodes keyed by the cluster token, follows %q", st.LeaderID)
	}

	for i := range nodes {
		restart(i, func(c *Config) { c.raftClusterKeyOnly, c.RaftAcceptClusterKey = false, true })
		whole(fmt.Sprintf("m%d with the secret and the cluster token's key", i+1))
	}
	for i := range nodes {
		restart(i, func(c *Config) { c.RaftAcceptClusterKey = false })
		whole(fmt.Sprintf("m%d with the secret alone", i+1))
	}
	for _, s := range nodes {
		var resp raft.RequestVoteResponse
		tr := dialerWith(t, secretDialer(plainDial, raftKeys{clusterTokenKey(testClusterToken)}))
		if err := tr.RequestVote(raft.ServerID(s.cfg.ID), raft.ServerAddress(s.RaftAddr()), strangerVote(), &resp); err == nil {
			t.Errorf("%s answered a peer keyed by the cluster token after the move", s.cfg.ID)
		}
	}
}
