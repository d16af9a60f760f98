//go:build linux || darwin || freebsd

package brokerd

import "syscall"

// diskSpace returns the bytes free for an unprivileged user and the size of
// the file system holding dir.
func diskSpace(dir string) (avail, size uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	return uint64(st.Bavail) * uint64(st.Bsize), uint64(st.Blocks) * uint64(st.Bsize), nil
}
