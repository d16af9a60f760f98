package cli

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

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
		{[]string{"-auth-cluster-token-file", cluster, "-auth-admin-token-file", file("weak", strings.Repeat("a", 32))},
			"-auth-admin-token-file " + filepath.Join(dir, "weak") + ": a token must hold at least 8 distinct characters; this one has 1"},
		{[]string{"-auth-cluster-token-file", file("weak2", strings.Repeat("0123", 10))}, "at least 8 distinct characters; this one has 4"},
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

// A token file others than its owner may read or write is taken, with one
// WARN line naming the file and its mode; a 0600 file gets none.
func TestLooseTokenFileWarns(t *testing.T) {
	dir := t.TempDir()
	file := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(auth.NewToken()+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tight, loose, group := file("tight", 0o600), file("loose", 0o644), file("group", 0o640)
	run := func(args ...string) string {
		t.Helper()
		var f AuthFlags
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		f.Register(fs, true)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if _, _, err := f.Builtins(); err != nil {
			t.Fatalf("%v: %v (a loose file must not be refused)", args, err)
		}
		var out bytes.Buffer
		f.LogWarnings(hclog.New(&hclog.LoggerOptions{Output: &out}))
		return out.String()
	}
	if out := run("-auth-cluster-token-file", tight); out != "" {
		t.Fatalf("a 0600 token file logged: %q", out)
	}
	out := run("-auth-cluster-token-file", loose, "-auth-admin-token-file", group)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("want one line per loose file, got %q", out)
	}
	for i, want := range []struct{ file, mode string }{{loose, "0644"}, {group, "0640"}} {
		if l := lines[i]; !strings.Contains(l, "[WARN]") || !strings.Contains(l, "file="+want.file) || !strings.Contains(l, "mode="+want.mode) {
			t.Errorf("line %q: want a WARN naming file=%s mode=%s", l, want.file, want.mode)
		}
	}
}
