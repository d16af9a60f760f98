package metaserver

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/ferrymq/ferrymq/storage/vfs"
)

// makeSnapshotDir makes the snapshot directory of raft's file snapshot
// store in dir, vfs.DirMode, unless it exists: the store would make it
// 0755 itself, and its snapshots' files as the umask lets it. Inside it no
// other local user reads the registry's state (raft.db is bbolt's 0600; the
// data directory vfs.DirMode).
func makeSnapshotDir(dir string) error {
	err := os.Mkdir(filepath.Join(dir, "snapshots"), vfs.DirMode)
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("metaserver: snapshot directory: %w", err)
	}
	return nil
}
