package metaserverd

import (
	"testing"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/cmd/internal/cli"
	"github.com/ferrymq/ferrymq/cmd/internal/clitest"
)

// The TLS flags: a metaserver with a certificate, its key and a CA (and
// its raft secret) starts; a missing file, a certificate without its key or
// no CA (raft authenticates its peers by their certificates) exits 2
// naming the flag.
func TestTLSFlags(t *testing.T) {
	secret := secretFile(t, auth.NewToken())
	base := func() []string {
		return []string{"-id", "m1", "-dir", t.TempDir(), "-rpc-addr", "127.0.0.1:0", "-raft-addr", "127.0.0.1:0", "-raft-secret-file", secret}
	}
	f := clitest.TLSFlags(t, Run, "m1", base)
	// Raft over TLS authenticates the peers by their certificates.
	t.Run("no CA", func(t *testing.T) {
		clitest.Refuses(t, Run, append(base(), "-tls-cert", f.Cert, "-tls-key", f.Key), "-tls-ca", cli.ExitConfig)
	})
}
