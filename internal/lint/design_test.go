package lint

import (
	"bytes"
	"cmp"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the import table in DESIGN.md from the rules")

// The import table in DESIGN.md stands between these markers.
const (
	designFile  = "../../DESIGN.md"
	tableBegin  = "<!-- imports:begin -->"
	tableEnd    = "<!-- imports:end -->"
	regenerate  = "go test ./internal/lint -run TestDesignImportTable -update"
	tableHeader = "| layer | package | job | may import (inside the module) |\n|---|---|---|---|\n"
)

// importTable renders the rules as DESIGN.md shows them: one row per
// rule, lowest layer first, then the rules no row can show.
func importTable() string {
	keys := make([]string, 0, len(rules))
	for k := range rules {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Or(cmp.Compare(rules[a].layer, rules[b].layer), cmp.Compare(a, b))
	})
	var b strings.Builder
	fmt.Fprintf(&b, "<!-- Generated from internal/lint/rules_test.go by `%s`: edit the rules, not this table. -->\n", regenerate)
	b.WriteString(tableHeader)
	for _, k := range keys {
		r := rules[k]
		job := r.job
		if slices.Contains(testOnly, k) {
			job += "; only tests may import it"
		}
		may := "nothing"
		if len(r.imports) > 0 {
			names := make([]string, len(r.imports))
			for i, a := range r.imports {
				names[i] = "`" + a + "`"
				if a == "*" {
					names[i] = "anything"
				}
			}
			may = strings.Join(names, ", ")
		}
		fmt.Fprintf(&b, "| %d | `%s` | %s | %s |\n", r.layer, k, job, may)
	}
	b.WriteString("\nA row covers the package's sub-packages unless a row names them, and a package may import its own\n" +
		"sub-packages. Only `cmd/...` imports `cmd/internal/...`; nothing imports a program. No package imports one of a\n" +
		"higher layer, in its code or in its in-package tests; an external test package (`package x_test`) is a package\n" +
		"above everything and may. `internal/lint` checks all of this (`TestForbiddenImports`, `TestNoUpwardImports`).\n")
	return b.String()
}

// TestDesignImportTable fails when the import table in DESIGN.md is not
// the one the rules make; with -update it rewrites the table.
func TestDesignImportTable(t *testing.T) {
	doc, err := os.ReadFile(designFile)
	if err != nil {
		t.Fatal(err)
	}
	begin, end := bytes.Index(doc, []byte(tableBegin)), bytes.Index(doc, []byte(tableEnd))
	if begin < 0 || end < begin || bytes.Count(doc, []byte(tableBegin)) != 1 || bytes.Count(doc, []byte(tableEnd)) != 1 {
		t.Fatalf("DESIGN.md must hold the import table between one %s and one %s after it", tableBegin, tableEnd)
	}
	from := begin + len(tableBegin)
	got, want := string(doc[from:end]), "\n"+importTable()
	if got == want {
		return
	}
	if *update {
		out := append(append(append([]byte{}, doc[:from]...), want...), doc[end:]...)
		if err := os.WriteFile(designFile, out, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote the import table in %s", designFile)
		return
	}
	t.Errorf("the import table in DESIGN.md is not the rules' (run `%s`):\n%s", regenerate, lineDiff(got, want))
}

// lineDiff lists the lines only in got (-) and only in want (+).
func lineDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	var b strings.Builder
	for _, l := range g {
		if !slices.Contains(w, l) {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range w {
		if !slices.Contains(g, l) {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}
