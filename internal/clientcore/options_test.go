package clientcore

import (
	"testing"

	"github.com/ferrymq/ferrymq/sdkmetrics"
)

type ownA struct{ n int }
type ownB struct{ n int }

// Shared options set the shared part, an SDK's own options its own
// configuration only (another SDK's are ignored), nil and zero options set
// nothing, and the logger and metrics get their defaults.
func TestApply(t *testing.T) {
	var a ownA
	opts := []Opt{
		Share(func(s *Shared) { s.MetaAddrs = []string{"m:1"} }),
		nil,
		SharedOpt{},
		Own(func(o *ownA) { o.n = 7 }),
		Own(func(o *ownB) { o.n = 9 }),
	}
	s := Apply(&a, opts)
	if a.n != 7 || len(s.MetaAddrs) != 1 || s.MetaAddrs[0] != "m:1" {
		t.Fatalf("own %+v, shared %+v", a, s)
	}
	if s.Logger == nil || s.Metrics == nil {
		t.Fatal("no default logger or metrics")
	}
	if _, ok := s.Metrics.(sdkmetrics.Nop); !ok {
		t.Fatalf("default metrics %T", s.Metrics)
	}
	var bad []string
	s.MetaAddrs = []string{"m:1", ""}
	s.Validate(true, func(f string, _ ...any) { bad = append(bad, f) })
	if len(bad) != 1 {
		t.Fatalf("problems %v, want the empty address", bad)
	}
	bad = nil
	(&Shared{}).Validate(true, func(f string, _ ...any) { bad = append(bad, f) })
	if len(bad) != 1 {
		t.Fatalf("problems %v, want MetaAddrs required", bad)
	}
}
