package metaserver_test

import (
	"context"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/protocol"
)

// TestIdentify: a metaserver says what it is, so that a client that got an
// answer it did not expect can tell an old metaserver from a wrong address.
func TestIdentify(t *testing.T) {
	m := testcluster.StartMeta(t, 1, nil)
	c := testcluster.Dial(t, m.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Call(ctx, protocol.CodeIdentify, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := protocol.DecodeIdentity(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if id.Kind != protocol.KindMetaserver || id.ID != m.Peers[0].ID {
		t.Fatalf("IDENTIFY answered %+v, want a metaserver with id %q", id, m.Peers[0].ID)
	}
}
