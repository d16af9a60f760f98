package protocol

import (
	"fmt"
	"testing"
)

// pullAnswer is a PULL answer of about 1 MiB of 1 KiB messages of one
// topic, as a consumer's drain reads them.
func pullAnswer() []byte {
	body := make([]byte, 1024)
	var msgs []StoredMessage
	size := 0
	for i := 0; size < 1<<20; i++ {
		m := Message{ID: fmt.Sprintf("5f3a9c0e1b2d-%d", i), Topic: "bench", Queue: 3, Reliability: Normal, Timestamp: 1_800_000_000_000,
			Producer: ProducerStamp{ID: 7, Epoch: 1, Seq: int64(i)}, Body: body}
		msgs = append(msgs, StoredMessage{QueueOffset: int64(i), LogOffset: int64(i) * 1100, StoreTime: 1_800_000_000_000, Message: m})
		size += 24 + m.EncodedSize()
	}
	return AppendPullResponse(nil, &PullResponse{NextOffset: int64(len(msgs)), MaxOffset: 1 << 30, Messages: msgs})
}

func BenchmarkDecodePullResponse(b *testing.B) {
	ans := pullAnswer()
	n, _ := DecodePullResponse(ans)
	b.SetBytes(int64(len(ans)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := DecodePullResponse(ans); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(n.Messages)), "ns/msg")
}

// BenchmarkPullDecoder is BenchmarkDecodePullResponse with one decoder
// reused, as a consumer's fetcher decodes.
func BenchmarkPullDecoder(b *testing.B) {
	ans := pullAnswer()
	var d PullDecoder
	n, _ := d.Decode(ans)
	count := len(n.Messages)
	b.SetBytes(int64(len(ans)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := d.Decode(ans); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*count), "ns/msg")
}
