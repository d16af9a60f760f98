package metaserverd

import (
	"path/filepath"
	"testing"

	"github.com/ferrymq/ferrymq/cmd/internal/cli"
	"github.com/ferrymq/ferrymq/cmd/internal/clitest"
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
	clitest.Accepts(t, Run, append(base(), "-tls-cert", f.Cert, "-tls-key", f.Key, "-tls-ca", f.CA))
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
		t.Run(tc.name, func(t *testing.T) { clitest.Refuses(t, Run, append(base(), tc.args...), tc.want, cli.ExitConfig) })
	}
}
