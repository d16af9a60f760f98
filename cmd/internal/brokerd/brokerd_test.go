package brokerd

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferrymq/ferrymq/cmd/internal/cli"
	"github.com/ferrymq/ferrymq/cmd/internal/clitest"
)

func TestBadSettingsFailClearly(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "not-a-dir")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cases := []struct {
		name string
		args []string
		want string
		code int
	}{
		{"missing id", []string{"-group", "g", "-dir", dir}, "ID is required", cli.ExitConfig},
		{"id with a space", []string{"-id", "bad id", "-group", "g", "-dir", dir}, `broker id "bad id"`, cli.ExitConfig},
		{"group with a space", []string{"-id", "b", "-group", "g 1", "-dir", dir}, `broker group name "g 1"`, cli.ExitConfig},
		{"bad role", []string{"-id", "b", "-group", "g", "-dir", dir, "-role", "boss"}, "Role", cli.ExitConfig},
		{"bad flush", []string{"-id", "b", "-group", "g", "-dir", dir, "-flush", "sometimes"}, "flush mode", cli.ExitConfig},
		{"unknown flag", []string{"-frobnicate"}, "frobnicate", cli.ExitConfig},
		{"unusable dir", []string{"-id", "b", "-group", "g", "-dir", filepath.Join(file, "sub"), "-addr", "127.0.0.1:0"}, "directory", cli.ExitConfig},
		{"taken port", []string{"-id", "b", "-group", "g", "-dir", filepath.Join(dir, "d"), "-addr", taken.Addr().String(), "-ha-addr", "127.0.0.1:0"}, "address already in use", cli.ExitConfig},
		{"taken pprof port", []string{"-id", "b", "-group", "g", "-dir", filepath.Join(dir, "p"), "-addr", "127.0.0.1:0", "-ha-addr", "127.0.0.1:0", "-meta", "127.0.0.1:1", "-pprof", taken.Addr().String()}, "pprof listener", cli.ExitConfig},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { clitest.Refuses(t, Run, tc.args, tc.want, tc.code) })
	}
}

// TestNegativeDurationFlagsAreConfigErrors: a negative duration flag is a
// bad setting (exit 2, naming the config field), never silently the
// default. It depends on broker.Config.Validate rejecting negative
// durations; until that lands, the negative value takes the default, the
// broker starts and this test fails.
func TestNegativeDurationFlagsAreConfigErrors(t *testing.T) {
	base := func() []string {
		return []string{"-id", "b", "-group", "g", "-dir", t.TempDir(), "-addr", "127.0.0.1:0", "-ha-addr", "127.0.0.1:0", "-meta", "127.0.0.1:1"}
	}
	t.Run("base settings are accepted", func(t *testing.T) { clitest.Accepts(t, Run, base()) })
	for _, tc := range []struct{ flag, value, field string }{
		{"-session", "-5s", "SessionTimeout"},
		{"-heartbeat", "-1s", "HeartbeatInterval"},
		{"-high-wait", "-1s", "HighWait"},
		{"-flush-interval", "-1ms", "FlushInterval"},
		{"-retention-check", "-1m", "RetentionCheck"},
	} {
		t.Run(tc.flag+" "+tc.value, func(t *testing.T) {
			clitest.Refuses(t, Run, append(base(), tc.flag, tc.value), tc.field, cli.ExitConfig)
		})
	}
}
