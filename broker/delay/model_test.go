package delay

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ferrymq/ferrymq/storage"
)

// TestModel runs random sequences of what the broker does (delayed
// sends, releases, cancels, moves, follows, clock moves, reopens, lost
// directories, log truncations and retention) and after each step
// compares the index with a model of every entry's state; at the end an
// index rebuilt from the log alone must say the same.
func TestModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		base, err := os.MkdirTemp(t.TempDir(), "case")
		if err != nil {
			rt.Fatalf("%v", err)
		}
		defer removeAll(rt, base)
		l := openTestLog(rt, filepath.Join(base, "log"), 2048)
		defer l.Close()
		clk := &clock{now: time.UnixMilli(1_800_000_000_000)}
		cfg := Config{Log: l, Dir: filepath.Join(base, "delay"), Now: clk.Now,
			MaxLoaded:       rapid.IntRange(1, 40).Draw(rt, "maxLoaded"),
			CheckpointEvery: time.Duration(rapid.IntRange(1, 5000).Draw(rt, "cpEveryMs")) * time.Millisecond}
		defer func(old int64) { stepBytes = old }(stepBytes)
		stepBytes = rapid.SampledFrom([]int64{150, 1000, 32 << 20}).Draw(rt, "stepBytes")
		x, err := Open(cfg)
		if err != nil {
			rt.Fatalf("open: %v", err)
		}
		defer func() { x.Close() }()
		topics := []string{"a", "b"}
		m := &model{entries: map[int64]*mEntry{}, gone: map[int64]*mEntry{}}
		var records []int64 // every record's log offset
		follow := func() {
			if err := x.Follow(); err != nil {
				rt.Fatalf("follow: %v", err)
			}
		}
		claimed := func(e Entry, what string) {
			me := m.entries[e.At]
			if me == nil || me.Entry != e {
				rt.Fatalf("%s gave %+v, the model has %+v", what, e, me)
			}
		}
		steps := rapid.IntRange(1, 50).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			flush := rapid.Bool().Draw(rt, "flush")
			switch op := rapid.IntRange(0, 11).Draw(rt, "op"); op {
			case 0, 1, 2: // delayed sends
				n := rapid.IntRange(1, 4).Draw(rt, "n")
				var es []storage.Entry
				var ms []Entry
				for range n {
					now := clk.now.UnixMilli()
					var due int64
					switch rapid.IntRange(0, 3).Draw(rt, "dueKind") {
					case 0:
						due = now - rapid.Int64Range(0, 3600_000).Draw(rt, "past")
					case 1:
						due = now + rapid.Int64Range(0, 60_000).Draw(rt, "near")
					case 2:
						due = now + rapid.Int64Range(0, 90*86400_000).Draw(rt, "far")
					case 3:
						due = now
						if pend := m.pending(); len(pend) > 0 {
							due = pend[rapid.IntRange(0, len(pend)-1).Draw(rt, "same")].DueAt
						}
					}
					tp := topics[rapid.IntRange(0, 1).Draw(rt, "topic")]
					q := uint32(rapid.IntRange(0, 1).Draw(rt, "queue"))
					es = append(es, delayedEntry(tp, q, due, -1))
					ms = append(ms, Entry{DueAt: due, Topic: tp, Queue: q})
				}
				for j, p := range appendLog(rt, l, flush, es...) {
					ms[j].At, ms[j].Size = p.LogOffset, int(p.End-p.LogOffset)
					m.entries[p.LogOffset] = &mEntry{Entry: ms[j], st: State{Kind: StatePending}, origin: p.LogOffset}
					records = append(records, p.LogOffset)
				}
			case 3: // follow
				follow()
			case 4: // the clock moves
				d := rapid.Int64Range(0, 3*86400_000).Draw(rt, "clock")
				if rapid.Bool().Draw(rt, "small") {
					d %= 60_000
				}
				clk.now = clk.now.Add(time.Duration(d) * time.Millisecond)
			case 5, 6: // fire what is due; some are released, some given back
				follow()
				max := rapid.IntRange(1, 10).Draw(rt, "max")
				got := x.Due(clk.now, max)
				var want []Entry
				for _, e := range m.pending() {
					if e.DueAt <= clk.now.UnixMilli() && len(want) < max {
						want = append(want, e.Entry)
					}
				}
				if !slices.Equal(got, want) {
					rt.Fatalf("Due(%d, %d) = %v, want %v\n%s", clk.now.UnixMilli(), max, got, want, x.dump())
				}
				for _, e := range got {
					if _, st, ok, _ := x.Claim(e.At, e.DueAt); ok || st.Kind != StatePending {
						rt.Fatalf("Claim(%d) of an entry Due claimed: %v %+v", e.At, ok, st)
					}
				}
				for _, e := range got {
					if rapid.IntRange(0, 3).Draw(rt, "giveBack") == 0 {
						x.Release(e.At, false)
						continue
					}
					pos := appendLog(rt, l, flush, releaseEntries(e)...)
					x.Release(e.At, true)
					m.entries[e.At].st = State{Kind: StateReleased, MarkAt: pos[1].LogOffset, ReleasedAt: pos[0].LogOffset}
					records = append(records, pos[0].LogOffset, pos[1].LogOffset)
				}
			case 7: // cancel one
				follow()
				pend := m.pending()
				if len(pend) == 0 {
					continue
				}
				me := pend[rapid.IntRange(0, len(pend)-1).Draw(rt, "cancel")]
				e, st, ok, err := x.Claim(me.At, me.DueAt)
				if err != nil || !ok || st.Kind != StatePending {
					rt.Fatalf("Claim(%d): %v %v %+v", me.At, ok, err, st)
				}
				claimed(e, "Claim")
				if _, _, ok, _ := x.Claim(me.At, me.DueAt); ok {
					rt.Fatalf("Claim(%d) twice", me.At)
				}
				pos := appendLog(rt, l, flush, cancelEntry(e))
				x.Release(e.At, true)
				me.st = State{Kind: StateCancelled, MarkAt: pos[0].LogOffset}
				records = append(records, pos[0].LogOffset)
			case 8: // retention moves what it would delete, then deletes
				follow()
				off := l.EndOffset()
				if len(records) > 0 {
					off = records[rapid.IntRange(0, len(records)-1).Draw(rt, "moveBefore")]
				}
				max := rapid.IntRange(1, 10).Draw(rt, "moveMax")
				got, err := x.PendingBefore(off, max)
				if err != nil {
					rt.Fatalf("PendingBefore: %v", err)
				}
				var want []Entry
				for _, e := range m.pending() {
					if e.At < off {
						want = append(want, e.Entry)
					}
				}
				slices.SortFunc(want, func(a, b Entry) int { return int(sign(a.At - b.At)) })
				want = want[:min(len(want), max)]
				if !slices.Equal(got, want) {
					rt.Fatalf("PendingBefore(%d, %d) = %v, want %v", off, max, got, want)
				}
				for _, e := range got {
					origin := m.entries[e.At].origin
					pos := appendLog(rt, l, flush, movedEntry(e.Topic, e.Queue, e.DueAt, e.At, origin))
					x.Release(e.At, true)
					m.entries[e.At].st = State{Kind: StateMoved, MovedTo: pos[0].LogOffset}
					ne := Entry{At: pos[0].LogOffset, Size: int(pos[0].End - pos[0].LogOffset), DueAt: e.DueAt, Topic: e.Topic, Queue: e.Queue}
					m.entries[ne.At] = &mEntry{Entry: ne, st: State{Kind: StatePending}, origin: origin}
					records = append(records, ne.At)
				}
				// Retention deletes (also what was not moved: it is gone).
				if rapid.Bool().Draw(rt, "delete") {
					start, err := l.DeleteBefore(off)
					if err != nil {
						rt.Fatalf("DeleteBefore: %v", err)
					}
					for at, e := range m.entries {
						if at < start {
							if e.st.Kind == StateMoved {
								m.gone[at] = e
							}
							delete(m.entries, at)
						}
					}
					records = slices.DeleteFunc(records, func(at int64) bool { return at < start })
				}
			case 9: // reopen: cleanly, or as after a crash
				if rapid.Bool().Draw(rt, "crash") {
					x.crash()
				} else if err := x.Close(); err != nil {
					rt.Fatalf("close: %v", err)
				}
				if x, err = Open(cfg); err != nil {
					rt.Fatalf("reopen: %v", err)
				}
			case 10: // the index's directory is lost
				x.crash()
				removeAll(rt, cfg.Dir)
				if x, err = Open(cfg); err != nil {
					rt.Fatalf("reopen without a directory: %v", err)
				}
			case 11: // the log is cut at a record boundary, then Reset
				if len(records) == 0 {
					continue
				}
				cut := records[rapid.IntRange(0, len(records)-1).Draw(rt, "cut")]
				if _, err := l.Truncate(cut, sideFile(base, cut)); err != nil {
					rt.Fatalf("truncate at %d: %v", cut, err)
				}
				records = slices.DeleteFunc(records, func(at int64) bool { return at >= cut })
				for at, e := range m.gone {
					if e.st.MovedTo >= cut {
						delete(m.gone, at) // its message is lost with the cut
					}
				}
				for at, e := range m.entries {
					switch {
					case at >= cut:
						delete(m.entries, at)
					case e.st.Kind == StateMoved && e.st.MovedTo >= cut, e.st.MarkAt >= cut:
						e.st = State{Kind: StatePending}
					}
				}
				if err := x.Reset(); err != nil {
					rt.Fatalf("reset: %v", err)
				}
			}
			follow()
			m.noLookups = rapid.IntRange(0, 3).Draw(rt, "noLookups") > 0
			check(rt, x, m, topics, fmt.Sprintf("step %d", i))
		}
		m.noLookups = false
		check(rt, x, m, topics, "the end")
		// The index rebuilt from the log alone says the same.
		y, err := Open(Config{Log: l, Dir: filepath.Join(base, "rebuilt"), Now: clk.Now})
		if err != nil {
			rt.Fatalf("open a rebuilt index: %v", err)
		}
		defer y.Close()
		check(rt, y, m, topics, "rebuilt")
	})
}
