package cli

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestParseConfigFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.json")
	if err := os.WriteFile(file, []byte(`{"name": "from-file", "port": 9, "on": true}`), 0o644); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	name := fs.String("name", "default", "")
	port := fs.Int("port", 1, "")
	on := fs.Bool("on", false, "")
	if err := Parse(fs, []string{"-config", file, "-port", "7"}); err != nil {
		t.Fatal(err)
	}
	if *name != "from-file" || *port != 7 || !*on {
		t.Fatalf("got name=%q port=%d on=%v; the file fills what the command line left, and the command line wins", *name, *port, *on)
	}

	for body, want := range map[string]string{`{"nope": 1}`: "unknown setting", `{"port": "x"}`: "port", `not json`: "config file"} {
		if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.Int("port", 1, "")
		err := Parse(fs, []string{"-config", file})
		var ce *ConfigError
		if !errors.As(err, &ce) || ExitCode(err) != ExitConfig {
			t.Fatalf("%s: got %v (exit %d), want a config error naming %q", body, err, ExitCode(err), want)
		}
	}
	if ExitCode(nil) != ExitOK || ExitCode(errors.New("x")) != ExitError || ExitCode(flag.ErrHelp) != ExitOK {
		t.Fatal("exit codes")
	}
}
