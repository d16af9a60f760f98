package storage

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"pgregory.net/rapid"
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
// and keep queue offsets dense for the next append.
func TestCrashLosesNoFlushedRecord(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		dir, err := os.MkdirTemp("", "ferrymq-crash-")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(dir)
		segSize := rapid.SampledFrom([]int64{300, 1024, 1 << 20}).Draw(rt, "segment size")
		cfg := Config{Dir: dir, SegmentSize: segSize, FlushInterval: time.Hour}
		l, err := Open(cfg)
		if err != nil {
			rt.Fatal(err)
		}
		type appended struct {
			payload []byte
			end     int64
		}
		model := map[queueKey][]appended{}
		var acked int64 // every record ending at or before this was acknowledged as flushed
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
			for j, m := 0, rapid.IntRange(1, 4).Draw(rt, "batch"); j < m; j++ {
				q := uint32(rapid.IntRange(0, 2).Draw(rt, "queue"))
				size := rapid.IntRange(0, 200).Draw(rt, "size")
				p := bytes.Repeat([]byte{byte(i), byte(j), byte(q)}, size/3+1)
				batch = append(batch, Entry{Topic: "crash", Queue: q, Payload: p})
			}
			flush := rapid.Bool().Draw(rt, "flush")
			pos, err := l.Append(batch, flush)
			if err != nil {
				rt.Fatal(err)
			}
			for j, e := range batch {
				k := queueKey{e.Topic, e.Queue}
				if pos[j].QueueOffset != int64(len(model[k])) {
					rt.Fatalf("queue offset %d, want %d", pos[j].QueueOffset, len(model[k]))
				}
				model[k] = append(model[k], appended{e.Payload, pos[j].End})
			}
			if flush {
				acked = pos[len(pos)-1].End
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

		l, err = Open(cfg)
		if err != nil {
			rt.Fatalf("recovery after %s damage past the flushed offset %d: %v", damage, flushed, err)
		}
		defer l.Close()
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
			pos, err := l.Append([]Entry{{Topic: k.topic, Queue: k.queue, Payload: []byte("after")}}, false)
			if err != nil {
				rt.Fatal(err)
			}
			if want := first + int64(len(got)); pos[0].QueueOffset != want {
				rt.Fatalf("%v: append after recovery got queue offset %d, want %d", k, pos[0].QueueOffset, want)
			}
		}
	})
}
