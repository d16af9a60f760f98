// Package testlog gives tests a logger that is silent unless FERRY_TEST_LOG
// is set, when it writes to stderr at debug level.
package testlog

import (
	"io"
	"os"

	"github.com/hashicorp/go-hclog"
)

// New returns a named test logger.
func New(name string) hclog.Logger {
	var out io.Writer = io.Discard
	if os.Getenv("FERRY_TEST_LOG") != "" {
		out = os.Stderr
	}
	return hclog.New(&hclog.LoggerOptions{Name: name, Output: out, Level: hclog.Debug})
}
