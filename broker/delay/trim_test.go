package delay

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// TestCloseAfterTruncate: the log is cut behind what the index followed
// (and trimmed its journal to) and the index is closed before it follows
// again: the checkpoint Close writes (if any) is one the next Open uses,
// not one whose queue offsets are past the log's, which makes Open
// rebuild the whole index.
func TestCloseAfterTruncate(t *testing.T) {
	dir := t.TempDir()
	l := openTestLog(t, filepath.Join(dir, "log"), 0)
	defer l.Close()
	clk := &clock{now: time.UnixMilli(1_800_000_000_000)}
	var logs bytes.Buffer
	cfg := Config{Log: l, Dir: filepath.Join(dir, "delay"), Now: clk.Now, Logger: hclog.New(&hclog.LoggerOptions{Output: &logs})}
	x, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	due := clk.now.UnixMilli() + 5_000
	p := appendLog(t, l, true, delayedEntry("t", 0, due, -1), delayedEntry("t", 0, due, -1), delayedEntry("t", 0, due, -1))
	if err := x.Follow(); err != nil || x.Pending("") != 3 {
		t.Fatalf("follow: %v, pending %d", err, x.Pending(""))
	}
	if _, err := l.Truncate(p[1].LogOffset, sideFile(dir, p[1].LogOffset)); err != nil {
		t.Fatal(err)
	}
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	if x, err = Open(cfg); err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if x.Pending("") != 1 {
		t.Fatalf("reopened: pending %d, want 1", x.Pending(""))
	}
	if strings.Contains(logs.String(), "rebuilding") {
		t.Fatalf("the checkpoint written at Close was refused: %s", logs.String())
	}
}
