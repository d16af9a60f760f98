package delay

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestJournalIsASlice: adds, drops from the front and lookups give what a
// plain slice gives, across block boundaries.
func TestJournalIsASlice(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		var j journal
		var want []effect
		next := int64(0)
		for range rapid.IntRange(1, 60).Draw(rt, "ops") {
			switch rapid.IntRange(0, 2).Draw(rt, "op") {
			case 0, 1:
				for range rapid.IntRange(1, 3*journalBlock).Draw(rt, "adds") {
					j.add(effect{at: next, qoff: next * 2})
					want = append(want, effect{at: next, qoff: next * 2})
					next++
				}
			case 2:
				k := rapid.IntRange(0, len(want)).Draw(rt, "drop")
				j.drop(k)
				want = want[k:]
			}
			if j.len() != len(want) {
				rt.Fatalf("len %d, want %d", j.len(), len(want))
			}
			for _, i := range []int{0, len(want) / 2, len(want) - 1} {
				if i >= 0 && i < len(want) && *j.at(i) != want[i] {
					rt.Fatalf("at(%d) = %+v, want %+v", i, *j.at(i), want[i])
				}
			}
			if len(j.spare) > journalSpare || len(j.blocks) > (j.head+j.n)/journalBlock+1 {
				rt.Fatalf("%d blocks (%d spare) for %d effects from %d", len(j.blocks), len(j.spare), j.n, j.head)
			}
		}
	})
}

// TestMergeRunsSorts: runs of sorted records (one per queue read, some
// empty) come out in log order, every record once.
func TestMergeRunsSorts(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		var recs []rec
		var runs []int
		for q := range rapid.IntRange(0, 11).Draw(rt, "queues") {
			runs = append(runs, len(recs))
			at := int64(0)
			for range rapid.IntRange(0, 40).Draw(rt, "records") {
				at += rapid.Int64Range(1, 100).Draw(rt, "gap")
				recs = append(recs, rec{at: at*16 + int64(q), qid: uint32(q)})
			}
		}
		want := slices.Clone(recs)
		slices.SortFunc(want, func(a, b rec) int { return int(sign(a.at - b.at)) })
		got, _ := mergeRuns(recs, runs, nil)
		if !slices.Equal(got, want) {
			rt.Fatalf("merged %v, want %v", got, want)
		}
	})
}
