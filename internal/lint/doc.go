// Package lint holds tests that enforce the architecture: each package's
// layer and which of the module's packages it may import (rules_test.go),
// and that DESIGN.md's import table is the one the rules make.
package lint

//go:generate go test -run TestDesignImportTable -update
