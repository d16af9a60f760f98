package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
)

// TestJourneyOfAReleasedDelayedMessage: the journey by id of a delayed
// message that was released describes the released message (in its
// topic's queue), not the pending record in the internal queue, and find
// shows no release mark as a message.
func TestJourneyOfAReleasedDelayedMessage(t *testing.T) {
	c := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1"}})
	meta := "--meta=" + c.MetaAddr()
	mustCtl(t, meta, "topic", "create", "orders", "--queues", "1")
	var s sendJSON
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "send", "orders", "--key", "k", "--after", "1s", "--body", "later", "--json")), &s); err != nil {
		t.Fatal(err)
	}
	testwait.ForEvery(t, 20*time.Second, 50*time.Millisecond, "the release", func() bool {
		var f findJSON
		if err := json.Unmarshal([]byte(mustCtl(t, meta, "message", "find", "--id", s.ID, "--json")), &f); err != nil {
			return false
		}
		for _, m := range f.Messages {
			if m.InternalTopic != "" && m.Schedule != nil && m.Schedule.Kind != 1 {
				t.Errorf("find --id shows an internal record that is not the pending message: %+v schedule %+v body %q", m.FoundMessage, *m.Schedule, m.Body)
			}
		}
		return len(f.Messages) >= 2
	})
	var j journeyJSON
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "message", "journey", s.ID, "--json")), &j); err != nil {
		t.Fatal(err)
	}
	if j.Message.InternalTopic != "" {
		t.Fatalf("journey by id of a released delayed message describes the pending record: internal topic %q, queue offset %d, steps %+v",
			j.Message.InternalTopic, j.Message.QueueOffset, j.Steps)
	}
}
