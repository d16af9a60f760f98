package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/internal/testlog"
)

// TestWarnOpenDataDir: an existing data directory other users may read or
// enter gets one warning naming it and its mode; a private one, and one
// not there yet (it is created private), none.
func TestWarnOpenDataDir(t *testing.T) {
	base := t.TempDir()
	for _, tc := range []struct {
		name  string
		mode  os.FileMode // 0: not created
		warns int
	}{
		{"world-readable", 0o755, 1},
		{"world-enterable", 0o751, 1},
		{"group-readable", 0o750, 0},
		{"private", 0o700, 0},
		{"missing", 0, 0},
	} {
		dir := filepath.Join(base, tc.name)
		if tc.mode != 0 {
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, tc.mode); err != nil { // past the umask
				t.Fatal(err)
			}
		}
		logs := testlog.NewCapture("server", hclog.Info)
		WarnOpenDataDir(logs, "-dir", dir)
		lines := logs.Lines("")
		if len(lines) != tc.warns {
			t.Errorf("%s (%v): %d lines %q; want %d warnings", tc.name, tc.mode, len(lines), lines, tc.warns)
			continue
		}
		for _, l := range lines {
			if !strings.Contains(l, "[WARN]") || !strings.Contains(l, dir) || !strings.Contains(l, tc.mode.String()) || !strings.Contains(l, "chmod") {
				t.Errorf("%s: %q; want a warning naming the directory, its mode and the fix", tc.name, l)
			}
		}
	}
}
