package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func TestDeleteBeforeKeepsQueueOffsets(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 1024}
	l := openLog(t, cfg)
	// Queue 0 is written only early (all its records get deleted); queue 1 all along.
	for i := range 20 {
		mustAppend(t, l, []Entry{{Topic: "r", Queue: 0, Payload: payloadFor("r", 0, int64(i), 100)}}, false)
	}
	for i := range 60 {
		mustAppend(t, l, []Entry{{Topic: "r", Queue: 1, Payload: payloadFor("r", 1, int64(i), 100)}}, false)
	}
	end := l.EndOffset()
	start, err := l.DeleteBefore(end - 2048)
	if err != nil {
		t.Fatal(err)
	}
	if start <= 0 || start > end-2048 || l.StartOffset() != start {
		t.Fatalf("start after deletion %d (end %d)", start, end)
	}
	first0, next0 := l.QueueRange("r", 0)
	first1, next1 := l.QueueRange("r", 1)
	if first0 != 20 || next0 != 20 || next1 != 60 || first1 == 0 || first1 >= 60 {
		t.Fatalf("ranges after deletion: q0 [%d,%d) q1 [%d,%d)", first0, next0, first1, next1)
	}
	if _, err := l.Read("r", 1, 0, 1<<20); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("read before the start: %v", err)
	}
	es, err := l.Read("r", 1, first1, 1<<20)
	if err != nil || len(es) != int(60-first1) || es[0].QueueOffset != first1 {
		t.Fatalf("read from the new first offset: %d entries, %v", len(es), err)
	}
	if _, err := l.ReadRaw(0, 100); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("raw read before the start: %v", err)
	}
	// Offsets continue, also for the queue whose records are all gone.
	pos := mustAppend(t, l, []Entry{{Topic: "r", Queue: 0, Payload: []byte("after")}}, false)
	if pos[0].QueueOffset != 20 {
		t.Fatalf("queue 0 went on at %d, want 20", pos[0].QueueOffset)
	}
	names, _ := os.ReadDir(dir)
	for _, n := range names {
		var base int64
		if _, err := fmt.Sscanf(n.Name(), "%020d.log", &base); err == nil && base < start {
			t.Fatalf("segment %s still on disk", n.Name())
		}
	}
	before := dumpQueues(t, l)
	must(t, l.Close())

	l = openLog(t, cfg)
	defer l.Close()
	if fmt.Sprint(dumpQueues(t, l)) != fmt.Sprint(before) || l.StartOffset() != start {
		t.Fatal("queues differ after reopening a trimmed log")
	}
	// A queue whose records were all deleted before the restart continues too.
	mustAppend(t, l, []Entry{{Topic: "r", Queue: 1, Payload: []byte("x")}}, false)
	_, _ = l.DeleteBefore(l.EndOffset())
	_, n1 := l.QueueRange("r", 1)
	must(t, l.Close())
	l2 := openLog(t, cfg)
	defer l2.Close()
	if _, n := l2.QueueRange("r", 1); n != n1 {
		t.Fatalf("queue 1 restarts at %d after its records were deleted, want %d", n, n1)
	}
	if pos := mustAppend(t, l2, []Entry{{Topic: "r", Queue: 1, Payload: []byte("y")}}, false); pos[0].QueueOffset != n1 {
		t.Fatalf("queue 1 went on at %d, want %d", pos[0].QueueOffset, n1)
	}
}

// A crash after the queue offsets were written but before the segments were
// removed leaves a log that opens with everything.
func TestCrashMidDeletion(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 512}
	l := openLog(t, cfg)
	for i := range 30 {
		mustAppend(t, l, []Entry{{Topic: "c", Queue: uint32(i % 2), Payload: payloadFor("c", uint32(i%2), int64(i/2), 80)}}, false)
	}
	want := dumpQueues(t, l)
	must(t, l.writeQueues(map[queueKey]int64{{"c", 0}: 10, {"c", 1}: 10}))
	crash(l)
	l = openLog(t, cfg)
	defer l.Close()
	if fmt.Sprint(dumpQueues(t, l)) != fmt.Sprint(want) {
		t.Fatal("records were lost or offsets changed after a crash in the middle of a deletion")
	}
	// A damaged queue offsets file is reported, not ignored.
	must(t, l.Close())
	flipByte(t, filepath.Join(dir, queuesName), 6)
	if _, err := Open(cfg); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open with a damaged queue offsets file: %v", err)
	}
}

func TestDeleteWhileReadingAndWriting(t *testing.T) {
	l := openLog(t, Config{Dir: t.TempDir(), SegmentSize: 4096})
	defer l.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := l.Append([]Entry{{Topic: "d", Payload: payloadFor("d", 0, int64(i), 200)}}, false); err != nil {
				errs <- err
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			first, _ := l.QueueRange("d", 0)
			es, err := l.Read("d", 0, first, 8192)
			if err != nil && !errors.Is(err, ErrOutOfRange) {
				errs <- err
				return
			}
			for j, e := range es {
				if e.QueueOffset != es[0].QueueOffset+int64(j) {
					errs <- fmt.Errorf("offsets not dense: %d after %d", e.QueueOffset, es[0].QueueOffset)
					return
				}
			}
		}
	}()
	for l.EndOffset() < 256<<10 {
		if _, err := l.DeleteBefore(l.EndOffset() - 16<<10); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Microsecond)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	first, next := l.QueueRange("d", 0)
	if first == 0 || next <= first {
		t.Fatalf("range after deletions: [%d,%d)", first, next)
	}
}
