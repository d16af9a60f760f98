package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
)

// TestParkedPullsShareOneConnection: a member holding several idle queues
// of one broker has a PULL parked on each at once, over its one connection
// to that broker, and a message to any of them is handled long before the
// PULLs' wait. The broker admits a request on a connection only while the
// answers it owes there fit in its write buffer (4 MiB), and a parked PULL
// owes its answer, at the size it asked for, until it is answered. PULLs of
// 4 MiB each (a 64 MiB prefetch over 2 queues) left one parked and the other
// unread behind it until the first one's wait ended: a message to the
// second waited up to PollWait (1 s by default; `ferryctl bench` showed it
// as a 1 s end-to-end maximum in every run, on each queue's last message).
func TestParkedPullsShareOneConnection(t *testing.T) {
	e := startEnv(t, []string{"g1"}, false)
	e.cl.Meta.CreateTopic(t, "idle", "g1", "g1")
	handled := make(chan *Message, 4)
	// A wait far longer than the test's bounds: a message answered only
	// when a PULL's wait ends fails the test.
	c := e.consumer(t, "grp", []string{"idle"}, PollWait(30*time.Second))
	runIn(t, c, func(ctx context.Context, m *Message) error {
		handled <- m
		return nil
	})
	testwait.For(t, 10*time.Second, "both queues' starts", func() bool {
		qs := c.Stats().Queues
		return len(qs) == 2 && qs[0].MaxOffset >= 0 && qs[1].MaxOffset >= 0
	})
	stats := e.cl.Master("g1").Stats()
	testwait.For(t, 10*time.Second, "a PULL parked on each queue", func() bool { return stats.PullsParked.Load() == 2 })

	// Twice each: after a queue's answer its next PULL parks again, with
	// the other one still parked.
	master := testcluster.Dial(t, e.cl.Master("g1").Addr())
	for round := range 2 {
		for q := range uint32(2) {
			sent := time.Now()
			// The broker may not know the new topic's route yet (NO_ROUTE,
			// nothing stored): send again until it takes the message.
			testwait.For(t, 10*time.Second, "the broker to take a message", func() bool {
				res := testcluster.Send(t, master, []protocol.Message{testcluster.Msg("idle", q, protocol.Normal, "m")})
				return res[0].Status == protocol.StatusOK
			})
			select {
			case m := <-handled:
				if m.Queue != q {
					t.Fatalf("handled a message of queue %d, sent to %d", m.Queue, q)
				}
				t.Logf("round %d, queue %d: handled %v after its send", round, q, time.Since(sent))
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: the message to queue %d not handled after 10 s (PULLs wait 30 s)", round, q)
			}
			testwait.For(t, 10*time.Second, "a PULL parked on each queue again", func() bool { return stats.PullsParked.Load() == 2 })
		}
	}
}
