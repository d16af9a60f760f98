package storage

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkOpenLargeLog opens logs of 1, 10 and 100 GiB. It writes one real
// segment of 1 GiB (1 KiB records over 8 queues) and makes the larger logs
// cheaply: more segments are hard links to that file, and their index
// chunks are the real ones moved along the log (log offsets and queue
// offsets shifted), so Open finds what it would find in a log of that size.
// Open reads the chunk files' headers and directories and the last
// record's header, never the segments' records. With
// FERRY_BENCH_DROP_CACHES=1 (as root) it drops the page cache before each
// Open, for the cold figure. It also opens the real segment without its
// index (rebuilt from the records), for comparison.
//
//	go test -run '^$' -bench OpenLargeLog -benchtime 3x ./storage/
func BenchmarkOpenLargeLog(b *testing.B) {
	src := b.TempDir()
	cfg := Config{Dir: src}
	l := openLog(b, cfg)
	payload := make([]byte, 1024)
	var batch []Entry
	for q := range uint32(8) {
		batch = append(batch, Entry{Topic: "bench", Queue: q, Payload: payload})
	}
	per := int64(len(batch) * recordSize(5, len(payload)))
	for l.EndOffset()+per <= DefaultSegmentSize {
		mustAppend(b, l, batch, false)
	}
	must(b, l.Close())
	segSize := fileSize(b, filepath.Join(src, fmt.Sprintf("%020d.log", 0)))
	var chunks []*openedChunk
	names, err := os.ReadDir(filepath.Join(src, indexDirName))
	must(b, err)
	for _, n := range names {
		if _, ok := parseIndexChunkName(n.Name()); !ok {
			continue // a key table
		}
		oc, err := readIndexChunk(cfg.withDefaults().FS, filepath.Join(src, indexDirName, n.Name()))
		must(b, err)
		chunks = append(chunks, oc)
	}

	for _, gib := range []int{1, 10, 100} {
		dir := b.TempDir()
		build(b, src, dir, segSize, chunks, gib)
		b.Run(fmt.Sprintf("%dGiB", gib), func(b *testing.B) { benchOpen(b, dir) })
	}
	noIndex := b.TempDir()
	build(b, src, noIndex, segSize, chunks, 1)
	must(b, os.RemoveAll(filepath.Join(noIndex, indexDirName)))
	b.Run("1GiB-without-index", func(b *testing.B) {
		benchOpen(b, noIndex)
		b.StopTimer()
		must(b, os.RemoveAll(filepath.Join(noIndex, indexDirName))) // Close wrote it again
	})
}

func benchOpen(b *testing.B, dir string) {
	var total time.Duration
	for b.Loop() {
		b.StopTimer()
		dropCaches(b)
		b.StartTimer()
		start := time.Now()
		l, err := Open(Config{Dir: dir})
		if err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
		b.StopTimer()
		st := l.IndexStats()
		b.ReportMetric(float64(st.Parts), "parts")
		b.ReportMetric(float64(l.EndOffset())/(1<<30), "GiB")
		l.crashed = true // nothing to write back
		_ = l.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/open")
}

func dropCaches(b *testing.B) {
	if os.Getenv("FERRY_BENCH_DROP_CACHES") != "1" {
		return
	}
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0); err != nil {
		b.Fatalf("drop the page cache (needs root): %v", err)
	}
}

// build makes a log of gib segments in dir: hard links to src's segment,
// with src's index chunks moved along.
func build(b *testing.B, src, dir string, segSize int64, chunks []*openedChunk, gib int) {
	b.Helper()
	srcSeg := filepath.Join(src, fmt.Sprintf("%020d.log", 0))
	must(b, os.MkdirAll(filepath.Join(dir, indexDirName), 0o755))
	next := map[queueKey]int64{}
	for i := range int64(gib) {
		base := i * segSize
		must(b, os.Link(srcSeg, filepath.Join(dir, fmt.Sprintf("%020d.log", base))))
		for _, oc := range chunks {
			raw, err := os.ReadFile(oc.c.name)
			must(b, err)
			var qs []chunkQueue
			for _, e := range oc.dir {
				q := chunkQueue{k: e.k, firstQO: e.firstQO + next[e.k]}
				for j := range e.count {
					at := e.at + j*indexEntrySize
					q.pos = append(q.pos, int64(binary.BigEndian.Uint64(raw[at:]))+base)
					q.size = append(q.size, int32(binary.BigEndian.Uint32(raw[at+8:])))
				}
				qs = append(qs, q)
			}
			snap := raw[oc.c.snapAt : oc.c.snapAt+oc.c.snapLen]
			last := chunkLast{at: oc.c.last.at + base, crc: oc.c.last.crc}
			out := encodeIndexChunk(oc.c.from+base, oc.c.to+base, last, qs, snap)
			must(b, os.WriteFile(indexChunkName(dir, oc.c.from+base), out, 0o644))
		}
		for _, oc := range chunks {
			for _, e := range oc.dir {
				next[e.k] += e.count
			}
		}
	}
	cp := &Log{cfg: Config{Dir: dir}, fs: Config{}.withDefaults().FS}
	must(b, cp.openCheckpointFile())
	must(b, cp.putCheckpoint(int64(gib)*segSize))
	must(b, cp.checkpoint.Close())
}
