//go:build !unix

package cli

// setUmask does nothing where there is no umask.
func setUmask(int) {}
