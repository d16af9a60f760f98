// Package testwait waits in tests for an observable event: a counter, a
// state change, a line in a log. It never stands in for an assertion that
// something did not happen; for that, tests move a fake clock.
//
// It imports nothing of the module, so every package's tests can use it,
// internal tests of the lowest packages included. Only tests may import it
// (an import rule in internal/lint says so).
package testwait

import (
	"testing"
	"time"
)

// Poll is how often For and Until check their condition.
const Poll = 2 * time.Millisecond

// For polls cond until it holds, and fails tb if timeout passes first,
// naming what it waited for.
func For(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	ForEvery(tb, timeout, Poll, what, cond)
}

// ForEvery is For with a poll interval, for conditions that cost a process
// or an RPC each time they are checked.
func ForEvery(tb testing.TB, timeout, interval time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !poll(timeout, interval, cond) {
		tb.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Until polls cond until it holds or timeout passes, and reports whether
// it held.
func Until(timeout time.Duration, cond func() bool) bool { return poll(timeout, Poll, cond) }

// UntilEvery is Until with a poll interval, for conditions that cost a
// process or an RPC each time they are checked.
func UntilEvery(timeout, interval time.Duration, cond func() bool) bool {
	return poll(timeout, interval, cond)
}

func poll(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
	return true
}
