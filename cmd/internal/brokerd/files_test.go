package brokerd

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/cmd/internal/clitest"
)

// TestDataFilesArePrivate: a broker started on a new data directory makes
// it, and what it writes in it, for its owner alone, and warns of nothing;
// one started on an existing directory others may read warns once.
func TestDataFilesArePrivate(t *testing.T) {
	base := t.TempDir()
	args := func(dir string) []string {
		return []string{"-id", "b", "-group", "g", "-dir", dir, "-addr", "127.0.0.1:0", "-ha-addr", "127.0.0.1:0", "-meta", "127.0.0.1:1"}
	}
	fresh := filepath.Join(base, "data", "b")
	if out := clitest.RunOnce(t, Run, args(fresh)); strings.Contains(out, "open to other local users") {
		t.Fatalf("a new data directory was warned of:\n%s", out)
	}
	if files, _ := clitest.PrivateTree(t, filepath.Join(base, "data")); len(files) == 0 {
		t.Fatal("the broker wrote no file")
	}
	clitest.WarnsOnceOfOpenDir(t, Run, base, args)
}
