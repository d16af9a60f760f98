package brokerd

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runOnce starts the broker with args and stops it at once; it returns
// what it logged.
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

// checkPrivate fails t for anything under root with a permission beyond
// 0600 (files) or 0700 (directories), and returns the files it saw.
func checkPrivate(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		want := os.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		} else {
			files = append(files, path)
		}
		if perm := info.Mode().Perm(); perm&^want != 0 {
			t.Errorf("%s is %v; want no permission beyond %v", path, perm, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestDataFilesArePrivate: a broker started on a new data directory makes
// it, and what it writes in it, for its owner alone, and warns of nothing;
// one started on an existing directory others may read warns once.
func TestDataFilesArePrivate(t *testing.T) {
	base := t.TempDir()
	args := func(dir string) []string {
		return []string{"-id", "b", "-group", "g", "-dir", dir, "-addr", "127.0.0.1:0", "-ha-addr", "127.0.0.1:0", "-meta", "127.0.0.1:1"}
	}
	fresh := filepath.Join(base, "data", "b")
	if out := runOnce(t, args(fresh)); strings.Contains(out, "open to other local users") {
		t.Fatalf("a new data directory was warned of:\n%s", out)
	}
	if files := checkPrivate(t, filepath.Join(base, "data")); len(files) == 0 {
		t.Fatal("the broker wrote no file")
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
