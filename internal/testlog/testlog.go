// Package testlog gives tests a logger that is silent unless FERRY_TEST_LOG
// is set, when it writes to stderr at debug level.
package testlog

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"

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

// Capture is a logger at level whose lines a test reads back while other
// goroutines log.
type Capture struct {
	hclog.Logger
	name  string
	level hclog.Level
	mu    sync.Mutex
	buf   bytes.Buffer
}

// NewCapture returns a logger that keeps what it is told at level or above.
func NewCapture(name string, level hclog.Level) *Capture {
	c := &Capture{name: name, level: level}
	c.Logger = hclog.New(&hclog.LoggerOptions{Name: name, Output: (*captureWriter)(c), Level: level})
	return c
}

// Slog returns a log/slog logger (an SDK's) whose lines the capture keeps
// too, at the capture's level or above.
func (c *Capture) Slog() *slog.Logger {
	level := slog.LevelInfo
	switch {
	case c.level <= hclog.Debug:
		level = slog.LevelDebug
	case c.level == hclog.Warn:
		level = slog.LevelWarn
	case c.level >= hclog.Error:
		level = slog.LevelError
	}
	return slog.New(slog.NewTextHandler((*captureWriter)(c), &slog.HandlerOptions{Level: level})).With("logger", c.name)
}

type captureWriter Capture

func (w *captureWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// Lines returns the lines logged so far that contain substr.
func (c *Capture) Lines(substr string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, line := range strings.Split(c.buf.String(), "\n") {
		if line != "" && strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return out
}
