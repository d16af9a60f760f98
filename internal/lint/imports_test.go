package lint

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/ferrymq/ferrymq"

// rules lists, per package (and its sub-packages, unless a longer entry names
// them), the module packages it may import. "*" allows anything.
var rules = map[string][]string{
	"protocol":           {},
	"storage":            {},
	"metaserver/api":     {"protocol", "routing"},
	"routing":            {"protocol"},
	"internal/transport": {"protocol"},
	"internal/tlsconf":   {},
	// The permission model: pure, so every side that checks or presents
	// credentials may import it.
	"auth":              {"protocol"},
	"metaserver/fsm":    {"protocol", "routing", "auth"},
	"metaserver/client": {"protocol", "routing", "internal/transport", "internal/clientcore", "metaserver/api", "auth"},
	// storage/vfs: MkdirAllDurable, for its data directory.
	"metaserver": {"metaserver/fsm", "metaserver/api", "metaserver/client", "protocol", "routing", "internal/transport", "auth", "storage/vfs"},
	"broker":     {"storage", "protocol", "routing", "internal/transport", "internal/clientcore", "metaserver/api", "metaserver/client", "auth"},
	"producer":   {"protocol", "routing", "internal/transport", "internal/clientcore", "sdkmetrics", "metaserver/api", "metaserver/client", "auth"},
	"consumer":   {"protocol", "routing", "internal/transport", "internal/clientcore", "sdkmetrics", "metaserver/api", "metaserver/client", "auth"},
	"cmd":        {"*"},
	// Measurement programs under scripts/ are users of the public packages.
	"scripts":           {"producer", "sdk", "protocol", "routing", "metaserver/api", "metaserver/client", "auth"},
	"internal/lint":     {},
	"internal/testlog":  {},
	"internal/testwait": {},
	// Reads Prometheus gatherers in tests (testOnly below).
	"internal/testmetrics": {},
	// TLS material for tests (testOnly below).
	"internal/testtls": {"internal/tlsconf"},
	// The test harness starts whole clusters; only tests may import it
	// (testOnly below).
	"internal/testcluster": {"broker", "metaserver", "metaserver/api", "metaserver/client", "internal/transport",
		"internal/testlog", "internal/testwait", "protocol", "routing", "storage", "auth"},
	"tests": {"*"},
	// The checks of the deployment files (tests only): they hold the
	// manifests against the programs' real flags and metrics.
	"deploy": {"*"},

	// The client core: the route cache, the connection pool, the option
	// and error core that the SDKs and the broker share (the consumer
	// writes dead letters through its sender, not the producer). It sits
	// below the metaserver client, which keeps its connections in the
	// core's pool.
	"internal/clientcore": {"protocol", "routing", "internal/transport", "sdkmetrics"},
	// The options every SDK client takes.
	"sdk": {"internal/clientcore", "sdkmetrics"},
	// The SDKs' metric events (a leaf), and their Prometheus exporter.
	"sdkmetrics":      {},
	"sdkmetrics/prom": {"sdkmetrics"},
}

// sdkForbidden lists the libraries the SDK packages (what an application
// links to produce or consume) may not import: they log through log/slog
// and report metrics through sdkmetrics' hooks, so an application picks its
// own logging and metrics libraries (sdkmetrics/prom is the Prometheus
// plugin, imported only by those who want it).
var sdkForbidden = map[string][]string{
	"producer":            {"github.com/prometheus/", "github.com/hashicorp/go-hclog"},
	"consumer":            {"github.com/prometheus/", "github.com/hashicorp/go-hclog"},
	"sdk":                 {"github.com/prometheus/", "github.com/hashicorp/go-hclog"},
	"sdkmetrics":          {"github.com/prometheus/", "github.com/hashicorp/go-hclog"},
	"internal/clientcore": {"github.com/prometheus/", "github.com/hashicorp/go-hclog"},
}

// testOnly are packages that only test files may import: a program or a
// library that imported them would start test clusters.
var testOnly = []string{"internal/testcluster", "internal/testlog", "internal/testwait", "internal/testmetrics", "internal/testtls"}

// ruleFor returns the rule key that governs pkg (a path inside the module):
// the longest key equal to pkg or a parent of it.
func ruleFor(pkg string) (string, bool) {
	best := ""
	for k := range rules {
		if (pkg == k || strings.HasPrefix(pkg, k+"/")) && len(k) > len(best) {
			best = k
		}
	}
	return best, best != ""
}

// allowed reports whether from may import to (both paths inside the module).
func allowed(from, to string) bool {
	if strings.HasPrefix(to, "cmd/internal/") {
		return strings.HasPrefix(from, "cmd/") // the programs' shared code
	}
	if strings.HasPrefix(to, "cmd/") || to == "cmd" {
		return false // nothing imports a program
	}
	key, ok := ruleFor(from)
	if !ok {
		return false
	}
	if toKey, ok := ruleFor(to); ok && toKey == key {
		return true // within one component
	}
	for _, a := range rules[key] {
		if a == "*" || to == a || strings.HasPrefix(to, a+"/") {
			return true
		}
	}
	return false
}

func TestAllowedMatchesDesign(t *testing.T) {
	cases := []struct {
		from, to string
		want     bool
	}{
		{"producer", "protocol", true},
		{"producer", "broker", false},
		{"producer", "storage", false},
		{"producer", "metaserver", false},
		{"producer", "metaserver/fsm", false},
		{"producer", "metaserver/client", true},
		{"broker", "storage", true},
		{"broker", "metaserver", false},
		{"storage", "protocol", false},
		{"storage", "storage/vfs", true},
		{"protocol", "routing", false},
		{"metaserver/fsm", "internal/transport", false},
		{"metaserver/fsm", "routing", true},
		{"metaserver/fsm", "auth", true},
		{"auth", "protocol", true},
		{"auth", "metaserver/fsm", false},
		{"auth", "internal/transport", false},
		{"broker", "auth", true},
		{"producer", "auth", true},
		{"metaserver", "metaserver/fsm", true},
		{"metaserver", "storage/vfs", true},
		{"metaserver", "storage", false},
		{"cmd/ferryctl", "producer", true},
		{"broker", "cmd/ferryctl", false},
		{"cmd/ferryctl", "cmd/internal/cli", true},
		{"producer", "cmd/internal/cli", false},
		{"unlisted", "protocol", false},
		{"consumer", "producer", false},
		{"consumer", "internal/clientcore", true},
		{"producer", "internal/clientcore", true},
		{"broker", "internal/clientcore", true},
		{"internal/clientcore", "metaserver/client", false},
		{"internal/clientcore", "producer", false},
		{"metaserver/client", "internal/clientcore", true},
		{"sdk", "internal/clientcore", true},
		{"sdk", "producer", false},
		{"sdkmetrics", "internal/clientcore", false},
		{"sdkmetrics/prom", "sdkmetrics", true},
		{"sdkmetrics/prom", "producer", false},
	}
	for _, c := range cases {
		if got := allowed(c.from, c.to); got != c.want {
			t.Errorf("allowed(%q, %q) = %v, want %v", c.from, c.to, got, c.want)
		}
	}
}

type listedPackage struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// TestForbiddenImports lists every package of the module with `go list` and
// fails on an import the rules do not allow, or on a package no rule covers.
func TestForbiddenImports(t *testing.T) {
	cmd := exec.Command("go", "list", "-json", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	var problems []string
	seen := 0
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		seen++
		from := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		if _, ok := ruleFor(from); !ok {
			problems = append(problems, "package "+from+" has no import rule: add it to rules")
			continue
		}
		for _, imp := range p.Imports {
			for _, lib := range sdkForbidden[from] {
				if strings.HasPrefix(imp, lib) {
					problems = append(problems, "the SDK package "+from+" imports "+imp)
				}
			}
			if imp != module && !strings.HasPrefix(imp, module+"/") {
				continue
			}
			to := strings.TrimPrefix(strings.TrimPrefix(imp, module), "/")
			if !allowed(from, to) {
				problems = append(problems, from+" imports "+to)
			}
			if slices.Contains(testOnly, to) && !slices.Contains(testOnly, from) {
				problems = append(problems, from+" imports the test-only "+to+" outside its tests")
			}
		}
		// Tests may import the test-only packages, but no program.
		for _, imp := range append(p.TestImports, p.XTestImports...) {
			to := strings.TrimPrefix(strings.TrimPrefix(imp, module), "/")
			if strings.HasPrefix(to, "cmd/") && !strings.HasPrefix(from, "cmd/") && from != "tests" && from != "deploy" {
				problems = append(problems, "tests of "+from+" import the program "+to)
			}
		}
	}
	if seen < 5 {
		t.Fatalf("go list found only %d packages", seen)
	}
	sort.Strings(problems)
	for _, p := range problems {
		t.Error("forbidden import: " + p)
	}
}
