package main

import (
	"strconv"
	"strings"
	"testing"
)

// rateIn is what bench --rate takes: 0 (unpaced), or 0.001 to 1e9
// messages/s.
func rateIn(v string) int {
	if f, err := strconv.ParseFloat(v, 64); err == nil && f == 0 {
		return wantNetwork
	}
	return floatIn(0.001, 1e9)(v)
}

// TestBenchRateBounds: a --rate so low that its turns would be years apart
// (or past what a Duration holds) is refused before any network call; 0
// (unpaced) and the lowest rate are taken.
func TestBenchRateBounds(t *testing.T) {
	for _, v := range []string{"1e-300", "0.0001", "0.000999", "-0.5", "0", "0.001", "1"} {
		code, _, errOut := ctl("--meta", nowhere, "--timeout", "1s", "bench", "--rate", v, "--count", "1")
		if want := rateIn(v); code != want {
			t.Errorf("--rate %s: exit %d, want %d: %s", v, code, want, errOut)
		}
		if code == exitUsage && !strings.Contains(errOut, "--rate "+v+": want 0 (as fast as the cluster takes them) or a number from 0.001 to 1e+09") {
			t.Errorf("--rate %s: %q does not say what --rate takes", v, errOut)
		}
	}
}
