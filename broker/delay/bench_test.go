package delay

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/storage"
)

// BenchmarkFollow measures Follow per delayed entry: each op is one entry
// appended (not timed) and followed, due within the next hour, with a
// checkpoint (which syncs every bucket file written since the last)
// every 20k entries.
func BenchmarkFollow(b *testing.B) { benchFollow(b, 3600_000) }

// BenchmarkFollowFar is BenchmarkFollow with due times spread over 90
// days: nearly every entry touches a bucket file of its own, which the
// next checkpoint syncs.
func BenchmarkFollowFar(b *testing.B) { benchFollow(b, 90*86400_000) }

func benchFollow(b *testing.B, spread int) {
	dir := b.TempDir()
	l := openTestLog(b, filepath.Join(dir, "log"), 0)
	defer l.Close()
	clk := &clock{now: time.UnixMilli(1_800_000_000_000)}
	x, err := Open(Config{Log: l, Dir: filepath.Join(dir, "delay"), Now: clk.Now})
	if err != nil {
		b.Fatal(err)
	}
	defer x.Close()
	now := clk.now.UnixMilli()
	const batch = 1000
	es := make([]storage.Entry, batch)
	b.ResetTimer()
	for done := 0; done < b.N; done += batch {
		b.StopTimer()
		n := min(batch, b.N-done)
		for i := range n {
			es[i] = delayedEntry("t", uint32(i%8), now+int64((done+i)*7919%spread), -1)
		}
		appendLog(b, l, true, es[:n]...)
		clk.now = clk.now.Add(50 * time.Millisecond) // 20k entries/s: a checkpoint every 20 batches
		b.StartTimer()
		if err := x.Follow(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "entries/s")
}

// BenchmarkDue measures Due and Release per entry, from a loaded backlog.
func BenchmarkDue(b *testing.B) {
	dir := b.TempDir()
	l := openTestLog(b, filepath.Join(dir, "log"), 0)
	defer l.Close()
	clk := &clock{now: time.UnixMilli(1_800_000_000_000)}
	x, err := Open(Config{Log: l, Dir: filepath.Join(dir, "delay"), Now: clk.Now})
	if err != nil {
		b.Fatal(err)
	}
	defer x.Close()
	now := clk.now.UnixMilli()
	es := make([]storage.Entry, 0, 1000)
	for done := 0; done < b.N; done += len(es) {
		es = es[:0]
		for i := 0; i < 1000 && done+i < b.N; i++ {
			es = append(es, delayedEntry("t", uint32(i%8), now-int64((done+i)*7919%600_000), -1))
		}
		appendLog(b, l, false, es...)
	}
	if err := x.Follow(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	got := 0
	for got < b.N {
		due := x.Due(clk.now, 100)
		if len(due) == 0 {
			b.Fatalf("Due gave %d of %d", got, b.N)
		}
		for _, e := range due {
			x.Release(e.At, true)
		}
		got += len(due)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "entries/s")
}
