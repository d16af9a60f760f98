package consumer

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// movingRouter routes topic t's one queue to a group whose master and
// epoch a test changes (the queue moves off a retired group).
type movingRouter struct {
	mu    sync.Mutex
	group string
	addr  string
	epoch uint32
	base  int64
	ver   uint64
}

func (r *movingRouter) moveAt(group, addr string, epoch uint32, base int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.group, r.addr, r.epoch, r.base = group, addr, epoch, base
	r.ver++
}

func (r *movingRouter) RouteExisting(ctx context.Context, topic string) (routing.Route, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return routing.Route{Topic: topic, Version: r.ver, Queues: []routing.QueueRoute{
		{Queue: 0, Group: r.group, Master: r.addr, Epoch: r.epoch, Writable: true, Base: r.base}}}, nil
}

// epochBrokers are fake brokers whose answers carry the epoch of the
// group behind each address, recording the epochs PULLs name by address.
type epochBrokers struct {
	*fakeBrokers
	epochOf map[string]uint32
	mu      sync.Mutex
	named   map[string][]uint32
}

func (b *epochBrokers) Pull(ctx context.Context, addr string, req *protocol.PullRequest, dec *protocol.PullDecoder) (protocol.PullResponse, error) {
	b.mu.Lock()
	b.named[addr] = append(b.named[addr], req.Epoch)
	b.mu.Unlock()
	resp, err := b.fakeBrokers.Pull(ctx, addr, req, dec)
	resp.Epoch = b.epochOf[addr]
	return resp, err
}

func (b *epochBrokers) namedAt(addr string) []uint32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.named[addr])
}

// An epoch is one broker group's: once a queue moves to another group
// (its group retired), a member names the old group's epoch neither in its
// PULLs to the new group (whose broker would take it for one of its own:
// a higher one stops it checking readers after its next failover, a lower
// one can send readers back) nor in its commits, and a member starting
// from an offset committed in the old group does not either.
func TestEpochStaysWithItsGroup(t *testing.T) {
	fb := &epochBrokers{fakeBrokers: newFakeBrokers(), epochOf: map[string]uint32{"a": 7, "b": 2}, named: map[string][]uint32{}}
	router := &movingRouter{group: "gA", addr: "a", epoch: 7, ver: 1}
	co := newFakeCoord(map[string]int{"t": 1})
	opts := []Opt{withCoordinator(co), withRouter(router), withPuller(fb), withDeadLetterer(&fakeDLQ{}),
		Heartbeat(50 * time.Millisecond), Session(time.Second), AutoCommit(50 * time.Millisecond),
		PollWait(100 * time.Millisecond), RetryBackoff(time.Millisecond, 5*time.Millisecond)}
	c, err := New("grp", []string{"t"}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	stop := runIn(t, c, func(ctx context.Context, m *Message) error {
		mu.Lock()
		got = append(got, string(m.Body))
		mu.Unlock()
		return nil
	})
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(got) }
	fb.add("t", 0, "m0", "m1")
	waitFor(t, 5*time.Second, "m0 and m1, and their commit in gA's epoch 7", func() bool {
		e, g := co.epoch("t", 0)
		return count() == 2 && co.offset("t", 0) == 2 && e == 7 && g == "gA"
	})

	// gA is gone; the queue moves to gB, whose epoch is 2, at offset 2.
	fb.setDown("a", true)
	router.moveAt("gB", "b", 2, 2)
	fb.add("t", 0, "m2")
	waitFor(t, 10*time.Second, "m2 from gB, and its commit in gB's epoch 2", func() bool {
		e, g := co.epoch("t", 0)
		return count() == 3 && co.offset("t", 0) == 3 && e == 2 && g == "gB"
	})
	if named := fb.namedAt("b"); len(named) == 0 || slices.Contains(named, 7) {
		t.Fatalf("PULLs to gB named epochs %v: gA's 7 among them", named)
	}
	stop()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	// A member that starts from an offset committed in gA (a commit that
	// reached the registry before the move, which then took the queue up
	// there) names gA's epoch neither: it reads on from the offset.
	router.moveAt("gB", "b", 2, 3)
	co.mu.Lock()
	co.epochs[qkey{"t", 0}] = api.QueueOffset{Topic: "t", Queue: 0, Offset: 3, Epoch: 7, EpochGroup: "gA"}
	co.mu.Unlock()
	fb.mu.Lock()
	fb.named = map[string][]uint32{}
	fb.mu.Unlock()
	c, err = New("grp", []string{"t"}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fb.add("t", 0, "m3")
	runIn(t, c, func(ctx context.Context, m *Message) error {
		mu.Lock()
		got = append(got, string(m.Body))
		mu.Unlock()
		return nil
	})
	waitFor(t, 10*time.Second, "m3", func() bool { return count() == 4 })
	if named := fb.namedAt("b"); len(named) == 0 || slices.Contains(named, 7) {
		t.Fatalf("a member starting from gA's commit named epochs %v to gB", named)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, []string{"m0", "m1", "m2", "m3"}) {
		t.Fatalf("handled %v", got)
	}
}

// A member that read a queue at a group past the offset another group
// took it up at, when the queue moved (the old group stored messages after
// the last end the registry heard from it), goes back to that offset: the
// new group's messages there are others, and skipping them would lose them.
func TestReaderPastTheBaseGoesBack(t *testing.T) {
	fb := &epochBrokers{fakeBrokers: newFakeBrokers(), epochOf: map[string]uint32{"a": 1, "b": 1}, named: map[string][]uint32{}}
	router := &movingRouter{group: "gA", addr: "a", epoch: 1, ver: 1}
	co := newFakeCoord(map[string]int{"t": 1})
	c, err := New("grp", []string{"t"}, withCoordinator(co), withRouter(router), withPuller(fb), withDeadLetterer(&fakeDLQ{}),
		Heartbeat(50*time.Millisecond), Session(time.Second), AutoCommit(50*time.Millisecond),
		PollWait(100*time.Millisecond), RetryBackoff(time.Millisecond, 5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var mu sync.Mutex
	var got []string
	runIn(t, c, func(ctx context.Context, m *Message) error {
		mu.Lock()
		got = append(got, fmt.Sprintf("%d:%s", m.Offset, m.Body))
		mu.Unlock()
		return nil
	})
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(got) }
	fb.add("t", 0, "a0", "a1", "a2", "a3", "a4")
	waitFor(t, 5*time.Second, "gA's five messages", func() bool { return count() == 5 })

	// gA dies having told the registry of 3 messages only; gB takes the
	// queue up at 3 and stores two messages there.
	fb.setDown("a", true)
	fb.mu.Lock()
	fb.base[qkey{"t", 0}] = 3
	fb.logs[qkey{"t", 0}] = nil
	fb.mu.Unlock()
	fb.add("t", 0, "b3", "b4", "b5")
	router.moveAt("gB", "b", 1, 3)
	waitFor(t, 10*time.Second, "gB's three messages", func() bool { return count() == 8 })
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"0:a0", "1:a1", "2:a2", "3:a3", "4:a4", "3:b3", "4:b4", "5:b5"}; !slices.Equal(got, want) {
		t.Fatalf("handled %v, want %v", got, want)
	}
}
