package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/storage/vfs"
)

// Stamped test payloads start with "PS", the producer id (8 bytes), epoch
// (2) and sequence (8); testStamp reads them back, as the broker's hook
// reads its message encoding.
const stampPrefix = 2 + 8 + 2 + 8

func stampedPayload(ps ProducerStamp, body string) []byte {
	b := append([]byte("PS"), make([]byte, 18)...)
	binary.BigEndian.PutUint64(b[2:], ps.ID)
	binary.BigEndian.PutUint16(b[10:], ps.Epoch)
	binary.BigEndian.PutUint64(b[12:], uint64(ps.Seq))
	return append(b, body...)
}

func testStamp(p []byte) (ProducerStamp, bool) {
	if len(p) < stampPrefix || string(p[:2]) != "PS" {
		return ProducerStamp{}, false
	}
	return ProducerStamp{
		ID:    binary.BigEndian.Uint64(p[2:]),
		Epoch: binary.BigEndian.Uint16(p[10:]),
		Seq:   int64(binary.BigEndian.Uint64(p[12:])),
	}, true
}

// se is a stamped entry whose payload carries its stamp.
func se(topic string, queue uint32, id uint64, epoch uint16, seq int64) Entry {
	ps := ProducerStamp{ID: id, Epoch: epoch, Seq: seq}
	return Entry{Topic: topic, Queue: queue, Producer: ps, Payload: stampedPayload(ps, fmt.Sprintf("%s/%d p%d e%d s%d", topic, queue, id, epoch, seq))}
}

// dumpProducers lists the deduplication state: call it only while no
// append is in flight (the writer owns the state).
func dumpProducers(l *Log) string {
	var lines []string
	for k, ids := range l.prod.queues {
		for id, st := range ids {
			line := fmt.Sprintf("%s/%d p%d e%d seen %d:", k.topic, k.queue, id, st.epoch, st.lastSeen)
			for i := range int(st.n) {
				r := st.runs[(int(st.head)-i+producerRuns)%producerRuns]
				line += fmt.Sprintf(" [%d-%d@%d]", r.firstSeq, r.lastSeq, r.firstQO)
			}
			lines = append(lines, line)
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func stored(p Position) Position {
	return Position{QueueOffset: p.QueueOffset, LogOffset: p.LogOffset, End: p.End}
}

func dupOf(p Position) Position {
	return Position{QueueOffset: p.QueueOffset, LogOffset: p.LogOffset, End: p.End, Duplicate: true}
}

var unknownDup = Position{QueueOffset: -1, LogOffset: -1, End: -1, Duplicate: true}

func refused(err error) Position { return Position{QueueOffset: -1, LogOffset: -1, End: -1, Err: err} }

func checkPositions(t testing.TB, what string, got, want []Position) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d positions, want %d", what, len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.QueueOffset != w.QueueOffset || g.LogOffset != w.LogOffset || g.End != w.End || g.Duplicate != w.Duplicate || !errors.Is(g.Err, w.Err) || (g.Err == nil) != (w.Err == nil) {
			t.Fatalf("%s: entry %d at %+v, want %+v", what, i, g, w)
		}
	}
}

func TestProducerDuplicateAnsweredWithOriginal(t *testing.T) {
	l := openLog(t, Config{Dir: t.TempDir(), ProducerStamp: testStamp})
	defer l.Close()
	orig := mustAppend(t, l, []Entry{se("d", 0, 1, 0, 0), se("d", 0, 1, 0, 1), se("d", 0, 1, 0, 2)}, false)
	for i, p := range orig {
		if p.Duplicate || p.Err != nil || p.QueueOffset != int64(i) {
			t.Fatalf("first append, entry %d: %+v", i, p)
		}
	}
	end := l.EndOffset()
	pos := mustAppend(t, l, []Entry{se("d", 0, 1, 0, 1)}, true)
	checkPositions(t, "one entry again", pos, []Position{dupOf(orig[1])})
	pos = mustAppend(t, l, []Entry{se("d", 0, 1, 0, 0), se("d", 0, 1, 0, 1), se("d", 0, 1, 0, 2)}, false)
	checkPositions(t, "the batch again", pos, []Position{dupOf(orig[0]), dupOf(orig[1]), dupOf(orig[2])})
	if l.EndOffset() != end {
		t.Fatalf("duplicates were written: end %d, was %d", l.EndOffset(), end)
	}
	if _, next := l.QueueRange("d", 0); next != 3 {
		t.Fatalf("queue ends at %d after duplicates, want 3", next)
	}
	pos = mustAppend(t, l, []Entry{se("d", 0, 1, 0, 3)}, false)
	checkPositions(t, "next sequence", pos, []Position{{QueueOffset: 3, LogOffset: end, End: end + int64(recordSize(1, len(se("d", 0, 1, 0, 3).Payload)))}})
	if s := l.ProducerStats(); s != (ProducerStats{Tracked: 1, Duplicates: 4}) {
		t.Fatalf("stats %+v", s)
	}
}

func TestProducerGapRefusedRestStored(t *testing.T) {
	l := openLog(t, Config{Dir: t.TempDir(), ProducerStamp: testStamp})
	defer l.Close()
	mustAppend(t, l, []Entry{se("g", 0, 1, 0, 0)}, false)
	group := []Entry{
		se("g", 0, 1, 0, 2), // a gap: 1 is missing
		{Topic: "g", Queue: 0, Payload: []byte("unstamped")},
		se("g", 0, 2, 0, 7), // a producer never seen: any sequence
		se("g", 0, 1, 0, 1), // fills the gap
		se("g", 0, 1, 0, 3), // a gap again: 2 was refused
	}
	pos := mustAppend(t, l, group, false)
	if !errors.Is(pos[0].Err, ErrOutOfOrderSequence) || !errors.Is(pos[4].Err, ErrOutOfOrderSequence) {
		t.Fatalf("gaps not refused: %+v", pos)
	}
	checkPositions(t, "group", pos, []Position{refused(ErrOutOfOrderSequence), stored(pos[1]), stored(pos[2]), stored(pos[3]), refused(ErrOutOfOrderSequence)})
	for i, want := range []int64{1, 2, 3} {
		if pos[i+1].QueueOffset != want {
			t.Fatalf("entry %d stored at %d, want %d", i+1, pos[i+1].QueueOffset, want)
		}
	}
	es, err := l.Read("g", 0, 0, 1<<20)
	must(t, err)
	var got []string
	for _, e := range es {
		body := e.Payload
		if _, ok := testStamp(body); ok {
			body = body[stampPrefix:]
		}
		got = append(got, string(body))
	}
	if want := "[g/0 p1 e0 s0 unstamped g/0 p2 e0 s7 g/0 p1 e0 s1]"; fmt.Sprint(got) != want {
		t.Fatalf("queue holds %q, want %s", got, want)
	}
	if es[3].LogOffset != pos[3].LogOffset {
		t.Fatalf("entry 3 at %d, read back at %d", pos[3].LogOffset, es[3].LogOffset)
	}
	if s := l.ProducerStats(); s.Refused != 2 || s.Tracked != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestProducerEpochs(t *testing.T) {
	l := openLog(t, Config{Dir: t.TempDir(), ProducerStamp: testStamp})
	defer l.Close()
	one := func(e Entry) Position { return mustAppend(t, l, []Entry{e}, false)[0] }
	one(se("e", 0, 1, 1, 0))
	one(se("e", 0, 1, 1, 1))
	checkPositions(t, "stale epoch", []Position{one(se("e", 0, 1, 0, 2))}, []Position{refused(ErrProducerFenced)})
	checkPositions(t, "stale epoch, old sequence", []Position{one(se("e", 0, 1, 0, 1))}, []Position{refused(ErrProducerFenced)})
	checkPositions(t, "new epoch not at 0", []Position{one(se("e", 0, 1, 2, 2))}, []Position{refused(ErrOutOfOrderSequence)})
	first := one(se("e", 0, 1, 2, 0))
	if first.Err != nil || first.Duplicate || first.QueueOffset != 2 {
		t.Fatalf("new epoch at 0: %+v", first)
	}
	checkPositions(t, "the old epoch, now fenced", []Position{one(se("e", 0, 1, 1, 2))}, []Position{refused(ErrProducerFenced)})
	if p := one(se("e", 0, 1, 2, 1)); p.Err != nil || p.QueueOffset != 3 {
		t.Fatalf("new epoch, seq 1: %+v", p)
	}
	checkPositions(t, "new epoch, seq 0 again", []Position{one(se("e", 0, 1, 2, 0))}, []Position{dupOf(first)})
	// The state is per queue: another queue has not seen epoch 2.
	if p := one(se("e", 1, 1, 0, 5)); p.Err != nil || p.Duplicate {
		t.Fatalf("another queue: %+v", p)
	}
	if s := l.ProducerStats(); s != (ProducerStats{Tracked: 2, Duplicates: 1, Refused: 4}) {
		t.Fatalf("stats %+v", s)
	}
}

// Entries of one group see the state left by the entries before them.
func TestProducerStampsInOneGroup(t *testing.T) {
	l := openLog(t, Config{Dir: t.TempDir(), ProducerStamp: testStamp})
	defer l.Close()
	mustAppend(t, l, []Entry{{Topic: "o", Payload: []byte("first")}}, false)
	pos := mustAppend(t, l, []Entry{
		se("o", 0, 1, 0, 0), se("o", 0, 1, 0, 1), se("o", 0, 1, 0, 1), se("o", 0, 1, 0, 2),
		se("o", 0, 1, 0, 0), se("o", 0, 1, 0, 4), se("o", 0, 1, 1, 0), se("o", 0, 1, 0, 3), se("o", 0, 1, 1, 0),
	}, false)
	checkPositions(t, "group", pos, []Position{
		stored(pos[0]), stored(pos[1]), dupOf(pos[1]), stored(pos[3]),
		dupOf(pos[0]), refused(ErrOutOfOrderSequence), stored(pos[6]), refused(ErrProducerFenced), dupOf(pos[6]),
	})
	for i, want := range map[int]int64{0: 1, 1: 2, 3: 3, 6: 4} {
		if pos[i].QueueOffset != want {
			t.Fatalf("entry %d at queue offset %d, want %d", i, pos[i].QueueOffset, want)
		}
	}
	if pos[1].LogOffset != pos[0].End || pos[3].LogOffset != pos[1].End || pos[6].LogOffset != pos[3].End || l.EndOffset() != pos[6].End {
		t.Fatalf("records not back to back: %+v, end %d", pos, l.EndOffset())
	}
	// The same answers once the group is in the index.
	again := mustAppend(t, l, []Entry{se("o", 1, 1, 0, 0), se("o", 0, 1, 1, 0), se("o", 0, 1, 1, 1)}, false)
	checkPositions(t, "after the group", again, []Position{stored(again[0]), dupOf(pos[6]), stored(again[2])})
	// Asynchronous appends queued back to back are decided in order.
	var wg sync.WaitGroup
	res := make([][]Position, 3)
	for i, e := range []Entry{se("o", 0, 1, 1, 2), se("o", 0, 1, 1, 2), se("o", 0, 1, 1, 4)} {
		wg.Add(1)
		l.AppendAsync([]Entry{e}, false, func(p []Position, err error) {
			defer wg.Done()
			if err != nil {
				t.Error(err)
			}
			res[i] = p
		})
	}
	wg.Wait()
	checkPositions(t, "async", slices.Concat(res...), []Position{stored(res[0][0]), dupOf(res[0][0]), refused(ErrOutOfOrderSequence)})
}

// The state keeps the last producerRuns runs of a pair; older duplicates
// are answered without offsets.
func TestProducerWindow(t *testing.T) {
	l := openLog(t, Config{Dir: t.TempDir(), ProducerStamp: testStamp})
	defer l.Close()
	// Two producers interleaved: every entry of each starts a run.
	var orig []Position
	for s := range int64(8) {
		pos := mustAppend(t, l, []Entry{se("w", 0, 1, 0, s), se("w", 0, 2, 0, s)}, false)
		orig = append(orig, pos[0])
	}
	for s := range int64(8) {
		want := unknownDup
		if s >= 8-producerRuns {
			want = dupOf(orig[s])
		}
		checkPositions(t, fmt.Sprintf("seq %d again", s), mustAppend(t, l, []Entry{se("w", 0, 1, 0, s)}, false), []Position{want})
	}
	// One producer alone: consecutive sequences at consecutive offsets are
	// one run, however long.
	var alone []Position
	for s := range int64(20) {
		alone = append(alone, mustAppend(t, l, []Entry{se("w", 1, 3, 0, s)}, false)[0])
	}
	checkPositions(t, "oldest of a long run", mustAppend(t, l, []Entry{se("w", 1, 3, 0, 0)}, false), []Position{dupOf(alone[0])})
}

// Recovery rebuilds the state from the log, after a clean close or a crash.
func TestProducerStateRebuiltAtReopen(t *testing.T) {
	for _, how := range []string{"close", "crash"} {
		t.Run(how, func(t *testing.T) {
			cfg := Config{Dir: t.TempDir(), ProducerStamp: testStamp, SegmentSize: 700}
			l := openLog(t, cfg)
			var last []Entry
			var lastPos []Position
			for b := range int64(12) {
				batch := []Entry{se("r", uint32(b%2), 1, 0, b/2*2), se("r", uint32(b%2), 1, 0, b/2*2+1), se("r", 0, uint64(b%3+2), 0, b/3)}
				last = batch
				lastPos = mustAppend(t, l, batch, false)
			}
			before, end := dumpProducers(l), l.EndOffset()
			if how == "close" {
				must(t, l.Close())
			} else {
				crash(l)
			}
			l = openLog(t, cfg)
			defer l.Close()
			if got := dumpProducers(l); got != before {
				t.Fatalf("state after reopen:\n%s\nbefore:\n%s", got, before)
			}
			if s := l.ProducerStats(); s.Tracked != 5 {
				t.Fatalf("tracked %d after reopen, want 5", s.Tracked)
			}
			pos := mustAppend(t, l, last, false)
			checkPositions(t, "last batch again", pos, []Position{dupOf(lastPos[0]), dupOf(lastPos[1]), dupOf(lastPos[2])})
			if l.EndOffset() != end {
				t.Fatalf("end %d after the duplicates, was %d", l.EndOffset(), end)
			}
			pos = mustAppend(t, l, []Entry{se("r", 1, 1, 0, 13), se("r", 1, 1, 0, 12)}, false)
			if !errors.Is(pos[0].Err, ErrOutOfOrderSequence) || pos[1].Err != nil || pos[1].Duplicate {
				t.Fatalf("after reopen: %+v", pos)
			}
		})
	}
}

// A slave fed by ReadRaw/AppendRaw holds the master's state.
func TestProducerStateCopiedBySlave(t *testing.T) {
	master := openLog(t, Config{Dir: t.TempDir(), ProducerStamp: testStamp, SegmentSize: 1500})
	defer master.Close()
	slaveCfg := Config{Dir: t.TempDir(), ProducerStamp: testStamp, SegmentSize: 1500}
	slave := openLog(t, slaveCfg)
	var last Entry
	var lastPos Position
	for i := range int64(60) {
		q, id := uint32(i%3), uint64(i%4+1)
		last = se("s", q, id, 0, i/12)
		lastPos = mustAppend(t, master, []Entry{last, {Topic: "s", Queue: q, Payload: []byte("plain")}}, false)[0]
		if lastPos.Err != nil || lastPos.Duplicate {
			t.Fatalf("append %d: %+v", i, lastPos)
		}
		if i%17 == 0 {
			copyLog(t, master, slave, 500)
		}
	}
	copyLog(t, master, slave, 900)
	want := dumpProducers(master)
	if got := dumpProducers(slave); got != want {
		t.Fatalf("slave state:\n%s\nmaster's:\n%s", got, want)
	}
	if m, s := master.ProducerStats(), slave.ProducerStats(); m.Tracked != s.Tracked {
		t.Fatalf("tracked: master %d, slave %d", m.Tracked, s.Tracked)
	}
	end := slave.EndOffset()
	checkPositions(t, "last entry again on the slave", mustAppend(t, slave, []Entry{last}, false), []Position{dupOf(lastPos)})
	if slave.EndOffset() != end {
		t.Fatal("the duplicate was written on the slave")
	}
	must(t, slave.Close())
	slave = openLog(t, slaveCfg)
	defer slave.Close()
	if got := dumpProducers(slave); got != want {
		t.Fatalf("reopened slave state:\n%s\nmaster's:\n%s", got, want)
	}
}

func TestProducerIdleExpiry(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli())
	advance := func(d time.Duration) { clock.Add(d.Milliseconds()) }
	cfg := Config{Dir: t.TempDir(), ProducerStamp: testStamp, ProducerIdle: time.Hour,
		Now: func() time.Time { return time.UnixMilli(clock.Load()) }}
	l := openLog(t, cfg)
	mustAppend(t, l, []Entry{se("x", 0, 1, 0, 0), se("x", 0, 1, 0, 1), se("x", 0, 2, 0, 0), se("x", 1, 3, 0, 0)}, false)
	advance(30 * time.Minute)
	mustAppend(t, l, []Entry{se("x", 1, 3, 0, 1)}, false) // keeps producer 3 alive
	if p := mustAppend(t, l, []Entry{se("x", 0, 1, 0, 5)}, false)[0]; !errors.Is(p.Err, ErrOutOfOrderSequence) {
		t.Fatalf("gap within the idle time: %+v", p)
	}
	advance(30*time.Minute + time.Second) // producers 1 and 2 idle for longer than an hour
	p := mustAppend(t, l, []Entry{se("x", 0, 1, 0, 5)}, false)[0]
	if p.Err != nil || p.Duplicate || p.QueueOffset != 3 {
		t.Fatalf("a forgotten producer's sequence is not accepted: %+v", p)
	}
	if s := l.ProducerStats(); s.Tracked != 2 {
		t.Fatalf("tracked %d after the sweep, want 2 (producers 1 and 3)\n%s", s.Tracked, dumpProducers(l))
	}
	if p := mustAppend(t, l, []Entry{se("x", 0, 2, 0, 0)}, false)[0]; p.Err != nil || p.Duplicate {
		t.Fatalf("a forgotten producer's old sequence is stored again: %+v", p)
	}
	// A sweep runs at most once a minute of record time, but a state idle
	// for longer than ProducerIdle is forgotten at once.
	advance(30 * time.Minute)
	mustAppend(t, l, []Entry{se("x", 1, 3, 0, 2)}, false)
	advance(30*time.Minute + time.Second)
	mustAppend(t, l, []Entry{{Topic: "x", Payload: []byte("tick")}}, false) // sweeps: producer 1 and 2 idle
	if s := l.ProducerStats(); s.Tracked != 1 {
		t.Fatalf("tracked %d, want 1\n%s", s.Tracked, dumpProducers(l))
	}
	advance(30 * time.Second)
	if p := mustAppend(t, l, []Entry{se("x", 1, 3, 0, 9)}, false)[0]; !errors.Is(p.Err, ErrOutOfOrderSequence) {
		t.Fatalf("producer 3 forgotten too early: %+v", p)
	}
	advance(30*time.Minute + time.Second) // producer 3 idle, but no sweep within a minute of the last
	if p := mustAppend(t, l, []Entry{se("x", 1, 3, 0, 9)}, false)[0]; p.Err != nil || p.Duplicate {
		t.Fatalf("an idle producer not yet swept is not forgotten: %+v", p)
	}
	// Recovery replays by record times: the same state.
	want := dumpProducers(l)
	must(t, l.Close())
	l = openLog(t, cfg)
	defer l.Close()
	if got := dumpProducers(l); got != want {
		t.Fatalf("state after reopen:\n%s\nbefore:\n%s", got, want)
	}
	// A reopen much later forgets everything idle by then at its first
	// stamped record.
	advance(2 * time.Hour)
	if p := mustAppend(t, l, []Entry{se("x", 1, 3, 0, 0)}, false)[0]; p.Err != nil || p.Duplicate {
		t.Fatalf("after two idle hours: %+v", p)
	}
	if s := l.ProducerStats(); s.Tracked != 1 {
		t.Fatalf("tracked %d, want 1\n%s", s.Tracked, dumpProducers(l))
	}
}

// A group whose write fails leaves the state as it was.
func TestProducerStateUndoneWithAFailedWrite(t *testing.T) {
	efs := vfs.NewErrorFS(vfs.Default)
	l := openLog(t, Config{Dir: t.TempDir(), FS: efs, ProducerStamp: testStamp})
	defer l.Close()
	first := mustAppend(t, l, []Entry{se("u", 0, 1, 0, 0)}, false)
	before := dumpProducers(l)
	efs.Inject(vfs.Fail(vfs.OpWrite).With(syscall.ENOSPC))
	if _, err := l.Append([]Entry{se("u", 0, 1, 0, 1), se("u", 0, 1, 0, 0), se("u", 0, 2, 0, 0), se("u", 1, 1, 3, 0)}, false); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("append on a full disk: %v", err)
	}
	efs.DropAll()
	if got := dumpProducers(l); got != before {
		t.Fatalf("state after a failed write:\n%s\nbefore:\n%s", got, before)
	}
	if s := l.ProducerStats(); s != (ProducerStats{Tracked: 1}) {
		t.Fatalf("stats after a failed write: %+v", s)
	}
	pos := mustAppend(t, l, []Entry{se("u", 0, 1, 0, 1), se("u", 0, 1, 0, 0)}, false)
	checkPositions(t, "retry", pos, []Position{stored(pos[0]), dupOf(first[0])})
	if pos[0].QueueOffset != 1 {
		t.Fatalf("retry stored at %d", pos[0].QueueOffset)
	}
}

// Producers append concurrently, each with several batches in flight and
// some batches sent twice; readers and stats run alongside. Every sequence
// is stored once, in order, and a slave copies the same state.
func TestProducersConcurrent(t *testing.T) {
	l := openLog(t, Config{Dir: t.TempDir(), ProducerStamp: testStamp, SegmentSize: 64 << 10})
	defer l.Close()
	const producers, batches = 8, 150
	var resent atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var side sync.WaitGroup
	side.Add(1)
	go func() { // readers and stats
		defer side.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = l.ProducerStats()
			if _, err := l.Read("c", 0, 0, 4096); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, q := uint64(p+1), uint32(p%3)
			inflight := make(chan struct{}, 5)
			var seq int64
			var prev []Entry
			var done sync.WaitGroup
			send := func(batch []Entry, dups int) {
				inflight <- struct{}{}
				done.Add(1)
				l.AppendAsync(batch, false, func(pos []Position, err error) {
					defer done.Done()
					defer func() { <-inflight }()
					if err != nil {
						t.Error(err)
						return
					}
					n := 0
					for _, ps := range pos {
						if ps.Err != nil {
							t.Errorf("producer %d: %v", id, ps.Err)
						}
						if ps.Duplicate {
							n++
						}
					}
					if n != dups {
						t.Errorf("producer %d: %d duplicates in a batch, want %d", id, n, dups)
					}
				})
			}
			for b := range batches {
				if b%7 == 6 {
					send(prev, len(prev))
					resent.Add(int64(len(prev)))
					continue
				}
				var batch []Entry
				for range b%4 + 1 {
					batch = append(batch, se("c", q, id, 0, seq))
					seq++
				}
				send(batch, 0)
				prev = batch
			}
			done.Wait()
		}()
	}
	wg.Wait()
	close(stop)
	side.Wait()
	for q := range uint32(3) {
		es, err := l.Read("c", q, 0, 1<<30)
		must(t, err)
		next := map[uint64]int64{}
		for _, e := range es {
			ps, _ := testStamp(e.Payload)
			if ps.Seq != next[ps.ID] {
				t.Fatalf("queue %d: producer %d stored seq %d, want %d", q, ps.ID, ps.Seq, next[ps.ID])
			}
			next[ps.ID]++
		}
	}
	if s := l.ProducerStats(); s.Duplicates != resent.Load() || s.Refused != 0 || s.Tracked != producers {
		t.Fatalf("stats %+v, %d resent", s, resent.Load())
	}
	slave := openLog(t, Config{Dir: t.TempDir(), ProducerStamp: testStamp})
	defer slave.Close()
	copyLog(t, l, slave, 16<<10)
	if dumpProducers(slave) != dumpProducers(l) {
		t.Fatal("the slave's state differs from the master's")
	}
}

// TestProducerStateMemory measures the bytes a tracked (producer, queue)
// pair costs, with many producers per queue and with one.
func TestProducerStateMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("measures the heap")
	}
	for _, shape := range []struct{ queues, perQueue int }{{10, 10_000}, {100_000, 1}} {
		var tab producerTable
		tab.init(Config{}.withDefaults())
		keys := make([]queueKey, shape.queues)
		for i := range keys {
			keys[i] = queueKey{fmt.Sprintf("topic-%d", i%10), uint32(i)}
		}
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		for i, k := range keys {
			for id := range shape.perQueue {
				tab.apply(k, ProducerStamp{ID: uint64(id + 1)}, int64(i), 1)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		pairs := shape.queues * shape.perQueue
		per := float64(m1.HeapAlloc-m0.HeapAlloc) / float64(pairs)
		t.Logf("%d queues x %d producers: %.0f bytes per tracked pair", shape.queues, shape.perQueue, per)
		if per > 512 {
			t.Errorf("%.0f bytes per pair", per)
		}
		runtime.KeepAlive(&tab)
	}
}

// Appends with a stamp and without cost the same bytes: the stamp lives in
// the payload, the record format is unchanged.
func TestProducerRecordFormatUnchanged(t *testing.T) {
	a := openLog(t, Config{Dir: t.TempDir(), ProducerStamp: testStamp, Now: func() time.Time { return time.UnixMilli(5) }})
	defer a.Close()
	b := openLog(t, Config{Dir: t.TempDir(), Now: func() time.Time { return time.UnixMilli(5) }})
	defer b.Close()
	e := se("f", 0, 1, 0, 0)
	mustAppend(t, a, []Entry{e}, false)
	e.Producer = ProducerStamp{}
	mustAppend(t, b, []Entry{e}, false)
	if !bytes.Equal(rawFrom(t, a, 0), rawFrom(t, b, 0)) {
		t.Fatal("a stamped entry's record differs")
	}
}

// BenchmarkProducerCheck is the writer's cost of one stamped entry: the
// check and the state update, with 64 producers over 8 queues.
func BenchmarkProducerCheck(b *testing.B) {
	var tab producerTable
	tab.init(Config{}.withDefaults())
	keys := make([]queueKey, 8)
	for i := range keys {
		keys[i] = queueKey{"bench", uint32(i)}
	}
	seqs := make([]int64, 64)
	b.ResetTimer()
	for i := range b.N {
		if i%16 == 0 {
			tab.commit()
			tab.begin()
		}
		g := i % 64
		k, ps := keys[g%8], ProducerStamp{ID: uint64(g + 1), Seq: seqs[g]}
		ids, st := tab.find(k, ps.ID)
		if v, _, _ := tab.check(st, ps, 1); v != accept {
			b.Fatal(v)
		}
		tab.applyTo(ids, st, k, ps, int64(i), 1)
		seqs[g]++
	}
}

// A stamped entry with a negative sequence is invalid; a zero producer id
// means no stamp, whatever the epoch and sequence.
func TestProducerStampValidity(t *testing.T) {
	l := openLog(t, Config{Dir: t.TempDir(), ProducerStamp: testStamp})
	defer l.Close()
	if _, err := l.Append([]Entry{se("v", 0, 1, 0, -1)}, false); !errors.Is(err, ErrInvalidEntry) {
		t.Fatalf("negative sequence: %v", err)
	}
	for range 2 {
		p := mustAppend(t, l, []Entry{{Topic: "v", Producer: ProducerStamp{Epoch: 3, Seq: 7}, Payload: []byte("x")}}, false)[0]
		if p.Duplicate || p.Err != nil {
			t.Fatalf("id 0: %+v", p)
		}
	}
	if s := l.ProducerStats(); s != (ProducerStats{}) {
		t.Fatalf("stats %+v", s)
	}
}

// An entry with requirements is written only if the deduplication state
// holds each producer in its queue at its epoch with its sequence stored,
// earlier entries of its own group counted; a refused one writes nothing
// and takes no offset. After a reopen the state, rebuilt from the log,
// judges the same.
func TestRequiresJudgedByTheState(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, ProducerStamp: testStamp}
	l := openLog(t, cfg)
	mark := func(reqs ...Requirement) Entry {
		return Entry{Topic: "marks", Queue: 0, Payload: []byte("mark"), Requires: reqs}
	}
	need := func(queue uint32, epoch uint16, seq int64) Requirement {
		return Requirement{Topic: "d", Queue: queue, Producer: 7, Epoch: epoch, Seq: seq}
	}
	mustAppend(t, l, []Entry{se("d", 0, 7, 1, 0), se("d", 0, 7, 1, 1), se("d", 1, 7, 1, 0)}, false)
	pos := mustAppend(t, l, []Entry{
		mark(need(0, 1, 1), need(1, 1, 0)), // held
		mark(need(0, 1, 2)),                // seq 2 is missing
		mark(need(0, 2, 1)),                // another epoch
		mark(need(2, 1, 0)),                // a queue it never wrote
		se("d", 0, 7, 1, 2),
		mark(need(0, 1, 2)), // held now: the group's entry before it counts
	}, false)
	checkPositions(t, "marks", pos, []Position{
		stored(pos[0]), refused(ErrMissingRecords), refused(ErrMissingRecords), refused(ErrMissingRecords), stored(pos[4]), stored(pos[5]),
	})
	if first, next := l.QueueRange("marks", 0); first != 0 || next != 2 {
		t.Fatalf("marks queue [%d, %d): want the two held marks only", first, next)
	}
	must(t, l.Close())
	l = openLog(t, cfg)
	defer l.Close()
	pos = mustAppend(t, l, []Entry{mark(need(0, 1, 2)), mark(need(0, 1, 3))}, false)
	checkPositions(t, "after a reopen", pos, []Position{stored(pos[0]), refused(ErrMissingRecords)})
}
