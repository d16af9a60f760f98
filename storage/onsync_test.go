package storage

import (
	"sync"
	"testing"
	"time"
)

// TestOnSyncSeesEverySync: Config.OnSync gets one duration per sync of the
// segments, as many as the Flushes counter, adding up to FlushNanos.
func TestOnSyncSeesEverySync(t *testing.T) {
	var mu sync.Mutex
	var calls int64
	var total time.Duration
	l := openLog(t, Config{Dir: t.TempDir(), Flush: FlushSync, OnSync: func(d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		total += d
	}})
	for i := range 5 {
		mustAppend(t, l, []Entry{{Topic: "t", Queue: 0, Payload: payloadFor("t", 0, int64(i), 64)}}, true)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls < 5 || calls != l.Flushes.Load() || int64(total) != l.FlushNanos.Load() {
		t.Fatalf("OnSync ran %d times for %v; the log counts %d syncs for %v; want the same, at least one per synced append (5)",
			calls, total, l.Flushes.Load(), time.Duration(l.FlushNanos.Load()))
	}
}
