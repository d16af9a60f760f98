package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/storage/vfs"
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

// A deletion that fails at any step reports the error and leaves a log that
// reads, appends, reopens and deletes again: the segments on disk are the
// ones in memory, a prefix of them is gone, and queue offsets hold.
func TestDeleteBeforeFailures(t *testing.T) {
	for _, c := range []struct {
		name      string
		rule      func(dir string) *vfs.Rule
		wantStart int64 // where the log starts after the failed deletion
	}{
		{"create the queue offsets file", func(string) *vfs.Rule {
			return vfs.Fail(vfs.OpCreate).Path(queuesName + ".tmp").With(syscall.ENOSPC)
		}, 0},
		{"write the queue offsets file", func(string) *vfs.Rule {
			return vfs.Fail(vfs.OpWrite).Path(queuesName + ".tmp").Partial(5).With(syscall.ENOSPC)
		}, 0},
		{"sync the queue offsets file", func(string) *vfs.Rule {
			return vfs.Fail(vfs.OpSync).Path(queuesName + ".tmp").With(syscall.EIO)
		}, 0},
		{"rename the queue offsets file", func(string) *vfs.Rule {
			return vfs.Fail(vfs.OpRename).Path(queuesName).With(syscall.EIO)
		}, 0},
		{"remove the first segment", func(dir string) *vfs.Rule {
			return vfs.Fail(vfs.OpRemove).Path(segName(dir, 0)).With(syscall.EACCES)
		}, 0},
		{"remove the second segment", func(dir string) *vfs.Rule {
			return vfs.Fail(vfs.OpRemove).Path(segName(dir, 1000)).With(syscall.EIO)
		}, 1000},
		{"sync the directory after removing", func(dir string) *vfs.Rule {
			return vfs.Fail(vfs.OpSyncDir).After(1).With(syscall.EIO) // the first is the queue offsets file's
		}, 3000},
	} {
		t.Run(c.name, func(t *testing.T) {
			efs := vfs.NewErrorFS(vfs.Default)
			dir := t.TempDir()
			cfg := Config{Dir: dir, FS: efs, SegmentSize: 1000, FlushInterval: time.Hour}
			l := openLog(t, cfg)
			m := model{}
			// Queue 3 lives only in the first segment, so a deletion takes all
			// its records; the others span every segment.
			var ends []int64
			for i := range 35 {
				q := uint32(i % 3)
				if i == 4 {
					q = 3
				}
				must(t, m.append(t, l, false, entry(q, fmt.Sprint("r", i), 100)))
				ends = append(ends, l.EndOffset())
			}
			rule := c.rule(dir)
			efs.Inject(rule)
			start, err := l.DeleteBefore(3000)
			isInjected(t, err, nil)
			if rule.Fired() != 1 {
				t.Fatalf("the rule failed %d calls", rule.Fired())
			}
			efs.DropAll()
			if start != c.wantStart || l.StartOffset() != c.wantStart {
				t.Fatalf("after the failed deletion: returned %d, starts at %d; want %d", start, l.StartOffset(), c.wantStart)
			}
			for _, base := range []int64{0, 1000, 2000, 3000} {
				_, err := os.Stat(segName(dir, base))
				if onDisk := err == nil; onDisk != (base >= c.wantStart) {
					t.Fatalf("segment %d on disk: %v; the log starts at %d", base, onDisk, c.wantStart)
				}
			}
			// Each queue starts at its first record still held.
			firsts := map[queueKey]int64{}
			for i, end := range ends {
				q := uint32(i % 3)
				if i == 4 {
					q = 3
				}
				if end <= c.wantStart {
					firsts[queueKey{"f", q}]++
				}
			}
			for k := range m {
				if first, _ := l.QueueRange(k.topic, k.queue); first != firsts[k] {
					t.Fatalf("%v starts at %d, want %d", k, first, firsts[k])
				}
			}
			m.check(t, l)
			must(t, m.append(t, l, false, entry(3, "after", 100), entry(0, "after", 100)))
			m.check(t, l)
			before := dumpQueues(t, l)
			must(t, l.Close())

			cfg.FS = nil
			l = openLog(t, cfg)
			defer l.Close()
			if l.StartOffset() != c.wantStart || fmt.Sprint(dumpQueues(t, l)) != fmt.Sprint(before) {
				t.Fatalf("reopened: starts at %d, queues differ: %v", l.StartOffset(), fmt.Sprint(dumpQueues(t, l)) != fmt.Sprint(before))
			}
			// Deleting again finishes the job.
			if start, err := l.DeleteBefore(3000); err != nil || start != 3000 {
				t.Fatalf("deleting again: %d, %v", start, err)
			}
			m.check(t, l)
		})
	}
}
