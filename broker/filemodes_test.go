package broker

import (
	"os"
	"path/filepath"
	"testing"
)

// TestOwnFilesArePrivate: the files the broker writes itself, beside the
// commit log, are for its owner alone: the epoch file 0600, a failover
// tail's marker 0600 in a 0700 directory.
func TestOwnFilesArePrivate(t *testing.T) {
	dir := t.TempDir()
	if err := (localEpochs{{Epoch: 1, Start: 0, Master: "b1"}}).save(dir); err != nil {
		t.Fatal(err)
	}
	side := filepath.Join(dir, "truncated", "cut.log")
	h := &tailHandover{}
	if err := h.mark(side); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{
		filepath.Join(dir, epochFile): 0o600, side + replayMarker: 0o600, filepath.Dir(side): 0o700,
	} {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if perm := st.Mode().Perm(); perm&^want != 0 {
			t.Errorf("%s is %v; want no permission beyond %v", path, perm, want)
		}
	}
}
