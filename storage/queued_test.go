package storage

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
	"testing"
)

// goid is the calling goroutine's id, from its stack's first line.
func goid() uint64 {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	n, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return n
}

// AppendQueued never writes on the caller's goroutine: its completion runs
// on the writer goroutine, even when the log is idle, and appends queued
// one after another keep their order.
func TestAppendQueuedRunsOnTheWriter(t *testing.T) {
	l := openLog(t, Config{Dir: t.TempDir()})
	defer l.Close()
	var wg sync.WaitGroup
	var order []int64
	var mu sync.Mutex
	caller := goid()
	wg.Add(1)
	l.AppendQueued([]Entry{{Topic: "q", Payload: []byte("a")}}, false, func(pos []Position, err error) {
		defer wg.Done()
		if goid() == caller {
			t.Error("AppendQueued wrote its group on the caller's goroutine")
		}
		if err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		order = append(order, pos[0].QueueOffset)
		mu.Unlock()
	})
	for range 20 {
		wg.Add(1)
		l.AppendQueued([]Entry{{Topic: "q", Payload: []byte("b")}}, false, func(pos []Position, err error) {
			defer wg.Done()
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, pos[0].QueueOffset)
			mu.Unlock()
		})
	}
	wg.Wait()
	for i, qo := range order {
		if qo != int64(i) {
			t.Fatalf("queued appends landed at %v: want their order", order)
		}
	}
}
