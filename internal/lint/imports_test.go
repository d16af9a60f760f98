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
	for _, a := range rules[key].imports {
		if a == "*" || to == a || strings.HasPrefix(to, a+"/") {
			return true
		}
	}
	return false
}

// edgeCase is an import from one package to another and what a check
// says of it.
type edgeCase struct {
	from, to string
	want     bool
}

// checkEdges fails t on every case that check, named name, answers
// otherwise.
func checkEdges(t *testing.T, name string, check func(from, to string) bool, cases []edgeCase) {
	t.Helper()
	for _, c := range cases {
		if got := check(c.from, c.to); got != c.want {
			t.Errorf("%s(%q, %q) = %v, want %v", name, c.from, c.to, got, c.want)
		}
	}
}

func TestAllowedMatchesDesign(t *testing.T) {
	checkEdges(t, "allowed", allowed, []edgeCase{
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
	})
}

type listedPackage struct {
	ImportPath   string
	Name         string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// listPackages lists every package of the module with `go list`.
func listPackages(t *testing.T) []listedPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	var pkgs []listedPackage
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 5 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	return pkgs
}

// inModule returns imp as a path inside the module, and whether it is one.
func inModule(imp string) (string, bool) {
	if imp != module && !strings.HasPrefix(imp, module+"/") {
		return "", false
	}
	return strings.TrimPrefix(strings.TrimPrefix(imp, module), "/"), true
}

// TestForbiddenImports lists every package of the module with `go list`
// and fails on an import the rules do not allow, or on a package no rule
// covers.
func TestForbiddenImports(t *testing.T) {
	var problems []string
	for _, p := range listPackages(t) {
		from, _ := inModule(p.ImportPath)
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
			to, ok := inModule(imp)
			if !ok {
				continue
			}
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
			if strings.HasPrefix(to, "cmd/") && !strings.HasPrefix(from, "cmd/") && from != "e2e" && from != "deploy" {
				problems = append(problems, "tests of "+from+" import the program "+to)
			}
		}
	}
	sort.Strings(problems)
	for _, p := range problems {
		t.Error("forbidden import: " + p)
	}
}

// layerOf is the layer of pkg (a path inside the module); ok is false for
// a package no rule covers (TestForbiddenImports names those).
func layerOf(pkg string) (layer int, ok bool) {
	key, ok := ruleFor(pkg)
	return rules[key].layer, ok
}

// upward reports whether from importing to runs from a lower layer up to a
// higher one.
func upward(from, to string) bool {
	lf, okf := layerOf(from)
	lt, okt := layerOf(to)
	return okf && okt && lf < lt
}

// upwardImports lists every import of pkgs that runs up: the imports of
// each package's code and of its in-package tests. External test packages
// (package x_test) are packages of their own above everything, and may
// import anything the rules allow their tests.
func upwardImports(pkgs []listedPackage) []string {
	var up []string
	for _, p := range pkgs {
		from, _ := inModule(p.ImportPath)
		for _, imp := range p.Imports {
			if to, ok := inModule(imp); ok && upward(from, to) {
				up = append(up, from+" imports "+to)
			}
		}
		for _, imp := range p.TestImports {
			if to, ok := inModule(imp); ok && upward(from, to) {
				up = append(up, "the tests of "+from+" (package "+p.Name+") import "+to)
			}
		}
	}
	sort.Strings(up)
	return up
}

// TestNoUpwardImports fails on every import, by a package or by its
// in-package tests, from a lower layer up to a higher one.
func TestNoUpwardImports(t *testing.T) {
	up := upwardImports(listPackages(t))
	for _, u := range up {
		t.Errorf("upward import: %s", u)
	}
	if len(up) > 0 {
		t.Errorf("%d imports run from a lower layer up to a higher one: move the code, or the importer's tests to an external test package", len(up))
	}
}

func TestUpward(t *testing.T) {
	checkEdges(t, "upward", upward, []edgeCase{
		{"broker", "protocol", false},
		{"protocol", "routing", true},
		{"storage/vfs", "storage", false},
		{"internal/testcluster", "broker", false},
		{"broker", "internal/testcluster", true},
		{"metaserver/client", "internal/testcluster", true},
		{"producer", "internal/testcluster", false},
		{"producer", "broker", false},
		{"broker", "producer", true},
		{"internal/loadgen", "consumer", false},
		{"consumer", "internal/loadgen", true},
		{"cmd/ferryctl", "internal/loadgen", false},
		{"cmd/internal/cli", "e2e", true},
		{"unlisted", "e2e", false},
	})
}

// TestRulesPointDown: no rule allows an import of a higher layer, so the
// two checks never contradict each other.
func TestRulesPointDown(t *testing.T) {
	for key, r := range rules {
		for _, a := range r.imports {
			if a == "*" {
				continue
			}
			if l, ok := layerOf(a); !ok {
				t.Errorf("%s may import %s, which no rule covers", key, a)
			} else if l > r.layer {
				t.Errorf("%s (layer %d) may import %s (layer %d): a rule that points up", key, r.layer, a, l)
			}
		}
		if r.job == "" {
			t.Errorf("%s has no job: DESIGN.md's table shows it", key)
		}
	}
}
