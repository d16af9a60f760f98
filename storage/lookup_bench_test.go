package storage

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/ferrymq/ferrymq/internal/testwait"
)

// BenchmarkLookup looks up one key over the whole window of a log of 1 GiB
// (1M records of 1 KiB, each with a key of its own, "k:<n>"), which it
// writes once per run, and reports the lookup's p50 and p99 latency, the
// bytes it read, the key tables' bytes per GiB of log, and the tail's
// memory per message (the key refs of the records past the last chunk).
//
//	go test -run '^$' -bench Lookup -benchtime 2000x ./storage/
func BenchmarkLookup(b *testing.B) {
	const records, size = 1 << 20, 1024
	dir := b.TempDir()
	cfg := Config{Dir: dir, LookupKeys: func(p []byte, add func([]byte)) {
		if len(p) >= 16 {
			add(p[:16])
		}
	}}
	l := openLog(b, cfg)
	defer l.Close()
	payload := make([]byte, size)
	key := func(n int) []byte { return fmt.Appendf(nil, "k:%014d", n) }
	for n := 0; n < records; n += 64 {
		batch := make([]Entry, 64)
		for i := range batch {
			p := slices.Clone(payload)
			copy(p, key(n+i))
			batch[i] = Entry{Topic: "bench", Queue: uint32(i % 8), Payload: p}
		}
		mustAppend(b, l, batch, false)
	}
	must(b, l.Flush())
	testwait.For(b, time.Minute, "the indexer", func() bool { return l.IndexStats().PendingCuts == 0 })
	st := l.IndexStats()
	tables, _ := filepath.Glob(filepath.Join(dir, indexDirName, "*"+keysFileSuffix))
	var tableBytes int64
	for _, n := range tables {
		fi, err := os.Stat(n)
		must(b, err)
		tableBytes += fi.Size()
	}
	end := l.EndOffset()
	tailMsgs := (end - st.IndexedOffset) / int64(recordSize(5, size))
	b.Logf("log %d bytes, %d chunks, %d key tables of %d bytes; tail: %d messages, %d key refs",
		end, st.Chunks, len(tables), tableBytes, tailMsgs, st.KeyRefs)

	b.Run("whole-window", func(b *testing.B) {
		lat := make([]time.Duration, 0, b.N)
		var scanned int64
		for range b.N {
			k := key(rand.IntN(records))
			t0 := time.Now()
			res, err := l.Lookup(LookupQuery{Key: k, Limit: 10})
			lat = append(lat, time.Since(t0))
			if err != nil || len(res.Offsets) == 0 || res.Next != 0 {
				b.Fatalf("lookup %s: %+v, %v", k, res, err)
			}
			scanned += res.ScannedBytes
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		b.ReportMetric(float64(scanned)/float64(b.N), "read-B/op")
		b.ReportMetric(float64(tableBytes)/(float64(end)/(1<<30)), "keytable-B/GiB")
		b.ReportMetric(float64(unsafe.Sizeof(keyRef{})*uintptr(st.KeyRefs))/float64(max(tailMsgs, 1)), "tail-B/msg")
	})
}
