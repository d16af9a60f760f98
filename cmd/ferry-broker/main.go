// Command ferry-broker runs a ferrymq broker, master or slave of a group.
// See README.md for the flags.
package main

import (
	"github.com/ferrymq/ferrymq/cmd/internal/brokerd"
	"github.com/ferrymq/ferrymq/cmd/internal/cli"
)

func main() { cli.Main("ferry-broker", brokerd.Run) }
