package brokerd

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/cmd/internal/cli"
)

func TestBadSettingsFailClearly(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "not-a-dir")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cases := []struct {
		name string
		args []string
		want string
		code int
	}{
		{"missing id", []string{"-group", "g", "-dir", dir}, "ID is required", cli.ExitConfig},
		{"bad role", []string{"-id", "b", "-group", "g", "-dir", dir, "-role", "boss"}, "Role", cli.ExitConfig},
		{"bad flush", []string{"-id", "b", "-group", "g", "-dir", dir, "-flush", "sometimes"}, "flush mode", cli.ExitConfig},
		{"unknown flag", []string{"-frobnicate"}, "frobnicate", cli.ExitConfig},
		{"unusable dir", []string{"-id", "b", "-group", "g", "-dir", filepath.Join(file, "sub"), "-addr", "127.0.0.1:0"}, "directory", cli.ExitConfig},
		{"taken port", []string{"-id", "b", "-group", "g", "-dir", filepath.Join(dir, "d"), "-addr", taken.Addr().String(), "-ha-addr", "127.0.0.1:0"}, "address already in use", cli.ExitConfig},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Run(context.Background(), tc.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) || cli.ExitCode(err) != tc.code {
				t.Fatalf("got %v (exit %d), want an error naming %q with exit %d", err, cli.ExitCode(err), tc.want, tc.code)
			}
		})
	}
}
