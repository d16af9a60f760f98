package cli

import (
	"fmt"
	"testing"
	"time"
)

// TestFailLimiter: a source that presented failedPerSecond unknown tokens
// within a second is refused more until the next second; other sources are
// not; past maxFailSources sources in a second, the rest share one count.
func TestFailLimiter(t *testing.T) {
	var l failLimiter
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range failedPerSecond {
		if !l.allow("10.0.0.1", t0) {
			t.Fatalf("refused after %d failures, want %d allowed", i, failedPerSecond)
		}
		l.failed("10.0.0.1", t0.Add(time.Duration(i)*time.Millisecond))
	}
	if l.allow("10.0.0.1", t0.Add(999*time.Millisecond)) {
		t.Fatalf("allowed after %d failures within the second", failedPerSecond)
	}
	if !l.allow("10.0.0.2", t0.Add(999*time.Millisecond)) {
		t.Fatal("another source refused")
	}
	if !l.allow("10.0.0.1", t0.Add(time.Second)) {
		t.Fatal("still refused in the next second")
	}
	for i := range maxFailSources {
		l.failed(fmt.Sprint("src", i), t0.Add(time.Second))
	}
	for range failedPerSecond {
		l.failed("late", t0.Add(time.Second))
	}
	if l.allow("another-late", t0.Add(time.Second)) || len(l.counts) > maxFailSources+1 {
		t.Fatalf("sources past the cap are not counted together (%d counted)", len(l.counts))
	}
}
