package protocol

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

func sampleMessages() []Message {
	return []Message{
		{ID: "m-1", Topic: "orders", Queue: 3, Reliability: Normal, Timestamp: 1700000000123,
			Body: []byte("hello")},
		{ID: "m-2", Topic: "orders.eu", Queue: 0, Reliability: High, Timestamp: -1,
			Properties: []Property{{"key", "k1"}, {"trace", ""}}, Body: bytes.Repeat([]byte{0xAB}, 1000)},
		{ID: "m-3", Topic: "t", Queue: 1<<32 - 1, Body: nil},
		{ID: "m-4", Topic: "orders", Queue: 2, Reliability: High, Timestamp: 5,
			Producer: ProducerStamp{ID: 1 << 40, Epoch: 3, Seq: 12345}, Body: []byte("stamped")},
		{ID: "m-5", Topic: "orders", Queue: 1, Timestamp: 6, Tag: "paid", Body: []byte("tagged")},
		{ID: "m-6", Topic: "orders", Queue: 1, Timestamp: 7, Producer: ProducerStamp{ID: 9, Seq: 1},
			Schedule: Schedule{Kind: ScheduleDelayed, At: 1 << 41, Ref: -1}, Tag: strings.Repeat("t", MaxTagLen),
			Properties: []Property{{"key", "k"}}, Body: []byte("all of it")},
		{ID: "m-7", Topic: "orders", Queue: 4, Timestamp: 8, Producer: ProducerStamp{ID: 9, Epoch: 2, Seq: 3}, Txn: 1<<40 + 1,
			Schedule: Schedule{Kind: ScheduleDelayed, At: 1 << 41, Ref: -1}, Tag: "t", Body: []byte("in a transaction")},
	}
}

func TestFrameRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		f    Frame
	}{
		{"empty request", Frame{Code: CodeSend, Opaque: 1}},
		{"response with status", Frame{Flags: FlagResponse, Code: CodePull, Status: StatusReadOnly, Opaque: 1<<32 - 1, Body: []byte("group g1 is read-only")}},
		{"oneway with header", Frame{Flags: FlagOneway, Code: CodeHeartbeat, Header: []byte{1, 2, 3}, Body: []byte("x")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := AppendFrame(nil, &tc.f)
			if err != nil {
				t.Fatal(err)
			}
			if len(b) != tc.f.Size() {
				t.Fatalf("encoded %d bytes, Size says %d", len(b), tc.f.Size())
			}
			got, err := DecodeFrame(b)
			if err != nil {
				t.Fatal(err)
			}
			if got.Flags != tc.f.Flags || got.Code != tc.f.Code || got.Status != tc.f.Status ||
				got.Opaque != tc.f.Opaque || !bytes.Equal(got.Header, tc.f.Header) || !bytes.Equal(got.Body, tc.f.Body) {
				t.Fatalf("round trip: got %+v want %+v", got, tc.f)
			}
		})
	}
}

func TestFrameCaps(t *testing.T) {
	big := Frame{Code: CodeSend, Body: make([]byte, MaxFrameSize-FixedHeaderSize+1)}
	if _, err := AppendFrame(nil, &big); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("frame over the cap: got %v, want ErrFrameTooLarge", err)
	}
	fits := Frame{Code: CodeSend, Body: make([]byte, MaxFrameSize-FixedHeaderSize)}
	if _, err := AppendFrame(nil, &fits); err != nil {
		t.Fatalf("frame at the cap: %v", err)
	}
	hdr := Frame{Header: make([]byte, MaxHeaderSize+1)}
	if _, err := AppendFrame(nil, &hdr); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("header over the cap: got %v", err)
	}
	if _, err := FrameLength([]byte{0x01, 0, 0, 1}); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("length over the cap: got %v", err)
	}
	if _, err := FrameLength([]byte{0, 0, 0, 3}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("length under the header: got %v", err)
	}
}

func TestFrameRejectsBadFields(t *testing.T) {
	good, _ := AppendFrame(nil, &Frame{Code: CodeSend, Opaque: 7, Body: []byte("abc")})
	mutate := func(i int, v byte) []byte {
		b := bytes.Clone(good)
		b[i] = v
		return b
	}
	cases := map[string][]byte{
		"bad magic":         mutate(4, 0),
		"bad version":       mutate(6, 9),
		"unknown flag":      mutate(7, 0x80),
		"oneway response":   mutate(7, FlagOneway|FlagResponse),
		"header past end":   mutate(17, 200),
		"length mismatch":   good[:len(good)-1],
		"empty":             nil,
		"short length word": good[:3],
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := DecodeFrame(b); !errors.Is(err, ErrMalformed) {
				t.Fatalf("got %v, want ErrMalformed", err)
			}
		})
	}
}

func TestSendRoundTrip(t *testing.T) {
	msgs := sampleMessages()
	b := AppendSendRequest(nil, 7, msgs)
	size := SendRequestHeaderSize
	for i := range msgs {
		size += msgs[i].EncodedSize()
	}
	if len(b) != size {
		t.Fatalf("encoded %d bytes, EncodedSize sums to %d", len(b), size)
	}
	epoch, got, err := DecodeSendRequest(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if epoch != 7 {
		t.Fatalf("epoch %d, want 7", epoch)
	}
	if len(got) != len(msgs) {
		t.Fatalf("got %d messages, want %d", len(got), len(msgs))
	}
	for i := range msgs {
		if !got[i].Equal(&msgs[i]) {
			t.Errorf("message %d: got %+v want %+v", i, got[i], msgs[i])
		}
	}
	// The raw form gives each message's own encoding.
	repoch, rmsgs, raws, err := DecodeSendRequestRaw(b)
	if err != nil || len(raws) != len(msgs) || repoch != 7 {
		t.Fatalf("raw decode: %d raws, %v", len(raws), err)
	}
	for i := range msgs {
		if !bytes.Equal(raws[i], AppendMessage(nil, &msgs[i])) || !rmsgs[i].Equal(&msgs[i]) {
			t.Fatalf("raw message %d differs", i)
		}
	}
	// Every strict prefix is an error, never a panic or a partial batch.
	for n := 0; n < len(b); n++ {
		if _, out, err := DecodeSendRequest(b[:n], nil); err == nil || len(out) != 0 {
			t.Fatalf("prefix of %d bytes: got %d messages, err %v", n, len(out), err)
		}
	}

	results := []SendResult{{StatusOK, 0, 0}, {StatusReadOnly, 0, 0}, {StatusOK, 1 << 40, 1 << 50}}
	rb := AppendSendResponse(nil, results)
	gotRes, err := DecodeSendResponse(rb, nil)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(gotRes) != fmt.Sprint(results) {
		t.Fatalf("results: got %v want %v", gotRes, results)
	}
}

func TestHostileCountDoesNotAllocate(t *testing.T) {
	// A count of 2^32-1 messages in an 8-byte body must fail before allocating.
	b := []byte{0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 10 {
		if _, _, err := DecodeSendRequest(b, nil); !errors.Is(err, ErrMalformed) {
			t.Fatalf("got %v", err)
		}
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 64<<10 {
		t.Fatalf("%d bytes allocated for 10 hostile counts", n)
	}
	if _, err := DecodePullResponse(append(make([]byte, 24), b...)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("pull response with hostile count: %v", err)
	}
}

func TestPullRoundTrip(t *testing.T) {
	req := PullRequest{Topic: "orders", Queue: 2, Offset: 42, MaxBytes: 1 << 20, Epoch: 3, WaitMillis: 500}
	got, err := DecodePullRequest(AppendPullRequest(nil, &req))
	if err != nil || got != req {
		t.Fatalf("got %+v, %v; want %+v", got, err, req)
	}
	req.Filter = "A || B"
	got, err = DecodePullRequest(AppendPullRequest(nil, &req))
	if err != nil || got != req {
		t.Fatalf("with a filter: got %+v, %v; want %+v", got, err, req)
	}
	req.Filter, req.Group, req.Member = "", "billing", "m-1"
	got, err = DecodePullRequest(AppendPullRequest(nil, &req))
	if err != nil || got != req {
		t.Fatalf("with a group and member: got %+v, %v; want %+v", got, err, req)
	}
	long := req
	long.Filter = strings.Repeat("A", MaxFilterLen+1)
	if _, err := DecodePullRequest(AppendPullRequest(nil, &long)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a filter over the cap: %v", err)
	}
	neg := req
	neg.Offset = -1
	if _, err := DecodePullRequest(AppendPullRequest(nil, &neg)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("negative offset: %v", err)
	}
	msgs := sampleMessages()
	resp := PullResponse{NextOffset: 45, MinOffset: 0, MaxOffset: 100, Epoch: 3}
	for i, m := range msgs {
		resp.Messages = append(resp.Messages, StoredMessage{QueueOffset: 42 + int64(i), LogOffset: int64(i) * 1000, StoreTime: 1_800_000_000_000 + int64(i), Message: m})
	}
	b := AppendPullResponse(nil, &resp)
	// The raw form a broker writes gives the same bytes.
	raw := AppendPullResponseHeader(nil, 45, 0, 100, 3, len(msgs))
	for i := range msgs {
		raw = AppendStoredRaw(raw, 42+int64(i), int64(i)*1000, 1_800_000_000_000+int64(i), AppendMessage(nil, &msgs[i]))
	}
	if !bytes.Equal(b, raw) {
		t.Fatal("AppendStoredRaw differs from AppendStoredMessage")
	}
	gotResp, err := DecodePullResponse(b)
	if err != nil {
		t.Fatal(err)
	}
	if gotResp.NextOffset != 45 || gotResp.MaxOffset != 100 || len(gotResp.Messages) != len(msgs) {
		t.Fatalf("got %+v", gotResp)
	}
	for i := range msgs {
		sm := gotResp.Messages[i]
		if sm.QueueOffset != 42+int64(i) || !sm.Message.Equal(&msgs[i]) {
			t.Errorf("message %d: got %+v", i, sm)
		}
	}
}

func TestMessageValidate(t *testing.T) {
	ok := Message{ID: "a", Topic: "t-1.x_y", Body: []byte("b")}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid message: %v", err)
	}
	cases := []struct {
		name string
		edit func(m *Message)
		want error
	}{
		{"too large", func(m *Message) { m.Body = make([]byte, MaxMessageSize+1) }, ErrMessageTooLarge},
		{"no id", func(m *Message) { m.ID = "" }, ErrInvalid},
		{"no topic", func(m *Message) { m.Topic = "" }, ErrInvalid},
		{"bad topic byte", func(m *Message) { m.Topic = "a/b" }, ErrInvalid},
		{"bad reliability", func(m *Message) { m.Reliability = 7 }, ErrInvalid},
		{"empty property key", func(m *Message) { m.Properties = []Property{{"", "v"}} }, ErrInvalid},
		{"long tag", func(m *Message) { m.Tag = strings.Repeat("t", MaxTagLen+1) }, ErrInvalid},
		{"tag with a space", func(m *Message) { m.Tag = "a b" }, ErrInvalid},
		{"tag with ||", func(m *Message) { m.Tag = "a||b" }, ErrInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := ok
			tc.edit(&m)
			if err := m.Validate(); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestStatusTable(t *testing.T) {
	for s := Status(0); s < 64; s++ {
		if !s.Known() {
			if s.Retriable() {
				t.Errorf("unknown status %d is retriable", s)
			}
			continue
		}
		if s.String() == "" || s.String()[0] == 'S' && s.String()[:6] == "STATUS" {
			t.Errorf("status %d has no name", s)
		}
	}
	retriable := []Status{StatusReadOnly, StatusNotMaster, StatusSlaveLagging, StatusNoRoute, StatusBusy, StatusStoreError}
	for _, s := range retriable {
		if !s.Retriable() {
			t.Errorf("%v should be retriable", s)
		}
	}
	final := []Status{StatusOK, StatusMessageTooLarge, StatusInvalid, StatusUnknownTopic, StatusDuplicate}
	for _, s := range final {
		if s.Retriable() {
			t.Errorf("%v should not be retriable", s)
		}
	}
	err := fmt.Errorf("send: %w", ErrorForStatus(StatusReadOnly, "group g1"))
	if !errors.Is(err, ErrReadOnly) || errors.Is(err, ErrNotMaster) {
		t.Fatalf("errors.Is on a wrapped status error is wrong: %v", err)
	}
	if StatusOf(err) != StatusReadOnly || !IsRetriable(err) {
		t.Fatalf("StatusOf = %v", StatusOf(err))
	}
	if StatusOf(fmt.Errorf("x: %w", ErrMalformed)) != StatusInvalid || StatusOf(errors.New("boom")) != StatusInternal {
		t.Fatal("StatusOf maps plain errors wrong")
	}
	if ErrorForStatus(StatusOK, "") != nil {
		t.Fatal("OK must be a nil error")
	}
}

func BenchmarkAppendSendRequest(b *testing.B) {
	msgs := make([]Message, 64)
	for i := range msgs {
		msgs[i] = Message{ID: fmt.Sprintf("id-%d", i), Topic: "bench", Queue: uint32(i % 8), Body: make([]byte, 1024)}
	}
	buf := make([]byte, 0, 128<<10)
	b.SetBytes(int64(len(AppendSendRequest(nil, 1, msgs))))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendSendRequest(buf[:0], 1, msgs)
	}
}

// TestSendRequestRawAllocs: the broker's decoder allocates per batch, not
// per message (the messages, their encodings, the ids' one string and the
// topic's: 4), and the ids are copies: reusing the frame leaves them intact.
func TestSendRequestRawAllocs(t *testing.T) {
	msgs := make([]Message, 64)
	for i := range msgs {
		msgs[i] = Message{ID: fmt.Sprintf("id-%d", i), Topic: "bench", Queue: uint32(i % 8), Body: make([]byte, 16)}
	}
	enc := AppendSendRequest(nil, 1, msgs)
	allocs := testing.AllocsPerRun(100, func() {
		if _, _, _, err := DecodeSendRequestRaw(enc); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 8 { // 4; a few more under -race
		t.Fatalf("%.0f allocations to decode a batch of %d, want at most 8", allocs, len(msgs))
	}
	_, got, _, err := DecodeSendRequestRaw(enc)
	if err != nil {
		t.Fatal(err)
	}
	clear(enc)
	for i := range msgs {
		if got[i].ID != msgs[i].ID {
			t.Fatalf("message %d: id %q after the frame was cleared, want %q", i, got[i].ID, msgs[i].ID)
		}
	}
}

func BenchmarkDecodeSendRequestRaw(b *testing.B) {
	msgs := make([]Message, 64)
	for i := range msgs {
		msgs[i] = Message{ID: fmt.Sprintf("id-%d", i), Topic: "bench", Queue: uint32(i % 8), Body: make([]byte, 1024)}
	}
	enc := AppendSendRequest(nil, 1, msgs)
	b.SetBytes(int64(len(enc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, _, err := DecodeSendRequestRaw(enc); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeSendRequest(b *testing.B) {
	msgs := make([]Message, 64)
	for i := range msgs {
		msgs[i] = Message{ID: fmt.Sprintf("id-%d", i), Topic: "bench", Queue: uint32(i % 8), Body: make([]byte, 1024)}
	}
	enc := AppendSendRequest(nil, 1, msgs)
	out := make([]Message, 0, 64)
	b.SetBytes(int64(len(enc)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		_, out, err = DecodeSendRequest(enc, out[:0])
		if err != nil {
			b.Fatal(err)
		}
	}
}

// A PullDecoder decodes answer after answer as DecodePullResponse does,
// reusing its memory: an answer costs one allocation (its ids' string)
// besides its messages' properties, and
// what a longer answer before it left holds none of that answer's bytes.
func TestPullDecoderReuse(t *testing.T) {
	answer := func(n int, props bool) []byte {
		msgs := sampleMessages()
		resp := PullResponse{NextOffset: int64(n), MaxOffset: 100, Epoch: 2}
		for i := range n {
			m := msgs[i%len(msgs)]
			m.ID = fmt.Sprintf("id-%d", i)
			if !props {
				m.Topic, m.Properties = "orders", nil
			}
			resp.Messages = append(resp.Messages, StoredMessage{QueueOffset: int64(i), LogOffset: int64(i) * 10, StoreTime: int64(i), Message: m})
		}
		return AppendPullResponse(nil, &resp)
	}
	var d PullDecoder
	for _, n := range []int{50, 3, 0, 50} {
		b := answer(n, true)
		want, err := DecodePullResponse(b)
		if err != nil {
			t.Fatal(err)
		}
		got, err := d.Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		if got.NextOffset != want.NextOffset || got.MaxOffset != want.MaxOffset || got.Epoch != want.Epoch || len(got.Messages) != n {
			t.Fatalf("%d messages: got %+v, want %+v", n, got, want)
		}
		for i := range got.Messages {
			g, w := &got.Messages[i], &want.Messages[i]
			if g.QueueOffset != w.QueueOffset || g.LogOffset != w.LogOffset || g.StoreTime != w.StoreTime || !g.Message.Equal(&w.Message) {
				t.Fatalf("%d messages: message %d is %+v, want %+v", n, i, g, w)
			}
		}
		for i, sm := range d.msgs[n:cap(d.msgs)] {
			if sm.Message.Body != nil || sm.Message.ID != "" {
				t.Fatalf("after an answer of %d: entry %d still holds an earlier answer's message", n, n+i)
			}
		}
	}
	b := answer(50, false)
	if allocs := testing.AllocsPerRun(20, func() { _, _ = d.Decode(b) }); allocs > 1 {
		t.Errorf("%v allocations to decode an answer of 50 messages of one topic without properties; want 1 (their ids)", allocs)
	}
	// A malformed answer after good ones is refused as ever.
	if _, err := d.Decode(b[:len(b)-1]); !errors.Is(err, ErrMalformed) {
		t.Fatalf("truncated answer: %v", err)
	}
	if _, err := d.Decode(b[:36+10]); !errors.Is(err, ErrMalformed) {
		t.Fatalf("answer cut in its first message: %v", err)
	}
}

func TestTxnIDs(t *testing.T) {
	id := TxnID{Producer: 12, Epoch: 3, Number: 40}
	got, err := ParseTxnID(id.String())
	if err != nil || got != id {
		t.Fatalf("ParseTxnID(%q) = %+v, %v", id.String(), got, err)
	}
	for _, bad := range []string{"", "1.2", "0.1.1", "1.1.0", "1.70000.1", "1.2.3x", "01.2.3", "-1.2.3"} {
		if _, err := ParseTxnID(bad); err == nil {
			t.Errorf("ParseTxnID(%q) took it", bad)
		}
	}
	if !(TxnID{1, 2, 9}).Before(TxnID{1, 3, 1}) || !(TxnID{1, 3, 1}).Before(TxnID{1, 3, 2}) || (TxnID{1, 3, 2}).Before(TxnID{1, 3, 2}) {
		t.Error("Before orders by epoch, then number")
	}
	m := Message{ID: "a", Topic: "t", Producer: ProducerStamp{ID: 12, Epoch: 3, Seq: 5}, Txn: 40}
	raw := AppendMessage(nil, &m)
	if got, ok := PeekTxn(raw); !ok || got != id || TxnOf(&m) != id {
		t.Fatalf("PeekTxn = %+v %v, TxnOf = %+v; want %+v", got, ok, TxnOf(&m), id)
	}
	m.Txn, m.Producer = 0, ProducerStamp{}
	if got, ok := PeekTxn(AppendMessage(nil, &m)); !ok || !got.IsZero() {
		t.Fatalf("PeekTxn of a plain message = %+v %v", got, ok)
	}
	m.Txn = 4
	if err := m.Validate(); err == nil {
		t.Error("a transaction's message without a stamp validated")
	}
}
