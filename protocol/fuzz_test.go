package protocol

import (
	"bytes"
	"errors"
	"testing"
)

// Each fuzz target asserts two things: a decoder given any bytes returns
// either an error that wraps ErrMalformed (or ErrFrameTooLarge) or a value,
// never a panic; and whatever decodes re-encodes to exactly the input, so the
// encoding is canonical and round-trips. The seeds run in every plain
// `go test`; `go test -fuzz FuzzX ./protocol` explores further.

func checkMalformed(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("decode error does not wrap ErrMalformed: %v", err)
	}
}

func addWithPrefixes(f *testing.F, b []byte) {
	f.Add(b)
	for _, n := range []int{0, 1, len(b) / 2, len(b) - 1} {
		if n >= 0 && n < len(b) {
			f.Add(b[:n])
		}
	}
}

func FuzzDecodeFrame(f *testing.F) {
	for _, fr := range []Frame{
		{Code: CodeSend, Opaque: 1, Body: AppendSendRequest(nil, 2, sampleMessages())},
		{Flags: FlagResponse, Code: CodeSend, Status: StatusBusy, Opaque: 9, Body: []byte("busy")},
		{Flags: FlagOneway, Code: CodeHeartbeat, Header: []byte("h")},
	} {
		b, _ := AppendFrame(nil, &fr)
		addWithPrefixes(f, b)
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xfe, 0x77})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := DecodeFrame(b)
		if err != nil {
			checkMalformed(t, err)
			return
		}
		out, err := AppendFrame(nil, &fr)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if !bytes.Equal(out, b) {
			t.Fatalf("round trip differs:\n in %x\nout %x", b, out)
		}
	})
}

func FuzzDecodeSendRequest(f *testing.F) {
	addWithPrefixes(f, AppendSendRequest(nil, 2, sampleMessages()))
	f.Add(AppendSendRequest(nil, 0, nil))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		epoch, msgs, err := DecodeSendRequest(b, nil)
		if err != nil {
			checkMalformed(t, err)
			if len(msgs) != 0 {
				t.Fatalf("error with %d messages returned", len(msgs))
			}
			return
		}
		if out := AppendSendRequest(nil, epoch, msgs); !bytes.Equal(out, b) {
			t.Fatalf("round trip differs:\n in %x\nout %x", b, out)
		}
	})
}

func FuzzDecodeSendResponse(f *testing.F) {
	addWithPrefixes(f, AppendSendResponse(nil, []SendResult{{StatusOK, 1, 2}, {StatusReadOnly, 0, 0}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		res, err := DecodeSendResponse(b, nil)
		if err != nil {
			checkMalformed(t, err)
			return
		}
		if out := AppendSendResponse(nil, res); !bytes.Equal(out, b) {
			t.Fatalf("round trip differs:\n in %x\nout %x", b, out)
		}
	})
}

func FuzzDecodePullRequest(f *testing.F) {
	addWithPrefixes(f, AppendPullRequest(nil, &PullRequest{Topic: "orders", Queue: 1, Offset: 5, MaxBytes: 4096, Epoch: 2}))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodePullRequest(b)
		if err != nil {
			checkMalformed(t, err)
			return
		}
		if out := AppendPullRequest(nil, &p); !bytes.Equal(out, b) {
			t.Fatalf("round trip differs:\n in %x\nout %x", b, out)
		}
	})
}

func FuzzDecodePullResponse(f *testing.F) {
	resp := PullResponse{NextOffset: 3, MaxOffset: 3}
	for i, m := range sampleMessages() {
		resp.Messages = append(resp.Messages, StoredMessage{QueueOffset: int64(i), LogOffset: int64(i) * 100, Message: m})
	}
	addWithPrefixes(f, AppendPullResponse(nil, &resp))
	addWithPrefixes(f, AppendPullResponse(nil, &PullResponse{NextOffset: 7}))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodePullResponse(b)
		if err != nil {
			checkMalformed(t, err)
			return
		}
		if out := AppendPullResponse(nil, &p); !bytes.Equal(out, b) {
			t.Fatalf("round trip differs:\n in %x\nout %x", b, out)
		}
	})
}

func FuzzDecodeMessage(f *testing.F) {
	for _, m := range sampleMessages() {
		addWithPrefixes(f, AppendMessage(nil, &m))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMessage(b)
		if err != nil {
			checkMalformed(t, err)
			return
		}
		if out := AppendMessage(nil, &m); !bytes.Equal(out, b) {
			t.Fatalf("round trip differs:\n in %x\nout %x", b, out)
		}
	})
}

func FuzzDecodeHAFetchRequest(f *testing.F) {
	addWithPrefixes(f, AppendHAFetchRequest(nil, &HAFetchRequest{Offset: 1 << 40, Acked: 1 << 39, MaxBytes: 1 << 20, WaitMillis: 100, Epoch: 4, BrokerID: "g1-b"}))
	addWithPrefixes(f, AppendHAFetchRequest(nil, &HAFetchRequest{Offset: 1 << 40, Acked: 1 << 40, Epoch: 4, BrokerID: "g1-b", Check: true, CheckAt: 1<<40 - 99, CheckCRC: 7}))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := DecodeHAFetchRequest(b)
		if err != nil {
			checkMalformed(t, err)
			return
		}
		if out := AppendHAFetchRequest(nil, &req); !bytes.Equal(out, b) {
			t.Fatalf("round trip differs:\n in %x\nout %x", b, out)
		}
	})
}

func FuzzDecodeRecoverRequest(f *testing.F) {
	addWithPrefixes(f, AppendRecoverRequest(nil, &RecoverRequest{Epoch: 3, BrokerID: "g1-m", From: 1 << 30, Cut: 1 << 29, Records: []byte("records")}))
	f.Fuzz(func(t *testing.T, b []byte) {
		q, err := DecodeRecoverRequest(b)
		if err != nil {
			checkMalformed(t, err)
			return
		}
		if out := AppendRecoverRequest(nil, &q); !bytes.Equal(out, b) {
			t.Fatalf("round trip differs:\n in %x\nout %x", b, out)
		}
	})
}

func FuzzDecodeRecoverResponse(f *testing.F) {
	addWithPrefixes(f, AppendRecoverResponse(nil, &RecoverResponse{Stored: 7, Duplicates: 2, End: 1 << 33}))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodeRecoverResponse(b)
		if err != nil {
			checkMalformed(t, err)
			return
		}
		if out := AppendRecoverResponse(nil, &p); !bytes.Equal(out, b) {
			t.Fatalf("round trip differs:\n in %x\nout %x", b, out)
		}
	})
}

func FuzzDecodeHAAck(f *testing.F) {
	addWithPrefixes(f, AppendHAAck(nil, &HAAck{Acked: 1 << 40, Epoch: 4, BrokerID: "g1-b"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := DecodeHAAck(b)
		if err != nil {
			checkMalformed(t, err)
			return
		}
		if out := AppendHAAck(nil, &a); !bytes.Equal(out, b) {
			t.Fatalf("round trip differs:\n in %x\nout %x", b, out)
		}
	})
}

func FuzzDecodeHAFetchResponse(f *testing.F) {
	addWithPrefixes(f, append(AppendHAFetchResponseHeader(nil, 77, 3), "records"...))
	f.Fuzz(func(t *testing.T, b []byte) {
		resp, err := DecodeHAFetchResponse(b)
		if err != nil {
			checkMalformed(t, err)
			return
		}
		if out := append(AppendHAFetchResponseHeader(nil, resp.MasterEnd, resp.Epoch), resp.Records...); !bytes.Equal(out, b) {
			t.Fatalf("round trip differs:\n in %x\nout %x", b, out)
		}
	})
}

func FuzzDecodeIdentity(f *testing.F) {
	addWithPrefixes(f, AppendIdentity(nil, &Identity{Kind: KindBroker, ID: "g1-master", Group: "g1", Role: "master"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, err := DecodeIdentity(b)
		if err != nil {
			checkMalformed(t, err)
			return
		}
		if out := AppendIdentity(nil, &id); !bytes.Equal(out, b) {
			t.Fatalf("round trip differs:\n in %x\nout %x", b, out)
		}
	})
}
