package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/ferrymq/ferrymq/storage/vfs"
)

// indexCut is a range of the log whose index entries go to one chunk file,
// with the deduplication state as of its end. The writer cuts; the indexer
// goroutine writes the chunk once the log is synced past the cut's end.
type indexCut struct {
	from, to int64
	last     chunkLast
	snap     []byte
}

// maybeCut cuts the index at the log's end once the entries since the last
// cut cover IndexChunkBytes of log (or, with force, if there are any). It
// runs on the writer goroutine between groups (or during recovery, or in
// Close after the writer stopped), with l.mu held if the log is shared.
func (l *Log) maybeCut(force bool) {
	if last, due := l.cutDue(force); due {
		l.cut(last)
	}
}

// cutDue reports whether the index is due for a cut at the log's end, and
// identifies the record that ends it; l.mu is held (or the log not shared).
func (l *Log) cutDue(force bool) (chunkLast, bool) {
	end := l.end.Load()
	if end <= l.cutFrom || (!force && end-l.cutFrom < l.cfg.IndexChunkBytes) {
		return chunkLast{}, false
	}
	last, err := l.lastRecord(end)
	if err != nil {
		l.log.Warn("cannot cut the index", "offset", end, "error", err)
		return chunkLast{}, false
	}
	return last, true
}

// cut cuts the index at the log's end, whose last record is last; on the
// writer (which owns the producer table), with or without l.mu.
func (l *Log) cut(last chunkLast) {
	l.addCut(indexCut{from: l.cutFrom, to: l.end.Load(), last: last, snap: l.prod.encodeSnapshot()})
}

// addCut queues a cut and wakes the indexer.
func (l *Log) addCut(c indexCut) {
	l.cutMu.Lock()
	l.cuts = append(l.cuts, c)
	l.cutMu.Unlock()
	l.cutFrom = c.to
	l.wakeIndexer()
}

func (l *Log) wakeIndexer() {
	select {
	case l.idxWake <- struct{}{}:
	default:
	}
}

// lastRecord identifies the record that ends at end (l.lastAt): l.mu is
// held or the log not shared.
func (l *Log) lastRecord(end int64) (chunkLast, error) {
	seg, _, ok := l.segmentFor(l.lastAt)
	if !ok || l.lastAt < 0 {
		return chunkLast{}, fmt.Errorf("no record before log offset %d", end)
	}
	var h [recordHeaderSize]byte
	if _, err := seg.f.ReadAt(h[:], l.lastAt-seg.base); err != nil {
		return chunkLast{}, err
	}
	if l.lastAt+recordHeaderSize+int64(binary.BigEndian.Uint32(h[:])) != end {
		return chunkLast{}, fmt.Errorf("the record at %d does not end at %d", l.lastAt, end)
	}
	return chunkLast{at: l.lastAt, crc: binary.BigEndian.Uint32(h[4:])}, nil
}

// indexer writes the index chunks the writer cuts, each once the log is
// synced past its end (the flusher wakes it), until Close.
func (l *Log) indexer() {
	defer close(l.idxDone)
	for {
		select {
		case <-l.idxWake:
			l.writeCuts()
			if l.rebuildKeyTable() {
				l.wakeIndexer() // the next one after the next turn's cuts
			}
		case <-l.stopIdx:
			if !l.crashed {
				l.writeCuts()
			}
			return
		}
	}
}

// writeCuts writes the pending cuts that the log's sync covers, in order.
// A chunk that cannot be written stays pending (its entries stay in
// memory) and is tried again at the next wake.
func (l *Log) writeCuts() {
	for {
		l.cutMu.Lock()
		if len(l.cuts) == 0 {
			l.cutMu.Unlock()
			return
		}
		c := l.cuts[0]
		l.cutMu.Unlock()
		if c.to > l.flushed.Load() {
			return
		}
		if err := l.writeChunk(c); err != nil {
			if !l.idxFailing {
				l.log.Warn("index chunk write failed; its entries stay in memory and it is retried after the next sync", "from", c.from, "to", c.to, "error", err)
			}
			l.idxFailing = true
			return
		}
		if l.idxFailing {
			l.log.Info("index chunk writes work again", "from", c.from, "to", c.to)
			l.idxFailing = false
		}
	}
}

// writeChunk writes the key table and the chunk of cut c, then moves its
// entries from the queues' tails to parts that read the file, and its key
// refs out of memory.
func (l *Log) writeChunk(c indexCut) error {
	l.idxMu.Lock()
	defer l.idxMu.Unlock()
	l.cutMu.Lock()
	current := len(l.cuts) > 0 && l.cuts[0].from == c.from && l.cuts[0].to == c.to
	if current {
		c = l.cuts[0]
	}
	l.cutMu.Unlock()
	if !current || c.to > l.flushed.Load() && l.scanLimit < c.to { // dropped or moved back by a truncation meanwhile
		return nil
	}

	// The tails hold the cut's entries as their prefixes (cuts are written
	// in order, and Truncate and DeleteBefore wait for idxMu). Slices are
	// never changed below their length, so they are read unlocked.
	var qs []chunkQueue
	l.mu.RLock()
	for k, qi := range l.index {
		n := sort.Search(len(qi.pos), func(i int) bool { return qi.pos[i] >= c.to })
		if n > 0 {
			qs = append(qs, chunkQueue{k: k, firstQO: qi.base, pos: qi.pos[:n], size: qi.size[:n], fp: qi.fp[:n]})
		}
	}
	refs := l.keys.below(c.to)
	l.mu.RUnlock()
	b := encodeIndexChunk(c.from, c.to, c.last, qs, c.snap) // sorts qs as the file lists them

	if !l.idxDirMade {
		// Once per Log: the directory and its place in the log directory
		// survive a power loss before a chunk counts.
		if err := vfs.MkdirAllDurable(l.fs, filepath.Join(l.cfg.Dir, indexDirName)); err != nil {
			return err
		}
		l.idxDirMade = true
	}
	// The key table goes first: a chunk that counts has one (unless it
	// is lost or damaged later: then lookups scan and the indexer rebuilds
	// it).
	var kt *keyTable
	if l.cfg.LookupKeys != nil {
		var err error
		if kt, err = l.writeKeyTable(c.from, c.to, c.last, refs); err != nil {
			return err
		}
	}
	name := indexChunkName(l.cfg.Dir, c.from)
	if err := l.writeFileAtomic(name, b); err != nil {
		return err
	}
	oc, err := readIndexChunk(l.fs, name) // what a later Open will read
	if err != nil {
		return fmt.Errorf("storage: index chunk %s reads back wrong: %w", name, err)
	}
	ic := oc.c
	ic.files = &l.openChunks
	if kt != nil {
		ic.keys.Store(kt)
	}

	l.mu.Lock()
	for i, q := range qs {
		qi := l.index[q.k]
		n := int64(len(q.pos))
		qi.parts = append(qi.parts, indexPart{c: ic, firstQO: q.firstQO, count: n, at: oc.dir[i].at})
		qi.base += n
		qi.pos = slices.Clone(qi.pos[n:])
		qi.size = slices.Clone(qi.size[n:])
		qi.fp = slices.Clone(qi.fp[n:])
	}
	l.chunks = append(l.chunks, ic)
	l.keys.dropBelow(c.to)
	l.mu.Unlock()

	l.cutMu.Lock()
	l.cuts = slices.Delete(l.cuts, 0, 1)
	l.cutMu.Unlock()
	return nil
}

// writeFileAtomic writes b to a file under a temporary name, syncs it,
// renames it into place and syncs its directory: it appears whole or not at
// all.
func (l *Log) writeFileAtomic(name string, b []byte) error {
	return l.writeFileAtomicFunc(name, func(f vfs.File) error {
		_, err := f.WriteAt(b, 0)
		return err
	})
}

// writeFileAtomicFunc is writeFileAtomic with write filling the file.
func (l *Log) writeFileAtomicFunc(name string, write func(f vfs.File) error) error {
	tmp := name + ".tmp"
	if err := l.fs.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	f, err := l.fs.Create(tmp)
	if err != nil {
		return err
	}
	err = write(f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = l.fs.Rename(tmp, name)
	}
	if err != nil {
		_ = l.fs.Remove(tmp)
		return err
	}
	return l.fs.SyncDir(filepath.Dir(name))
}

// removeChunks deletes the files of chunks and of their key tables, and
// syncs their directory. The files are opened first, so that readers
// holding the index that refers to them can still read them (a key table
// that cannot be opened is scanned instead).
func (l *Log) removeChunks(chunks []*indexChunk) error {
	if len(chunks) == 0 {
		return nil
	}
	var b [1]byte
	for _, c := range chunks {
		if err := c.readAt(b[:], 0); err != nil {
			return err
		}
		if kt := c.keys.Load(); kt != nil {
			_ = kt.f.readAt(b[:], 0)
		}
	}
	for _, c := range chunks {
		for _, name := range []string{c.name, keyTableName(l.cfg.Dir, c.from)} {
			if err := l.fs.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("storage: remove index chunk: %w", err)
			}
		}
	}
	return l.fs.SyncDir(filepath.Join(l.cfg.Dir, indexDirName))
}

// loadChunks reads the index chunk files and keeps the chain that recovery
// may trust: chunks that follow each other from the log's start, each
// ending at or before limit (the checkpoint: synced records), the last one
// ending on a record the log still holds. It removes the files of the
// others. It builds the queues' parts and the deduplication state as of
// the chain's end, which it returns (the log's start if the chain is
// empty). The segments are open; l is not yet shared.
func (l *Log) loadChunks(limit int64) (int64, error) {
	start := int64(0)
	if len(l.segments) == 0 {
		limit = -1 // no log: every chunk is stale
	} else {
		start = l.segments[0].base
	}
	physEnd := start
	for i, s := range l.segments {
		if s.base != physEnd {
			limit = min(limit, physEnd) // a chain stops where the segments do not follow each other
			break
		}
		physEnd = s.base + s.size
		if i == len(l.segments)-1 {
			limit = min(limit, physEnd)
		}
	}
	dir := filepath.Join(l.cfg.Dir, indexDirName)
	names, err := l.fs.List(dir)
	if errors.Is(err, os.ErrNotExist) {
		return start, nil
	}
	if err != nil {
		return 0, fmt.Errorf("storage: list %s: %w", dir, err)
	}
	var all []*openedChunk
	var stale []string
	for _, n := range names {
		from, ok := parseIndexChunkName(n)
		if !ok {
			if n != "" && filepath.Ext(n) == ".tmp" {
				stale = append(stale, filepath.Join(dir, n))
			}
			continue
		}
		oc, err := readIndexChunk(l.fs, filepath.Join(dir, n))
		if err != nil && !errors.Is(err, errBadChunk) {
			// A read error is not a bad chunk: Open fails rather than drop
			// (and later rebuild) the index on a passing I/O error.
			return 0, fmt.Errorf("storage: read index chunk: %w", err)
		}
		if err != nil || oc.c.from != from {
			l.log.Warn("ignoring an index chunk", "file", filepath.Join(dir, n), "error", err)
			stale = append(stale, filepath.Join(dir, n))
			continue
		}
		all = append(all, oc)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].c.from < all[j].c.from })

	var chain []*openedChunk
	for _, oc := range all {
		c := oc.c
		follows := len(chain) == 0 && c.from <= start && start < c.to && limit >= 0 ||
			len(chain) > 0 && c.from == chain[len(chain)-1].c.to
		if follows && c.to <= limit {
			chain = append(chain, oc)
		} else {
			stale = append(stale, c.name)
		}
	}
	// Queue offsets must continue from chunk to chunk; the last chunk must
	// end on the record it names, and its snapshot must read.
	for len(chain) > 0 {
		n, why, err := l.chainBreak(chain)
		if err != nil {
			for _, oc := range chain {
				oc.c.close()
			}
			return 0, err
		}
		if n < len(chain) {
			l.log.Warn("ignoring index chunks that do not follow the log", "from", chain[n].c.name, "reason", why)
			for _, oc := range chain[n:] {
				oc.c.close()
				stale = append(stale, oc.c.name)
			}
			chain = chain[:n]
			continue
		}
		break
	}
	for _, name := range stale {
		if err := l.fs.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("storage: remove stale index chunk: %w", err)
		}
	}
	if len(stale) > 0 {
		if err := l.fs.SyncDir(dir); err != nil {
			return 0, fmt.Errorf("storage: sync %s: %w", dir, err)
		}
	}
	l.loadKeyTables(dir, names, chain)
	if len(chain) == 0 {
		return start, nil
	}
	for _, oc := range chain {
		for _, e := range oc.dir {
			qi := l.index[e.k]
			if qi == nil {
				qi = &queueIndex{first: e.firstQO, base: e.firstQO}
				l.index[e.k] = qi
			}
			qi.parts = append(qi.parts, indexPart{c: oc.c, firstQO: e.firstQO, count: e.count, at: e.at})
			qi.base += e.count
		}
		oc.c.files = &l.openChunks
		l.chunks = append(l.chunks, oc.c)
	}
	last := chain[len(chain)-1]
	l.lastAt = last.c.last.at
	l.prod.forgetBefore(func(k queueKey) int64 { return l.firstAt(k, start) })
	return last.c.to, nil
}

// loadKeyTables gives the chunks of the chain their key tables, and
// removes the key tables of no chunk of it and those that do not check
// out. Neither a missing key table nor one that cannot be read fails Open:
// lookups scan the chunk's records, and the indexer rebuilds it.
func (l *Log) loadKeyTables(dir string, names []string, chain []*openedChunk) {
	byFrom := make(map[int64]*indexChunk, len(chain))
	for _, oc := range chain {
		byFrom[oc.c.from] = oc.c
	}
	removed := false
	for _, n := range names {
		from, ok := parseChunkFileName(n, keysFileSuffix)
		if !ok {
			continue
		}
		name := filepath.Join(dir, n)
		if c := byFrom[from]; c != nil {
			kt, err := readKeyTable(l.fs, name, c.from, c.to, c.last)
			if err == nil {
				kt.f.files = &l.openChunks
				c.keys.Store(kt)
				continue
			}
			l.log.Warn("ignoring a key table; lookups scan its chunk until it is rebuilt", "file", name, "error", err)
			if !errors.Is(err, errBadChunk) {
				continue
			}
		}
		if err := l.fs.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
			l.log.Warn("cannot remove a stale key table", "file", name, "error", err)
		}
		removed = true
	}
	if removed {
		if err := l.fs.SyncDir(dir); err != nil {
			l.log.Warn("cannot sync the index directory", "dir", dir, "error", err)
		}
	}
}

// firstAt is the first queue offset of queue k at or past log offset
// start, as far as the index knows it (math.MaxInt64 for a queue it does
// not list). A chunk that cannot be read counts as holding nothing: the
// reader of its entries will report it.
func (l *Log) firstAt(k queueKey, start int64) int64 {
	qi := l.index[k]
	if qi == nil {
		return math.MaxInt64
	}
	f, err := qi.offsetAt(start)
	if err != nil {
		return qi.lowest()
	}
	return f
}

// chainBreak returns the length of the longest prefix of chain that the
// log can trust, and why the rest cannot be; an error if a file could not
// be read.
func (l *Log) chainBreak(chain []*openedChunk) (int, string, error) {
	next := map[queueKey]int64{}
	for i, oc := range chain {
		for _, e := range oc.dir {
			if n, ok := next[e.k]; ok && n != e.firstQO {
				return i, fmt.Sprintf("%s/%d starts at queue offset %d, want %d", e.k.topic, e.k.queue, e.firstQO, n), nil
			}
			next[e.k] = e.firstQO + e.count
		}
	}
	n := len(chain)
	last := chain[n-1]
	seg, segEnd, ok := l.segmentFor(last.c.last.at)
	if !ok || last.c.last.at+recordHeaderSize > segEnd {
		return n - 1, "its last record is not in the log", nil
	}
	var h [recordHeaderSize]byte
	if _, err := seg.f.ReadAt(h[:], last.c.last.at-seg.base); err != nil {
		return 0, "", fmt.Errorf("storage: read %s at %d: %w", seg.name, last.c.last.at-seg.base, err)
	}
	if last.c.last.at+recordHeaderSize+int64(binary.BigEndian.Uint32(h[:])) != last.c.to || binary.BigEndian.Uint32(h[4:]) != last.c.last.crc {
		return n - 1, "its last record is not the log's", nil
	}
	if err := last.c.readSnapshot(&l.prod); err != nil {
		if !errors.Is(err, errBadChunk) {
			return 0, "", err
		}
		return n - 1, err.Error(), nil
	}
	return n, "", nil
}

// IndexStats describes the index: what is on disk and what is in memory.
type IndexStats struct {
	// IndexedOffset is the log offset up to which the index is in chunk
	// files: Open reads only the log after it.
	IndexedOffset int64
	Chunks        int   // index chunk files
	Parts         int   // (queue, chunk) pairs held in memory, about 56 bytes each
	TailEntries   int64 // entries held in memory, 16 bytes each
	PendingCuts   int   // chunks cut but not yet written
	KeyTables     int   // chunks with a key table that checks out so far
	KeyRefs       int64 // key refs held in memory (of the records past the last chunk written), 24 bytes each
}

// IndexStats returns the index's figures.
func (l *Log) IndexStats() IndexStats {
	l.mu.RLock()
	s := IndexStats{Chunks: len(l.chunks), IndexedOffset: l.segments[0].base}
	if len(l.chunks) > 0 {
		s.IndexedOffset = l.chunks[len(l.chunks)-1].to
	}
	for _, qi := range l.index {
		s.Parts += len(qi.parts)
		s.TailEntries += int64(len(qi.pos))
	}
	for _, c := range l.chunks {
		if kt := c.keys.Load(); kt != nil && !kt.bad.Load() {
			s.KeyTables++
		}
	}
	s.KeyRefs = int64(l.keys.n)
	l.mu.RUnlock()
	l.cutMu.Lock()
	s.PendingCuts = len(l.cuts)
	l.cutMu.Unlock()
	return s
}
