package main

import (
	"strings"
	"testing"
)

// TestMissingQueueExitCode: a queue the topic does not have is bad usage,
// exit 2 with the same message, for read and for group reset-offsets alike
// (docs/ferryctl.md's exit-code table).
func TestMissingQueueExitCode(t *testing.T) {
	meta := "--meta=" + startCluster(t)
	mustCtl(t, meta, "topic", "create", "orders", "--queues", "2")
	for _, args := range [][]string{
		{"read", "orders", "--queue", "7"},
		{"group", "reset-offsets", "readers", "--topic", "orders", "--to-earliest", "--queues", "7", "--create"},
	} {
		code, _, errOut := ctl(append([]string{meta}, args...)...)
		if code != exitUsage || !strings.Contains(errOut, "topic orders has 2 queues; no queue 7") {
			t.Errorf("ferryctl %v: exit %d, %q; want exit 2 saying the topic has 2 queues", args, code, errOut)
		}
	}
}
