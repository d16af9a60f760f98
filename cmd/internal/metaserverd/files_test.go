package metaserverd

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/cmd/internal/clitest"
)

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
	if out := clitest.RunOnce(t, Run, args(fresh)); strings.Contains(out, "open to other local users") {
		t.Fatalf("a new data directory was warned of:\n%s", out)
	}
	files, dirs := clitest.PrivateTree(t, filepath.Join(base, "data"))
	seen := map[string]bool{}
	for _, p := range append(files, dirs...) {
		seen[filepath.Base(p)] = true
	}
	if !seen["raft.db"] || !seen["snapshots"] {
		t.Fatalf("the node made %v; want raft.db and snapshots", seen)
	}
	clitest.WarnsOnceOfOpenDir(t, Run, base, args)
}
