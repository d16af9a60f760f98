package storage

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ferrymq/ferrymq/storage/vfs"
)

type segFile struct {
	path string
	base int64
	size int64
}

func listSegments(t *rapid.T, dir string) []segFile {
	names, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []segFile
	for _, n := range names {
		var base int64
		if _, err := fmt.Sscanf(n.Name(), "%020d.log", &base); err != nil {
			continue
		}
		st, err := os.Stat(filepath.Join(dir, n.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, segFile{filepath.Join(dir, n.Name()), base, st.Size()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].base < out[j].base })
	return out
}

// TestCrashLosesNoFlushedRecord appends random batches (some asking for
// their flush, some followed by Flush), "crashes" the process without a
// final sync, then damages everything past the last flush the way a machine
// crash can: cut the log anywhere, scribble over it, leave zeros at the end,
// or leave it whole. Recovery must keep every record whose flush was
// acknowledged, never return a record that differs from what was appended,
// and keep queue offsets dense for the next append. It runs up to three
// crash and reopen cycles.
//
// Half the entries are stamped by two producers, who send the next
// sequence, resend old ones, skip some, bump their epoch or use a stale
// one. Every answer must be what the rules give on a model of the state
// (the last runs of every pair, computed from the stored stamped records),
// and after every reopen, re-appending every stamped record still in the
// log must be answered from the rebuilt state: a duplicate with its
// original offsets while in the window.
func TestCrashLosesNoFlushedRecord(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		dir, err := os.MkdirTemp("", "ferrymq-crash-")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(dir)
		segSize := rapid.SampledFrom([]int64{300, 1024, 1 << 20}).Draw(rt, "segment size")
		cfg := Config{Dir: dir, SegmentSize: segSize, FlushInterval: time.Hour, ProducerStamp: testStamp,
			IndexChunkBytes: rapid.SampledFrom([]int64{1, 200, 700, 0}).Draw(rt, "index chunk bytes"),
			Pretouch:        rapid.SampledFrom([]int64{-1, 64, 4096}).Draw(rt, "pretouch")}
		l, err := Open(cfg)
		if err != nil {
			rt.Fatal(err)
		}
		defer func() { // a no-op once closed; rapid may abandon a case midway
			if l != nil {
				_ = l.Close()
			}
		}()
		type appended struct {
			payload []byte
			end     int64
		}
		model := map[queueKey][]appended{}
		var stamps []modelRec // the stamped records the log holds, in log order
		var acked int64       // every record ending at or before this was acknowledged as flushed
		for cycle, cycles := 0, rapid.IntRange(1, 3).Draw(rt, "cycles"); cycle < cycles; cycle++ {
			for i, n := 0, rapid.IntRange(1, 30).Draw(rt, "ops"); i < n; i++ {
				op := rapid.IntRange(0, 19).Draw(rt, "op")
				if op == 1 { // retention: drop whole segments before a random offset
					if _, err := l.DeleteBefore(rapid.Int64Range(0, l.EndOffset()).Draw(rt, "delete before")); err != nil {
						rt.Fatal(err)
					}
					continue
				}
				if op == 0 {
					if err := l.Flush(); err != nil {
						rt.Fatal(err)
					}
					acked = l.EndOffset()
					continue
				}
				var batch []Entry
				var expect []modelAnswer
				tent := stamps // stamps and the batch's entries before this one: what this one sees
				nexts := map[queueKey]int64{}
				for j, m := 0, rapid.IntRange(1, 4).Draw(rt, "batch"); j < m; j++ {
					q := uint32(rapid.IntRange(0, 2).Draw(rt, "queue"))
					k := queueKey{"crash", q}
					if _, ok := nexts[k]; !ok {
						nexts[k] = int64(len(model[k]))
					}
					size := rapid.IntRange(0, 200).Draw(rt, "size")
					p := bytes.Repeat([]byte{byte(i), byte(j), byte(q), byte(cycle)}, size/4+1)
					if !rapid.Bool().Draw(rt, "stamped") {
						batch = append(batch, Entry{Topic: k.topic, Queue: q, Payload: p})
						expect = append(expect, modelAnswer{accept: true, ref: -1})
						nexts[k]++
						continue
					}
					id := uint64(rapid.IntRange(1, 2).Draw(rt, "producer"))
					ps := drawStamp(rt, modelState(tent, k, id), id)
					a := modelCheck(tent, k, ps)
					if a.accept {
						a.ref = len(tent)
						tent = append(slices.Clip(tent), modelRec{k: k, ps: ps, qo: nexts[k]})
						nexts[k]++
					}
					expect = append(expect, a)
					batch = append(batch, Entry{Topic: k.topic, Queue: q, Producer: ps, Payload: stampedPayload(ps, string(p))})
				}
				flush := rapid.Bool().Draw(rt, "flush")
				pos, err := l.Append(batch, flush)
				if err != nil {
					rt.Fatal(err)
				}
				for j := range batch {
					if a := expect[j]; a.accept && a.ref >= 0 {
						tent[a.ref].lo, tent[a.ref].end = pos[j].LogOffset, pos[j].End
					}
				}
				stamps = tent
				start := l.StartOffset()
				for j, e := range batch {
					k := queueKey{e.Topic, e.Queue}
					if a := expect[j]; !a.accept {
						if want := a.position(stamps, start); pos[j] != want {
							rt.Fatalf("entry %d (%v %+v): %+v, want %+v", j, k, e.Producer, pos[j], want)
						}
						continue
					}
					if pos[j].Err != nil || pos[j].Duplicate {
						rt.Fatalf("entry %d (%v %+v) not stored: %+v", j, k, e.Producer, pos[j])
					}
					if pos[j].QueueOffset != int64(len(model[k])) {
						rt.Fatalf("queue offset %d, want %d", pos[j].QueueOffset, len(model[k]))
					}
					model[k] = append(model[k], appended{e.Payload, pos[j].End})
				}
				if flush { // the flush covers the whole group, whatever its last entry got
					acked = l.EndOffset()
				}
			}
			flushed, end := l.FlushedOffset(), l.EndOffset()
			if flushed < acked {
				rt.Fatalf("flushed offset %d behind an acknowledged flush at %d", flushed, acked)
			}
			crash(l)

			// Damage what was never flushed.
			segs := listSegments(rt, dir)
			damage := rapid.SampledFrom([]string{"none", "cut", "scribble", "zeros"}).Draw(rt, "damage")
			if end > flushed {
				at := rapid.Int64Range(flushed, end-1).Draw(rt, "at")
				for _, s := range segs {
					if at < s.base || at >= s.base+s.size {
						if at < s.base && damage == "cut" {
							if err := os.Truncate(s.path, 0); err != nil { // a later segment lost whole
								rt.Fatal(err)
							}
						}
						continue
					}
					local := at - s.base
					f, err := os.OpenFile(s.path, os.O_RDWR, 0)
					if err != nil {
						rt.Fatal(err)
					}
					switch damage {
					case "cut":
						err = f.Truncate(local)
					case "scribble":
						n := rapid.IntRange(1, 64).Draw(rt, "scribble length")
						junk := rapid.SliceOfN(rapid.Byte(), n, n).Draw(rt, "junk")
						_, err = f.WriteAt(junk, local)
					case "zeros":
						_, err = f.WriteAt(make([]byte, 512), local)
					}
					f.Close()
					if err != nil {
						rt.Fatal(err)
					}
				}
			}

			indexDamage := damageIndex(rt, dir)

			l, err = Open(cfg)
			if err != nil {
				rt.Fatalf("recovery after %s damage past the flushed offset %d (index: %s): %v", damage, flushed, indexDamage, err)
			}
			if l.EndOffset() < acked {
				rt.Fatalf("recovered end %d is before the acknowledged flush at %d", l.EndOffset(), acked)
			}
			start := l.StartOffset()
			for k, want := range model {
				first, _ := l.QueueRange(k.topic, k.queue)
				got, err := l.Read(k.topic, k.queue, first, 1<<30)
				if err != nil {
					rt.Fatal(err)
				}
				if int(first)+len(got) > len(want) {
					rt.Fatalf("%v: records up to %d read back, only %d appended", k, int(first)+len(got), len(want))
				}
				for i, w := range want {
					kept := w.end > start // not deleted by retention
					present := i >= int(first) && i < int(first)+len(got)
					if kept && i < int(first) {
						rt.Fatalf("%v: record %d (ending at %d) is after the log start %d but before the queue's first offset %d", k, i, w.end, start, first)
					}
					if kept && w.end <= acked && !present {
						rt.Fatalf("%v: acknowledged record %d (ending at %d, flush acknowledged to %d) lost", k, i, w.end, acked)
					}
					if kept && damage == "none" && !present {
						rt.Fatalf("%v: record %d lost with no damage at all", k, i)
					}
					if present && !bytes.Equal(got[i-int(first)].Payload, w.payload) {
						rt.Fatalf("%v: record %d read back as different bytes", k, i)
					}
				}
				model[k] = want[:max(int(first)+len(got), 0)]
			}

			// The state is what the records still in the log give.
			recovered := l.EndOffset()
			var kept []modelRec
			for _, r := range stamps {
				if r.lo >= start && r.end <= recovered {
					kept = append(kept, r)
				}
			}
			stamps = kept
			var again []Entry
			var wantPos []Position
			for _, r := range stamps {
				a := modelCheck(stamps, r.k, r.ps)
				if a.accept {
					rt.Fatalf("the model accepts the stored %+v again", r)
				}
				again = append(again, Entry{Topic: r.k.topic, Queue: r.k.queue, Producer: r.ps, Payload: stampedPayload(r.ps, "again")})
				wantPos = append(wantPos, a.position(stamps, start))
			}
			if len(again) > 0 {
				pos, err := l.Append(again, false)
				if err != nil {
					rt.Fatal(err)
				}
				for j := range pos {
					if w := wantPos[j]; pos[j] != w {
						rt.Fatalf("stamped record %+v again after the reopen: %+v, want %+v", stamps[j], pos[j], w)
					}
				}
				if l.EndOffset() != recovered {
					rt.Fatalf("re-appended stamped records were stored: end %d, was %d", l.EndOffset(), recovered)
				}
			}

			for k := range model {
				first, next := l.QueueRange(k.topic, k.queue)
				pos, err := l.Append([]Entry{{Topic: k.topic, Queue: k.queue, Payload: []byte("after")}}, false)
				if err != nil {
					rt.Fatal(err)
				}
				if pos[0].QueueOffset != next || next != int64(len(model[k])) {
					rt.Fatalf("%v: append after recovery got queue offset %d, want %d (first %d, model %d)", k, pos[0].QueueOffset, next, first, len(model[k]))
				}
				model[k] = append(model[k], appended{[]byte("after"), pos[0].End})
			}
			acked = recovered // recovery synced what it kept
		}
		if err := l.Close(); err != nil {
			rt.Fatal(err)
		}
	})
}

// modelRec is a stamped record in the crash test's model.
type modelRec struct {
	k       queueKey
	ps      ProducerStamp
	qo      int64
	lo, end int64
}

// modelPair is the model of one pair's state: its epoch and the indexes
// (into the records) of the records of its last producerRuns runs.
type modelPair struct {
	epoch   uint16
	lastSeq int64
	runs    [][]int
}

// modelState replays the stamped records, as recovery does, and returns the
// state of one pair (nil if none).
func modelState(recs []modelRec, k queueKey, id uint64) *modelPair {
	var st *modelPair
	for i, r := range recs {
		if r.k != k || r.ps.ID != id {
			continue
		}
		if st == nil || r.ps.Epoch != st.epoch {
			st = &modelPair{epoch: r.ps.Epoch, lastSeq: r.ps.Seq, runs: [][]int{{i}}}
			continue
		}
		st.lastSeq = r.ps.Seq
		run := st.runs[len(st.runs)-1]
		prev := recs[run[len(run)-1]]
		if r.ps.Seq == prev.ps.Seq+1 && r.qo == prev.qo+1 {
			st.runs[len(st.runs)-1] = append(run, i)
			continue
		}
		st.runs = append(st.runs, []int{i})
		if len(st.runs) > producerRuns {
			st.runs = st.runs[1:]
		}
	}
	return st
}

// modelAnswer is what the rules answer to a stamp.
type modelAnswer struct {
	accept bool
	dup    bool
	ref    int // the original of a duplicate (-1: older than the window); the record of an accepted entry
	err    error
}

func modelCheck(recs []modelRec, k queueKey, ps ProducerStamp) modelAnswer {
	st := modelState(recs, k, ps.ID)
	switch {
	case st == nil:
		return modelAnswer{accept: true}
	case ps.Epoch < st.epoch:
		return modelAnswer{ref: -2, err: ErrProducerFenced}
	case ps.Epoch > st.epoch:
		if ps.Seq == 0 {
			return modelAnswer{accept: true}
		}
		return modelAnswer{ref: -2, err: ErrOutOfOrderSequence}
	}
	last := st.lastSeq
	switch {
	case ps.Seq <= last:
		for _, run := range st.runs {
			for _, i := range run {
				if recs[i].ps.Seq == ps.Seq {
					return modelAnswer{dup: true, ref: i}
				}
			}
		}
		return modelAnswer{dup: true, ref: -1}
	case ps.Seq == last+1:
		return modelAnswer{accept: true}
	}
	return modelAnswer{ref: -2, err: ErrOutOfOrderSequence}
}

// position is the Position a refused or duplicate entry gets, given the log
// starts at start.
func (a modelAnswer) position(recs []modelRec, start int64) Position {
	switch {
	case a.err != nil:
		return Position{QueueOffset: -1, LogOffset: -1, End: -1, Err: a.err}
	case a.dup && a.ref < 0:
		return Position{QueueOffset: -1, LogOffset: -1, End: -1, Duplicate: true}
	case a.dup:
		r := recs[a.ref]
		if r.lo < start {
			return Position{QueueOffset: r.qo, LogOffset: -1, End: -1, Duplicate: true}
		}
		return Position{QueueOffset: r.qo, LogOffset: r.lo, End: r.end, Duplicate: true}
	}
	return Position{}
}

// drawStamp draws what a producer sends next: mostly the next sequence,
// sometimes a resend, a gap, a new epoch (at 0 or not) or a stale epoch.
func drawStamp(rt *rapid.T, st *modelPair, id uint64) ProducerStamp {
	if st == nil {
		return ProducerStamp{ID: id, Epoch: uint16(rapid.IntRange(0, 1).Draw(rt, "epoch")), Seq: int64(rapid.IntRange(0, 2).Draw(rt, "seq"))}
	}
	ps := ProducerStamp{ID: id, Epoch: st.epoch, Seq: st.lastSeq + 1}
	switch rapid.IntRange(0, 9).Draw(rt, "send") {
	case 5: // a resend
		ps.Seq = int64(rapid.Int64Range(max(0, st.lastSeq-8), st.lastSeq).Draw(rt, "resend"))
	case 6: // a gap
		ps.Seq += rapid.Int64Range(1, 3).Draw(rt, "gap")
	case 7: // a new instance
		ps.Epoch, ps.Seq = st.epoch+1, 0
	case 8: // a new instance not starting at 0
		ps.Epoch, ps.Seq = st.epoch+1, rapid.Int64Range(1, 3).Draw(rt, "seq")
	case 9: // a zombie
		if st.epoch > 0 {
			ps.Epoch = st.epoch - 1
		}
	}
	return ps
}

// TestFaultsLoseNoAcknowledgedRecord appends, flushes and deletes while
// random file-system calls fail (a full disk, an I/O error, on writes,
// syncs, creations, directory syncs, truncations, removals and renames),
// then crashes the process (what was written stays in the page cache) and
// reopens the log with a healthy disk. An append that fails must fail whole;
// every record the log took must be there after the reopen, byte for byte,
// unless retention deleted it; queue offsets must stay dense. Only when the
// log broke (a failed write could not be undone) may records of the append
// that broke it survive, after all the others.
func TestFaultsLoseNoAcknowledgedRecord(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		dir, err := os.MkdirTemp("", "ferrymq-faults-")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(dir)
		efs := vfs.NewErrorFS(vfs.Default)
		cfg := Config{
			Dir:             dir,
			FS:              efs,
			SegmentSize:     rapid.SampledFrom([]int64{300, 1024}).Draw(rt, "segment size"),
			Flush:           rapid.SampledFrom([]FlushMode{FlushAsync, FlushSync}).Draw(rt, "flush mode"),
			FlushInterval:   time.Hour,
			IndexChunkBytes: rapid.SampledFrom([]int64{1, 500, 0}).Draw(rt, "index chunk bytes"),
			Pretouch:        rapid.SampledFrom([]int64{-1, 1000}).Draw(rt, "pretouch"),
		}
		l, err := Open(cfg)
		if err != nil {
			rt.Fatal(err)
		}
		type stored struct {
			payload string
			end     int64 // log offset just past the record
		}
		model := map[queueKey][]stored{} // what the log holds, per queue, in offset order
		broke := false
		for i, n := 0, rapid.IntRange(1, 40).Draw(rt, "ops"); i < n; i++ {
			switch op := rapid.IntRange(0, 9).Draw(rt, "op"); op {
			case 0:
				kind := rapid.SampledFrom([]vfs.Op{vfs.OpWrite, vfs.OpSync, vfs.OpCreate, vfs.OpSyncDir,
					vfs.OpTruncate, vfs.OpRemove, vfs.OpRename}).Draw(rt, "fault")
				rule := vfs.Fail(kind).Nth(rapid.IntRange(1, 3).Draw(rt, "nth")).
					With(rapid.SampledFrom([]error{syscall.ENOSPC, syscall.EIO}).Draw(rt, "errno"))
				if kind == vfs.OpWrite {
					rule.Partial(rapid.IntRange(0, 400).Draw(rt, "partial"))
				}
				efs.Inject(rule)
			case 1:
				efs.DropAll()
			case 2:
				_ = l.Flush()
			case 3:
				before := l.StartOffset()
				start, err := l.DeleteBefore(rapid.Int64Range(0, l.EndOffset()).Draw(rt, "delete before"))
				if start != l.StartOffset() || start < before {
					rt.Fatalf("DeleteBefore returned %d (%v); the log starts at %d, was %d", start, err, l.StartOffset(), before)
				}
			default:
				var batch []Entry
				nexts := map[queueKey]int64{}
				for j, m := 0, rapid.IntRange(1, 3).Draw(rt, "batch"); j < m; j++ {
					q := uint32(rapid.IntRange(0, 2).Draw(rt, "queue"))
					p := fmt.Sprintf("%d-%d|", i, j) + strings.Repeat("x", rapid.IntRange(0, 150).Draw(rt, "size"))
					batch = append(batch, Entry{Topic: "fault", Queue: q, Payload: []byte(p)})
					k := queueKey{"fault", q}
					_, nexts[k] = l.QueueRange(k.topic, k.queue)
				}
				pos, err := l.Append(batch, rapid.Bool().Draw(rt, "flush"))
				if errors.Is(err, ErrBroken) {
					broke = true
				}
				if err == nil {
					for j, e := range batch {
						k := queueKey{e.Topic, e.Queue}
						if pos[j].QueueOffset != int64(len(model[k])) {
							rt.Fatalf("%v: appended at %d, want %d", k, pos[j].QueueOffset, len(model[k]))
						}
						model[k] = append(model[k], stored{string(e.Payload), pos[j].End})
					}
					continue
				}
				// A failed append is all or nothing: nothing if its write
				// failed, everything if only its sync did.
				added := map[queueKey]int64{}
				for _, e := range batch {
					added[queueKey{e.Topic, e.Queue}]++
				}
				all, none := true, true
				for k, before := range nexts {
					_, next := l.QueueRange(k.topic, k.queue)
					all = all && next == before+added[k]
					none = none && next == before
				}
				if !all && !none {
					rt.Fatalf("a failed append (%v) was stored in part", err)
				}
				if none {
					continue
				}
				for k, before := range nexts { // read back where it landed
					es, rerr := l.Read(k.topic, k.queue, before, 1<<30)
					if rerr != nil {
						rt.Fatal(rerr)
					}
					for _, e := range es {
						model[k] = append(model[k], stored{string(e.Payload), e.LogOffset + int64(recordSize(len(k.topic), len(e.Payload)))})
					}
				}
			}
		}
		efs.DropAll()
		crash(l)

		l, err = Open(Config{Dir: dir, SegmentSize: cfg.SegmentSize})
		if err != nil {
			rt.Fatalf("reopen after faults: %v", err)
		}
		defer l.Close()
		start := l.StartOffset()
		for q := range uint32(3) {
			k := queueKey{"fault", q}
			want := model[k]
			first, next := l.QueueRange(k.topic, k.queue)
			es, err := l.Read(k.topic, k.queue, first, 1<<30)
			if err != nil {
				rt.Fatal(err)
			}
			if int64(len(es)) != next-first {
				rt.Fatalf("%v: read %d entries of [%d,%d)", k, len(es), first, next)
			}
			if first > int64(len(want)) {
				rt.Fatalf("%v: starts at %d, only %d stored", k, first, len(want))
			}
			for i, w := range want {
				if int64(i) < first {
					if w.end > start {
						rt.Fatalf("%v: record %d (ending at %d) lost; the log starts at %d", k, i, w.end, start)
					}
					continue
				}
				if int64(i) >= next {
					rt.Fatalf("%v: record %d lost; the queue ends at %d", k, i, next)
				}
				e := es[int64(i)-first]
				if e.QueueOffset != int64(i) || string(e.Payload) != w.payload {
					rt.Fatalf("%v: record %d reads back as %d %q, want %q", k, i, e.QueueOffset, e.Payload, w.payload)
				}
			}
			if extra := next - int64(max(len(want), int(first))); extra > 0 && !broke {
				rt.Fatalf("%v: %d records that no append stored", k, extra)
			}
			for i, e := range es {
				if e.QueueOffset != first+int64(i) {
					rt.Fatalf("%v: offsets not dense: %d at %d", k, e.QueueOffset, i)
				}
			}
			pos, err := l.Append([]Entry{{Topic: k.topic, Queue: k.queue, Payload: []byte("after")}}, false)
			if err != nil {
				rt.Fatal(err)
			}
			if pos[0].QueueOffset != next {
				rt.Fatalf("%v: append after the reopen at %d, want %d", k, pos[0].QueueOffset, next)
			}
		}
	})
}

// copyDir copies the files of a log directory (no subdirectories).
func copyDir(t *rapid.T, from, to string) {
	names, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if n.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, n.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, n.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTruncateCrashRecoversOldOrCut truncates a random log (stamped and
// plain records, some segments deleted by retention) at a random record
// boundary (or its end) while the disk fails: one random call fails, or
// the disk freezes at a random call (every change from there on fails, as
// if the machine died there). Then the process crashes and the log is
// reopened on a healthy disk. The reopened log must be the old one or the
// one cut exactly at the offset (never anything else; byte for byte a
// prefix of the old), the one cut when Truncate succeeded, the old one when
// it failed without breaking the log; the side file, if it exists, must
// hold exactly the cut bytes. A cut log must behave, on more appends, as a
// copy of the old log truncated on a healthy disk does.
func TestTruncateCrashRecoversOldOrCut(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		dir, err := os.MkdirTemp("", "ferrymq-trunc-")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(dir)
		refDir, err := os.MkdirTemp("", "ferrymq-trunc-ref-")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(refDir)
		efs := vfs.NewErrorFS(vfs.Default)
		segSize := rapid.SampledFrom([]int64{300, 1024}).Draw(rt, "segment size")
		cfg := Config{Dir: dir, FS: efs, SegmentSize: segSize, FlushInterval: time.Hour, ProducerStamp: testStamp,
			IndexChunkBytes: rapid.SampledFrom([]int64{1, 300, 0}).Draw(rt, "index chunk bytes"),
			Pretouch:        rapid.SampledFrom([]int64{-1, 500}).Draw(rt, "pretouch")}
		l, err := Open(cfg)
		if err != nil {
			rt.Fatal(err)
		}
		defer func() { _ = l.Close() }()

		// A random log; every record's start is a boundary.
		type pk struct {
			q  uint32
			id uint64
		}
		seqs := map[pk]ProducerStamp{}
		var bounds []int64
		draw := func(i int) Entry {
			q := uint32(rapid.IntRange(0, 2).Draw(rt, "queue"))
			p := bytes.Repeat([]byte{byte(i), byte(q)}, rapid.IntRange(1, 60).Draw(rt, "size"))
			if !rapid.Bool().Draw(rt, "stamped") {
				return Entry{Topic: "trunc", Queue: q, Payload: p}
			}
			k := pk{q, uint64(rapid.IntRange(1, 2).Draw(rt, "producer"))}
			ps, ok := seqs[k]
			switch {
			case !ok:
				ps = ProducerStamp{ID: k.id}
			case rapid.IntRange(0, 9).Draw(rt, "new epoch") == 0:
				ps = ProducerStamp{ID: k.id, Epoch: ps.Epoch + 1}
			default:
				ps.Seq++
			}
			seqs[k] = ps
			return Entry{Topic: "trunc", Queue: q, Producer: ps, Payload: stampedPayload(ps, string(p))}
		}
		for i, n := 0, rapid.IntRange(1, 30).Draw(rt, "appends"); i < n; i++ {
			var batch []Entry
			for j, m := 0, rapid.IntRange(1, 3).Draw(rt, "batch"); j < m; j++ {
				batch = append(batch, draw(i))
			}
			pos, err := l.Append(batch, false)
			if err != nil {
				rt.Fatal(err)
			}
			for _, p := range pos {
				if p.Err != nil || p.Duplicate {
					rt.Fatalf("entry refused: %+v", p)
				}
				bounds = append(bounds, p.LogOffset)
			}
			if rapid.IntRange(0, 9).Draw(rt, "retention") == 0 {
				if _, err := l.DeleteBefore(rapid.Int64Range(0, l.EndOffset()).Draw(rt, "delete before")); err != nil {
					rt.Fatal(err)
				}
			}
		}
		start, oldEnd := l.StartOffset(), l.EndOffset()
		var live []int64
		for _, b := range bounds {
			if b >= start {
				live = append(live, b)
			}
		}
		offset := oldEnd
		if len(live) > 0 && rapid.IntRange(0, 9).Draw(rt, "no-op") > 0 {
			offset = rapid.SampledFrom(live).Draw(rt, "offset")
		}
		orig := rawFrom(rt, l, start)
		oldQueues, oldProducers := fmt.Sprint(dumpQueues(rt, l)), dumpProducers(l)

		// The reference: a copy truncated on a healthy disk.
		copyDir(rt, dir, refDir)
		ref, err := Open(Config{Dir: refDir, SegmentSize: segSize, FlushInterval: time.Hour, ProducerStamp: testStamp})
		if err != nil {
			rt.Fatal(err)
		}
		defer func() { _ = ref.Close() }()
		// What Open makes of the old log (it forgets producers whose
		// records retention deleted, so not quite the state of l).
		reopenedQueues, reopenedProducers := fmt.Sprint(dumpQueues(rt, ref)), dumpProducers(ref)
		if reopenedQueues != oldQueues {
			rt.Fatal("the copy of the log opens with other queues")
		}
		if _, err := ref.Truncate(offset, filepath.Join(refDir, "truncated", SideFileName(offset, 1))); err != nil {
			rt.Fatal(err)
		}
		refQueues, refProducers := fmt.Sprint(dumpQueues(rt, ref)), dumpProducers(ref)

		switch mode := rapid.SampledFrom([]string{"none", "fault", "freeze"}).Draw(rt, "mode"); mode {
		case "fault":
			kind := rapid.SampledFrom([]vfs.Op{vfs.OpWrite, vfs.OpSync, vfs.OpCreate, vfs.OpSyncDir, vfs.OpMkdirAll,
				vfs.OpTruncate, vfs.OpRemove, vfs.OpRename}).Draw(rt, "fault")
			efs.Inject(vfs.Fail(kind).Nth(rapid.IntRange(1, 4).Draw(rt, "nth")).
				With(rapid.SampledFrom([]error{syscall.ENOSPC, syscall.EIO}).Draw(rt, "errno")))
		case "freeze":
			efs.Inject(vfs.Fail(vfs.OpMutations).After(rapid.IntRange(0, 24).Draw(rt, "calls before the freeze")))
		}
		side := filepath.Join(dir, "truncated", SideFileName(offset, 1))
		res, terr := l.Truncate(offset, side)
		switch {
		case terr == nil && l.EndOffset() != offset && offset < oldEnd:
			rt.Fatalf("Truncate(%d) succeeded with the end at %d", offset, l.EndOffset())
		case terr == nil && offset < oldEnd && (res.From != offset || res.To != oldEnd || res.SideFile != side):
			rt.Fatalf("result %+v for [%d,%d)", res, offset, oldEnd)
		case terr == nil && offset < oldEnd && (fmt.Sprint(dumpQueues(rt, l)) != refQueues || dumpProducers(l) != refProducers):
			rt.Fatal("the truncated log differs from the reference")
		case terr != nil && !errors.Is(terr, ErrBroken):
			if l.EndOffset() != oldEnd || fmt.Sprint(dumpQueues(rt, l)) != oldQueues || dumpProducers(l) != oldProducers {
				rt.Fatalf("a failed truncation (%v) changed the log", terr)
			}
		}
		crash(l)
		efs.DropAll()

		l, err = Open(cfg)
		if err != nil {
			rt.Fatalf("reopen after truncating at %d of [%d,%d) (%v): %v", offset, start, oldEnd, terr, err)
		}
		end := l.EndOffset()
		switch {
		case end != oldEnd && end != offset:
			rt.Fatalf("reopened with the end at %d: neither the old end %d nor the cut at %d (truncate: %v)", end, oldEnd, offset, terr)
		case terr == nil && end != offset:
			rt.Fatalf("Truncate succeeded but the log reopened at %d, not %d", end, offset)
		case terr != nil && !errors.Is(terr, ErrBroken) && end != oldEnd:
			rt.Fatalf("Truncate failed (%v) without breaking the log, but the log reopened cut", terr)
		}
		if got := rawFrom(rt, l, start); !bytes.Equal(got, orig[:end-start]) {
			rt.Fatalf("the reopened log is not a prefix of the old one")
		}
		if end == oldEnd {
			if fmt.Sprint(dumpQueues(rt, l)) != oldQueues || dumpProducers(l) != reopenedProducers {
				rt.Fatal("the log reopened whole but its state differs")
			}
		} else if fmt.Sprint(dumpQueues(rt, l)) != refQueues || dumpProducers(l) != refProducers {
			rt.Fatal("the log reopened cut but its state differs from the reference")
		}
		if b, err := os.ReadFile(side); err == nil {
			if !bytes.Equal(b, orig[offset-start:]) {
				rt.Fatalf("the side file holds %d bytes, not the %d cut", len(b), len(orig[offset-start:]))
			}
			var n int
			if err := ReadRecordFile(side, func(r RecordInfo) error {
				if r.Offset < offset || r.Offset >= oldEnd {
					return fmt.Errorf("record at %d", r.Offset)
				}
				n++
				return nil
			}); err != nil {
				rt.Fatal(err)
			}
		} else if terr == nil && offset < oldEnd {
			rt.Fatalf("Truncate succeeded without a side file: %v", err)
		}

		// The cut log goes on as the reference does.
		if end == offset {
			for i, n := 0, rapid.IntRange(1, 5).Draw(rt, "more"); i < n; i++ {
				batch := []Entry{draw(100 + i)}
				if rapid.Bool().Draw(rt, "resend") && len(seqs) > 0 {
					// a resent stamp, from before or after the cut
					for k, ps := range seqs {
						ps.Seq = rapid.Int64Range(0, ps.Seq).Draw(rt, "resent seq")
						batch = append(batch, Entry{Topic: "trunc", Queue: k.q, Producer: ps, Payload: stampedPayload(ps, "again")})
						break
					}
				}
				got, err := l.Append(batch, false)
				if err != nil {
					rt.Fatal(err)
				}
				want, err := ref.Append(batch, false)
				if err != nil {
					rt.Fatal(err)
				}
				for j := range got {
					if g, w := got[j], want[j]; g.QueueOffset != w.QueueOffset || g.LogOffset != w.LogOffset || g.Duplicate != w.Duplicate || !errors.Is(g.Err, w.Err) {
						rt.Fatalf("append %d.%d after the cut: %+v, the reference %+v", i, j, g, w)
					}
				}
			}
		}
	})
}

// damageIndex does to the index chunk files what a crash, a bad disk or an
// operator can: remove one, cut one short, flip a byte of its header,
// directory or snapshot (the parts Open reads and checks), or leave a
// half-written temporary file. Open must then rebuild from the log what the
// damaged chunk held. (A flipped byte among a chunk's entries is found by
// the read that uses it: TestIndexEntryCorruptionIsReported.) It returns
// what it did.
func damageIndex(rt *rapid.T, dir string) string {
	idir := filepath.Join(dir, indexDirName)
	names, _ := os.ReadDir(idir)
	var chunks []string
	for _, n := range names {
		if _, ok := parseIndexChunkName(n.Name()); ok {
			chunks = append(chunks, filepath.Join(idir, n.Name()))
		}
	}
	what := rapid.SampledFrom([]string{"none", "none", "remove", "cut", "flip", "tmp"}).Draw(rt, "index damage")
	if what == "tmp" {
		if err := os.MkdirAll(idir, 0o755); err != nil {
			rt.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(idir, "00000000000000000000.idx.tmp"), []byte("FYIX half"), 0o644); err != nil {
			rt.Fatal(err)
		}
		return what
	}
	if what == "none" || len(chunks) == 0 {
		return "none"
	}
	victim := rapid.SampledFrom(chunks).Draw(rt, "index chunk")
	b, err := os.ReadFile(victim)
	if err != nil {
		rt.Fatal(err)
	}
	switch what {
	case "remove":
		err = os.Remove(victim)
	case "cut":
		err = os.Truncate(victim, int64(rapid.IntRange(0, len(b)-1).Draw(rt, "cut index at")))
	case "flip":
		oc, rerr := readIndexChunk(vfs.Default, victim)
		if rerr != nil {
			rt.Fatal(rerr)
		}
		// Header and directory, or the snapshot: never the entries.
		ranges := [][2]int64{{0, oc.c.entries}}
		if oc.c.snapLen > 0 {
			ranges = append(ranges, [2]int64{oc.c.snapAt, oc.c.snapAt + oc.c.snapLen})
		}
		r := rapid.SampledFrom(ranges).Draw(rt, "index region")
		at := rapid.Int64Range(r[0], r[1]-1).Draw(rt, "flip at")
		if at >= 68 && at < indexHeaderSize {
			at = 0 // reserved bytes are not checked
		}
		b[at] ^= 0x5a
		err = os.WriteFile(victim, b, 0o644)
	}
	if err != nil {
		rt.Fatal(err)
	}
	return what + " " + filepath.Base(victim)
}
