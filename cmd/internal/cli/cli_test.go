package cli

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
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

// TestVersionFlag: -version on a server stops before anything starts and
// exits 0; the line names the program, the version set at build time
// ("devel" in a plain build) and the Go that built it; it is not a setting
// a config file may carry.
func TestVersionFlag(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Int("port", 1, "")
	err := Parse(fs, []string{"-port", "9", "-version"})
	if !errors.Is(err, ErrVersion) || ExitCode(err) != ExitOK {
		t.Fatalf("-version: %v (exit %d), want ErrVersion and exit 0", err, ExitCode(err))
	}
	if line := VersionLine("ferry-broker"); !strings.HasPrefix(line, "ferry-broker "+Version+" (go") {
		t.Fatalf("version line %q", line)
	}
	file := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(file, []byte(`{"version": true}`), 0o644); err != nil {
		t.Fatal(err)
	}
	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if err := Parse(fs, []string{"-config", file}); ExitCode(err) != ExitConfig {
		t.Fatalf("a config file with version: %v, want a config error", err)
	}
}
