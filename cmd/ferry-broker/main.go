// Command ferry-broker runs a ferrymq broker, master or slave of a group.
// See README.md for the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/ferrymq/ferrymq/cmd/internal/brokerd"
	"github.com/ferrymq/ferrymq/cmd/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := brokerd.Run(ctx, os.Args[1:], os.Stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "ferry-broker:", err)
	}
	stop()
	os.Exit(cli.ExitCode(err))
}
