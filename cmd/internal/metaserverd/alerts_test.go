package metaserverd

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestAlertRules runs the unit tests of the Prometheus alert rules
// (deploy/prometheus/alerts_test.yml) with promtool: a disk filling
// towards its retention with most of it free does not fire
// FerrymqDiskFillingUp, the same trend under 40% free does, and a master
// without a slave is a warning. It needs promtool (on PATH, from Debian's
// prometheus package as .ci/run installs it, or in $(go env GOPATH)/bin)
// and is skipped without it, unless CI is set.
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		gopath := os.Getenv("GOPATH")
		if gopath == "" {
			home, _ := os.UserHomeDir()
			gopath = filepath.Join(home, "go")
		}
		promtool = filepath.Join(gopath, "bin", "promtool")
		if _, err := os.Stat(promtool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatal("no promtool on PATH or in GOPATH/bin, and CI is set: .ci/run installs it")
			}
			t.Skip("no promtool on PATH or in GOPATH/bin")
		}
	}
	out, err := exec.Command(promtool, "test", "rules", filepath.Join("..", "..", "..", "deploy", "prometheus", "alerts_test.yml")).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}
