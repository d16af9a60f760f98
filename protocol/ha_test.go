package protocol

import (
	"errors"
	"testing"
)

// The HA bodies round-trip, and a fetch that acknowledges past where it asks
// from, or a negative offset, is malformed.
func TestHABodies(t *testing.T) {
	for _, f := range []HAFetchRequest{
		{Offset: 1 << 33, Acked: 1 << 32, MaxBytes: 4 << 20, WaitMillis: 100, Epoch: 7, BrokerID: "g1-slave"},
		{Offset: 1 << 33, Acked: 1 << 33, Epoch: 7, BrokerID: "g1-slave", Check: true, CheckAt: 1<<33 - 130, CheckCRC: 0xdeadbeef},
		{Offset: 0, Acked: 0, Epoch: 1, BrokerID: "s", Check: true},
		{Offset: 1 << 33, Acked: 1 << 32, Epoch: 7, BrokerID: "g1-slave", Sequenced: true, Seq: 1<<32 - 1},
		{Offset: 1 << 33, Acked: 1 << 33, Epoch: 7, BrokerID: "g1-slave", Check: true, CheckAt: 1<<33 - 130, CheckCRC: 3, Sequenced: true, Seq: 4},
		{Offset: 1 << 33, Acked: 1 << 32, Epoch: 7, BrokerID: "g1-slave", Sequenced: true, Seq: 0, After: 1<<32 - 1, Follows: true},
	} {
		got, err := DecodeHAFetchRequest(AppendHAFetchRequest(nil, &f))
		if err != nil || got != f {
			t.Fatalf("fetch round trip: %+v, %v; want %+v", got, err, f)
		}
	}
	unknownFlags := AppendHAFetchRequest(nil, &HAFetchRequest{Offset: 1, BrokerID: "s", Sequenced: true, Seq: 2, After: 1})
	unknownFlags[len(unknownFlags)-1] = 2 // the flags byte ends the body
	if _, err := DecodeHAFetchRequest(unknownFlags); !errors.Is(err, ErrMalformed) {
		t.Errorf("a fetch with unknown flags: %v, want malformed", err)
	}
	// The answer to a sequenced fetch carries its start.
	body := append(AppendHAFetchResponseStart(AppendHAFetchResponseHeader(nil, 1<<34, 7), 1<<33), "records"...)
	resp, err := DecodeHAFetchResponseSequenced(body)
	if err != nil || resp.MasterEnd != 1<<34 || resp.Epoch != 7 || resp.Start != 1<<33 || string(resp.Records) != "records" {
		t.Fatalf("sequenced answer: %+v, %v", resp, err)
	}
	if _, err := DecodeHAFetchResponseSequenced(AppendHAFetchResponseStart(AppendHAFetchResponseHeader(nil, 1, 7), -1)); !errors.Is(err, ErrMalformed) {
		t.Errorf("a negative start: %v, want malformed", err)
	}
	a := HAAck{Acked: 1 << 33, Epoch: 7, BrokerID: "g1-slave"}
	gotAck, err := DecodeHAAck(AppendHAAck(nil, &a))
	if err != nil || gotAck != a {
		t.Fatalf("ack round trip: %+v, %v; want %+v", gotAck, err, a)
	}
	for _, bad := range []HAFetchRequest{
		{Offset: 10, Acked: 11, BrokerID: "s"},
		{Offset: -1, Acked: -2, BrokerID: "s"},
		{Offset: 10, Acked: -1, BrokerID: "s"},
		{Offset: 10, Acked: 10, BrokerID: "s", Check: true, CheckAt: -1},
		// A fetch that follows another continues its stream: nothing to check.
		{Offset: 10, Acked: 10, BrokerID: "s", Check: true, Sequenced: true, Seq: 2, After: 1, Follows: true},
	} {
		if _, err := DecodeHAFetchRequest(AppendHAFetchRequest(nil, &bad)); !errors.Is(err, ErrMalformed) {
			t.Errorf("fetch %+v: %v, want malformed", bad, err)
		}
	}
	if _, err := DecodeHAAck(AppendHAAck(nil, &HAAck{Acked: -1, BrokerID: "s"})); !errors.Is(err, ErrMalformed) {
		t.Errorf("negative ack: %v, want malformed", err)
	}
	if CodeHAAck.String() != "HA_ACK" {
		t.Errorf("CodeHAAck is %q", CodeHAAck.String())
	}
}
