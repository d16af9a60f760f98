package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
)

// TestSendErrorCausesByKind: failures the producer reports with a message
// id, an attempt count or an address in their text are counted by their
// kind (the producer's sentinels) and status, not one cause per message;
// the first error's full text is the example.
func TestSendErrorCausesByKind(t *testing.T) {
	var s sendErrors
	unreachable := fmt.Errorf("%w: route lookup: metaserver client: ROUTE_LOOKUP: transport: dial 127.0.0.1:8301: i/o timeout", producer.ErrUnreachable)
	var first string
	for i := range 50 {
		err := fmt.Errorf("%w: message 0000%04d to %q (attempts: %d): %w", producer.ErrDeliveryTimeout, i, "orders", i%7+1, unreachable)
		if i == 0 {
			first = err.Error()
		}
		s.add(err)
	}
	for i := range 20 {
		s.add(fmt.Errorf("%w: message 0001%04d to %q (attempts: %d): send to group g1 at 127.0.0.1:%d: %w",
			producer.ErrDeliveryTimeout, i, "orders", i+1, 7400+i, &protocol.Error{Status: protocol.StatusReadOnly, Message: fmt.Sprintf("group g1 epoch %d", i)}))
	}
	for i := range 5 {
		s.add(fmt.Errorf("%w: message 0002%04d to %q", producer.ErrFenced, i, "orders"))
	}
	got := s.list()
	want := []struct {
		cause string
		count int64
	}{
		{"not delivered in time: metaserver unreachable", 50},
		{"not delivered in time: READ_ONLY", 20},
		{"producer fenced", 5},
	}
	if len(got) != len(want) {
		t.Fatalf("%d causes, want %d; the first: %+v", len(got), len(want), got[:min(2, len(got))])
	}
	for i, w := range want {
		if got[i].Cause != w.cause || got[i].Count != w.count {
			t.Errorf("cause %d: %q x %d, want %q x %d", i, got[i].Cause, got[i].Count, w.cause, w.count)
		}
	}
	if got[0].Example != first {
		t.Errorf("example %q, want the first error %q", got[0].Example, first)
	}
	lines := strings.Split(sendFailures(benchResult{Errors: 75, ErrorCauses: got}).Error(), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[1], "50 x not delivered in time: metaserver unreachable: ") {
		t.Errorf("%q", lines)
	}
}

// TestBenchRateEndsAtDuration: a --rate whose next turn comes after
// --duration ends the run at the duration, without sending at that turn:
// at --rate 0.5 four producers have their second turns 8s in, so a 2s run
// sends one message each; at --rate 0.001 the second turn is 1000s (one
// producer) away. Each run must end well before its next turn: a run still
// going after a minute fails the test.
func TestBenchRateEndsAtDuration(t *testing.T) {
	meta := "--meta=" + startCluster(t)
	for _, c := range []struct {
		args []string
		most int64
	}{
		{[]string{"--rate", "0.5", "--producers", "4", "--duration", "2s"}, 4},
		{[]string{"--rate", "0.001", "--producers", "1", "--duration", "2s", "--mode", "sync"}, 1},
		{[]string{"--rate", "0.001", "--producers", "2", "--duration", "1s", "--count", "5"}, 2},
	} {
		type result struct {
			code     int
			out, err string
		}
		done := make(chan result, 1)
		go func() {
			code, out, errOut := ctl(append([]string{meta, "bench", "--topic", "paced", "--queues", "2", "--size", "16", "--json"}, c.args...)...)
			done <- result{code, out, errOut}
		}()
		var r result
		select {
		case r = <-done:
		case <-time.After(time.Minute):
			t.Fatalf("bench %v still runs after a minute", c.args)
		}
		var res benchResult
		if err := json.Unmarshal([]byte(r.out), &res); err != nil || r.code != 0 {
			t.Fatalf("bench %v: exit %d, %v\n%s\n%s", c.args, r.code, err, r.out, r.err)
		}
		if res.Sent < 1 || res.Sent > c.most || res.Errors != 0 {
			t.Errorf("bench %v: sent %d, %d errors; want 1 to %d sent (the turns before the deadline)", c.args, res.Sent, res.Errors, c.most)
		}
	}
}

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
