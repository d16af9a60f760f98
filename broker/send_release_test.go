package broker_test

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/protocol"
)

// SEND batches large enough to be read into recycled buffers (the broker
// releases each once the commit log has its messages) are stored whole:
// concurrent batches from several connections, each message's body its
// own, read back exactly as sent, none from a batch that reused the buffer.
func TestLargeSendBatchesStoredWhole(t *testing.T) {
	meta := testcluster.StartMeta(t, 1, func(c *metaserver.Config) { c.LagTime, c.SessionTimeout = time.Minute, 10*time.Second })
	g := testcluster.StartGroup(t, meta.Addrs(), "g1", testcluster.GroupOpts{})
	meta.CreateTopic(t, "big", "g1", "g1")
	const conns, batches, perBatch = 3, 20, 40 // 40 x 1 KiB: a 40 KiB frame
	c0 := testcluster.Dial(t, g.Master.Addr())
	testwait.For(t, 10*time.Second, "the route", func() bool {
		for q := range uint32(2) {
			msg := []protocol.Message{{ID: "warm", Topic: "big", Queue: q, Timestamp: 1, Body: []byte("w")}}
			if testcluster.Send(t, c0, msg)[0].Status != protocol.StatusOK {
				return false
			}
		}
		return true
	})
	body := func(c, b, i int) []byte {
		return bytes.Repeat(fmt.Appendf(nil, "%d/%d/%d;", c, b, i), 1024)[:1024]
	}
	var wg sync.WaitGroup
	for c := range conns {
		cl := testcluster.Dial(t, g.Master.Addr())
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				msgs := make([]protocol.Message, perBatch)
				for i := range msgs {
					msgs[i] = protocol.Message{ID: fmt.Sprintf("%d-%d-%d", c, b, i), Topic: "big", Queue: uint32(c % 2),
						Timestamp: 1, Body: body(c, b, i)}
				}
				for i, r := range testcluster.Send(t, cl, msgs) {
					if r.Status != protocol.StatusOK {
						t.Errorf("message %d-%d-%d: %v", c, b, i, r.Status)
					}
				}
			}
		}()
	}
	wg.Wait()
	got := 0
	for q := range uint32(2) {
		for _, m := range testcluster.PullAll(t, c0, "big", q)[1:] { // after the warm-up message
			var c, b, i int
			if _, err := fmt.Sscanf(m.Message.ID, "%d-%d-%d", &c, &b, &i); err != nil {
				t.Fatalf("id %q: %v", m.Message.ID, err)
			}
			if !bytes.Equal(m.Message.Body, body(c, b, i)) || m.Message.Queue != uint32(c%2) {
				t.Fatalf("message %s stored as %.40q in queue %d", m.Message.ID, m.Message.Body, m.Message.Queue)
			}
			got++
		}
	}
	if got != conns*batches*perBatch {
		t.Fatalf("read back %d messages, want %d", got, conns*batches*perBatch)
	}
}
