package producer

import (
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/sdk"
)

// TestOptionsValidation: New checks every option at once and names each bad
// one; negative and zero durations and sizes are errors, never defaults, and
// options that contradict each other are errors too.
func TestOptionsValidation(t *testing.T) {
	addr := sdk.MetaAddrs("127.0.0.1:1") // New dials nothing
	cases := []struct {
		name string
		opts []Opt
		want []string // each must be in the error; none: New succeeds
	}{
		{"defaults", []Opt{addr}, nil},
		{"linger 0 sends at once", []Opt{addr, Linger(0)}, nil},
		{"no addresses", nil, []string{"MetaAddrs is required"}},
		{"empty address", []Opt{sdk.MetaAddrs("127.0.0.1:1", "")}, []string{"MetaAddrs has an empty address"}},
		{"negative linger", []Opt{addr, Linger(-time.Millisecond)}, []string{"Linger -1ms is negative"}},
		{"negative batch", []Opt{addr, MaxBatchBytes(-1)}, []string{"MaxBatchBytes -1"}},
		{"zero batch", []Opt{addr, MaxBatchBytes(0)}, []string{"MaxBatchBytes 0"}},
		{"batch over a frame", []Opt{addr, MaxBatchBytes(16 << 20), MaxBuffered(10, 1<<30)}, []string{"MaxBatchBytes 16777216 must be from 1 to"}},
		{"negative in-flight", []Opt{addr, MaxInflightPerGroup(-1)}, []string{"MaxInflightPerGroup -1"}},
		{"zero in-flight", []Opt{addr, MaxInflightPerGroup(0)}, []string{"MaxInflightPerGroup 0"}},
		{"negative buffered records", []Opt{addr, MaxBuffered(-1, 1<<20)}, []string{"MaxBuffered records -1"}},
		{"negative buffered bytes", []Opt{addr, MaxBuffered(10, -1)}, []string{"MaxBuffered bytes -1"}},
		{"negative delivery timeout", []Opt{addr, DeliveryTimeout(-time.Second)}, []string{"DeliveryTimeout -1s"}},
		{"zero delivery timeout", []Opt{addr, DeliveryTimeout(0)}, []string{"DeliveryTimeout 0s"}},
		{"negative request timeout", []Opt{addr, RequestTimeout(-time.Second)}, []string{"RequestTimeout -1s"}},
		{"negative retry backoff", []Opt{addr, RetryBackoff(-time.Second)}, []string{"RetryBackoff -1s"}},
		{"negative route refresh", []Opt{addr, RouteRefresh(-time.Second)}, []string{"RouteRefresh -1s"}},
		{"zero route poll", []Opt{addr, RoutePoll(0)}, []string{"RoutePoll 0s"}},
		{"zero failover wait", []Opt{addr, FailoverWait(0)}, []string{"FailoverWait 0s must be positive"}},
		{"failover wait past the delivery timeout", []Opt{addr, FailoverWait(time.Hour)}, nil},
		{"linger as long as the delivery timeout", []Opt{addr, Linger(time.Second), DeliveryTimeout(time.Second)},
			[]string{"Linger 1s must be shorter than DeliveryTimeout 1s"}},
		{"batch larger than the buffer", []Opt{addr, MaxBatchBytes(2 << 20), MaxBuffered(100, 1<<20)},
			[]string{"MaxBatchBytes 2097152 must not be larger than MaxBuffered bytes 1048576"}},
		{"every bad one named", []Opt{addr, Linger(-1), MaxInflightPerGroup(0), DeliveryTimeout(-1), RouteRefresh(0)},
			[]string{"Linger", "MaxInflightPerGroup", "DeliveryTimeout", "RouteRefresh"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(tc.opts...)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				_ = p.Close()
				return
			}
			if err == nil {
				_ = p.Close()
				t.Fatalf("New accepted it; want an error naming %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			// One line per bad option, so a relation is not reported for an
			// option already bad on its own.
			if n := strings.Count(err.Error(), "\n") + 1; tc.name != "every bad one named" && n != 1 {
				t.Errorf("%d problems reported for one: %v", n, err)
			}
		})
	}
}
