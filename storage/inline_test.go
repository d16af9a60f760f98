package storage

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/storage/vfs"
)

// These tests cover the inline path of enqueue: an append to an idle log
// is written by its caller, under the writer token, and the writer
// goroutine takes over the appends queued meanwhile.

// gate blocks the first write to a segment file until it is opened, so a
// test can hold the writer token inside an inline append. The logs it is
// used with do not pre-touch (Pretouch -1): the toucher's zeros would be
// that first write.
type gate struct {
	entered, release chan struct{}
	once             sync.Once
}

func newGate() *gate { return &gate{entered: make(chan struct{}), release: make(chan struct{})} }

// rule fails nothing; it holds the first matching write until release.
func (g *gate) rule() *vfs.Rule {
	return vfs.Fail(vfs.OpWrite).Path("*.log").Where(func(vfs.Call) bool {
		g.once.Do(func() {
			close(g.entered)
			<-g.release
		})
		return false
	})
}

// idle waits until no goroutine holds the writer token and nothing is
// queued, so the next append is written inline.
func idle(t testing.TB, l *Log) {
	t.Helper()
	testwait.For(t, 5*time.Second, "the log to be idle", func() bool {
		l.qmu.Lock()
		defer l.qmu.Unlock()
		return !l.writing && len(l.queue) == 0
	})
}

type result struct {
	pos []Position
	err error
}

// Appends queued behind an inline one are written after it, in the order
// they were queued, by the writer goroutine; once the log is idle again,
// the next append is inline again.
func TestInlineAppendOrder(t *testing.T) {
	efs := vfs.NewErrorFS(vfs.Default)
	g := newGate()
	efs.Inject(g.rule())
	l := openLog(t, Config{Dir: t.TempDir(), FS: efs, ProducerStamp: testStamp, FlushInterval: time.Hour, Pretouch: -1})
	defer l.Close()

	results := make([]chan result, 8)
	for i := range results {
		results[i] = make(chan result, 1)
	}
	appendAsync := func(i int) (inline bool) {
		var returned bool
		var mu sync.Mutex
		l.AppendAsync([]Entry{se("o", 0, 1, 0, int64(i))}, false, func(p []Position, err error) {
			mu.Lock()
			inline = !returned
			mu.Unlock()
			results[i] <- result{p, err}
		})
		mu.Lock()
		defer mu.Unlock()
		returned = true
		return inline
	}
	go appendAsync(0) // the log is idle: written inline, held at its write
	<-g.entered
	for i := 1; i < 6; i++ {
		if appendAsync(i) {
			t.Fatalf("append %d completed before AppendAsync returned while another held the writer", i)
		}
	}
	close(g.release)
	var end int64
	for i := range 6 {
		r := <-results[i]
		if r.err != nil || r.pos[0].Err != nil || r.pos[0].Duplicate {
			t.Fatalf("append %d: %v %+v", i, r.err, r.pos)
		}
		if r.pos[0].QueueOffset != int64(i) || r.pos[0].LogOffset != end {
			t.Fatalf("append %d at queue offset %d, log offset %d; want %d, %d", i, r.pos[0].QueueOffset, r.pos[0].LogOffset, i, end)
		}
		end = r.pos[0].End
	}
	idle(t, l)
	if !appendAsync(6) {
		t.Fatal("an append to an idle log was not written inline")
	}
	if r := <-results[6]; r.err != nil || r.pos[0].QueueOffset != 6 || r.pos[0].LogOffset != end {
		t.Fatalf("append 6: %v %+v, want queue offset 6 at %d", r.err, r.pos, end)
	}
}

// Many appenders, inline and queued, each a stamped producer issuing its
// appends without waiting for them: every append is accepted (a producer's
// appends are written in the order it issued them, or the log would refuse
// a gap), each producer's records are in sequence order in the log, and
// queue offsets are dense. Under -race, two goroutines writing at once
// would be a reported race on the writer's state.
func TestInlineAppendsConcurrent(t *testing.T) {
	l := openLog(t, Config{Dir: t.TempDir(), ProducerStamp: testStamp, FlushInterval: 5 * time.Millisecond})
	defer l.Close()
	const producers, per = 8, 200
	type got struct {
		seq int64
		pos Position
	}
	var mu sync.Mutex
	stored := map[uint64][]got{}
	var wg, done sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := uint64(p + 1)
			for seq := int64(0); seq < per; {
				n := int64(1 + (seq+int64(p))%3)
				n = min(n, per-seq)
				var es []Entry
				for j := range n {
					es = append(es, se("c", uint32(p%3), id, 0, seq+j))
				}
				done.Add(1)
				l.AppendAsync(es, (seq+int64(p))%7 == 0, func(pos []Position, err error) {
					defer done.Done()
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						t.Errorf("producer %d: %v", id, err)
						return
					}
					for j, ps := range pos {
						if ps.Err != nil || ps.Duplicate {
							t.Errorf("producer %d seq %d: %+v", id, es[j].Producer.Seq, ps)
						}
						stored[id] = append(stored[id], got{es[j].Producer.Seq, ps})
					}
				})
				seq += n
			}
		}()
	}
	wg.Wait()
	done.Wait()
	for id, gs := range stored {
		if len(gs) != per {
			t.Fatalf("producer %d: %d records stored, want %d", id, len(gs), per)
		}
		byLog := map[int64]int64{}
		for _, g := range gs {
			byLog[g.seq] = g.pos.LogOffset
		}
		for s := int64(1); s < per; s++ {
			if byLog[s] <= byLog[s-1] {
				t.Fatalf("producer %d: seq %d at log offset %d, not after seq %d at %d", id, s, byLog[s], s-1, byLog[s-1])
			}
		}
	}
	for q := range uint32(3) {
		first, next := l.QueueRange("c", q)
		es, err := l.Read("c", q, first, 1<<30)
		if err != nil || int64(len(es)) != next-first {
			t.Fatalf("queue %d: read %d of [%d,%d): %v", q, len(es), first, next, err)
		}
		for i, e := range es {
			if e.QueueOffset != first+int64(i) {
				t.Fatalf("queue %d: entry %d has queue offset %d", q, i, e.QueueOffset)
			}
		}
	}
}

// Appenders race while the disk fails every fifth write part way (no
// pre-touching, so that the failures hit appends): each
// append is all or nothing, whether its group was written inline or by
// the writer goroutine, and the log holds exactly the appends that
// succeeded, before and after a reopen.
func TestInlineAppendsAllOrNothing(t *testing.T) {
	efs := vfs.NewErrorFS(vfs.Default)
	dir := t.TempDir()
	l := openLog(t, Config{Dir: dir, FS: efs, FlushInterval: time.Hour, SegmentSize: 16 << 10, Pretouch: -1})
	var writes atomic.Int64
	efs.Inject(vfs.Fail(vfs.OpWrite).Path("*.log").Partial(7).With(syscall.ENOSPC).Where(func(vfs.Call) bool {
		return writes.Add(1)%5 == 0
	}))
	const appenders, per = 4, 60
	var mu sync.Mutex
	ok := map[string]bool{} // payload -> stored
	failed := map[string]bool{}
	var wg sync.WaitGroup
	for a := range appenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				es := []Entry{entry(uint32(a%2), fmt.Sprintf("a%d-%d-x", a, i), 300), entry(2, fmt.Sprintf("a%d-%d-y", a, i), 200)}
				_, err := l.Append(es, false)
				mu.Lock()
				for _, e := range es {
					if err == nil {
						ok[string(e.Payload)] = true
					} else {
						if !errors.Is(err, syscall.ENOSPC) {
							t.Errorf("append failed with %v, want the injected ENOSPC", err)
						}
						failed[string(e.Payload)] = true
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(failed) == 0 || len(ok) == 0 {
		t.Fatalf("%d entries stored and %d failed: the test wants both", len(ok), len(failed))
	}
	check := func(l *Log, when string) {
		t.Helper()
		seen := map[string]bool{}
		for q := range uint32(3) {
			first, next := l.QueueRange("f", q)
			es, err := l.Read("f", q, first, 1<<30)
			if err != nil || int64(len(es)) != next-first {
				t.Fatalf("%s: queue %d: read %d of [%d,%d): %v", when, q, len(es), first, next, err)
			}
			for i, e := range es {
				if e.QueueOffset != first+int64(i) {
					t.Fatalf("%s: queue %d: entry %d has queue offset %d", when, q, i, e.QueueOffset)
				}
				p := string(e.Payload)
				if !ok[p] {
					t.Fatalf("%s: queue %d holds %.12q, which was not acknowledged", when, q, p)
				}
				seen[p] = true
			}
		}
		if len(seen) != len(ok) {
			t.Fatalf("%s: the log holds %d of the %d acknowledged entries", when, len(seen), len(ok))
		}
	}
	check(l, "open")
	must(t, l.Close())
	l = openLog(t, Config{Dir: dir})
	defer l.Close()
	check(l, "reopened")
}

// Close waits for an append being written inline: the append completes
// (its callback runs), then Close returns, appends after it fail with ErrClosed, and the record
// is there when the log is reopened.
func TestCloseWhileInlineAppend(t *testing.T) {
	efs := vfs.NewErrorFS(vfs.Default)
	g := newGate()
	efs.Inject(g.rule())
	dir := t.TempDir()
	l := openLog(t, Config{Dir: dir, FS: efs, Pretouch: -1})
	var mu sync.Mutex
	var order []string
	note := func(s string) {
		mu.Lock()
		order = append(order, s)
		mu.Unlock()
	}
	appended := make(chan result, 1)
	go l.AppendAsync([]Entry{{Topic: "c", Payload: []byte("held")}}, false, func(p []Position, err error) {
		note("append")
		appended <- result{p, err}
	})
	<-g.entered
	closed := make(chan error, 1)
	go func() {
		err := l.Close()
		note("close")
		closed <- err
	}()
	testwait.For(t, 5*time.Second, "Close to start", func() bool {
		l.qmu.Lock()
		defer l.qmu.Unlock()
		return l.closing
	})
	if _, err := l.Append([]Entry{{Topic: "c", Payload: []byte("late")}}, false); !errors.Is(err, ErrClosed) {
		t.Fatalf("append after Close started: %v, want ErrClosed", err)
	}
	close(g.release)
	r := <-appended
	if err := <-closed; err != nil {
		t.Fatalf("close: %v", err)
	}
	if r.err != nil || r.pos[0].QueueOffset != 0 {
		t.Fatalf("the held append: %v %+v", r.err, r.pos)
	}
	if len(order) != 2 || order[0] != "append" {
		t.Fatalf("completed in the order %v, want the append before Close", order)
	}
	l = openLog(t, Config{Dir: dir})
	defer l.Close()
	es, err := l.Read("c", 0, 0, 1<<20)
	if err != nil || len(es) != 1 || string(es[0].Payload) != "held" {
		t.Fatalf("reopened: %d entries, %v", len(es), err)
	}
}
