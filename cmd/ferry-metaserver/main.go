// Command ferry-metaserver runs one node of ferrymq's Raft-replicated
// routing registry. See README.md for the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/ferrymq/ferrymq/cmd/internal/cli"
	"github.com/ferrymq/ferrymq/cmd/internal/metaserverd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := metaserverd.Run(ctx, os.Args[1:], os.Stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "ferry-metaserver:", err)
	}
	stop()
	os.Exit(cli.ExitCode(err))
}
