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
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/cmd/internal/cli"
	"github.com/ferrymq/ferrymq/internal/testtls"
	"github.com/ferrymq/ferrymq/tlsconf"
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

// TLSFlags checks the TLS flags every server takes (cli.TLSFlags): with a
// certificate named name, its key and a CA, run starts from the command
// line base makes; a certificate without its key, or a CA or key file that
// is not there, exits 2 naming the flag. It returns the files, for the
// program's own cases.
func TLSFlags(t *testing.T, run Run, name string, base func() []string) tlsconf.Files {
	t.Helper()
	dir := t.TempDir()
	f := testtls.Cert(t, testtls.CA(t, dir), name, dir)
	Accepts(t, run, append(base(), "-tls-cert", f.Cert, "-tls-key", f.Key, "-tls-ca", f.CA))
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a certificate without its key", []string{"-tls-cert", f.Cert, "-tls-ca", f.CA}, "-tls-cert and -tls-key"},
		{"a CA file that is not there", []string{"-tls-cert", f.Cert, "-tls-key", f.Key, "-tls-ca", missing}, "-tls-ca " + missing},
		{"a key file that is not there", []string{"-tls-cert", f.Cert, "-tls-key", missing}, "-tls-key " + missing},
	} {
		t.Run(tc.name, func(t *testing.T) { Refuses(t, run, append(base(), tc.args...), tc.want, cli.ExitConfig) })
	}
	return f
}
