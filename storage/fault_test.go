package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/storage/vfs"
)

// These tests fail the disk on purpose (vfs.ErrorFS) and check what a user
// of the log relies on: the append that met the failure gets the error, no
// acknowledged record is lost, queue offsets stay dense, and the log reopens.

// model is what a log must hold: per queue, the payloads stored, in queue
// offset order.
type model map[queueKey][]string

// append appends entries as one group; if the log takes them, the model
// records them, after checking that they got the next queue offsets.
func (m model) append(t testing.TB, l *Log, flush bool, entries ...Entry) error {
	t.Helper()
	pos, err := l.Append(entries, flush)
	if err != nil {
		return err
	}
	for i, e := range entries {
		k := queueKey{e.Topic, e.Queue}
		if pos[i].QueueOffset != int64(len(m[k])) {
			t.Fatalf("%v: appended at queue offset %d, want %d", k, pos[i].QueueOffset, len(m[k]))
		}
		m[k] = append(m[k], string(e.Payload))
	}
	return nil
}

// check reads every queue whole: it must hold exactly the model's payloads
// from its first offset on (retention may have removed the ones before),
// with dense offsets, and end where the model does.
func (m model) check(t testing.TB, l *Log) {
	t.Helper()
	for k, want := range m {
		first, next := l.QueueRange(k.topic, k.queue)
		if next != int64(len(want)) || first < 0 || first > next {
			t.Fatalf("%v: range [%d,%d), want it to end at %d", k, first, next, len(want))
		}
		es, err := l.Read(k.topic, k.queue, first, 1<<30)
		if err != nil {
			t.Fatalf("%v: %v", k, err)
		}
		if int64(len(es)) != next-first {
			t.Fatalf("%v: read %d entries of [%d,%d)", k, len(es), first, next)
		}
		for i, e := range es {
			if e.QueueOffset != first+int64(i) || string(e.Payload) != want[first+int64(i)] {
				t.Fatalf("%v: entry %d is %d %q, want %d %q", k, i, e.QueueOffset, e.Payload, first+int64(i), want[first+int64(i)])
			}
		}
	}
	l.Queues(func(topic string, queue uint32, first, next int64) {
		if _, ok := m[queueKey{topic, queue}]; !ok && next > 0 {
			t.Errorf("queue %s/%d holds [%d,%d), but no append to it succeeded", topic, queue, first, next)
		}
	})
}

// checkReopened checks l, closes it, and checks the log opened again from
// dir.
func (m model) checkReopened(t testing.TB, l *Log, dir string) {
	t.Helper()
	m.check(t, l)
	must(t, l.Close())
	l = openLog(t, Config{Dir: dir})
	defer l.Close()
	m.check(t, l)
}

// entry makes an entry whose record is exactly size bytes (topic "f").
func entry(queue uint32, tag string, size int) Entry {
	p := make([]byte, size-recordSize(1, 0))
	copy(p, tag)
	return Entry{Topic: "f", Queue: queue, Payload: p}
}

func segName(dir string, base int64) string {
	return filepath.Join(dir, fmt.Sprintf("%020d.log", base))
}

func fileSize(t testing.TB, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

func isInjected(t testing.TB, err error, cause error) {
	t.Helper()
	if !errors.Is(err, vfs.ErrInjected) || (cause != nil && !errors.Is(err, cause)) {
		t.Fatalf("got %v, want the injected error (%v)", err, cause)
	}
}

// The 3rd write to a segment file hits a full disk after writing part of
// its bytes: that append fails, the ones before and after do not.
func TestFullDiskFailsOnlyItsAppend(t *testing.T) {
	efs := vfs.NewErrorFS(vfs.Default)
	dir := t.TempDir()
	// Pre-touching off: its writes would count, and the file sizes checked
	// are the log's.
	cfg := Config{Dir: dir, FS: efs, FlushInterval: time.Hour, Pretouch: -1}
	l := openLog(t, cfg)
	third := vfs.Fail(vfs.OpWrite).Path("*.log").Nth(3).Partial(13).With(syscall.ENOSPC)
	efs.Inject(third)
	m := model{}
	for i := range 5 {
		before := l.EndOffset()
		err := m.append(t, l, false, entry(0, fmt.Sprint("r", i), 100), entry(1, fmt.Sprint("s", i), 60))
		if i == 2 {
			isInjected(t, err, syscall.ENOSPC)
			if l.EndOffset() != before || fileSize(t, segName(dir, 0)) != before {
				t.Fatalf("the failed append left the end at %d and the segment at %d bytes, want %d", l.EndOffset(), fileSize(t, segName(dir, 0)), before)
			}
			continue
		}
		must(t, err)
	}
	if third.Fired() != 1 {
		t.Fatalf("the rule failed %d writes", third.Fired())
	}
	m.checkReopened(t, l, dir)
}

func TestDiskFullOnWrite(t *testing.T) {
	efs := vfs.NewErrorFS(vfs.Default)
	dir := t.TempDir()
	l := openLog(t, Config{Dir: dir, FS: efs, SegmentSize: 4096})
	m := model{}
	must(t, m.append(t, l, true, Entry{Topic: "d", Payload: []byte("kept-0")}, Entry{Topic: "d", Payload: []byte("kept-1")}))
	end := l.EndOffset()

	full := vfs.Fail(vfs.OpWrite).Partial(13).With(syscall.ENOSPC) // a partial write, then ENOSPC
	efs.Inject(full)
	for range 3 {
		err := m.append(t, l, false, Entry{Topic: "d", Payload: make([]byte, 500)}, Entry{Topic: "e", Payload: []byte("x")})
		isInjected(t, err, syscall.ENOSPC)
	}
	// Rolling into a new segment on a full disk fails the same way.
	isInjected(t, m.append(t, l, false, Entry{Topic: "d", Payload: make([]byte, 5000)}), syscall.ENOSPC)
	if l.EndOffset() != end {
		t.Fatalf("failed appends moved the end from %d to %d", end, l.EndOffset())
	}
	efs.Drop(full)
	must(t, m.append(t, l, false, Entry{Topic: "d", Payload: []byte("after")}))
	m.checkReopened(t, l, dir)
}

// A group that rolls into a new segment fails whole when the disk fails in
// any step of the roll, and leaves no new segment behind.
func TestRollFails(t *testing.T) {
	for _, c := range []struct {
		name string
		rule func(dir string) *vfs.Rule
	}{
		{"create the segment", func(string) *vfs.Rule { return vfs.Fail(vfs.OpCreate).Path("*.log").With(syscall.ENOSPC) }},
		{"sync its directory", func(dir string) *vfs.Rule { return vfs.Fail(vfs.OpSyncDir).Path(dir).With(syscall.EIO) }},
		{"write to it", func(dir string) *vfs.Rule {
			return vfs.Fail(vfs.OpWrite).Path(segName(dir, 1000)).Partial(50).With(syscall.ENOSPC)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			efs := vfs.NewErrorFS(vfs.Default)
			dir := t.TempDir()
			// Pre-touching off: the file sizes checked are the log's.
			l := openLog(t, Config{Dir: dir, FS: efs, SegmentSize: 1000, FlushInterval: time.Hour, Pretouch: -1})
			m := model{}
			for i := range 9 {
				must(t, m.append(t, l, false, entry(uint32(i%2), fmt.Sprint("r", i), 100)))
			}
			// The first entry fills segment 0 to its size; the second starts
			// segment 1000.
			group := []Entry{entry(0, "fits", 100), entry(1, "rolls", 100)}
			rule := c.rule(dir)
			efs.Inject(rule)
			isInjected(t, m.append(t, l, false, group...), nil)
			if rule.Fired() != 1 {
				t.Fatalf("the rule failed %d calls", rule.Fired())
			}
			if l.EndOffset() != 900 || fileSize(t, segName(dir, 0)) != 900 {
				t.Fatalf("after the failed roll: end %d, segment 0 has %d bytes; want 900", l.EndOffset(), fileSize(t, segName(dir, 0)))
			}
			if _, err := os.Stat(segName(dir, 1000)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the failed roll left segment 1000 behind: %v", err)
			}
			m.check(t, l)

			efs.Drop(rule)
			must(t, m.append(t, l, false, group...))
			if l.EndOffset() != 1100 || fileSize(t, segName(dir, 1000)) != 100 {
				t.Fatalf("after the roll: end %d", l.EndOffset())
			}
			m.check(t, l)
			must(t, l.Close())
			l = openLog(t, Config{Dir: dir, SegmentSize: 1000})
			defer l.Close()
			if b := l.Broken(); b != nil {
				t.Fatalf("Broken() = %v after reopening, want nil", b)
			}
			m.check(t, l)
		})
	}
}

// When a failed write cannot be undone (the truncate back, or the removal
// of a new segment, fails too), the append gets the error, every later
// append gets ErrBroken, reads go on, and reopening recovers the log.
func TestFailedUndoBreaksTheLog(t *testing.T) {
	for _, c := range []struct {
		name  string
		rules func(dir string) []*vfs.Rule
		cause error
	}{
		{"truncate back", func(string) []*vfs.Rule {
			return []*vfs.Rule{
				vfs.Fail(vfs.OpWrite).Path("*.log").Partial(150).With(syscall.ENOSPC),
				vfs.Fail(vfs.OpTruncate).With(syscall.EIO),
			}
		}, syscall.ENOSPC},
		{"remove the new segment", func(dir string) []*vfs.Rule {
			return []*vfs.Rule{
				vfs.Fail(vfs.OpWrite).Path(segName(dir, 1000)).Partial(30).With(syscall.ENOSPC),
				vfs.Fail(vfs.OpRemove).With(syscall.EIO),
			}
		}, syscall.ENOSPC},
		{"remove a segment whose directory sync failed", func(dir string) []*vfs.Rule {
			return []*vfs.Rule{
				vfs.Fail(vfs.OpSyncDir).With(syscall.EIO),
				vfs.Fail(vfs.OpRemove).With(syscall.EIO),
			}
		}, syscall.EIO},
	} {
		t.Run(c.name, func(t *testing.T) {
			efs := vfs.NewErrorFS(vfs.Default)
			dir := t.TempDir()
			// Pre-touching off: the file sizes checked are the log's.
			l := openLog(t, Config{Dir: dir, FS: efs, SegmentSize: 1000, FlushInterval: time.Hour, Pretouch: -1})
			m := model{}
			for i := range 9 {
				must(t, m.append(t, l, i == 4, entry(uint32(i%2), fmt.Sprint("r", i), 100)))
			}
			rules := c.rules(dir)
			efs.Inject(rules...)
			err := m.append(t, l, false, entry(0, "fits", 100), entry(1, "rolls", 100))
			isInjected(t, err, c.cause)
			if !errors.Is(err, ErrBroken) {
				t.Fatalf("append whose undo failed: %v, want ErrBroken too", err)
			}
			if b := l.Broken(); !errors.Is(b, ErrBroken) {
				t.Fatalf("Broken() = %v after a failed undo, want ErrBroken (a broker's /healthz reads it)", b)
			}
			efs.DropAll()
			if err := m.append(t, l, false, entry(0, "later", 100)); !errors.Is(err, ErrBroken) {
				t.Fatalf("append to a broken log: %v, want ErrBroken", err)
			}
			if l.EndOffset() != 900 {
				t.Fatalf("end %d, want 900", l.EndOffset())
			}
			m.check(t, l) // reads go on
			must(t, l.Close())

			l = openLog(t, Config{Dir: dir, SegmentSize: 1000})
			defer l.Close()
			// The failed group may partly survive the reopen (its records
			// were on disk when the undo failed), but only after every
			// acknowledged record, whole, with dense offsets.
			for k, want := range m {
				es, err := l.Read(k.topic, k.queue, 0, 1<<30)
				must(t, err)
				if len(es) < len(want) {
					t.Fatalf("%v: %d entries after reopening, %d were acknowledged", k, len(es), len(want))
				}
				for i, e := range es {
					if e.QueueOffset != int64(i) || (i < len(want) && string(e.Payload) != want[i]) {
						t.Fatalf("%v: entry %d is %d %q", k, i, e.QueueOffset, e.Payload)
					}
				}
				m[k] = m[k][:0]
				for _, e := range es {
					m[k] = append(m[k], string(e.Payload))
				}
			}
			must(t, m.append(t, l, false, entry(0, "after", 100), entry(1, "after", 100)))
			m.check(t, l)
		})
	}
}

// A failed sync fails the appends waiting for it (their records stay in the
// log: at least once); syncs that work again complete later appends; Close
// reports a final sync that fails; nothing written is lost on reopen.
func TestSyncFails(t *testing.T) {
	efs := vfs.NewErrorFS(vfs.Default)
	dir := t.TempDir()
	l := openLog(t, Config{Dir: dir, FS: efs, Flush: FlushSync, FlushInterval: time.Hour})
	m := model{}
	must(t, m.append(t, l, false, Entry{Topic: "s", Payload: []byte("a")}))

	// Every segment sync after the first fails.
	failing := vfs.Fail(vfs.OpSync).Path("*.log").After(1).With(syscall.ENOSPC)
	efs.Inject(failing)
	must(t, m.append(t, l, false, Entry{Topic: "s", Payload: []byte("b")}))
	flushed := l.FlushedOffset()
	isInjected(t, m.append(t, l, false, Entry{Topic: "s", Payload: []byte("c")}), syscall.ENOSPC)
	m[queueKey{"s", 0}] = append(m[queueKey{"s", 0}], "c") // in the log, not acknowledged
	isInjected(t, l.Flush(), syscall.ENOSPC)
	if l.FlushedOffset() != flushed {
		t.Fatalf("a failed sync moved the flushed offset from %d to %d", flushed, l.FlushedOffset())
	}
	m.check(t, l)

	efs.Drop(failing)
	pos, err := l.Append([]Entry{{Topic: "s", Payload: []byte("d")}}, false)
	must(t, err)
	m[queueKey{"s", 0}] = append(m[queueKey{"s", 0}], "d")
	if l.FlushedOffset() < pos[0].End {
		t.Fatal("an append completed unsynced after syncs recovered")
	}
	must(t, l.Flush())

	// Close reports a final sync that fails.
	efs2 := vfs.NewErrorFS(vfs.Default)
	l2 := openLog(t, Config{Dir: t.TempDir(), FS: efs2, FlushInterval: time.Hour})
	efs2.Inject(vfs.Fail(vfs.OpSync).With(syscall.EIO))
	if _, err := l2.Append([]Entry{{Topic: "s", Payload: []byte("unsynced")}}, false); err != nil {
		t.Fatal(err)
	}
	if err := l2.Close(); err == nil {
		t.Fatal("Close after a failed final sync returned nil")
	}

	m.checkReopened(t, l, dir)
}

// Open never takes a read error for a torn tail: it fails and truncates
// nothing, and a later Open finds everything.
func TestRecoveryReadErrorFailsOpen(t *testing.T) {
	for _, c := range []struct {
		name, path string
	}{
		{"segment", "*.log"},
		{"checkpoint", checkpointName},
		{"queue offsets", queuesName},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := Config{Dir: dir, SegmentSize: 1000}
			l := openLog(t, cfg)
			m := model{}
			for i := range 30 {
				must(t, m.append(t, l, false, entry(uint32(i%3), fmt.Sprint("r", i), 100)))
			}
			if _, err := l.DeleteBefore(1000); err != nil { // writes the queue offsets file
				t.Fatal(err)
			}
			must(t, l.Close())
			sizes := map[string]int64{}
			names, _ := os.ReadDir(dir)
			for _, n := range names {
				sizes[n.Name()] = fileSize(t, filepath.Join(dir, n.Name()))
			}

			efs := vfs.NewErrorFS(vfs.Default)
			efs.Inject(vfs.Fail(vfs.OpRead).Path(c.path).With(syscall.EIO))
			cfg.FS = efs
			if _, err := Open(cfg); !errors.Is(err, syscall.EIO) {
				t.Fatalf("Open with an unreadable %s: %v, want EIO", c.name, err)
			}
			after, _ := os.ReadDir(dir)
			for _, n := range after {
				if s := fileSize(t, filepath.Join(dir, n.Name())); s != sizes[n.Name()] {
					t.Fatalf("the failed Open changed %s from %d to %d bytes", n.Name(), sizes[n.Name()], s)
				}
			}
			if len(after) != len(names) {
				t.Fatalf("the failed Open changed the directory from %d to %d files", len(names), len(after))
			}
			cfg.FS = nil
			l = openLog(t, cfg)
			defer l.Close()
			m.check(t, l)
		})
	}
}

// Corruption before the checkpoint is reported even when the checkpoint
// cannot be read: Open must not take the durable records after it for a torn
// tail and cut them.
func TestUnreadableCheckpointDoesNotHideCorruption(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, Config{Dir: dir, SegmentSize: 512})
	var fifth Position
	for i := range 40 {
		pos := mustAppend(t, l, []Entry{{Topic: "m", Payload: payloadFor("m", 0, int64(i), 60)}}, false)
		if i == 5 {
			fifth = pos[0]
		}
	}
	must(t, l.Close())
	seg, local := locate(t, dir, fifth.LogOffset+20)
	flipByte(t, seg, local)
	// Without its index, Open checks every record (with it, reads find the
	// corruption: TestMidLogCorruptionIsReported).
	must(t, os.RemoveAll(filepath.Join(dir, indexDirName)))

	efs := vfs.NewErrorFS(vfs.Default)
	efs.Inject(vfs.Fail(vfs.OpRead).Path(checkpointName).With(syscall.EIO))
	if _, err := Open(Config{Dir: dir, SegmentSize: 512, FS: efs}); err == nil {
		t.Fatal("Open succeeded with an unreadable checkpoint over mid-log corruption")
	}
	_, err := Open(Config{Dir: dir, SegmentSize: 512})
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Offset != fifth.LogOffset {
		t.Fatalf("Open after the checkpoint is readable again: %v, want corruption at %d", err, fifth.LogOffset)
	}
}
