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

// TestBenchDelaySpreadUsage: --delay-spread is refused before any network
// call without --delay, with --deliver-at, and when the delay and the
// spread together could pass the broker's default -max-delay (90 days);
// within them it is taken.
func TestBenchDelaySpreadUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
		says string
	}{
		{[]string{"--delay-spread", "1h"}, exitUsage, "--delay-spread needs --delay"},
		{[]string{"--delay", "1s", "--delay-spread", "1h", "--deliver-at", "2030-01-01T00:00:00Z"}, exitUsage, "--delay and --deliver-at: give one"},
		{[]string{"--delay-spread", "1h", "--deliver-at", "2030-01-01T00:00:00Z"}, exitUsage, "--delay-spread and --deliver-at"},
		{[]string{"--delay", "1h", "--delay-spread", "2160h"}, exitUsage, "--delay 1h0m0s plus --delay-spread 2160h0m0s: want at most 2160h0m0s in all"},
		{[]string{"--delay", "1h", "--delay-spread", "2159h"}, wantNetwork, ""},
	} {
		args := append([]string{"--meta", nowhere, "--timeout", "1s", "bench", "--count", "1"}, c.args...)
		code, _, errOut := ctl(args...)
		if code != c.want || !strings.Contains(errOut, c.says) {
			t.Errorf("bench %v: exit %d, %q; want exit %d saying %q", c.args, code, errOut, c.want, c.says)
		}
	}
}
