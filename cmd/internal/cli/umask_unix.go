//go:build unix

package cli

import "syscall"

// setUmask sets the process's file-mode creation mask.
func setUmask(mask int) { syscall.Umask(mask) }
