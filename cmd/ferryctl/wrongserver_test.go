package main

import (
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/internal/testcluster"
)

// TestMetaIsABroker: --meta pointed at a broker's port says that this
// address is a broker, not a metaserver, once, and exits 2 (the flag is
// wrong) at once, for the admin commands and for the SDK-backed ones.
func TestMetaIsABroker(t *testing.T) {
	c := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1"}})
	broker := c.Master("g1").Addr()
	mustCtl(t, "--meta="+c.MetaAddr(), "topic", "create", "orders", "--queues", "2")
	for _, args := range [][]string{
		{"routes"},
		{"brokers"},
		{"topic", "create", "other", "--queues", "1"},
		{"send", "orders", "--body", "x"},
		{"read", "orders", "--queue", "0", "--from", "0"},
	} {
		code, out, errOut := ctl(append([]string{"--meta=" + broker, "--timeout=30s"}, args...)...)
		want := broker + " is a ferrymq broker (group g1"
		if code != exitUsage || !strings.Contains(errOut, want) || strings.Count(errOut, "not a metaserver") != 1 ||
			strings.Contains(errOut, "UNKNOWN_CODE") || strings.Contains(errOut, "cannot reach") || out != "" {
			t.Errorf("ferryctl --meta BROKER %v: exit %d, stdout %q, stderr %q; want exit %d and %q once", args, code, out, errOut, exitUsage, want)
		}
	}
	// A broker listed beside the metaserver is skipped.
	mustCtl(t, "--meta="+broker+","+c.MetaAddr(), "routes", "orders")
}
