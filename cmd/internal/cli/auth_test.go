package cli

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/auth"
)

func TestAuthFlags(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	clusterTok, adminTok := auth.NewToken(), auth.NewToken()
	cluster, admin := file("cluster", clusterTok+"\n"), file("admin", "  "+adminTok+"\n")
	parse := func(args ...string) (string, auth.Builtins, error) {
		var f AuthFlags
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		f.Register(fs, true)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return f.Builtins()
	}
	if tok, b, err := parse(); err != nil || tok != "" || b != (auth.Builtins{}) {
		t.Fatalf("no flags: %q %v %v; want authorization off", tok, b, err)
	}
	tok, b, err := parse("-auth-cluster-token-file", cluster, "-auth-admin-token-file", admin)
	if err != nil || tok != clusterTok || b.Cluster != auth.HashToken(clusterTok) || b.Admin != auth.HashToken(adminTok) {
		t.Fatalf("both files: %q %v %v", tok, b, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-auth-admin-token-file", admin}, "-auth-admin-token-file needs -auth-cluster-token-file"},
		{[]string{"-auth-cluster-token-file", filepath.Join(dir, "missing")}, "-auth-cluster-token-file: open "},
		{[]string{"-auth-cluster-token-file", file("short", "abc")}, "-auth-cluster-token-file " + filepath.Join(dir, "short") + ": a token must be 32 to 512 characters"},
		{[]string{"-auth-cluster-token-file", cluster, "-auth-admin-token-file", cluster}, "hold the same token"},
	} {
		_, _, err := parse(c.args...)
		var ce *ConfigError
		if err == nil || !strings.Contains(err.Error(), c.want) || !asConfigError(err, &ce) {
			t.Errorf("%v: %v; want a ConfigError saying %q", c.args, err, c.want)
		}
	}
}

func asConfigError(err error, ce **ConfigError) bool {
	e, ok := err.(*ConfigError)
	*ce = e
	return ok
}
