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
