// Package lint holds tests that enforce the architecture: which of the
// module's packages may import which (DESIGN.md section 2).
package lint
