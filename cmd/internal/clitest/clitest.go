// Package clitest runs the server programs' Run in tests, with a context
// that is already done: a command line Run accepts starts the server and
// stops it at once (Run returns nil), so a setting wrongly accepted fails
// the test instead of hanging it.
//
// It is imported only from tests (an import rule in internal/lint says so).
package clitest

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/cmd/internal/cli"
)

// Run is a server program's Run (brokerd.Run, metaserverd.Run).
type Run func(ctx context.Context, args []string, stderr io.Writer) error

// done returns a context that is already done.
func done() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// Accepts fails tb unless run starts with args and stops cleanly.
func Accepts(tb testing.TB, run Run, args []string) {
	tb.Helper()
	if err := run(done(), args, io.Discard); err != nil {
		tb.Fatalf("%q: %v; want the server to start", args, err)
	}
}

// Refuses fails tb unless run refuses args with an error that names want
// and has the exit code code.
func Refuses(tb testing.TB, run Run, args []string, want string, code int) {
	tb.Helper()
	err := run(done(), args, io.Discard)
	if err == nil || !strings.Contains(err.Error(), want) || cli.ExitCode(err) != code {
		tb.Fatalf("%q: got %v (exit %d), want an error naming %q with exit %d", args, err, cli.ExitCode(err), want, code)
	}
}
