package protocol

import (
	"slices"
	"testing"
)

// LookupKeys gives a message's id, its key, and the id of the message it
// is a dead letter or a retry of, and nothing else.
func TestLookupKeys(t *testing.T) {
	m := Message{ID: "m-1", Topic: "t", Tag: "A", Producer: ProducerStamp{ID: 1}, Schedule: Schedule{Kind: ScheduleDelayed, At: 5},
		Properties: []Property{{Key: "region", Value: "eu"}, {Key: DeadLetterOriginID, Value: "orig"}, {Key: RetryOriginID, Value: ""},
			{Key: KeyProperty, Value: "order-4711"}}, Body: []byte("x")}
	var got []string
	LookupKeys(AppendMessage(nil, &m), func(k []byte) { got = append(got, string(k)) })
	if !slices.Equal(got, []string{"m-1", "orig", "order-4711"}) {
		t.Fatalf("LookupKeys = %q", got)
	}
	got = nil
	LookupKeys([]byte{0, 9, 'x'}, func(k []byte) { got = append(got, string(k)) })
	if len(got) != 0 {
		t.Fatalf("a malformed message gave %q", got)
	}
}
