package protocol

import (
	"bytes"
	"errors"
	"testing"
)

// A stamped message round-trips, its stamp can be read without decoding
// the rest, and an unstamped one encodes exactly as before stamps existed.
func TestProducerStamp(t *testing.T) {
	m := Message{ID: "id-1", Topic: "t", Queue: 3, Reliability: High, Timestamp: 42,
		Producer: ProducerStamp{ID: 7, Epoch: 2, Seq: 99}, Properties: []Property{{"k", "v"}}, Body: []byte("body")}
	raw := AppendMessage(nil, &m)
	if len(raw) != m.EncodedSize() {
		t.Fatalf("encoded %d bytes, EncodedSize %d", len(raw), m.EncodedSize())
	}
	got, err := DecodeMessage(raw)
	if err != nil || !got.Equal(&m) {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	if s, ok := PeekProducerStamp(raw); !ok || s != m.Producer {
		t.Fatalf("peeked %+v %v", s, ok)
	}
	if !bytes.Equal(AppendMessage(nil, &got), raw) {
		t.Fatal("re-encoding differs")
	}

	plain := m
	plain.Producer = ProducerStamp{}
	raw = AppendMessage(nil, &plain)
	if raw[2+4+2+1+4]&stampedFlag != 0 || len(raw) != plain.EncodedSize() {
		t.Fatal("an unstamped message carries the stamp bit")
	}
	if _, ok := PeekProducerStamp(raw); ok {
		t.Fatal("peeked a stamp on an unstamped message")
	}

	// The bit with a zero producer id is not canonical.
	bad := AppendMessage(nil, &m)
	copy(bad[2+4+2+1+4+1+8:], make([]byte, 8))
	if _, err := DecodeMessage(bad); !errors.Is(err, ErrMalformed) {
		t.Fatalf("stamp with producer id 0: %v", err)
	}
	if _, ok := PeekProducerStamp(bad[:20]); ok {
		t.Fatal("peeked a stamp from a truncated message")
	}
}

// A scheduled message round-trips with or without a stamp, its schedule can
// be read without decoding the rest, an unknown kind is malformed, and a
// producer may send only delayed messages, never to an internal topic.
func TestSchedule(t *testing.T) {
	for _, stamp := range []ProducerStamp{{}, {ID: 7, Epoch: 2, Seq: 99}} {
		m := Message{ID: "id-1", Topic: "t", Queue: 3, Reliability: High, Timestamp: 42, Producer: stamp,
			Schedule: Schedule{Kind: ScheduleDelayed, At: 1_800_000_000_000, Ref: -1}, Body: []byte("body")}
		raw := AppendMessage(nil, &m)
		if len(raw) != m.EncodedSize() {
			t.Fatalf("encoded %d bytes, EncodedSize %d", len(raw), m.EncodedSize())
		}
		got, err := DecodeMessage(raw)
		if err != nil || !got.Equal(&m) || got.Reliability != High {
			t.Fatalf("decoded %+v, %v", got, err)
		}
		if sc, ok := PeekSchedule(raw); !ok || sc != m.Schedule {
			t.Fatalf("peeked %+v %v", sc, ok)
		}
		if s, ok := PeekProducerStamp(raw); ok != !stamp.IsZero() || s != stamp {
			t.Fatalf("peeked stamp %+v %v", s, ok)
		}
		if err := m.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	m := Message{ID: "id", Topic: "t", Schedule: Schedule{Kind: ScheduleReleased, At: 5, Ref: 9}}
	raw := AppendMessage(nil, &m)
	if err := m.Validate(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a producer's released copy: %v", err)
	}
	raw[2+2+2+1+4+1+8] = 9 // the kind
	if _, err := DecodeMessage(raw); !errors.Is(err, ErrMalformed) {
		t.Fatalf("unknown kind: %v", err)
	}
	for _, bad := range []Message{
		{ID: "id", Topic: "t", Schedule: Schedule{Kind: ScheduleDelayed}},
		{ID: "id", Topic: DelayTopic("t")},
	} {
		if err := bad.Validate(); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
	if sc, ok := PeekSchedule(AppendMessage(nil, &Message{ID: "x", Topic: "t"})); !ok || sc != (Schedule{}) {
		t.Fatalf("an ordinary message: %+v %v", sc, ok)
	}
	if h, err := ParseHandle("g-1@42"); err != nil || h != (Handle{Group: "g-1", Offset: 42}) || h.String() != "g-1@42" {
		t.Fatalf("handle %+v %v", h, err)
	}
	if h, err := ParseHandle("g-1@42/1765000000000"); err != nil || h != (Handle{"g-1", 42, 1765000000000}) || h.String() != "g-1@42/1765000000000" {
		t.Fatalf("a delayed message's handle %+v %v", h, err)
	}
	for _, bad := range []string{"", "g1", "@4", "g@-1", "g@x", "g@4/", "g@4/0", "g@4/x", "g@4/-5"} {
		if _, err := ParseHandle(bad); err == nil {
			t.Fatalf("handle %q parsed", bad)
		}
	}
}
