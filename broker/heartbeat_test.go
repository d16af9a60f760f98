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
// heartbeat accepted; not a moment before.
func TestWriteLeaseFollowsHeartbeats(t *testing.T) {
	clock := clockwork.NewFakeClock()
	reg := &fakeRegistry{}
	lease := &writeLease{clock: clock, session: time.Second}
	lease.ready.Store(1) // roles took over epoch 1
	var observed string
	h := &heartbeater{id: "b1", meta: reg, lease: lease, interval: 100 * time.Millisecond, clock: clock, log: hclog.NewNullLogger(),
		describe: func(hb *api.Heartbeat) { hb.Group = "g1" }, observe: func(g routing.Group) { observed = g.Master.HAAddr }}
	ctx := context.Background()

	if lease.valid() {
		t.Fatal("writable before any heartbeat")
	}
	h.beat(ctx)
	if !lease.valid() || observed != "master:1" {
		t.Fatalf("after an accepted heartbeat: valid %v, observed %q", lease.valid(), observed)
	}
	reg.set(routing.Admin, nil)
	h.beat(ctx)
	if lease.valid() {
		t.Fatal("writable after the registry said read-only")
	}
	reg.set(0, nil)
	h.beat(ctx)
	reg.set(0, errors.New("metaserver unreachable"))
	clock.Advance(time.Second - time.Nanosecond)
	h.beat(ctx)
	if !lease.valid() {
		t.Fatal("read-only before a session without heartbeats passed")
	}
	clock.Advance(time.Nanosecond)
	if lease.valid() {
		t.Fatal("still writable a whole session after the last accepted heartbeat")
	}
	reg.set(0, nil)
	h.beat(ctx)
	if !lease.valid() {
		t.Fatal("not writable again after a heartbeat was accepted")
	}
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
// claim (the heartbeater coalesces them), and the lease holds until the
// registry's answer says otherwise.
func TestClientEpochClaimOnlyKicksAHeartbeat(t *testing.T) {
	clock := clockwork.NewFakeClock()
	kicks := 0
	lease := &writeLease{clock: clock, session: time.Second, kick: func() { kicks++ }}
	lease.ready.Store(1)
	lease.renew(clock.Now(), true, true, 1, 0)
	if lease.claim(1) || lease.claim(0) || kicks != 0 {
		t.Fatalf("the lease's own epoch (or none) claimed newer, or kicked (%d kicks)", kicks)
	}
	if !lease.claim(0xFFFFFFF0) || kicks != 1 {
		t.Fatalf("a newer epoch not reported, or no heartbeat asked for (%d kicks)", kicks)
	}
	if !lease.valid() || lease.fenced() || !lease.validFor(1) {
		t.Fatal("a client's claimed epoch fenced the lease")
	}
	lease.renew(clock.Now(), false, true, 2, 0) // the claim was genuine: the registry's answer fences
	if lease.valid() || lease.validFor(1) {
		t.Fatal("writable after the registry named another master")
	}
}
