package broker

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/routing"
)

// fakeRegistry answers heartbeats with a group state, or an error.
type fakeRegistry struct {
	mu      sync.Mutex
	reasons routing.Reasons
	err     error
	got     []api.Heartbeat
}

func (f *fakeRegistry) epoch() uint32 { return 1 }

func (f *fakeRegistry) Heartbeat(_ context.Context, hb api.Heartbeat) (api.HeartbeatReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, hb)
	if f.err != nil {
		return api.HeartbeatReply{}, f.err
	}
	return api.HeartbeatReply{Group: routing.Group{Name: hb.Group, Reasons: f.reasons, Epoch: f.epoch(),
		Master: routing.Broker{ID: "b1", HAAddr: "master:1"}}}, nil
}

func (f *fakeRegistry) set(reasons routing.Reasons, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reasons, f.err = reasons, err
}

// The write lease: writable from the first accepted heartbeat that says
// so, until a reply says read-only or until one session passes with no
// heartbeat accepted; not a moment before. Each accepted reply is
// published as a view, to every subscriber.
func TestWriteLeaseFollowsHeartbeats(t *testing.T) {
	clock := clockwork.NewFakeClock()
	reg := &fakeRegistry{}
	s := newSession("b1", reg, 100*time.Millisecond, time.Second, clock, hclog.NewNullLogger())
	views := s.subscribe()
	lease := &s.lease
	lease.ready.Store(1) // roles took over epoch 1
	describe := func(hb *api.Heartbeat) { hb.Group = "g1" }
	ctx := context.Background()

	if lease.valid() || s.latest() != nil {
		t.Fatal("writable, or a view, before any heartbeat")
	}
	s.beat(ctx, describe)
	select {
	case <-views:
	default:
		t.Fatal("an accepted reply signalled no subscriber")
	}
	if v := s.latest(); !lease.valid() || v == nil || v.Master.HAAddr != "master:1" || v.Role != routing.RoleMaster || v.Epoch != 1 {
		t.Fatalf("after an accepted heartbeat: valid %v, view %+v", lease.valid(), v)
	}
	reg.set(routing.Admin, nil)
	s.beat(ctx, describe)
	if lease.valid() || s.latest().Writable() {
		t.Fatal("writable after the registry said read-only")
	}
	reg.set(0, nil)
	s.beat(ctx, describe)
	reg.set(0, errors.New("metaserver unreachable"))
	before := s.latest()
	clock.Advance(time.Second - time.Nanosecond)
	s.beat(ctx, describe)
	if !lease.valid() {
		t.Fatal("read-only before a session without heartbeats passed")
	}
	if s.latest() != before {
		t.Fatal("a failed heartbeat published a view")
	}
	clock.Advance(time.Nanosecond)
	if lease.valid() {
		t.Fatal("still writable a whole session after the last accepted heartbeat")
	}
	reg.set(0, nil)
	s.beat(ctx, describe)
	if !lease.valid() {
		t.Fatal("not writable again after a heartbeat was accepted")
	}
}

// A subscriber that does not read holds up no heartbeat: its signal is
// pending once, and it then reads the newest view, whatever it missed.
func TestSessionNeverWaitsOnAReader(t *testing.T) {
	clock := clockwork.NewFakeClock()
	reg := &fakeRegistry{}
	s := newSession("b1", reg, 100*time.Millisecond, time.Second, clock, hclog.NewNullLogger())
	slow := s.subscribe()
	for _, r := range []routing.Reasons{0, routing.Admin, 0, routing.Admin} {
		reg.set(r, nil)
		s.beat(context.Background(), func(*api.Heartbeat) {}) // returns with the reader asleep
	}
	<-slow
	select {
	case <-slow:
		t.Fatal("four replies signalled a sleeping reader more than once")
	default:
	}
	if v := s.latest(); v == nil || v.Writable() {
		t.Fatalf("the reader sees %+v, want the last (read-only) view", v)
	}
}

// The view names what this broker is to do: its role, and a resync order
// only when it is addressed to it.
func TestViewNamesThisBroker(t *testing.T) {
	reg := &orderRegistry{group: routing.Group{Name: "g1", Epoch: 2, Master: routing.Broker{ID: "m"}, Slave: routing.Broker{ID: "s"},
		Slaves: []routing.Broker{{ID: "s"}},
		Resync: &routing.ResyncOrder{Broker: "s", Seq: 7}}}
	for _, tc := range []struct {
		id     string
		role   routing.Role
		resync uint64
	}{{"m", routing.RoleMaster, 0}, {"s", routing.RoleSlave, 7}, {"x", "", 0}} {
		s := newSession(tc.id, reg, time.Second, 2*time.Second, clockwork.NewFakeClock(), hclog.NewNullLogger())
		s.beat(context.Background(), func(*api.Heartbeat) {})
		if v := s.latest(); v.Role != tc.role || v.ResyncSeq != tc.resync || v.ACLVersion != 5 {
			t.Errorf("broker %s: role %q, resync %d, ACL version %d; want %q, %d, 5", tc.id, v.Role, v.ResyncSeq, v.ACLVersion, tc.role, tc.resync)
		}
	}
}

// orderRegistry answers every heartbeat with one group, at ACL version 5.
type orderRegistry struct{ group routing.Group }

func (o *orderRegistry) Heartbeat(context.Context, api.Heartbeat) (api.HeartbeatReply, error) {
	return api.HeartbeatReply{Group: o.group, ACLVersion: 5}, nil
}

func TestConfigValidate(t *testing.T) {
	good := Config{ID: "b", Group: "g", Role: routing.RoleMaster, Dir: "/tmp/x", Addr: "127.0.0.1:0", MetaAddrs: []string{"m"}}
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	cases := []struct {
		name string
		edit func(*Config)
		want []string
	}{
		{"missing", func(c *Config) { *c = Config{} }, []string{"ID is required", "Group is required", "Role must be", "Dir is required",
			"Addr is required", "MetaAddrs is required"}},
		{"negative session", func(c *Config) { c.SessionTimeout = -time.Second }, []string{"SessionTimeout must not be negative"}},
		{"negatives", func(c *Config) { c.SegmentSize, c.HAFetchBytes, c.Workers = -1, -1, -1 },
			[]string{"SegmentSize must not be negative", "HAFetchBytes must not be negative", "Workers must not be negative"}},
		{"heartbeat not shorter than session", func(c *Config) { c.HeartbeatInterval = 10 * time.Second },
			[]string{"HeartbeatInterval (10s) must be shorter than SessionTimeout (10s)"}},
		{"fetch wait not shorter than HIGH wait", func(c *Config) { c.HAFetchWait, c.HighWait = time.Second, time.Second },
			[]string{"HAFetchWait (1s) must be shorter than HighWait (1s)"}},
		{"fetch over a frame", func(c *Config) { c.HAFetchBytes = 64 << 20 }, []string{"HAFetchBytes (67108864) must fit in one frame"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.edit(&c)
			err := c.Validate()
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// The lease runs from when the accepted heartbeat was sent, not from when
// its reply came back: a reply that took most of a session to arrive buys
// only what is left of it. A newer epoch an HA peer showed ends the lease
// at once, until the registry's next word.
func TestWriteLeaseRunsFromTheSend(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lease := &writeLease{clock: clock, session: time.Second}
	lease.ready.Store(1)
	sent := clock.Now()
	clock.Advance(900 * time.Millisecond) // the reply is slow
	lease.renew(sent, true, true, 1, 0)
	if !lease.valid() {
		t.Fatal("not writable within the session of the send")
	}
	clock.Advance(100 * time.Millisecond)
	if lease.valid() {
		t.Fatal("writable a session after the heartbeat was sent")
	}

	lease.renew(clock.Now(), true, true, 1, 0)
	lease.fence(2)
	if lease.valid() || !lease.fenced() || lease.validFor(1) {
		t.Fatal("writable after a newer epoch was seen")
	}
	lease.renew(clock.Now(), true, true, 1, 0) // the registry still says epoch 1
	if !lease.valid() {
		t.Fatal("a claimed epoch outlived the registry's next word")
	}
	lease.renew(clock.Now(), false, true, 2, 0) // replaced
	if lease.valid() || lease.validFor(1) {
		t.Fatal("writable after the registry named another master")
	}
	lease.renew(clock.Now(), true, true, 2, 0)
	if lease.valid() {
		t.Fatal("writable in epoch 2 before the broker took it over")
	}
	lease.ready.Store(2)
	if !lease.valid() || lease.validFor(1) {
		t.Fatal("the lease is for epoch 2 only once taken over")
	}

	// A metaserver with a shorter session than the broker's shortens the
	// lease: the leader's wait before a promotion must outlast it.
	lease.renew(clock.Now(), true, true, 2, 300*time.Millisecond)
	clock.Advance(300 * time.Millisecond)
	if lease.valid() {
		t.Fatal("the lease outlived the metaserver's session")
	}
}

// A client's newer epoch fences nothing: it asks for a heartbeat, once per
// claim (the session coalesces them), and the lease holds until the
// registry's answer says otherwise.
func TestClientEpochClaimOnlyKicksAHeartbeat(t *testing.T) {
	clock := clockwork.NewFakeClock()
	s := newSession("b1", &fakeRegistry{}, 100*time.Millisecond, time.Second, clock, hclog.NewNullLogger())
	lease := &s.lease
	lease.ready.Store(1)
	lease.renew(clock.Now(), true, true, 1, 0)
	if s.claim(1) || s.claim(0) || len(s.kicks) != 0 {
		t.Fatalf("the lease's own epoch (or none) claimed newer, or kicked (%d kicks)", len(s.kicks))
	}
	if !s.claim(0xFFFFFFF0) || len(s.kicks) != 1 {
		t.Fatalf("a newer epoch not reported, or no heartbeat asked for (%d kicks)", len(s.kicks))
	}
	if !lease.valid() || lease.fenced() || !lease.validFor(1) {
		t.Fatal("a client's claimed epoch fenced the lease")
	}
	lease.renew(clock.Now(), false, true, 2, 0) // the claim was genuine: the registry's answer fences
	if lease.valid() || lease.validFor(1) {
		t.Fatal("writable after the registry named another master")
	}
}
