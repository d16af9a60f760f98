package delay

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/storage"
)

// TestBoundedMemory: 200k entries spread over 30 days cost memory for
// the window's share only, and Due returns exactly those due, in order.
func TestBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("appends 200k records")
	}
	for _, width := range []time.Duration{10 * time.Second, time.Hour} {
		t.Run(width.String(), func(t *testing.T) { testBoundedMemory(t, width) })
	}
}

func testBoundedMemory(t *testing.T, width time.Duration) {
	dir := t.TempDir()
	l := openTestLog(t, filepath.Join(dir, "log"), 0)
	defer l.Close()
	clk := &clock{now: time.UnixMilli(1_800_000_000_000)}
	x, err := Open(Config{Log: l, Dir: filepath.Join(dir, "delay"), Now: clk.Now,
		BucketWidth: width, Window: 30 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	const n, span = 200_000, 30 * 86400_000
	start := clk.now.UnixMilli()
	dues := make([]int64, 0, n)
	batch := make([]storage.Entry, 0, 1000)
	for i := 0; i < n; i++ {
		due := start + int64(i)*7919%span // spread, not in order
		dues = append(dues, due)
		batch = append(batch, delayedEntry("t", uint32(i%4), due, -1))
		if len(batch) == cap(batch) {
			appendLog(t, l, false, batch...)
			batch = batch[:0]
		}
	}
	if err := x.Follow(); err != nil {
		t.Fatal(err)
	}
	share := int64(n) * (width + 30*time.Minute).Milliseconds() / span
	maxLoaded := 3 * share // the window's buckets, a little over
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	t.Logf("after following %d entries: %+v (at most %d loaded allowed), heap %d MiB", n, x.Stats(), maxLoaded, ms.HeapAlloc>>20)
	if s := x.Stats(); s.Pending != n || s.Loaded > maxLoaded {
		t.Fatalf("after following %d entries: %+v, want all pending and at most %d loaded", n, s, maxLoaded)
	}
	// Two hours later exactly the entries due by then come out, in order.
	clk.now = clk.now.Add(2 * time.Hour)
	var want []int64
	for _, d := range dues {
		if d <= clk.now.UnixMilli() {
			want = append(want, d)
		}
	}
	slices.Sort(want)
	var got []int64
	for {
		es := x.Due(clk.now, 100)
		if len(es) == 0 {
			break
		}
		for _, e := range es {
			got = append(got, e.DueAt)
			pos := appendLog(t, l, false, releaseEntries(e)...)
			_ = pos
			x.Release(e.At, true)
		}
		if err := x.Follow(); err != nil {
			t.Fatal(err)
		}
		if len(got) > n {
			t.Fatal("Due never ends")
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Due gave %d entries, want the %d due (first %v, want %v)", len(got), len(want), got[:min(5, len(got))], want[:min(5, len(want))])
	}
	t.Logf("after releasing the %d due: %+v", len(want), x.Stats())
	if s := x.Stats(); s.Pending != int64(n-len(want)) || s.Loaded > maxLoaded {
		t.Fatalf("after the releases: %+v, want %d pending and at most %d loaded", s, n-len(want), maxLoaded)
	}
}

// TestReopenIgnoresItemsPastW: items of records past the checkpoint, which
// a crash took back from the log, are not believed at reopen; the records
// at their offsets now are indexed instead.
func TestReopenIgnoresItemsPastW(t *testing.T) {
	dir := t.TempDir()
	l := openTestLog(t, filepath.Join(dir, "log"), 0)
	defer l.Close()
	clk := &clock{now: time.UnixMilli(1_800_000_000_000)}
	cfg := Config{Log: l, Dir: filepath.Join(dir, "delay"), Now: clk.Now}
	x, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := clk.now.UnixMilli()
	a := appendLog(t, l, true, delayedEntry("t", 0, now+5_000, -1), delayedEntry("t", 0, now+86400_000, -1))
	clk.now = clk.now.Add(time.Hour) // a checkpoint is due
	if err := x.Follow(); err != nil {
		t.Fatal(err)
	}
	x.checkpointWritten()
	w := x.Stats().Followed
	if w != l.FlushedOffset() {
		t.Fatalf("the checkpoint covers %d, want the flushed offset %d", w, l.FlushedOffset())
	}
	// Not flushed: the index follows them into its files, not its checkpoint.
	lost := appendLog(t, l, false, delayedEntry("t", 0, now+1_000, -1), delayedEntry("t", 0, now+7*86400_000, -1),
		delayedEntry("t", 0, now+86400_000+1_000, -1)) // due in the hour of a[1]: the same far file
	if err := x.Follow(); err != nil {
		t.Fatal(err)
	}
	if p := x.Pending(""); p != 5 || x.Stats().Followed != w {
		t.Fatalf("pending %d, followed %d: want 5 and still %d", p, x.Stats().Followed, w)
	}
	x.crash()
	far := filepath.Join(cfg.Dir, farName((now+7*86400_000)/3600_000*3600_000)) // due far ahead: in a far file
	if fi, err := os.Stat(far); err != nil || fi.Size() != itemSize {
		t.Fatalf("the unflushed entry's bucket file: %v, %v", fi, err)
	}
	// The crash takes the unflushed records back; others take their place.
	if _, err := l.Truncate(w, sideFile(dir, w)); err != nil {
		t.Fatal(err)
	}
	c := appendLog(t, l, true, delayedEntry("u", 1, now+3_000, -1), cancelEntry(Entry{At: a[1].LogOffset, DueAt: now + 86400_000, Topic: "t"}))
	if x, err = Open(cfg); err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if p, pt, pu := x.Pending(""), x.Pending("t"), x.Pending("u"); p != 2 || pt != 1 || pu != 1 {
		t.Fatalf("pending %d (t %d, u %d), want 2 (1, 1)", p, pt, pu)
	}
	if _, err := os.Stat(far); !os.IsNotExist(err) {
		t.Fatalf("the bucket file of the lost record's entry is still there: %v", err)
	}
	if st, _ := x.State(lost[2].LogOffset, now+86400_000+1_000); st.Kind != StateUnknown {
		t.Fatalf("the lost record's entry in a far file is %+v", st)
	}
	if st, _ := x.State(c[0].LogOffset, now+1_000); st.Kind != StateUnknown {
		t.Fatalf("the lost record's entry is %+v", st)
	}
	if st, _ := x.State(c[0].LogOffset, now+3_000); st.Kind != StatePending {
		t.Fatalf("the new record's entry is %+v", st)
	}
	if st, _ := x.State(a[1].LogOffset, now+86400_000); st.Kind != StateCancelled || st.MarkAt != c[1].LogOffset {
		t.Fatalf("the cancelled entry is %+v", st)
	}
	if d, ok := x.NextDue(); !ok || d != now+3_000 {
		t.Fatalf("NextDue = %d %v", d, ok)
	}
	clk.now = clk.now.Add(5 * time.Second)
	es := x.Due(clk.now, 10)
	if len(es) != 2 || es[0].At != c[0].LogOffset || es[1].At != a[0].LogOffset {
		t.Fatalf("Due = %+v", es)
	}
}

// TestTornBucketTail: bytes past the items the checkpoint counts (a torn
// write, or a whole stale item) are ignored; a bad checkpoint rebuilds.
func TestTornBucketTail(t *testing.T) {
	dir := t.TempDir()
	l := openTestLog(t, filepath.Join(dir, "log"), 0)
	defer l.Close()
	clk := &clock{now: time.UnixMilli(1_800_000_000_000)}
	cfg := Config{Log: l, Dir: filepath.Join(dir, "delay"), Now: clk.Now}
	x, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := clk.now.UnixMilli()
	p := appendLog(t, l, true, delayedEntry("t", 0, now+1_000, -1), delayedEntry("t", 0, now+2_000, -1))
	if err := x.Follow(); err != nil {
		t.Fatal(err)
	}
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(cfg.Dir, bucketName((now+1_000)/10_000*10_000))
	raw, err := os.ReadFile(name)
	if err != nil || len(raw) != 2*itemSize {
		t.Fatalf("bucket file: %d bytes, %v", len(raw), err)
	}
	stale := appendItem(nil, item{kind: itemEntry, dueAt: now + 1_500, at: 99_999, ref: -1})
	torn := append(append(raw, stale...), raw[:17]...)
	if err := os.WriteFile(name, torn, 0o600); err != nil {
		t.Fatal(err)
	}
	if x, err = Open(cfg); err != nil {
		t.Fatal(err)
	}
	clk.now = clk.now.Add(3 * time.Second)
	es := x.Due(clk.now, 10)
	if len(es) != 2 || es[0].At != p[0].LogOffset || es[1].At != p[1].LogOffset || x.Pending("") != 2 {
		t.Fatalf("Due = %+v, pending %d", es, x.Pending(""))
	}
	x.Release(es[0].At, false)
	x.Release(es[1].At, false)
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	// A damaged checkpoint: the index is rebuilt from the log.
	cp := filepath.Join(cfg.Dir, checkpointName)
	b, err := os.ReadFile(cp)
	if err != nil {
		t.Fatal(err)
	}
	b[10] ^= 0xff
	if err := os.WriteFile(cp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if x, err = Open(cfg); err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if es := x.Due(clk.now, 10); len(es) != 2 || x.Pending("t") != 2 {
		t.Fatalf("after a bad checkpoint: Due = %+v, pending %d", es, x.Pending("t"))
	}
}

// TestTruncatedUnderFollow: a log cut behind what the index followed
// makes Follow fail until Reset, which rebuilds it.
func TestTruncatedUnderFollow(t *testing.T) {
	dir, l, clk, x := testIndex(t, 0)
	now := clk.now.UnixMilli()
	p := appendLog(t, l, true, delayedEntry("t", 0, now, -1), delayedEntry("t", 0, now, -1))
	if err := x.Follow(); err != nil || x.Pending("") != 2 {
		t.Fatalf("follow: %v, pending %d", err, x.Pending(""))
	}
	if _, err := l.Truncate(p[1].LogOffset, sideFile(dir, p[1].LogOffset)); err != nil {
		t.Fatal(err)
	}
	if err := x.Follow(); err == nil {
		t.Fatal("Follow after the log was cut behind it: no error")
	}
	if err := x.Reset(); err != nil {
		t.Fatal(err)
	}
	if err := x.Follow(); err != nil || x.Pending("") != 1 {
		t.Fatalf("after Reset: %v, pending %d", err, x.Pending(""))
	}
}

// TestUnmarkedTail: a released copy at the log's end whose mark is
// missing names its entry; with the mark it names nothing.
func TestUnmarkedTail(t *testing.T) {
	_, l, clk, x := testIndex(t, 0)
	now := clk.now.UnixMilli()
	appendLog(t, l, true, delayedEntry("t", 2, now, -1))
	if err := x.Follow(); err != nil {
		t.Fatal(err)
	}
	e := x.Due(clk.now, 1)[0]
	x.Release(e.At, false)
	rel := releaseEntries(e)
	p := appendLog(t, l, true, rel[0]) // the mark was lost
	if err := x.Follow(); err != nil {
		t.Fatal(err)
	}
	got, at, ok, err := x.UnmarkedTail()
	if err != nil || !ok || got != e || at != p[0].LogOffset {
		t.Fatalf("UnmarkedTail = %+v %d %v %v, want %+v %d", got, at, ok, err, e, p[0].LogOffset)
	}
	appendLog(t, l, true, rel[1])
	if err := x.Follow(); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := x.UnmarkedTail(); ok || err != nil {
		t.Fatalf("UnmarkedTail with the mark: %v %v", ok, err)
	}
	if st, _ := x.State(e.At, e.DueAt); st.Kind != StateReleased || st.ReleasedAt != p[0].LogOffset {
		t.Fatalf("State = %+v", st)
	}
}

// TestRetentionDropsGone: entries retention deleted without a move are
// neither pending nor known any more, loaded or not, and stay so across a
// reopen and a rebuild.
func TestRetentionDropsGone(t *testing.T) {
	dir := t.TempDir()
	l := openTestLog(t, filepath.Join(dir, "log"), 1024)
	defer l.Close()
	clk := &clock{now: time.UnixMilli(1_800_000_000_000)}
	cfg := Config{Log: l, Dir: filepath.Join(dir, "delay"), Now: clk.Now}
	x, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := clk.now.UnixMilli()
	var pos []storage.Position
	for i := range 40 {
		due := now + 1_000 // loaded
		if i%2 == 1 {
			due = now + int64(i)*86400_000 // not loaded
		}
		pos = append(pos, appendLog(t, l, true, delayedEntry("t", 0, due, -1))...)
	}
	if err := x.Follow(); err != nil || x.Pending("t") != 40 {
		t.Fatalf("follow: %v, pending %d", err, x.Pending("t"))
	}
	start, err := l.DeleteBefore(pos[20].LogOffset)
	if err != nil || start <= pos[0].LogOffset {
		t.Fatalf("DeleteBefore: start %d, %v", start, err)
	}
	gone := 0
	for _, p := range pos {
		if p.LogOffset < start {
			gone++
		}
	}
	check := func(x *Index, what string) {
		t.Helper()
		if p := x.Pending("t"); p != int64(40-gone) {
			t.Fatalf("%s: pending %d, want %d", what, p, 40-gone)
		}
		for i, p := range pos {
			due := now + 1_000
			if i%2 == 1 {
				due = now + int64(i)*86400_000
			}
			st, err := x.State(p.LogOffset, due)
			if want := StatePending; err != nil || (st.Kind != want) != (p.LogOffset < start) {
				t.Fatalf("%s: State of entry %d (at %d, start %d) = %+v, %v", what, i, p.LogOffset, start, st, err)
			}
		}
	}
	if err := x.Follow(); err != nil {
		t.Fatal(err)
	}
	check(x, "after retention")
	clk.now = clk.now.Add(2 * time.Second)
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	if x, err = Open(cfg); err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	check(x, "reopened")
	y, err := Open(Config{Log: l, Dir: filepath.Join(dir, "rebuilt"), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer y.Close()
	check(y, "rebuilt")
}

// TestOpenRefuses: a Config without a log or a directory, or with a
// negative field, is refused with an error.
func TestOpenRefuses(t *testing.T) {
	dir := t.TempDir()
	l := openTestLog(t, filepath.Join(dir, "log"), 0)
	defer l.Close()
	for name, cfg := range map[string]Config{
		"no log":         {Dir: dir},
		"no dir":         {Log: l},
		"negative width": {Log: l, Dir: dir, BucketWidth: -time.Second},
		"tiny width":     {Log: l, Dir: dir, BucketWidth: time.Microsecond},
	} {
		if x, err := Open(cfg); err == nil {
			x.Close()
			t.Errorf("%s: Open gave no error", name)
		}
	}
}

// TestConcurrent: a firer (Follow, Due, release appends, Release) and a
// sender and a reader of states run at once; every entry is released
// exactly once.
func TestConcurrent(t *testing.T) {
	dir := t.TempDir()
	l := openTestLog(t, filepath.Join(dir, "log"), 1<<20)
	defer l.Close()
	now := time.UnixMilli(1_800_000_000_000)
	x, err := Open(Config{Log: l, Dir: filepath.Join(dir, "delay"), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	const n = 2000
	sent := make(chan storage.Position, n)
	go func() {
		defer close(sent)
		for i := range n {
			p, err := l.Append([]storage.Entry{delayedEntry("t", uint32(i%3), now.UnixMilli()-int64(i%50), -1)}, false)
			if err != nil {
				t.Errorf("append: %v", err) // the firer then times out
				return
			}
			sent <- p[0]
		}
	}()
	stop := make(chan struct{})
	readerDone := make(chan struct{})
	go func() { // reads states while the firer works
		defer close(readerDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			x.Pending("")
			x.NextDue()
			x.Buckets("", 10*time.Second, 10)
			x.Stats()
		}
	}()
	seen := map[int64]bool{}
	deadline := time.Now().Add(time.Minute)
	for len(seen) < n && time.Now().Before(deadline) {
		if err := x.Follow(); err != nil {
			t.Fatal(err)
		}
		for _, e := range x.Due(now, 64) {
			if seen[e.At] {
				t.Fatalf("entry %d released twice", e.At)
			}
			seen[e.At] = true
			appendLog(t, l, false, releaseEntries(e)...)
			x.Release(e.At, true)
		}
	}
	close(stop)
	<-readerDone
	for range sent {
	}
	if err := x.Follow(); err != nil {
		t.Fatal(err)
	}
	if len(seen) != n || x.Pending("") != 0 {
		t.Fatalf("released %d of %d, %d pending", len(seen), n, x.Pending(""))
	}
}

// TestCheckpointBehindFollow: a checkpoint written while the index has
// followed past the flushed offset counts the items of the records before
// it only (in bucket and far files): after a crash that took the rest
// back, the items of the lost records are not believed.
func TestCheckpointBehindFollow(t *testing.T) {
	dir := t.TempDir()
	l := openTestLog(t, filepath.Join(dir, "log"), 0)
	defer l.Close()
	clk := &clock{now: time.UnixMilli(1_800_000_000_000)}
	var logged bytes.Buffer
	cfg := Config{Log: l, Dir: filepath.Join(dir, "delay"), Now: clk.Now,
		Logger: hclog.New(&hclog.LoggerOptions{Output: &logged, Level: hclog.Warn})}
	x, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := clk.now.UnixMilli()
	day := now + 86400_000
	kept := appendLog(t, l, false, delayedEntry("t", 0, day, -1), delayedEntry("t", 0, now+1_000, -1))
	if err := x.Follow(); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	w := l.FlushedOffset()
	appendLog(t, l, false, delayedEntry("t", 0, day+1_000, -1), delayedEntry("t", 0, now+2_000, -1),
		cancelEntry(Entry{At: kept[0].LogOffset, DueAt: day, Topic: "t"}))
	if err := x.Follow(); err != nil {
		t.Fatal(err)
	}
	clk.now = clk.now.Add(time.Hour) // a checkpoint is due: at the flushed offset, behind the follow
	if err := x.Follow(); err != nil {
		t.Fatal(err)
	}
	x.checkpointWritten()
	if got := x.Stats().Followed; got != w {
		t.Fatalf("the checkpoint covers %d, want %d", got, w)
	}
	x.crash()
	if _, err := l.Truncate(w, sideFile(dir, w)); err != nil {
		t.Fatal(err)
	}
	if x, err = Open(cfg); err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if strings.Contains(logged.String(), "rebuilding") {
		t.Fatalf("the reopen did not use the checkpoint: %s", logged.String())
	}
	if p := x.Pending(""); p != 2 {
		t.Fatalf("pending %d, want 2", p)
	}
	for _, c := range []struct{ at, due int64 }{{w, day + 1_000}, {w, now + 2_000}} {
		if st, err := x.State(c.at, c.due); err != nil || st.Kind != StateUnknown {
			t.Fatalf("State of a lost record (%d, due %d) = %+v, %v", c.at, c.due, st, err)
		}
	}
	if st, err := x.State(kept[0].LogOffset, day); err != nil || st.Kind != StatePending {
		t.Fatalf("the entry whose cancel was lost: %+v, %v", st, err)
	}
}

// TestMarkNamesItsEntry: a mark that names an entry's log offset but not
// its queue or due time resolves nothing (loaded or read from its file,
// and after a rebuild); the right one does.
func TestMarkNamesItsEntry(t *testing.T) {
	_, l, clk, x := testIndex(t, 0)
	now := clk.now.UnixMilli()
	near := delayedEntry("t", 2, now+1000, -1)      // loaded
	far := delayedEntry("t", 2, now+48*3600000, -1) // in its far file
	p := appendLog(t, l, true, near, far)
	for i, due := range []int64{now + 1000, now + 48*3600000} {
		e := Entry{At: p[i].LogOffset, DueAt: due, Topic: "t", Queue: 2}
		otherQueue, otherDue := e, e
		otherQueue.Queue = 3
		otherDue.DueAt++
		appendLog(t, l, true, cancelEntry(otherQueue), cancelEntry(otherDue))
		if err := x.Follow(); err != nil {
			t.Fatal(err)
		}
		if st, err := x.State(e.At, e.DueAt); err != nil || st.Kind != StatePending {
			t.Fatalf("entry %d after marks of another queue and due time: %+v %v, want pending", i, st, err)
		}
	}
	if err := x.Reset(); err != nil {
		t.Fatal(err)
	}
	if got := x.Pending("t"); got != 2 {
		t.Fatalf("after a rebuild %d pending, want 2", got)
	}
	appendLog(t, l, true, cancelEntry(Entry{At: p[0].LogOffset, DueAt: now + 1000, Topic: "t", Queue: 2}))
	if err := x.Follow(); err != nil {
		t.Fatal(err)
	}
	if st, _ := x.State(p[0].LogOffset, now+1000); st.Kind != StateCancelled {
		t.Fatalf("after its own cancel mark: %+v", st)
	}
}
