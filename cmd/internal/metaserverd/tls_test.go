package metaserverd

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/cmd/internal/cli"
	"github.com/ferrymq/ferrymq/internal/testtls"
)

// The TLS flags: a metaserver with a certificate, its key and a CA starts; a
// missing file, a certificate without its key or no CA (raft authenticates
// its peers by their certificates) exits 2 naming the flag.
func TestTLSFlags(t *testing.T) {
	dir := t.TempDir()
	f := testtls.Cert(t, testtls.CA(t, dir), "m1", dir)
	base := func() []string {
		return []string{"-id", "m1", "-dir", t.TempDir(), "-rpc-addr", "127.0.0.1:0", "-raft-addr", "127.0.0.1:0"}
	}
	// A done context: an accepted setting starts the node and stops it.
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Run(done, append(base(), "-tls-cert", f.Cert, "-tls-key", f.Key, "-tls-ca", f.CA), io.Discard); err != nil {
		t.Fatalf("a metaserver with -tls-cert, -tls-key and -tls-ca: %v", err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		// Raft over TLS authenticates the peers by their certificates.
		{"no CA", []string{"-tls-cert", f.Cert, "-tls-key", f.Key}, "-tls-ca"},
		{"a certificate without its key", []string{"-tls-cert", f.Cert, "-tls-ca", f.CA}, "-tls-cert and -tls-key"},
		{"a CA file that is not there", []string{"-tls-cert", f.Cert, "-tls-key", f.Key, "-tls-ca", missing}, "-tls-ca " + missing},
		{"a key file that is not there", []string{"-tls-cert", f.Cert, "-tls-key", missing}, "-tls-key " + missing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Run(done, append(base(), tc.args...), io.Discard)
			if err == nil || cli.ExitCode(err) != cli.ExitConfig || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v (exit %d), want a config error naming %q (exit 2)", err, cli.ExitCode(err), tc.want)
			}
		})
	}
}
