package metaserver_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// idSet collects producer ids and fails on a repeat.
type idSet struct {
	mu  sync.Mutex
	ids map[uint64]bool
}

func newIDSet() *idSet { return &idSet{ids: map[uint64]bool{}} }

func (s *idSet) add(t *testing.T, r api.InitProducerReply) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.ID == 0 {
		t.Errorf("producer id 0 handed out (%+v)", r)
	}
	if s.ids[r.ID] {
		t.Errorf("producer id %d handed out twice", r.ID)
	}
	s.ids[r.ID] = true
}

func (s *idSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

func initProducer(t *testing.T, cl *client.Client, name string) api.InitProducerReply {
	t.Helper()
	r, err := cl.InitProducer(context.Background(), name)
	if err != nil {
		t.Fatalf("InitProducer(%q): %v", name, err)
	}
	return r
}

// sameProducerState waits until every running node has applied the same
// producer counter as the leader.
func sameProducerState(t *testing.T, m *testcluster.Meta) {
	t.Helper()
	_, leader := m.Leader()
	testwait.For(t, 5*time.Second, "every node to apply the producer identities", func() bool {
		want := leader.FSM().NextProducerID()
		for _, s := range m.Nodes {
			if s != nil && s.FSM().NextProducerID() != want {
				return false
			}
		}
		return true
	})
}

// TestInitProducerConcurrent: concurrent inits through every node get
// distinct ids; concurrent instances of one name share its id at distinct
// epochs.
func TestInitProducerConcurrent(t *testing.T) {
	m := testcluster.StartMeta(t, 3, nil)
	var clients []*client.Client
	for _, addr := range m.Addrs() { // each client starts at another node: followers redirect
		cl, err := client.New(client.Config{Addrs: []string{addr}, CallTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		clients = append(clients, cl)
	}
	const workers, each, named = 8, 25, 4
	ids := newIDSet()
	var mu sync.Mutex
	epochs := map[uint16]bool{}
	namedIDs := map[uint64]bool{}
	var wg sync.WaitGroup
	for w := range workers {
		cl := clients[w%len(clients)]
		wg.Go(func() {
			for i := range each {
				if i < named {
					r, err := cl.InitProducer(context.Background(), "shared")
					if err != nil {
						t.Errorf("named init: %v", err)
						return
					}
					mu.Lock()
					if epochs[r.Epoch] {
						t.Errorf("epoch %d of %q handed out twice", r.Epoch, "shared")
					}
					epochs[r.Epoch] = true
					namedIDs[r.ID] = true
					mu.Unlock()
					continue
				}
				r, err := cl.InitProducer(context.Background(), "")
				if err != nil {
					t.Errorf("anonymous init: %v", err)
					return
				}
				if r.Epoch != 0 {
					t.Errorf("anonymous producer at epoch %d", r.Epoch)
				}
				ids.add(t, r)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if ids.len() != workers*(each-named) || len(epochs) != workers*named || len(namedIDs) != 1 {
		t.Fatalf("%d anonymous ids, %d epochs of the name, its ids %v", ids.len(), len(epochs), namedIDs)
	}
	for id := range namedIDs {
		if ids.ids[id] {
			t.Fatalf("the named producer's id %d was also given to an anonymous one", id)
		}
	}
	sameProducerState(t, m)
	for _, s := range m.Nodes {
		if p, ok := s.FSM().Producer("shared"); !ok || p.Epoch != workers*named-1 {
			t.Fatalf("node %s: %q is %+v (%v)", s.ID(), "shared", p, ok)
		}
	}
}

// TestInitProducerAcrossLeaderChange: producers keep starting while the
// leader is stopped; no id is handed out twice, and a named producer's
// epoch goes on from where the old leader left it.
func TestInitProducerAcrossLeaderChange(t *testing.T) {
	m := testcluster.StartMeta(t, 3, nil)
	cl := m.Client(t)
	ids := newIDSet()
	first := initProducer(t, cl, "worker")
	ids.add(t, first)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, err := cl.InitProducer(context.Background(), "")
				if err != nil {
					// An init whose outcome is unknown may have used an id;
					// that id is skipped, never repeated.
					t.Logf("init during the leader change: %v", err)
					continue
				}
				ids.add(t, r)
			}
		})
	}
	testwait.For(t, 10*time.Second, "inits before the change", func() bool { return ids.len() > 20 })
	old, _ := m.Leader()
	m.Stop(old)
	_, leader := m.Leader()
	after := ids.len()
	testwait.For(t, 10*time.Second, "inits served by the new leader", func() bool { return ids.len() > after+20 })
	close(stop)
	wg.Wait()

	again := initProducer(t, cl, "worker")
	if again.ID != first.ID || again.Epoch != first.Epoch+1 {
		t.Fatalf("named producer after the leader change: %+v (before: %+v)", again, first)
	}
	ids.add(t, initProducer(t, cl, ""))
	sameProducerState(t, m)
	if next := leader.FSM().NextProducerID(); next <= uint64(ids.len()) {
		t.Fatalf("next id %d, with %d handed out", next, ids.len())
	}
}

// TestInitProducerAcrossRestart: after the whole cluster restarts (from
// snapshots and the log), ids go on without repeats and names keep theirs.
func TestInitProducerAcrossRestart(t *testing.T) {
	m := testcluster.StartMeta(t, 3, func(c *metaserver.Config) {
		// Snapshot often, so the restart restores a snapshot as well as
		// replaying the log.
		c.SnapshotInterval, c.SnapshotThreshold = 20*time.Millisecond, 16
	})
	cl := m.Client(t)
	ids := newIDSet()
	named := initProducer(t, cl, "billing")
	ids.add(t, named)
	for range 40 {
		ids.add(t, initProducer(t, cl, ""))
	}
	sameProducerState(t, m)
	testwait.For(t, 10*time.Second, "every node to take a snapshot", func() bool {
		for _, c := range m.Cfgs {
			if !hasSnapshot(c.Dir) {
				return false
			}
		}
		return true
	})
	for range 5 { // and some entries after the snapshot
		ids.add(t, initProducer(t, cl, ""))
	}
	sameProducerState(t, m)
	_, leader := m.Leader()
	wantNext := leader.FSM().NextProducerID()

	m.StopAll()
	for i := range m.Nodes {
		m.Restart(i)
	}
	for _, s := range m.Nodes {
		testwait.For(t, 10*time.Second, "the node to restore its producer state", func() bool {
			return s.FSM().NextProducerID() >= wantNext
		})
		if p, ok := s.FSM().Producer("billing"); !ok || p != (fsm.ProducerIdentity{ID: named.ID, Epoch: named.Epoch}) {
			t.Fatalf("node %s after restart: billing is %+v (%v), was %+v", s.ID(), p, ok, named)
		}
	}
	cl2 := m.Client(t)
	for range 10 {
		ids.add(t, initProducer(t, cl2, ""))
	}
	if again := initProducer(t, cl2, "billing"); again.ID != named.ID || again.Epoch != named.Epoch+1 {
		t.Fatalf("named producer after the restart: %+v (before: %+v)", again, named)
	}
}

// hasSnapshot reports whether a node's data directory holds a finished
// raft snapshot.
func hasSnapshot(dir string) bool {
	entries, err := os.ReadDir(filepath.Join(dir, "snapshots"))
	if err != nil {
		return false
	}
	for _, e := range entries {
		if e.IsDir() && !strings.HasSuffix(e.Name(), ".tmp") {
			return true
		}
	}
	return false
}

func TestInitProducerRefusesBadNames(t *testing.T) {
	m := testcluster.StartMeta(t, 1, nil)
	cl := m.Client(t)
	for _, name := range []string{"a b", "naïve", "x/y", strings.Repeat("n", 256)} {
		if _, err := cl.InitProducer(context.Background(), name); !errors.Is(err, protocol.ErrInvalid) {
			t.Fatalf("name %q: %v", name, err)
		}
	}
	if r := initProducer(t, cl, strings.Repeat("n", 255)); r.ID != 1 || r.Epoch != 0 {
		t.Fatalf("first producer after refused names: %+v", r)
	}
}

// TestHeartbeatCarriesDedupeCounters: what a master reports about its
// dedupe state reaches the admin's group listing.
func TestHeartbeatCarriesDedupeCounters(t *testing.T) {
	m := startMeta(t, 1, fakeClock())
	cl := m.Client(t)
	heartbeat(t, cl, "g1", routing.RoleMaster, func(hb *api.Heartbeat) { hb.Producers, hb.Duplicates = 12, 3 })
	info, err := cl.Groups(context.Background())
	if err != nil || len(info) != 1 || info[0].Last.Producers != 12 || info[0].Last.Duplicates != 3 {
		t.Fatalf("groups: %+v, %v", info, err)
	}
}
