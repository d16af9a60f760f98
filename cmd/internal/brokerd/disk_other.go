//go:build !(linux || darwin || freebsd)

package brokerd

import "errors"

func diskSpace(string) (avail, size uint64, err error) {
	return 0, 0, errors.New("disk space: not supported on this system")
}
