package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/auth"
)

// A --token-file others than its owner may read or write is used, with one
// warning line on stderr naming it and its mode; a 0600 file gets none.
func TestLooseTokenFileWarns(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		mode os.FileMode
		warn string
	}{
		{0o600, ""},
		{0o400, ""},
		{0o644, "0644"},
		{0o604, "0604"},
	} {
		p := filepath.Join(dir, "token-"+c.mode.String())
		tok := auth.NewToken()
		if err := os.WriteFile(p, []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, c.mode); err != nil {
			t.Fatal(err)
		}
		var errOut bytes.Buffer
		cmd := &cobra.Command{}
		cmd.SetErr(&errOut)
		cmd.SetContext(context.Background())
		g := &globalOptions{tokenFile: p}
		if err := g.loadToken(cmd); err != nil || g.token != tok {
			t.Fatalf("mode %v: %v, token %q; want the file's token", c.mode, err, g.token)
		}
		got := errOut.String()
		if c.warn == "" {
			if got != "" {
				t.Errorf("mode %v: stderr %q, want nothing", c.mode, got)
			}
			continue
		}
		if strings.Count(got, "\n") != 1 || !strings.HasPrefix(got, "ferryctl: warning: ") ||
			!strings.Contains(got, p) || !strings.Contains(got, "mode "+c.warn) {
			t.Errorf("mode %v: stderr %q, want one warning line naming %s and mode %s", c.mode, got, p, c.warn)
		}
	}
}
