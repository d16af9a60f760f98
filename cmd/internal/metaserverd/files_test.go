package metaserverd

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runOnce starts the node with args and stops it at once; it returns what
// it logged.
func runOnce(t *testing.T, args []string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out bytes.Buffer
	if err := Run(ctx, args, &out); err != nil {
		t.Fatalf("%q: %v\n%s", args, err, out.String())
	}
	return out.String()
}

// TestDataFilesArePrivate: a metaserver started on a new data directory
// makes it, its Raft store and its snapshot directory for its owner alone
// (0700 directories, 0600 files), and warns of nothing; one started on an
// existing directory others may read warns once.
func TestDataFilesArePrivate(t *testing.T) {
	base := t.TempDir()
	args := func(dir string) []string {
		return []string{"-id", "m1", "-dir", dir, "-rpc-addr", "127.0.0.1:0", "-raft-addr", "127.0.0.1:0"}
	}
	fresh := filepath.Join(base, "data", "m1")
	if out := runOnce(t, args(fresh)); strings.Contains(out, "open to other local users") {
		t.Fatalf("a new data directory was warned of:\n%s", out)
	}
	seen := map[string]bool{}
	err := filepath.WalkDir(filepath.Join(base, "data"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		seen[d.Name()] = true
		want := os.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		}
		if perm := info.Mode().Perm(); perm&^want != 0 {
			t.Errorf("%s is %v; want no permission beyond %v", path, perm, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !seen["raft.db"] || !seen["snapshots"] {
		t.Fatalf("the node made %v; want raft.db and snapshots", seen)
	}

	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o755); err != nil {
		t.Fatal(err)
	}
	out := runOnce(t, args(open))
	if n := strings.Count(out, "open to other local users"); n != 1 || !strings.Contains(out, "[WARN]") || !strings.Contains(out, open) {
		t.Fatalf("an existing 0755 data directory: %d warnings, want 1 naming it:\n%s", n, out)
	}
}
