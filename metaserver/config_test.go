package metaserver

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func TestConfigValidate(t *testing.T) {
	base := func() Config {
		return Config{ID: "m1", Dir: "/tmp/m1", RaftAddr: "127.0.0.1:7201", RPCAddr: "127.0.0.1:7101"}
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want []string // substrings, one per expected problem; none: valid
	}{
		{"zero means defaults", func(*Config) {}, nil},
		{"test timings", func(c *Config) {
			c.SessionTimeout, c.JudgeInterval, c.LagTime = time.Second, 50*time.Millisecond, 500*time.Millisecond
			c.RaftHeartbeatTimeout, c.RaftElectionTimeout, c.RaftLeaderLeaseTimeout = 300*time.Millisecond, 300*time.Millisecond, 150*time.Millisecond
		}, nil},
		{"required fields", func(c *Config) { *c = Config{} }, []string{"ID is required", "Dir is required", "RaftAddr is required", "RPCAddr is required"}},
		{"negative counts", func(c *Config) { c.DefaultQueues, c.LagBytes, c.RecoverHeartbeats = -1, -2, -3 },
			[]string{"DefaultQueues is -1", "LagBytes is -2", "RecoverHeartbeats is -3"}},
		{"negative session is not the default", func(c *Config) { c.SessionTimeout = -10 * time.Second },
			[]string{"SessionTimeout is -10s; it must be positive (0 means the default)"}},
		{"every negative duration", func(c *Config) {
			c.LagTime, c.JudgeInterval, c.SnapshotInterval = -1, -2, -3
			c.RaftHeartbeatTimeout, c.RaftElectionTimeout, c.RaftLeaderLeaseTimeout = -4, -5, -6
		}, []string{"LagTime is -1ns", "JudgeInterval is -2ns",
			"RaftHeartbeatTimeout is -4ns", "RaftElectionTimeout is -5ns", "RaftLeaderLeaseTimeout is -6ns", "SnapshotInterval is -3ns"}},
		{"admission modes", func(c *Config) { c.AdmitGroups = AdmitManual }, nil},
		{"unknown admission mode", func(c *Config) { c.AdmitGroups = "Manual" }, []string{`AdmitGroups is "Manual"; want "auto" or "manual"`}},
		{"too many default queues", func(c *Config) { c.DefaultQueues = maxQueues + 1 }, []string{"DefaultQueues is 4097, over the limit"}},
		{"lag time under a millisecond", func(c *Config) { c.LagTime = 999 * time.Microsecond }, []string{"LagTime is 999µs"}},
		{"judge as slow as a session", func(c *Config) { c.SessionTimeout, c.JudgeInterval = time.Second, time.Second },
			[]string{"JudgeInterval (1s) must be shorter than SessionTimeout (1s)"}},
		{"session under the default judge interval", func(c *Config) { c.SessionTimeout = 400 * time.Millisecond },
			[]string{"JudgeInterval (500ms, the default) must be shorter than SessionTimeout (400ms)"}},
		{"judge interval over the default session", func(c *Config) { c.JudgeInterval = time.Minute },
			[]string{"JudgeInterval (1m0s) must be shorter than SessionTimeout (10s, the default)"}},
		{"consumer session out of bounds", func(c *Config) { c.ConsumerSession = 10 * time.Minute },
			[]string{"ConsumerSession is 10m0s; it must be 1s to 5m0s"}},
		{"judge as slow as a consumer session", func(c *Config) {
			c.SessionTimeout, c.JudgeInterval, c.ConsumerSession = time.Minute, 2*time.Second, 2*time.Second
		},
			[]string{"JudgeInterval (2s) must be shorter than ConsumerSession (2s)"}},
		{"lease longer than heartbeat timeout", func(c *Config) {
			c.RaftHeartbeatTimeout, c.RaftLeaderLeaseTimeout = 200*time.Millisecond, 300*time.Millisecond
		},
			[]string{"RaftLeaderLeaseTimeout (300ms) must not be longer than RaftHeartbeatTimeout (200ms)"}},
		{"lease longer than the default heartbeat timeout", func(c *Config) { c.RaftLeaderLeaseTimeout = 2 * time.Second },
			[]string{"RaftLeaderLeaseTimeout (2s) must not be longer than RaftHeartbeatTimeout (1s, the default)"}},
		{"heartbeat timeout under the default lease", func(c *Config) {
			c.RaftHeartbeatTimeout, c.RaftElectionTimeout = 100*time.Millisecond, 100*time.Millisecond
		},
			[]string{"RaftLeaderLeaseTimeout (500ms, the default) must not be longer than RaftHeartbeatTimeout (100ms)"}},
		{"election shorter than heartbeat timeout", func(c *Config) { c.RaftHeartbeatTimeout, c.RaftElectionTimeout = 2*time.Second, time.Second },
			[]string{"RaftElectionTimeout (1s) must not be shorter than RaftHeartbeatTimeout (2s)"}},
		{"raft floors", func(c *Config) {
			c.RaftHeartbeatTimeout, c.RaftElectionTimeout, c.RaftLeaderLeaseTimeout, c.SnapshotInterval = 4*time.Millisecond, 4*time.Millisecond, 4*time.Millisecond, time.Millisecond
		}, []string{"RaftHeartbeatTimeout is 4ms; raft needs at least 5ms", "RaftElectionTimeout is 4ms", "RaftLeaderLeaseTimeout is 4ms", "SnapshotInterval is 1ms"}},
		{"peers", func(c *Config) {
			c.Peers = []Peer{{ID: "a", RaftAddr: "r1", RPCAddr: "p1"}, {ID: "a", RaftAddr: "r1", RPCAddr: "p1"}, {ID: "b"}}
		}, []string{`peer "a" listed twice`, `peer "a": raft address r1`, `peer "a": RPC address p1`, "needs an ID, a raft address and an RPC address"}},
		{"all problems at once", func(c *Config) { c.ID, c.SessionTimeout, c.RaftLeaderLeaseTimeout = "", -1, 5*time.Second },
			[]string{"ID is required", "SessionTimeout is -1ns", "RaftLeaderLeaseTimeout (5s)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.edit(&c)
			err := c.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("valid config refused: %v", err)
				}
				// What Validate passes, raft passes too.
				if err := raft.ValidateConfig(c.withDefaults().raftConfig()); err != nil {
					t.Fatalf("Validate passed what raft refuses: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tc.want) {
				t.Fatalf("%d problems reported, want %d:\n%v", len(lines), len(tc.want), err)
			}
			for i, want := range tc.want {
				if !strings.Contains(lines[i], want) {
					t.Errorf("problem %d: %q does not say %q", i, lines[i], want)
				}
			}
		})
	}
}

// TestNewRefusesBadConfig: New validates before it binds anything, and a
// negative session is an error rather than the 10 s default.
func TestNewRefusesBadConfig(t *testing.T) {
	_, err := New(Config{ID: "m1", Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0", SessionTimeout: -time.Second})
	if err == nil || !strings.Contains(err.Error(), "SessionTimeout") {
		t.Fatalf("New with a negative session: %v", err)
	}
}
