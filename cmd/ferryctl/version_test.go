package main

import (
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/cmd/internal/cli"
)

// TestVersion: ferryctl --version prints the same line as the servers'
// -version, with no network call, and exits 0.
func TestVersion(t *testing.T) {
	code, out, errOut := ctl("--meta", "127.0.0.1:1", "--version")
	if code != exitOK || out != cli.VersionLine("ferryctl")+"\n" || errOut != "" {
		t.Fatalf("--version: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if !strings.Contains(out, cli.Version) {
		t.Fatalf("--version does not name the version %q: %q", cli.Version, out)
	}
}

// TestSingleDashVersion: ferryctl -version works as the servers' -version
// does (pflag alone read it as the shorthands -v -e ...: "unknown shorthand
// flag"), anywhere among the global flags; a -version that is a flag's
// value stays that value.
func TestSingleDashVersion(t *testing.T) {
	want := cli.VersionLine("ferryctl") + "\n"
	for _, args := range [][]string{{"-version"}, {"--meta", "127.0.0.1:1", "-version"}, {"-version", "--json"}} {
		code, out, errOut := ctl(args...)
		if code != exitOK || out != want || errOut != "" {
			t.Errorf("ferryctl %q: exit %d, stdout %q, stderr %q; want exit 0 and %q", args, code, out, errOut, want)
		}
	}
	// The value of --key: not the version flag (the send fails later, for
	// want of a body: a usage error that is not about -version).
	code, out, errOut := ctl("--meta", "127.0.0.1:1", "send", "t", "--key", "-version")
	if code != exitUsage || strings.Contains(out, cli.Version) || !strings.Contains(errOut, "body") {
		t.Fatalf("send --key -version: exit %d, stdout %q, stderr %q; want exit 2 asking for a body", code, out, errOut)
	}
}
