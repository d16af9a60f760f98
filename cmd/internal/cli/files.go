package cli

import (
	"io/fs"
	"os"

	"github.com/hashicorp/go-hclog"
)

// Umask is the file-mode creation mask the servers run with (Main sets
// it): what they create is at most 0640 (files) and 0750 (directories),
// whatever the shell's mask. The commit log and the Raft store ask for
// less themselves (0600 and 0700); the mask bounds what libraries create
// as they please (raft's snapshots).
const Umask = 0o027

// WarnOpenDataDir logs one warning when the data directory dir exists and
// other local users may read or enter it (any of its "other" permission
// bits set): what the server creates inside is theirs to read only if a
// directory on the way lets them. A directory that does not exist yet is
// created without those bits, and said nothing of.
func WarnOpenDataDir(log hclog.Logger, flag, dir string) {
	st, err := os.Stat(dir)
	if err != nil || !st.IsDir() {
		return
	}
	if mode := st.Mode().Perm(); mode&0o007 != 0 {
		log.Warn("the data directory is open to other local users: they may read its files; chmod o-rwx it (0750 or 0700)",
			"flag", flag, "dir", dir, "mode", fs.FileMode(mode).String())
	}
}
