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

func (f *fakeRegistry) Heartbeat(_ context.Context, hb api.Heartbeat) (api.HeartbeatReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, hb)
	if f.err != nil {
		return api.HeartbeatReply{}, f.err
	}
	return api.HeartbeatReply{Group: routing.Group{Name: hb.Group, Reasons: f.reasons, Master: routing.Broker{HAAddr: "master:1"}}}, nil
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
	var observed string
	h := &heartbeater{meta: reg, lease: lease, interval: 100 * time.Millisecond, clock: clock, log: hclog.NewNullLogger(),
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
