package delay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"path/filepath"
	"slices"
	"time"
)

// The checkpoint file, "checkpoint" (all integers big-endian):
//
//	magic "FYDC", u16 version 1, u16 0, i64 bucket width (ms), i64 W,
//	  i64 the log's start as the index applied it
//	u32 queues, per queue (its index is its number in items): u16 topic
//	  length, the delay topic, u32 queue, i64 next queue offset as of W
//	u32 buckets, per bucket: i64 number (start / width), u64 items in its
//	  file as of W, i64 a lower bound of its pending entries' log offsets,
//	  i64 the largest log offset of its items, u32 queues, per queue: u32
//	  number, i64 pending entries as of W
//	u32 far files, per far file: i64 number (start / its span), u64 items
//	  as of W, i64 the largest log offset of its items, u8 1 when its
//	  group is split, i64 a lower bound of its pending entries' log
//	  offsets, u32 queues, per queue: u32 number, i64 pending entries as
//	  of W (a group not split counts its span's entries; see group), u32
//	  buckets, per bucket of its span with pending entries (not split):
//	  u32 its place in the span, u32 pending entries as of W
//	u32 CRC32C of all that
//
// Version 1 had no split flag and counts after a far file's maximum: its
// groups are split.
const (
	checkpointName  = "checkpoint"
	checkpointMagic = "FYDC"
)

// A cpJob is a checkpoint taken under the index's lock (snapshot) and
// written outside it (write): the files to sync, then the checkpoint's
// bytes.
type cpJob struct {
	w     int64    // the offset it covers
	syncs []*store // the files written since the last checkpoint, synced before it is written
	paths []string // their names, taken under the lock
	data  []byte   // the checkpoint file
	began time.Time
	took  time.Duration // the snapshot's and the write's time (not the wait for the lock after)
	err   error
}

// checkpoint writes the checkpoint now, under the lock (Open, Close,
// rebuild): it waits for one in flight first.
func (x *Index) checkpoint() error {
	x.waitCheckpoint()
	if x.broken != nil {
		return x.broken
	}
	job, err := x.snapshot()
	if err != nil || job == nil {
		return err
	}
	x.writeJob(job)
	return x.finish(job)
}

// startCheckpoint takes a checkpoint's snapshot under the lock and writes
// it in a goroutine of its own, without the lock (Follow): Due, Claim and
// the rest wait only for the snapshot. At most one is in flight.
func (x *Index) startCheckpoint() error {
	if x.cpBusy != nil {
		return nil
	}
	job, err := x.snapshot()
	if err != nil || job == nil {
		return err
	}
	done := make(chan struct{})
	x.cpBusy = done
	go func() {
		defer close(done)
		x.writeJob(job)
		x.mu.Lock()
		defer x.mu.Unlock()
		x.cpBusy = nil
		if err := x.finish(job); err != nil {
			x.logger.Error("cannot write the delay index checkpoint", "error", err)
			if x.broken == nil {
				x.broken = err
			}
		}
	}()
	return nil
}

// waitCheckpoint waits (the lock released meanwhile) until no checkpoint
// is in flight.
func (x *Index) waitCheckpoint() {
	for x.cpBusy != nil {
		ch := x.cpBusy
		x.mu.Unlock()
		<-ch
		x.mu.Lock()
	}
}

// writeJob syncs the job's files (through handles of its own: the
// index's open files may be closed meanwhile) and then writes the
// checkpoint. It holds no lock: only the job's own state is used.
func (x *Index) writeJob(job *cpJob) {
	for _, path := range job.paths {
		if err := x.syncPath(path); err != nil {
			job.err = err
			job.took = time.Since(job.began)
			return
		}
	}
	job.err = x.writeFileDurable(checkpointName, job.data)
	job.took = time.Since(job.began)
}

func (x *Index) syncPath(path string) error {
	f, err := x.fs.OpenRW(path)
	if err != nil {
		return fmt.Errorf("delay: open bucket file %s: %w", path, err)
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("delay: sync bucket file %s: %w", path, err)
	}
	return nil
}

// finish records a written job (under the lock): W moves, the journal
// forgets the records before it. A job that failed leaves its files
// dirty (the next checkpoint syncs them again) and is returned.
func (x *Index) finish(job *cpJob) error {
	if job.err != nil {
		for _, st := range job.syncs {
			if !st.dead && !st.dirty {
				st.dirty = true
				x.dirty = append(x.dirty, st)
			}
		}
		return job.err
	}
	x.w = job.w
	x.cpWritten = true
	if cap(job.data) <= 1<<20 {
		x.cpBuf = job.data[:0] // for the next checkpoint's bytes (a large one is not kept)
	}
	keep := 0
	for keep < x.journal.len() && x.journal.at(keep).at < job.w {
		keep++
	}
	x.journal.drop(keep)
	x.cpTook = job.took
	return nil
}

// snapshot takes what a checkpoint at W = min(the log's flushed offset,
// what the index followed) writes, undoing from the counts what the
// records past W did (the journal): the buffered items written to their
// files (the page cache), the files to sync, the checkpoint's bytes. nil:
// nothing new to write.
func (x *Index) snapshot() (*cpJob, error) {
	began := time.Now()
	f := min(x.l.FlushedOffset(), x.pos)
	if f < x.w || (f == x.w && x.cpWritten) || f < x.start || f < x.trimmed {
		return nil, nil
	}
	if err := x.flushAll(); err != nil {
		return nil, err
	}
	job := &cpJob{w: f, began: began}
	for _, st := range x.dirty {
		if st.dead {
			continue
		}
		st.dirty = false
		job.syncs = append(job.syncs, st)
	}
	x.dirty = x.dirty[:0]

	// The state as of f: undo the effects of the records at or past it.
	next := make([]int64, len(x.queues))
	for i, q := range x.queues {
		next[i] = q.next
	}
	items := map[*store]int64{}
	pend := map[*counts][]qcount{}
	minAt := map[*counts]int64{}
	fine := map[*group][]uint32{} // the fine counts as of f, of the groups the undo changes
	for k := x.journal.len() - 1; k >= 0 && x.journal.at(k).at >= f; k-- {
		ef := x.journal.at(k)
		next[ef.qid] = ef.qoff
		if ef.s != nil {
			items[ef.s]--
		}
		var c *counts
		switch {
		case ef.b != nil:
			c = &ef.b.counts
		case ef.g != nil && !ef.g.split:
			c = &ef.g.counts
			if ef.dp > 0 {
				fc, ok := fine[ef.g]
				if !ok {
					fc = slices.Clone(ef.g.fine)
					fine[ef.g] = fc
				}
				fc[ef.bid-ef.g.id*x.farMs/x.widthMs]--
			}
		case ef.g != nil:
			if b := x.buckets[ef.bid]; b != nil {
				c = &b.counts // split since
			}
		}
		if c == nil || ef.dp == 0 || (ef.dp < 0 && ef.ref < x.start) {
			continue
		}
		pend[c] = addCount(pend[c], ef.pq, -int64(ef.dp))
		if ef.dp < 0 {
			// Pending as of f: the bucket's lower bound must cover it.
			if m, ok := minAt[c]; !ok || ef.ref < m {
				minAt[c] = ef.ref
			}
		}
	}

	// Buckets wholly below the log's start and W go.
	for id, b := range x.buckets {
		if b.npending != 0 || b.st != nil || b.maxAt >= min(f, x.start) || b.dirty || len(b.buf) > 0 {
			continue
		}
		if err := x.closeFile(id); err != nil {
			return nil, fmt.Errorf("delay: close bucket file: %w", err)
		}
		if err := x.fs.Remove(x.path(&b.store)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("delay: remove bucket file: %w", err)
		}
		b.dead = true
		delete(x.buckets, id)
	}
	for gid, g := range x.groups {
		if g.maxAt >= min(f, x.start) || g.dirty || len(g.buf) > 0 {
			continue
		}
		if err := x.closeFile(g.key); err != nil {
			return nil, fmt.Errorf("delay: close far file: %w", err)
		}
		if err := x.fs.Remove(x.path(&g.store)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("delay: remove far file: %w", err)
		}
		g.dead = true
		delete(x.groups, gid)
	}
	for _, st := range job.syncs {
		if !st.dead {
			job.paths = append(job.paths, x.path(st))
		}
	}

	buf := slices.Grow(x.cpBuf[:0], 64+len(x.queues)*32+len(x.buckets)*48)
	x.cpBuf = nil // the job's until it is written
	buf = append(buf, checkpointMagic...)
	buf = binary.BigEndian.AppendUint16(buf, 2)
	buf = binary.BigEndian.AppendUint16(buf, 0)
	buf = binary.BigEndian.AppendUint64(buf, uint64(x.widthMs))
	buf = binary.BigEndian.AppendUint64(buf, uint64(f))
	buf = binary.BigEndian.AppendUint64(buf, uint64(x.start))
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(x.queues)))
	for i, q := range x.queues {
		buf = binary.BigEndian.AppendUint16(buf, uint16(len(q.topic)))
		buf = append(buf, q.topic...)
		buf = binary.BigEndian.AppendUint32(buf, q.queue)
		buf = binary.BigEndian.AppendUint64(buf, uint64(next[i]))
	}
	nAt := len(buf)
	buf = binary.BigEndian.AppendUint32(buf, 0)
	var nb uint32
	var counts []qcount
	for _, b := range x.buckets {
		n := b.items + items[&b.store]
		counts = b.pending
		if d, ok := pend[&b.counts]; ok {
			counts = slices.Clone(b.pending)
			for _, qc := range d {
				counts = addCount(counts, qc.qid, qc.n)
			}
		}
		if n <= 0 && len(counts) == 0 && b.maxAt < 0 {
			continue // no item at all (its items may all be in its far file)
		}
		nb++
		buf = binary.BigEndian.AppendUint64(buf, uint64(b.id))
		buf = binary.BigEndian.AppendUint64(buf, uint64(n))
		lo := b.minAt
		if m, ok := minAt[&b.counts]; ok && m < lo {
			lo = m
		}
		buf = binary.BigEndian.AppendUint64(buf, uint64(lo))
		buf = binary.BigEndian.AppendUint64(buf, uint64(b.maxAt))
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(counts)))
		for _, qc := range counts {
			buf = binary.BigEndian.AppendUint32(buf, qc.qid)
			buf = binary.BigEndian.AppendUint64(buf, uint64(qc.n))
		}
	}
	binary.BigEndian.PutUint32(buf[nAt:], nb)
	gAt := len(buf)
	buf = binary.BigEndian.AppendUint32(buf, 0)
	var ng uint32
	for _, g := range x.groups {
		n := g.items + items[&g.store]
		if n <= 0 {
			continue
		}
		ng++
		buf = binary.BigEndian.AppendUint64(buf, uint64(g.id))
		buf = binary.BigEndian.AppendUint64(buf, uint64(n))
		buf = binary.BigEndian.AppendUint64(buf, uint64(g.maxAt))
		split := byte(0)
		if g.split {
			split = 1
		}
		buf = append(buf, split)
		counts = g.pending
		if d, ok := pend[&g.counts]; ok {
			counts = slices.Clone(g.pending)
			for _, qc := range d {
				counts = addCount(counts, qc.qid, qc.n)
			}
		}
		lo := g.minAt
		if m, ok := minAt[&g.counts]; ok && m < lo {
			lo = m
		}
		buf = binary.BigEndian.AppendUint64(buf, uint64(lo))
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(counts)))
		for _, qc := range counts {
			buf = binary.BigEndian.AppendUint32(buf, qc.qid)
			buf = binary.BigEndian.AppendUint64(buf, uint64(qc.n))
		}
		fc, ok := fine[g]
		if !ok {
			fc = g.fine
		}
		nAt := len(buf)
		buf = binary.BigEndian.AppendUint32(buf, 0)
		var nf uint32
		for i, c := range fc {
			if c > 0 {
				nf++
				buf = binary.BigEndian.AppendUint32(buf, uint32(i))
				buf = binary.BigEndian.AppendUint32(buf, c)
			}
		}
		binary.BigEndian.PutUint32(buf[nAt:], nf)
	}
	binary.BigEndian.PutUint32(buf[gAt:], ng)
	job.data = binary.BigEndian.AppendUint32(buf, crc32.Checksum(buf, castagnoli))
	return job, nil
}

// addCount adds d to qid's count in cs, dropping a count that comes to 0.
func addCount(cs []qcount, qid uint32, d int64) []qcount {
	if d == 0 {
		return cs
	}
	for i := range cs {
		if cs[i].qid == qid {
			cs[i].n += d
			if cs[i].n == 0 {
				cs = slices.Delete(cs, i, i+1)
			}
			return cs
		}
	}
	return append(cs, qcount{qid, d})
}

// writeFileDurable writes name in the index's directory: to a temporary
// name, synced, renamed, the directory synced (which also makes the names
// of new bucket files durable).
func (x *Index) writeFileDurable(name string, data []byte) error {
	path := filepath.Join(x.cfg.Dir, name)
	tmp := path + ".tmp"
	if err := x.fs.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delay: remove %s: %w", tmp, err)
	}
	f, err := x.fs.Create(tmp)
	if err != nil {
		return fmt.Errorf("delay: create %s: %w", tmp, err)
	}
	_, err = f.WriteAt(data, 0)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("delay: write %s: %w", tmp, err)
	}
	if err := x.fs.Rename(tmp, path); err != nil {
		return fmt.Errorf("delay: rename %s: %w", tmp, err)
	}
	if err := x.fs.SyncDir(x.cfg.Dir); err != nil {
		return fmt.Errorf("delay: sync %s: %w", x.cfg.Dir, err)
	}
	return nil
}

var errBadCheckpoint = errors.New("delay: bad checkpoint")

// loadCheckpoint reads the checkpoint into the (clear) index: ok false
// when there is none or it cannot be used (err then says why).
func (x *Index) loadCheckpoint() (ok bool, err error) {
	path := filepath.Join(x.cfg.Dir, checkpointName)
	f, err := x.fs.OpenRW(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("delay: open %s: %w", path, err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return false, fmt.Errorf("delay: size of %s: %w", path, err)
	}
	if size < 44 || size > 1<<32 {
		return false, fmt.Errorf("%w: %d bytes", errBadCheckpoint, size)
	}
	buf := make([]byte, size)
	if n, err := f.ReadAt(buf, 0); n < len(buf) {
		return false, fmt.Errorf("delay: read %s: %w", path, err)
	}
	body := buf[:len(buf)-4]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(buf[len(buf)-4:]) || string(body[:4]) != checkpointMagic ||
		(binary.BigEndian.Uint16(body[4:]) != 1 && binary.BigEndian.Uint16(body[4:]) != 2) {
		return false, fmt.Errorf("%w: its CRC or header does not check out", errBadCheckpoint)
	}
	version := binary.BigEndian.Uint16(body[4:])
	r := cpReader{b: body[8:]}
	if w := r.i64(); w != x.widthMs {
		return false, fmt.Errorf("delay: the checkpoint's bucket width %d ms is not the configured %d ms", w, x.widthMs)
	}
	w, start := r.i64(), r.i64()
	if end := x.l.EndOffset(); w > end {
		return false, fmt.Errorf("%w: it covers the log to %d, the log ends at %d", ErrLogBehind, w, end)
	}
	nq := int(r.u32())
	for i := 0; i < nq && r.ok(); i++ {
		topic := string(r.bytes(int(r.u16())))
		queue := uint32(r.u32())
		next := r.i64()
		id := x.queueID(topic, queue)
		if int(id) != i {
			return false, fmt.Errorf("%w: queue %s/%d twice", errBadCheckpoint, topic, queue)
		}
		x.queues[id].next = next
		if _, lnext := x.l.QueueRange(topic, queue); lnext < next {
			return false, fmt.Errorf("%w: queue %s/%d was followed to %d, the log's ends at %d", ErrLogBehind, topic, queue, next, lnext)
		}
	}
	nb := int(r.u32())
	for i := 0; i < nb && r.ok(); i++ {
		b := x.newBucket(r.i64())
		b.items = r.i64()
		b.written = b.items
		b.minAt, b.maxAt = r.i64(), r.i64()
		nc := int(r.u32())
		for j := 0; j < nc && r.ok(); j++ {
			q, c := uint32(r.u32()), r.i64()
			if int(q) >= len(x.queues) || c < 0 {
				return false, fmt.Errorf("%w: a count of queue %d", errBadCheckpoint, q)
			}
			b.addPending(q, c)
			x.penMu.Lock()
			x.topicPen[x.queues[q].target] += c
			x.total += c
			x.penMu.Unlock()
		}
		if x.buckets[b.id] != nil || b.items < 0 {
			return false, fmt.Errorf("%w: bucket %d", errBadCheckpoint, b.id)
		}
		x.buckets[b.id] = b
		if b.npending > 0 {
			b.inHeap = true
			x.unloaded = append(x.unloaded, b)
		}
	}
	ng := int(r.u32())
	for i := 0; i < ng && r.ok(); i++ {
		g := x.newGroup(r.i64())
		g.items = r.i64()
		g.written = g.items
		g.maxAt = r.i64()
		g.split = true
		if version >= 2 {
			if sb := r.bytes(1); sb != nil {
				g.split = sb[0] == 1
			}
			g.minAt = r.i64()
			nc := int(r.u32())
			for j := 0; j < nc && r.ok(); j++ {
				q, c := uint32(r.u32()), r.i64()
				if int(q) >= len(x.queues) || c < 0 || (g.split && c != 0) {
					return false, fmt.Errorf("%w: a count of queue %d", errBadCheckpoint, q)
				}
				x.count(&g.counts, q, c)
			}
			nf := int(r.u32())
			for j := 0; j < nf && r.ok(); j++ {
				i, c := r.u32(), r.u32()
				if x.farMs == 0 || int64(i) >= x.farMs/x.widthMs || g.split {
					return false, fmt.Errorf("%w: a bucket count of far file %d", errBadCheckpoint, g.id)
				}
				if g.fine == nil {
					g.fine = make([]uint32, x.farMs/x.widthMs)
				}
				g.fine[i] = c
			}
			if !g.split {
				x.nextSplit = min(x.nextSplit, g.id)
			}
		}
		if x.farMs == 0 || x.groups[g.id] != nil || g.items < 0 {
			return false, fmt.Errorf("%w: far file %d", errBadCheckpoint, g.id)
		}
		x.groups[g.id] = g
	}
	if !r.ok() || len(r.b) != 0 {
		return false, fmt.Errorf("%w: its length does not match its contents", errBadCheckpoint)
	}
	for _, g := range x.groups {
		if !g.split && x.anyBucketIn(g.id) {
			return false, fmt.Errorf("%w: far file %d is not split and a bucket of it is", errBadCheckpoint, g.id)
		}
	}
	heapInit(&x.unloaded)
	x.w, x.pos, x.start, x.cpWritten = w, w, start, true
	return true, nil
}

type cpReader struct {
	b   []byte
	bad bool
}

func (r *cpReader) ok() bool { return !r.bad }

func (r *cpReader) bytes(n int) []byte {
	if r.bad || len(r.b) < n {
		r.bad = true
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *cpReader) u16() uint16 {
	if b := r.bytes(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *cpReader) u32() uint32 {
	if b := r.bytes(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *cpReader) i64() int64 {
	if b := r.bytes(8); b != nil {
		return int64(binary.BigEndian.Uint64(b))
	}
	return 0
}
