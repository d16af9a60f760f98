package metaserverd

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/cmd/internal/cli"
	"github.com/ferrymq/ferrymq/cmd/internal/clitest"
	"github.com/ferrymq/ferrymq/internal/testtls"
)

// secretFile is a 0600 file holding s.
func secretFile(t *testing.T, s string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(s+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// -raft-secret-file: with authorization or TLS on (a token cluster, a
// TLS-only cluster, both) a metaserver without it exits 2 saying the raft
// port needs it and how to make one; with it, the node starts. A weak
// secret, the cluster token's own file or the bootstrap admin's token is
// refused (exit 2), as is -raft-accept-cluster-key without a cluster
// token. Without authorization and TLS nothing is required.
func TestRaftSecretFlag(t *testing.T) {
	dir := t.TempDir()
	f := testtls.Cert(t, testtls.CA(t, dir), "m1", dir)
	tlsArgs := []string{"-tls-cert", f.Cert, "-tls-key", f.Key, "-tls-ca", f.CA}
	cluster, admin, secret := secretFile(t, auth.NewToken()), secretFile(t, auth.NewToken()), secretFile(t, auth.NewToken())
	tokenArgs := []string{"-auth-cluster-token-file", cluster, "-auth-admin-token-file", admin}
	base := func(more ...[]string) []string {
		args := []string{"-id", "m1", "-dir", t.TempDir(), "-rpc-addr", "127.0.0.1:0", "-raft-addr", "127.0.0.1:0"}
		for _, m := range more {
			args = append(args, m...)
		}
		return args
	}
	with := func(file string) []string { return []string{"-raft-secret-file", file} }
	const required = "-raft-secret-file is required with -auth-cluster-token-file or -tls-*"

	t.Run("dev mode needs none", func(t *testing.T) { clitest.Accepts(t, Run, base()) })
	for _, tc := range []struct {
		name     string
		security []string
	}{{"token cluster", tokenArgs}, {"TLS-only cluster", tlsArgs}, {"TLS and token cluster", append(append([]string{}, tokenArgs...), tlsArgs...)}} {
		t.Run(tc.name+" without a secret", func(t *testing.T) {
			clitest.Refuses(t, Run, base(tc.security), required, cli.ExitConfig)
		})
		t.Run(tc.name+" with a secret", func(t *testing.T) { clitest.Accepts(t, Run, base(tc.security, with(secret))) })
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a weak secret", base(tokenArgs, with(secretFile(t, "metaservers-only"))), "-raft-secret-file "},
		{"a missing file", base(tokenArgs, with(filepath.Join(dir, "missing"))), "-raft-secret-file: open "},
		{"the cluster token's file", base(tokenArgs, with(cluster)), "is the cluster token, which every broker holds"},
		{"the admin's token file", base(tokenArgs, with(admin)), "is the bootstrap admin's token"},
		{"the move without a cluster token", base(tlsArgs, with(secret), []string{"-raft-accept-cluster-key"}), "-raft-accept-cluster-key"},
	} {
		t.Run(tc.name, func(t *testing.T) { clitest.Refuses(t, Run, tc.args, tc.want, cli.ExitConfig) })
	}
	t.Run("the move", func(t *testing.T) {
		clitest.Accepts(t, Run, base(tokenArgs, with(secret), []string{"-raft-accept-cluster-key"}))
	})
}
