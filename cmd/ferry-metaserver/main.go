// Command ferry-metaserver runs one node of ferrymq's Raft-replicated
// routing registry. See README.md for the flags.
package main

import (
	"github.com/ferrymq/ferrymq/cmd/internal/cli"
	"github.com/ferrymq/ferrymq/cmd/internal/metaserverd"
)

func main() { cli.Main("ferry-metaserver", metaserverd.Run) }
