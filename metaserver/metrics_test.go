package metaserver_test

import (
	"context"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/ferrymq/ferrymq/routing"
)

// TestRouteLookupHistogram: every route lookup the node answers, from its
// cache, its registry or with an error, is one observation of
// RouteLookupDuration, in seconds.
func TestRouteLookupHistogram(t *testing.T) {
	m := startMeta(t, 1, nil)
	_, s := m.Leader()
	cl := m.Client(t)
	heartbeat(t, cl, "g1", routing.RoleMaster, nil)
	m.CreateTopic(t, "looked-up", "g1", "g1")
	count := func() (uint64, float64) {
		var out dto.Metric
		if err := s.RouteLookupDuration().Write(&out); err != nil {
			t.Fatal(err)
		}
		return out.GetHistogram().GetSampleCount(), out.GetHistogram().GetSampleSum()
	}
	before, sumBefore := count()
	ctx := context.Background()
	for range 3 { // the first from the registry, the others from the cache
		if _, err := cl.Route(ctx, "looked-up"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cl.RouteExisting(ctx, "never-created"); err == nil {
		t.Fatal("a route lookup of a topic never created succeeded")
	}
	after, sumAfter := count()
	if after-before != 4 || sumAfter <= sumBefore {
		t.Fatalf("4 route lookups made %d observations adding %gs; want 4 adding some time", after-before, sumAfter-sumBefore)
	}
}
