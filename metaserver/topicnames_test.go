package metaserver_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
)

// TestNewTopicNamesAreChecked: the registry creates no topic named with
// dots alone or with '%' outside a dead-letter topic's %DLQ% prefix,
// neither by topic create nor by an auto-creating route lookup; a
// dead-letter topic is created.
func TestNewTopicNamesAreChecked(t *testing.T) {
	m := testcluster.StartMeta(t, 1, nil) // auto-create on
	cl := m.Client(t)
	heartbeat(t, cl, "g1", "master", nil)
	ctx := context.Background()
	for _, name := range []string{"..", ".", "%", "50%off", "%DLQ%a%b"} {
		if _, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: name, Queues: 1}); !errors.Is(err, protocol.ErrInvalid) {
			t.Errorf("topic create %q: %v; want INVALID", name, err)
		}
		if _, err := cl.Route(ctx, name); !errors.Is(err, protocol.ErrInvalid) {
			t.Errorf("route lookup (auto-create) of %q: %v; want INVALID", name, err)
		}
	}
	if len(m.Nodes[0].FSM().Topics()) != 0 {
		t.Fatalf("topics after the refusals: %+v", m.Nodes[0].FSM().Topics())
	}
	if _, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "%DLQ%billing", Queues: 1}); err != nil {
		t.Fatalf("creating a dead-letter topic: %v", err)
	}
	_, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "..", Queues: 1})
	if err == nil || !strings.Contains(err.Error(), "only dots") {
		t.Fatalf("topic create ..: %v; want the reason", err)
	}
}
