package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/cmd/internal/cli"
)

// The credential ferryctl presents to every server it dials (AUTH), on a
// cluster with authorization on: the token in --token-file, or else the
// token FERRY_TOKEN holds.

// addTokenFlags defines --token-file on the root's persistent flags.
func (g *globalOptions) addTokenFlags(pf *pflag.FlagSet) {
	pf.StringVar(&g.tokenFile, "token-file", "", "present the token in this file to the servers (default: the token in env FERRY_TOKEN)")
	g.checker(pf).name("token-file", "a file holding a token", func(s string) error {
		if s == "" {
			return errWant
		}
		return nil
	})
}

// loadToken reads the token before any network call: a file that cannot be
// read or does not hold a token is a usage error naming it; a file others
// than its owner may read or write is taken, with one warning line on
// stderr (as ssh does with keys).
func (g *globalOptions) loadToken(cmd *cobra.Command) error {
	g.token = ""
	if cmd.Annotations[offline] != "" {
		return nil
	}
	var from string
	var raw []byte
	switch {
	case g.tokenFile != "":
		b, mode, err := cli.ReadSecretFile(g.tokenFile)
		if err != nil {
			return usageError{fmt.Errorf("--token-file: %w", err)}
		}
		if mode&0o077 != 0 {
			fmt.Fprintf(cmd.ErrOrStderr(), "ferryctl: warning: --token-file %s has mode %#o: others than its owner can read or write it (chmod 600 it)\n", g.tokenFile, mode)
		}
		from, raw = "--token-file "+g.tokenFile, b
	case os.Getenv("FERRY_TOKEN") != "":
		from, raw = "FERRY_TOKEN", []byte(os.Getenv("FERRY_TOKEN"))
	default:
		return nil
	}
	tok, err := auth.ParseToken(raw)
	if err != nil {
		return usageError{fmt.Errorf("%s: %w", from, err)}
	}
	g.token = tok
	cmd.SetContext(withToken(cmd.Context(), tok))
	return nil
}

type tokenKey struct{}

// withToken gives the broker connections made under ctx (callBroker) the
// token.
func withToken(ctx context.Context, tok string) context.Context {
	if ctx == nil {
		ctx = context.Background()
	}
	return context.WithValue(ctx, tokenKey{}, tok)
}

// ctxToken is the token of the broker connections made under ctx.
func ctxToken(ctx context.Context) string {
	tok, _ := ctx.Value(tokenKey{}).(string)
	return tok
}
