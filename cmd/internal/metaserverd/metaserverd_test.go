package metaserverd

import (
	"net"
	"testing"

	"github.com/ferrymq/ferrymq/cmd/internal/cli"
	"github.com/ferrymq/ferrymq/cmd/internal/clitest"
)

func TestParsePeers(t *testing.T) {
	peers, err := ParsePeers("m1=127.0.0.1:1/127.0.0.1:2, m2=h:3/h:4")
	if err != nil || len(peers) != 2 || peers[1].ID != "m2" || peers[1].RaftAddr != "h:3" || peers[1].RPCAddr != "h:4" {
		t.Fatalf("got %+v, %v", peers, err)
	}
	for _, bad := range []string{"m1", "m1=a", "=a/b", "m1=a/"} {
		if _, err := ParsePeers(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestBadSettingsFailClearly(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	cases := []struct {
		name string
		args []string
		want string
		code int
	}{
		{"missing id", []string{"-dir", dir}, "ID is required", cli.ExitConfig},
		{"bad peers", []string{"-id", "m1", "-dir", dir, "-peers", "m1"}, "raftAddr/rpcAddr", cli.ExitConfig},
		{"bad log level", []string{"-id", "m1", "-dir", dir, "-log-level", "loud"}, "log level", cli.ExitConfig},
		{"unusable dir", []string{"-id", "m1", "-dir", "/proc/version/x", "-rpc-addr", "127.0.0.1:0", "-raft-addr", "127.0.0.1:0"}, "data directory", cli.ExitConfig},
		{"taken raft port", []string{"-id", "m1", "-dir", dir, "-raft-addr", taken.Addr().String(), "-rpc-addr", "127.0.0.1:0"}, "address already in use", cli.ExitConfig},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { clitest.Refuses(t, Run, tc.args, tc.want, tc.code) })
	}
}

// TestNegativeDurationFlagsAreConfigErrors: a negative duration flag is a
// bad setting (exit 2, naming the config field), never silently the
// default. It depends on metaserver.Config.Validate rejecting negative
// durations; without that, the negative value takes the default, the node
// starts and this test fails.
func TestNegativeDurationFlagsAreConfigErrors(t *testing.T) {
	base := func() []string {
		return []string{"-id", "m1", "-dir", t.TempDir(), "-rpc-addr", "127.0.0.1:0", "-raft-addr", "127.0.0.1:0"}
	}
	t.Run("base settings are accepted", func(t *testing.T) { clitest.Accepts(t, Run, base()) })
	t.Run("a retention in days is accepted", func(t *testing.T) { clitest.Accepts(t, Run, append(base(), "-audit-retention", "3650d")) })
	for _, tc := range []struct{ flag, value, field string }{
		{"-session", "-5s", "SessionTimeout"},
		{"-lag-time", "-1s", "LagTime"},
		{"-failover", "maybe", "-failover must be on or off"},
		{"-admit-groups", "Manual", "-admit-groups must be auto or manual"},
		{"-failover-max-loss", "-5", "-failover-max-loss must be 0 or more"},
		{"-failover-margin", "-1s", "FailoverMargin"},
		{"-consumer-session", "-1s", "ConsumerSession"},
		{"-consumer-session", "10m", "ConsumerSession"},
		{"-audit-retention", "59m", "-audit-retention must be from 1h to 3650d"},
		{"-audit-retention", "3651d", "-audit-retention must be from 1h to 3650d"},
		{"-audit-retention", "-1d", "not a number of days"},
		{"-audit-retention", "1y", "audit-retention"},
	} {
		t.Run(tc.flag+" "+tc.value, func(t *testing.T) {
			clitest.Refuses(t, Run, append(base(), tc.flag, tc.value), tc.field, cli.ExitConfig)
		})
	}
}
