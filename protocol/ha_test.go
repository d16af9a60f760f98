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
	} {
		got, err := DecodeHAFetchRequest(AppendHAFetchRequest(nil, &f))
		if err != nil || got != f {
			t.Fatalf("fetch round trip: %+v, %v; want %+v", got, err, f)
		}
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
