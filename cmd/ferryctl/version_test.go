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
