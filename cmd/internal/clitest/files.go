package clitest

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// RunOnce starts run with args and stops it at once; it fails tb on an
// error and returns what the server logged.
func RunOnce(tb testing.TB, run Run, args []string) string {
	tb.Helper()
	var out bytes.Buffer
	if err := run(done(), args, &out); err != nil {
		tb.Fatalf("%q: %v\n%s", args, err, out.String())
	}
	return out.String()
}

// PrivateTree fails tb for anything under root with a permission beyond
// 0600 (files) or 0700 (directories), and returns the files and the
// directories it saw.
func PrivateTree(tb testing.TB, root string) (files, dirs []string) {
	tb.Helper()
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
			dirs = append(dirs, path)
		} else {
			files = append(files, path)
		}
		if perm := info.Mode().Perm(); perm&^want != 0 {
			tb.Errorf("%s is %v; want no permission beyond %v", path, perm, want)
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return files, dirs
}

// WarnsOnceOfOpenDir fails tb unless run, started on an existing data
// directory of mode 0755 (made under base; args gives the command line for
// a data directory), logs one WARN naming it as open to other local users.
func WarnsOnceOfOpenDir(tb testing.TB, run Run, base string, args func(dir string) []string) {
	tb.Helper()
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o700); err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(open, 0o755); err != nil {
		tb.Fatal(err)
	}
	out := RunOnce(tb, run, args(open))
	if n := strings.Count(out, "open to other local users"); n != 1 || !strings.Contains(out, "[WARN]") || !strings.Contains(out, open) {
		tb.Fatalf("an existing 0755 data directory: %d warnings, want 1 naming it:\n%s", n, out)
	}
}
