package routing

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"slices"
	"testing"
)

func sampleRoute() Route {
	return Route{Topic: "orders", Version: 42, Queues: []QueueRoute{
		{Queue: 0, Group: "g1", Master: "127.0.0.1:9001", Writable: true},
		{Queue: 1, Group: "g2", Master: "127.0.0.1:9002", Writable: false},
		{Queue: 2, Group: "g1", Master: "", Writable: false},
	}}
}

func TestRouteCodecRoundTrip(t *testing.T) {
	for _, r := range []Route{sampleRoute(), {Topic: "empty", Version: 1}} {
		b := AppendRoute(nil, &r)
		got, err := DecodeRoute(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("got %+v want %+v", got, r)
		}
		for n := 0; n < len(b); n++ {
			if _, err := DecodeRoute(b[:n]); !errors.Is(err, ErrMalformedRoute) {
				t.Fatalf("prefix of %d bytes: %v", n, err)
			}
		}
	}
}

func FuzzDecodeRoute(f *testing.F) {
	r := sampleRoute()
	f.Add(AppendRoute(nil, &r))
	r.Queues[1].Base = 77
	f.Add(AppendRoute(nil, &r))
	f.Add([]byte{0, 1, 'x', 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRoute(b)
		if err != nil {
			if !errors.Is(err, ErrMalformedRoute) {
				t.Fatalf("error does not wrap ErrMalformedRoute: %v", err)
			}
			return
		}
		// Flags other than bit 0 are dropped, so compare re-encodings.
		again, err := DecodeRoute(AppendRoute(nil, &r))
		if err != nil || !reflect.DeepEqual(again, r) {
			t.Fatalf("re-decode: %+v, %v", again, err)
		}
	})
}

func TestReasons(t *testing.T) {
	if !Reasons(0).Writable() || Reasons(0).State() != "RW" || Reasons(0).String() != "" {
		t.Fatal("no reasons must be writable")
	}
	r := HeartbeatLost | Admin
	if r.Writable() || r.State() != "RO" || r.String() != "heartbeat-lost,admin" {
		t.Fatalf("got %v %v", r.State(), r.String())
	}
}

func TestSpreadQueues(t *testing.T) {
	got := SpreadQueues(5, []string{"g2", "g1"}, 1)
	want := []string{"g2", "g1", "g2", "g1", "g2"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v want %v", got, want)
	}
	r := sampleRoute()
	if w := r.WritableQueues(); len(w) != 1 || w[0].Queue != 0 {
		t.Fatalf("writable queues: %+v", w)
	}
	if g := r.Groups(); !bytes.Equal([]byte(g[0]+g[1]), []byte("g1g2")) {
		t.Fatalf("groups: %v", g)
	}
}

// A route with moved queues carries their bases after the queues; one
// without ends where it did before bases existed, so its bytes are the
// same as an older metaserver's.
func TestRouteCodecBases(t *testing.T) {
	plain := sampleRoute()
	moved := sampleRoute()
	moved.Queues[1].Base = 1234
	moved.Queues[2].Base = 1
	pb, mb := AppendRoute(nil, &plain), AppendRoute(nil, &moved)
	if want := len(pb) + 4 + 2*12; len(mb) != want {
		t.Fatalf("a route with 2 bases takes %d bytes, want %d", len(mb), want)
	}
	if !bytes.Equal(mb[:len(pb)], pb) {
		t.Fatal("the bases changed the encoding of the queues")
	}
	got, err := DecodeRoute(mb)
	if err != nil || !reflect.DeepEqual(got, moved) {
		t.Fatalf("got %+v, %v; want %+v", got, err, moved)
	}
	for n := len(pb) + 1; n < len(mb); n++ {
		if _, err := DecodeRoute(mb[:n]); !errors.Is(err, ErrMalformedRoute) {
			t.Fatalf("prefix of %d bytes: %v", n, err)
		}
	}
	bad := func(name string, section ...[]byte) {
		t.Helper()
		b := slices.Clone(pb)
		for _, s := range section {
			b = append(b, s...)
		}
		if _, err := DecodeRoute(b); !errors.Is(err, ErrMalformedRoute) {
			t.Errorf("%s: %v", name, err)
		}
	}
	u32 := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
	i64 := func(v int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) }
	bad("no entries", u32(0))
	bad("index past the queues", u32(1), u32(3), i64(5))
	bad("base 0", u32(1), u32(0), i64(0))
	bad("negative base", u32(1), u32(0), i64(-5))
	bad("indexes out of order", u32(2), u32(1), i64(5), u32(0), i64(5))
	bad("index twice", u32(2), u32(1), i64(5), u32(1), i64(6))
	bad("trailing bytes", u32(1), u32(0), i64(5), []byte{0})
}
