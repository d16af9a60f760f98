package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ferrymq/ferrymq/cmd/internal/cli"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/tlsconf"
)

// tlsOptions are the global TLS flags: with any of them ferryctl speaks TLS
// to every server it dials (metaservers, and brokers for send, read,
// consume, bench and the group commands).
type tlsOptions struct {
	ca, cert, key string
	config        *tls.Config // made from the flags before a command runs; nil: no TLS
}

// tlsFlagNames are the TLS flags, in the order their files are checked.
var tlsFlagNames = []string{"tls-ca", "tls-cert", "tls-key"}

// addTLSFlags defines --tls-ca, --tls-cert and --tls-key on the root's
// persistent flags.
func (g *globalOptions) addTLSFlags(pf *pflag.FlagSet) {
	pf.StringVar(&g.tls.ca, "tls-ca", "", "speak TLS, verifying the servers with this PEM CA certificate (env FERRY_TLS_CA)")
	pf.StringVar(&g.tls.cert, "tls-cert", "", "PEM client certificate, for servers that require one; needs --tls-key (env FERRY_TLS_CERT)")
	pf.StringVar(&g.tls.key, "tls-key", "", "PEM private key of --tls-cert (env FERRY_TLS_KEY)")
	c := g.checker(pf)
	for _, name := range tlsFlagNames {
		c.wrap(name, "a PEM file", func(s string) error {
			if s == "" {
				return errWant
			}
			return nil
		})
	}
}

// offline marks a command that dials nothing (it reads or writes local
// files): the TLS flags are not loaded for it, so that `certs` can make
// the files FERRY_TLS_* name.
const offline = "ferryctl.offline"

// loadTLS makes the TLS client config from the flags (set from the command
// line or the environment by now), before any network call: a file that is
// missing, unreadable or does not hold what its flag says, or a
// certificate without its key, is a usage error naming the flag.
func (g *globalOptions) loadTLS(cmd *cobra.Command) error {
	g.tls.config = nil
	if cmd.Annotations[offline] != "" {
		return nil
	}
	t := &g.tls
	if t.ca == "" && t.cert == "" && t.key == "" {
		return nil
	}
	if (t.cert == "") != (t.key == "") {
		return usageError{fmt.Errorf("%s and %s go together: a client certificate needs its private key", tlsLabel("tls-cert", ""), tlsLabel("tls-key", ""))}
	}
	if err := cli.CheckTLSFiles(t.cert, t.key, t.ca, tlsLabel); err != nil {
		return usageError{err}
	}
	cfg, err := tlsconf.Files{Cert: t.cert, Key: t.key, CA: t.ca}.Client()
	if err != nil {
		return usageError{err}
	}
	t.config = cfg
	cmd.SetContext(withBrokerTLS(cmd.Context(), cfg))
	return nil
}

// tlsLabel names a TLS flag and its file in a message: "--tls-ca FILE", or
// "FERRY_TLS_CA=FILE" when the value is the environment's.
func tlsLabel(flag, path string) string {
	if v, ok := os.LookupEnv(envName(flag)); ok && v == path && path != "" {
		return envName(flag) + "=" + shown(path)
	}
	if path == "" {
		return "--" + flag
	}
	return "--" + flag + " " + shown(path)
}

type brokerTLSKey struct{}

// withBrokerTLS gives the broker connections made under ctx (callBroker)
// the TLS config.
func withBrokerTLS(ctx context.Context, cfg *tls.Config) context.Context {
	if ctx == nil {
		ctx = context.Background()
	}
	return context.WithValue(ctx, brokerTLSKey{}, cfg)
}

// brokerTLS is the TLS config of the broker connections made under ctx.
func brokerTLS(ctx context.Context) *tls.Config {
	cfg, _ := ctx.Value(brokerTLSKey{}).(*tls.Config)
	return cfg
}

// explainTLSRefusal turns a server's refusal of a plaintext connection (its
// port requires TLS), or a handshake that failed for the TLS settings
// (transport.ErrTLSMismatch), into a usage error that says which flags
// ferryctl needs; other errors pass.
func explainTLSRefusal(err error) error {
	if errors.Is(err, transport.ErrTLSMismatch) {
		// Known at the first handshake (a CA against a plaintext server,
		// no client certificate where one is required, a CA that did not
		// sign the server's certificate): the flags are wrong, exit 2.
		return usageError{fmt.Errorf("%w; ferryctl's --tls-ca, --tls-cert and --tls-key (or FERRY_TLS_*) do not match the cluster's TLS settings", err)}
	}
	var pe *protocol.Error
	if err == nil || !errors.As(err, &pe) || pe.Status != protocol.StatusNotAuthorized {
		return err
	}
	addr, _, ok := strings.Cut(pe.Message, " requires TLS")
	if !ok {
		return err
	}
	return usageError{fmt.Errorf("%s requires TLS: give ferryctl the cluster's CA with --tls-ca (or FERRY_TLS_CA), and a client certificate with --tls-cert and --tls-key when the servers require one", addr)}
}
