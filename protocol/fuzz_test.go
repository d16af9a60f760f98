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

// fuzzRoundTrip fuzzes a body's decoder: any input fails with
// ErrMalformed, or decodes to a value that encodes back to exactly the
// input.
func fuzzRoundTrip[T any](f *testing.F, decode func([]byte) (T, error), encode func(*T) []byte) {
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decode(b)
		if err != nil {
			checkMalformed(t, err)
			return
		}
		if out := encode(&v); !bytes.Equal(out, b) {
			t.Fatalf("round trip differs:\n in %x\nout %x", b, out)
		}
	})
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
		// The broker's decoder gives the same messages.
		repoch, rmsgs, _, err := DecodeSendRequestRaw(b)
		if err != nil || repoch != epoch || len(rmsgs) != len(msgs) {
			t.Fatalf("raw decode: epoch %d, %d messages, %v", repoch, len(rmsgs), err)
		}
		for i := range msgs {
			if !rmsgs[i].Equal(&msgs[i]) {
				t.Fatalf("raw message %d: %+v, want %+v", i, rmsgs[i], msgs[i])
			}
		}
	})
}

func FuzzDecodeSendResponse(f *testing.F) {
	addWithPrefixes(f, AppendSendResponse(nil, []SendResult{{StatusOK, 1, 2}, {StatusReadOnly, 0, 0}}))
	fuzzRoundTrip(f, func(b []byte) ([]SendResult, error) { return DecodeSendResponse(b, nil) },
		func(res *[]SendResult) []byte { return AppendSendResponse(nil, *res) })
}

func FuzzDecodePullRequest(f *testing.F) {
	addWithPrefixes(f, AppendPullRequest(nil, &PullRequest{Topic: "orders", Queue: 1, Offset: 5, MaxBytes: 4096, Epoch: 2}))
	addWithPrefixes(f, AppendPullRequest(nil, &PullRequest{Topic: "orders", Queue: 1, Offset: 5, Filter: "A || B", Group: "g", Member: "m"}))
	addWithPrefixes(f, AppendPullRequest(nil, &PullRequest{Topic: "orders", Queue: 1, Offset: 5, ReadUncommitted: true}))
	fuzzRoundTrip(f, DecodePullRequest, func(p *PullRequest) []byte { return AppendPullRequest(nil, p) })
}

func FuzzDecodePullResponse(f *testing.F) {
	resp := PullResponse{NextOffset: 3, MaxOffset: 3}
	for i, m := range sampleMessages() {
		resp.Messages = append(resp.Messages, StoredMessage{QueueOffset: int64(i), LogOffset: int64(i) * 100, Message: m})
	}
	addWithPrefixes(f, AppendPullResponse(nil, &resp))
	addWithPrefixes(f, AppendPullResponse(nil, &PullResponse{NextOffset: 7}))
	fuzzRoundTrip(f, DecodePullResponse, func(p *PullResponse) []byte { return AppendPullResponse(nil, p) })
}

func FuzzDecodeMessage(f *testing.F) {
	for _, m := range sampleMessages() {
		addWithPrefixes(f, AppendMessage(nil, &m))
	}
	fuzzRoundTrip(f, DecodeMessage, func(m *Message) []byte { return AppendMessage(nil, m) })
}

func FuzzDecodeTxnMark(f *testing.F) {
	addWithPrefixes(f, AppendTxnMark(nil, &TxnMark{Kind: TxnOpen, ID: TxnID{Producer: 7, Epoch: 2, Number: 9}, Time: 1 << 40, Topic: "orders", Queue: 3, First: 1 << 33}))
	addWithPrefixes(f, AppendTxnMark(nil, &TxnMark{Kind: TxnAbort, ID: TxnID{Producer: 7, Epoch: 2, Number: 9}, Time: 1 << 40, By: TxnByTimeout}))
	addWithPrefixes(f, AppendTxnMark(nil, &TxnMark{Kind: TxnPrepared, ID: TxnID{Producer: 7, Epoch: 2, Number: 9}, Time: 1 << 40, By: TxnByProducer}))
	fuzzRoundTrip(f, DecodeTxnMark, func(m *TxnMark) []byte { return AppendTxnMark(nil, m) })
}

func FuzzDecodeHAFetchRequest(f *testing.F) {
	addWithPrefixes(f, AppendHAFetchRequest(nil, &HAFetchRequest{Offset: 1 << 40, Acked: 1 << 39, MaxBytes: 1 << 20, WaitMillis: 100, Epoch: 4, BrokerID: "g1-b"}))
	addWithPrefixes(f, AppendHAFetchRequest(nil, &HAFetchRequest{Offset: 1 << 40, Acked: 1 << 40, Epoch: 4, BrokerID: "g1-b", Check: true, CheckAt: 1<<40 - 99, CheckCRC: 7}))
	addWithPrefixes(f, AppendHAFetchRequest(nil, &HAFetchRequest{Offset: 1 << 40, Acked: 1 << 40, Epoch: 4, BrokerID: "g1-b", Check: true, CheckAt: 1<<40 - 99, CheckCRC: 7, Sequenced: true, Seq: 9}))
	addWithPrefixes(f, AppendHAFetchRequest(nil, &HAFetchRequest{Offset: 1 << 40, Acked: 1 << 39, Epoch: 4, BrokerID: "g1-b", Sequenced: true, Seq: 10, After: 9, Follows: true}))
	fuzzRoundTrip(f, DecodeHAFetchRequest, func(req *HAFetchRequest) []byte { return AppendHAFetchRequest(nil, req) })
}

func FuzzDecodeRecoverRequest(f *testing.F) {
	addWithPrefixes(f, AppendRecoverRequest(nil, &RecoverRequest{Epoch: 3, BrokerID: "g1-m", From: 1 << 30, Cut: 1 << 29, Records: []byte("records")}))
	fuzzRoundTrip(f, DecodeRecoverRequest, func(q *RecoverRequest) []byte { return AppendRecoverRequest(nil, q) })
}

func FuzzDecodeRecoverResponse(f *testing.F) {
	addWithPrefixes(f, AppendRecoverResponse(nil, &RecoverResponse{Stored: 7, Duplicates: 2, End: 1 << 33}))
	fuzzRoundTrip(f, DecodeRecoverResponse, func(p *RecoverResponse) []byte { return AppendRecoverResponse(nil, p) })
}

func FuzzDecodeHAAck(f *testing.F) {
	addWithPrefixes(f, AppendHAAck(nil, &HAAck{Acked: 1 << 40, Epoch: 4, BrokerID: "g1-b"}))
	fuzzRoundTrip(f, DecodeHAAck, func(a *HAAck) []byte { return AppendHAAck(nil, a) })
}

func FuzzDecodeHAFetchResponse(f *testing.F) {
	addWithPrefixes(f, append(AppendHAFetchResponseHeader(nil, 77, 3), "records"...))
	fuzzRoundTrip(f, DecodeHAFetchResponse, func(resp *HAFetchResponse) []byte {
		return append(AppendHAFetchResponseHeader(nil, resp.MasterEnd, resp.Epoch), resp.Records...)
	})
}

func FuzzDecodeHAFetchResponseSequenced(f *testing.F) {
	addWithPrefixes(f, append(AppendHAFetchResponseStart(AppendHAFetchResponseHeader(nil, 77, 3), 70), "records"...))
	fuzzRoundTrip(f, DecodeHAFetchResponseSequenced, func(resp *HAFetchResponse) []byte {
		return append(AppendHAFetchResponseStart(AppendHAFetchResponseHeader(nil, resp.MasterEnd, resp.Epoch), resp.Start), resp.Records...)
	})
}

func FuzzDecodeIdentity(f *testing.F) {
	addWithPrefixes(f, AppendIdentity(nil, &Identity{Kind: KindBroker, ID: "g1-master", Group: "g1", Role: "master"}))
	fuzzRoundTrip(f, DecodeIdentity, func(id *Identity) []byte { return AppendIdentity(nil, id) })
}
