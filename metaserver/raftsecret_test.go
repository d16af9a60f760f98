package metaserver

import (
	"bytes"
	"errors"
	"io"
	"net"
	"path/filepath"
	"runtime"
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
)

func keyNodeConfig(t *testing.T, id, token string) Config {
	return Config{
		ID: id, Dir: filepath.Join(t.TempDir(), id), RaftAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0",
		RaftHeartbeatTimeout: 150 * time.Millisecond, RaftElectionTimeout: 150 * time.Millisecond,
		RaftLeaderLeaseTimeout: 150 * time.Millisecond,
		Logger:                 testlog.New(id), ClusterToken: token,
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

// A 3-node cluster with a cluster token elects a leader and replicates what
// it applies over raft connections that passed the cluster-key handshake;
// no handshake between its members fails.
func TestRaftClusterKey(t *testing.T) {
	tok := auth.NewToken()
	nodes := startNodes(t, keyNodeConfig(t, "m1", tok), keyNodeConfig(t, "m2", tok), keyNodeConfig(t, "m3", tok))
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

// A node whose cluster token differs, though it is in the bootstrap list,
// cannot join: the two nodes that share the token elect a leader and keep
// it, the odd node never learns a leader nor applies anything, and both
// sides count the other's failed handshakes.
func TestRaftClusterKeyWrongKeyCannotJoin(t *testing.T) {
	tok, other := auth.NewToken(), auth.NewToken()
	nodes := startNodes(t, keyNodeConfig(t, "m1", tok), keyNodeConfig(t, "m2", tok), keyNodeConfig(t, "m3", other))
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
		t.Fatalf("m3, with another token, %s, leader %q", st.State, st.LeaderID)
	}
	if m := odd.FSM().Members(); len(m) != 0 {
		t.Fatalf("m3, with another token, applied the members %v", m)
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

// A stranger on the raft port of a node with a cluster token gets nothing
// but the challenge: raft's own vote requests and appends from a peer
// without the key fail, a raw connection that sends a vote request reads
// the challenge and then the end of the connection, and the node counts
// them and keeps its leadership. A peer holding the key (the control) is
// answered.
func TestRaftClusterKeyRefusesStrangers(t *testing.T) {
	tok := auth.NewToken()
	s := startNodes(t, keyNodeConfig(t, "m1", tok))[0]
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
	wrong := dialerWith(t, secretDialer(plainDial, raftKey(auth.NewToken())))
	if err := vote(wrong); err == nil || !strings.Contains(err.Error(), "refused this node's cluster key") {
		t.Fatalf("a vote request with another cluster's key: %v, want an error saying the key was refused", err)
	}
	// The token's hash, which brokers learn, is not the key.
	hash := auth.HashToken(tok)
	byHash := dialerWith(t, secretDialer(plainDial, hash[:]))
	if err := vote(byHash); err == nil {
		t.Fatal("a vote request keyed with the cluster token's hash was answered")
	}
	testwait.For(t, 10*time.Second, "m1 to count the failed handshakes", func() bool { return hl.failed.Load() >= before+4 })

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

	// The control: with the key, m1 answers (it refuses the vote, being
	// the leader, but it answers).
	member := dialerWith(t, secretDialer(plainDial, raftKey(tok)))
	if err := vote(member); err != nil {
		t.Fatalf("a peer holding the cluster key: %v", err)
	}
}

// With TLS and a cluster token both, a certificate of the cluster's CA is
// not enough: the cluster-key handshake runs inside TLS. A peer with both
// is answered.
func TestRaftOverTLSWithClusterKey(t *testing.T) {
	dir := t.TempDir()
	ca := testtls.CA(t, dir)
	tok := auth.NewToken()
	cfg := tlsNodeConfig(t, "m1", nodeTLS(t, ca, "m1", dir))
	cfg.ClusterToken = tok
	s := startNodes(t, cfg)[0]
	testwait.For(t, 20*time.Second, "m1 to lead", s.IsLeader)
	hl := raftListener(t, s)
	target := raft.ServerAddress(s.RaftAddr())
	vote := func(tr *raft.NetworkTransport) error {
		var resp raft.RequestVoteResponse
		return tr.RequestVote("m1", target, strangerVote(), &resp)
	}
	client := nodeTLS(t, ca, "producer", dir).client // a client's certificate, say
	before := hl.failed.Load()
	if err := vote(dialer(t, client)); err == nil {
		t.Fatal("a vote request over TLS without the cluster key was answered")
	}
	testwait.For(t, 10*time.Second, "m1 to count the failed handshake", func() bool { return hl.failed.Load() > before })

	member := dialerWith(t, secretDialer(tlsDialer(client), raftKey(tok)))
	if err := vote(member); err != nil {
		t.Fatalf("a peer with a certificate and the cluster key: %v", err)
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
	t.Run("cluster-key", func(t *testing.T) {
		tok := auth.NewToken()
		electsThroughFlood(t, keyNodeConfig(t, "m1", tok), keyNodeConfig(t, "m2", tok), keyNodeConfig(t, "m3", tok))
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
// cluster token (and allowed without).
func TestRaftClusterKeyIDLength(t *testing.T) {
	long := strings.Repeat("m", raftMaxIDLen+1)
	cfg := keyNodeConfig(t, long, auth.NewToken())
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "at most 255") {
		t.Fatalf("Validate with a %d-byte ID and a cluster token: %v", len(long), err)
	}
	cfg.ClusterToken = ""
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate with a %d-byte ID and no token: %v", len(long), err)
	}
}
