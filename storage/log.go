package storage

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/storage/vfs"
)

// FlushMode says when an append is complete.
type FlushMode int

const (
	// FlushAsync completes an append once written to the page cache; a
	// flusher syncs every FlushInterval. The default.
	FlushAsync FlushMode = iota
	// FlushSync completes an append only after fdatasync covers it.
	FlushSync
)

func (m FlushMode) String() string {
	if m == FlushSync {
		return "sync"
	}
	return "async"
}

// ParseFlushMode parses "async" or "sync".
func ParseFlushMode(s string) (FlushMode, error) {
	switch s {
	case "async":
		return FlushAsync, nil
	case "sync":
		return FlushSync, nil
	}
	return 0, fmt.Errorf("storage: unknown flush mode %q (want async or sync)", s)
}

// Config configures a Log. Zero fields take their defaults.
type Config struct {
	// Dir holds the segments and the checkpoint. Required.
	Dir string
	// FS is the file system. Default vfs.Default.
	FS vfs.FS
	// SegmentSize is the size at which a new segment starts. Default 1 GiB.
	SegmentSize int64
	// Flush is the flush mode. Default FlushAsync.
	Flush FlushMode
	// FlushInterval is how often FlushAsync syncs. Default 500 ms.
	FlushInterval time.Duration
	// MaxPayloadSize caps one entry's payload. Default 16 MiB.
	MaxPayloadSize int
	// Logger gets recovery and error reports. Default: a null logger.
	Logger hclog.Logger
	// Now is the clock stamped into records. Default time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.FS == nil {
		c.FS = vfs.Default
	}
	if c.SegmentSize <= 0 {
		c.SegmentSize = 1 << 30
	}
	if c.FlushInterval <= 0 {
		c.FlushInterval = 500 * time.Millisecond
	}
	if c.MaxPayloadSize <= 0 {
		c.MaxPayloadSize = defaultMaxPayload
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Entry is one message to append.
type Entry struct {
	Topic   string
	Queue   uint32
	Payload []byte
}

// Position is where an appended entry landed.
type Position struct {
	QueueOffset int64 // the entry's offset in its queue
	LogOffset   int64 // the log offset of its record
	End         int64 // the log offset just past its record
}

// StoredEntry is an entry read back from a queue.
type StoredEntry struct {
	QueueOffset int64
	LogOffset   int64
	StoreTime   int64 // unix milliseconds
	Payload     []byte
}

type queueKey struct {
	topic string
	queue uint32
}

// queueIndex maps the queue offsets of one queue to their records.
type queueIndex struct {
	base int64   // queue offset of pos[0]
	pos  []int64 // log offsets
	size []int32 // record sizes
}

func (q *queueIndex) next() int64 { return q.base + int64(len(q.pos)) }

type segment struct {
	base int64
	name string
	f    vfs.File
	size int64 // bytes written; changed by the writer under Log.mu

	// Readers and the flusher hold a reference while they use the file
	// outside Log.mu; a segment removed by retention is closed by whoever
	// drops the last reference.
	refs      atomic.Int32
	removed   atomic.Bool
	closeOnce sync.Once
}

// acquire takes a reference; Log.mu must be held (read or write) so the
// segment cannot be removed meanwhile.
func (s *segment) acquire() *segment {
	s.refs.Add(1)
	return s
}

func (s *segment) release() {
	if s.refs.Add(-1) == 0 && s.removed.Load() {
		s.close()
	}
}

func (s *segment) close() { s.closeOnce.Do(func() { _ = s.f.Close() }) }

// Log is a segmented commit log. Appends from any goroutine are queued and
// written by one writer goroutine in groups (group commit); a flusher
// goroutine syncs. Reads run alongside and see only whole records that were
// written. All methods are safe for concurrent use.
type Log struct {
	cfg       Config
	fs        vfs.FS
	log       hclog.Logger
	maxRecord int

	// The append queue, fed by Append and drained by the writer.
	qmu     sync.Mutex
	queue   []*appendReq
	closing bool
	wake    chan struct{}

	// mu guards the segment list, the indexes and closed, for readers; only
	// the writer (and Open and Close) change them.
	mu       sync.RWMutex
	segments []*segment
	index    map[queueKey]*queueIndex
	closed   bool

	// Flushes and FlushNanos count the syncs and their total time, for metrics.
	Flushes    atomic.Int64
	FlushNanos atomic.Int64

	end     atomic.Int64 // log offset after the last record written
	flushed atomic.Int64 // log offset up to which the log is synced
	broken  error        // writer-owned: set when a failed write could not be undone

	// Flush waiters, fed by the writer and released by the flusher.
	fmu       sync.Mutex
	waiters   []flushWaiter // in log order
	flushWake chan struct{}

	checkpoint vfs.File
	retainMu   sync.Mutex // serializes DeleteBefore
	// crashed makes Close skip its final sync, as a killed process would
	// (tests only).
	crashed    bool
	writerDone chan struct{}
	stopFlush  chan struct{}
	flushDone  chan struct{}
	buf        []byte // the writer's scratch buffer
}

type appendReq struct {
	entries []Entry
	// raw != nil makes this a raw append of whole records at rawOffset.
	raw       []byte
	rawOffset int64
	flush     bool
	done      func([]Position, error)

	positions []Position
	err       error
	end       int64
}

type flushWaiter struct {
	end int64
	req *appendReq
}

// Open opens (or creates) the log in cfg.Dir, recovering it after a crash.
func Open(cfg Config) (*Log, error) {
	if cfg.Dir == "" {
		return nil, errors.New("storage: Config.Dir is required")
	}
	cfg = cfg.withDefaults()
	l := &Log{
		cfg:        cfg,
		fs:         cfg.FS,
		log:        cfg.Logger,
		maxRecord:  recordSize(maxTopicLen, cfg.MaxPayloadSize),
		wake:       make(chan struct{}, 1),
		index:      make(map[queueKey]*queueIndex),
		flushWake:  make(chan struct{}, 1),
		writerDone: make(chan struct{}),
		stopFlush:  make(chan struct{}),
		flushDone:  make(chan struct{}),
	}
	if err := l.fs.MkdirAll(cfg.Dir); err != nil {
		return nil, fmt.Errorf("storage: create %s: %w", cfg.Dir, err)
	}
	if err := l.recover(); err != nil {
		l.closeFiles()
		return nil, err
	}
	go l.writer()
	go l.flusher()
	return l, nil
}

func (l *Log) segmentPath(base int64) string {
	return filepath.Join(l.cfg.Dir, fmt.Sprintf("%020d.log", base))
}

// EndOffset is the log offset just past the last record written.
func (l *Log) EndOffset() int64 { return l.end.Load() }

// FlushedOffset is the log offset up to which the log is synced to disk.
func (l *Log) FlushedOffset() int64 { return l.flushed.Load() }

// Append appends entries as one group and waits until they are written (and
// synced, in FlushSync mode or when flush is true). It returns each entry's
// position, in order. Either every entry is appended or none is.
func (l *Log) Append(entries []Entry, flush bool) ([]Position, error) {
	type res struct {
		pos []Position
		err error
	}
	ch := make(chan res, 1)
	l.AppendAsync(entries, flush, func(p []Position, err error) { ch <- res{p, err} })
	r := <-ch
	return r.pos, r.err
}

// AppendAsync queues entries as one group and calls done exactly once with
// their positions or an error, when Append would have returned. done runs on
// the log's writer or flusher goroutine: it must be quick and must not call
// back into the log's append methods.
func (l *Log) AppendAsync(entries []Entry, flush bool, done func([]Position, error)) {
	for _, e := range entries {
		if err := l.checkEntry(e); err != nil {
			done(nil, err)
			return
		}
	}
	if len(entries) == 0 {
		done(nil, nil)
		return
	}
	l.enqueue(&appendReq{entries: entries, flush: flush, done: done})
}

func (l *Log) checkEntry(e Entry) error {
	if e.Topic == "" || len(e.Topic) > maxTopicLen {
		return fmt.Errorf("%w: topic must be 1 to %d bytes, got %d", ErrInvalidEntry, maxTopicLen, len(e.Topic))
	}
	if len(e.Payload) > l.cfg.MaxPayloadSize {
		return fmt.Errorf("%w: payload of %d bytes over the cap %d", ErrInvalidEntry, len(e.Payload), l.cfg.MaxPayloadSize)
	}
	return nil
}

// AppendRaw appends whole records copied from another log (a slave copying
// its master): data must start at this log's end offset, hold only whole,
// valid records, and continue every queue's offsets. The log then holds the
// same bytes at the same offsets. It returns the new end offset.
func (l *Log) AppendRaw(offset int64, data []byte, flush bool) (int64, error) {
	if len(data) == 0 {
		return l.end.Load(), nil
	}
	type res struct {
		end int64
		err error
	}
	ch := make(chan res, 1)
	req := &appendReq{raw: data, rawOffset: offset, flush: flush}
	req.done = func(_ []Position, err error) { ch <- res{req.end, err} }
	l.enqueue(req)
	r := <-ch
	return r.end, r.err
}

func (l *Log) enqueue(req *appendReq) {
	l.qmu.Lock()
	if l.closing {
		l.qmu.Unlock()
		req.done(nil, ErrClosed)
		return
	}
	l.queue = append(l.queue, req)
	l.qmu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// writer takes every queued append and writes it as one group, until Close.
func (l *Log) writer() {
	defer close(l.writerDone)
	var batch []*appendReq
	for range l.wake {
		for {
			// Let appenders that are already runnable join this group: one
			// larger write costs far less than several small ones.
			runtime.Gosched()
			l.qmu.Lock()
			batch, l.queue = l.queue, batch[:0]
			closing := l.closing
			l.qmu.Unlock()
			if len(batch) == 0 {
				if closing {
					return
				}
				break
			}
			l.writeGroup(batch)
			clear(batch)
		}
	}
}

// chunk is a run of bytes written to one segment in a group.
type chunk struct {
	seg   *segment // nil: a new segment starting at base
	base  int64
	start int64 // offset in the segment where buf goes
	buf   []byte
}

// writeGroup writes a group of appends. The group is all or nothing on disk:
// if a write fails, every touched segment is cut back and new segments are
// removed, and every append of the group fails.
func (l *Log) writeGroup(batch []*appendReq) {
	if l.broken != nil {
		for _, r := range batch {
			r.done(nil, l.broken)
		}
		return
	}
	now := l.cfg.Now().UnixMilli()
	// Placement reads the segments and the indexes, which only this goroutine
	// grows but DeleteBefore may trim: hold the read lock until it is done.
	l.mu.RLock()
	active := l.segments[len(l.segments)-1]
	pos := l.end.Load()
	chunks := []chunk{{seg: active, base: active.base, start: active.size, buf: l.buf[:0]}}
	next := make(map[queueKey]int64) // tentative next queue offsets in this group
	nextOffset := func(k queueKey) int64 {
		if n, ok := next[k]; ok {
			return n
		}
		if qi := l.index[k]; qi != nil {
			return qi.next()
		}
		return 0
	}
	// place makes room for a record of n bytes, rolling to a new segment if
	// the current one would pass SegmentSize (a record never spans two).
	place := func(n int) *chunk {
		c := &chunks[len(chunks)-1]
		if used := c.start + int64(len(c.buf)); used > 0 && used+int64(n) > l.cfg.SegmentSize {
			chunks = append(chunks, chunk{base: pos})
			c = &chunks[len(chunks)-1]
		}
		return c
	}
	var ok []*appendReq
	for _, r := range batch {
		if r.raw != nil {
			if err := l.placeRaw(r, &pos, nextOffset, next, place); err != nil {
				r.err = err
				continue
			}
			ok = append(ok, r)
			continue
		}
		r.positions = make([]Position, len(r.entries))
		for i, e := range r.entries {
			k := queueKey{e.Topic, e.Queue}
			qo := nextOffset(k)
			size := recordSize(len(e.Topic), len(e.Payload))
			c := place(size)
			c.buf = appendRecord(c.buf, e.Topic, e.Queue, qo, now, e.Payload)
			r.positions[i] = Position{QueueOffset: qo, LogOffset: pos, End: pos + int64(size)}
			next[k] = qo + 1
			pos += int64(size)
		}
		r.end = pos
		ok = append(ok, r)
	}
	l.mu.RUnlock()
	if cap(chunks[0].buf) <= 64<<20 {
		l.buf = chunks[0].buf[:0] // keep the scratch buffer unless a burst made it huge
	}

	if err := l.writeChunks(chunks); err != nil {
		for _, r := range ok {
			r.err = err
		}
		ok = nil
	}
	if len(ok) > 0 {
		l.publish(chunks, ok)
	}
	for _, r := range batch {
		if r.err != nil {
			r.done(nil, r.err)
		}
	}
	l.complete(ok)
}

// placeRaw checks a raw append record by record and places its bytes.
func (l *Log) placeRaw(r *appendReq, pos *int64, nextOffset func(queueKey) int64, next map[queueKey]int64, place func(int) *chunk) error {
	if r.rawOffset != *pos {
		return fmt.Errorf("%w: data starts at %d but the log ends at %d", ErrOffsetMismatch, r.rawOffset, *pos)
	}
	// Validate everything before placing anything, so a bad record leaves no trace.
	local := make(map[queueKey]int64)
	var sizes []int
	for b := r.raw; len(b) > 0; {
		n, err := recordLen(b, l.maxRecord)
		if err == nil && n > len(b) {
			err = errors.New("truncated record")
		}
		if err != nil {
			return fmt.Errorf("%w: raw record at %d: %w", ErrCorrupt, *pos+int64(len(r.raw)-len(b)), err)
		}
		rec, err := decodeRecord(b[:n])
		if err != nil {
			return fmt.Errorf("%w: raw record at %d: %w", ErrCorrupt, *pos+int64(len(r.raw)-len(b)), err)
		}
		k := queueKey{rec.Topic, rec.Queue}
		want, seen := local[k]
		if !seen {
			want = nextOffset(k)
		}
		if rec.QueueOffset != want {
			return fmt.Errorf("%w: record at %d has queue offset %d for %s/%d, want %d",
				ErrOffsetMismatch, *pos+int64(len(r.raw)-len(b)), rec.QueueOffset, rec.Topic, rec.Queue, want)
		}
		local[k] = want + 1
		sizes = append(sizes, n)
		b = b[n:]
	}
	from := 0
	for _, n := range sizes {
		c := place(n)
		c.buf = append(c.buf, r.raw[from:from+n]...)
		from += n
		*pos += int64(n)
	}
	for k, v := range local {
		next[k] = v
	}
	r.end = *pos
	return nil
}

// writeChunks writes a group's chunks, creating new segments as needed. On
// failure it undoes everything it did.
func (l *Log) writeChunks(chunks []chunk) error {
	var created []*segment
	undo := func(cause error) error {
		for _, s := range created {
			_ = s.f.Close()
			_ = l.fs.Remove(s.name)
		}
		first := chunks[0]
		if err := first.seg.f.Truncate(first.start); err != nil {
			l.broken = fmt.Errorf("%w: truncate %s after a failed write: %w (write: %w)", ErrBroken, first.seg.name, err, cause)
			l.log.Error("log broken", "error", l.broken)
			return l.broken
		}
		return cause
	}
	for i := range chunks {
		c := &chunks[i]
		if c.seg == nil {
			s, err := l.createSegment(c.base)
			if err != nil {
				return undo(err)
			}
			created = append(created, s)
			c.seg = s
		}
		if len(c.buf) == 0 {
			continue
		}
		if _, err := c.seg.f.WriteAt(c.buf, c.start); err != nil {
			l.log.Warn("commit log write failed", "segment", c.seg.name, "bytes", len(c.buf), "error", err)
			return undo(fmt.Errorf("storage: write %s: %w", c.seg.name, err))
		}
	}
	return nil
}

func (l *Log) createSegment(base int64) (*segment, error) {
	name := l.segmentPath(base)
	f, err := l.fs.Create(name)
	if err != nil {
		return nil, fmt.Errorf("storage: create segment %s: %w", name, err)
	}
	if err := l.fs.SyncDir(l.cfg.Dir); err != nil {
		_ = f.Close()
		_ = l.fs.Remove(name)
		return nil, fmt.Errorf("storage: sync dir %s: %w", l.cfg.Dir, err)
	}
	return &segment{base: base, name: name, f: f}, nil
}

// publish makes a written group visible to readers: new segments, sizes,
// index entries and the end offset.
func (l *Log) publish(chunks []chunk, ok []*appendReq) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range chunks {
		c := &chunks[i]
		if c.seg != l.segments[len(l.segments)-1] {
			l.segments = append(l.segments, c.seg)
		}
		c.seg.size = c.start + int64(len(c.buf))
	}
	for _, r := range ok {
		if r.raw != nil {
			l.indexRaw(r.raw, r.rawOffset)
			continue
		}
		for i, e := range r.entries {
			p := r.positions[i]
			l.indexAdd(queueKey{e.Topic, e.Queue}, p.QueueOffset, p.LogOffset, int32(p.End-p.LogOffset))
		}
	}
	l.end.Store(ok[len(ok)-1].end) // appends are placed in order: the last ends the group
}

func (l *Log) indexRaw(raw []byte, at int64) {
	for len(raw) > 0 {
		n, _ := recordLen(raw, l.maxRecord)
		rec, _ := decodeRecord(raw[:n]) // validated by placeRaw
		l.indexAdd(queueKey{rec.Topic, rec.Queue}, rec.QueueOffset, at, int32(n))
		at += int64(n)
		raw = raw[n:]
	}
}

// indexAdd records one record; l.mu is held (or the log is not yet shared).
func (l *Log) indexAdd(k queueKey, queueOffset, logOffset int64, size int32) {
	qi := l.index[k]
	if qi == nil {
		qi = &queueIndex{base: queueOffset}
		l.index[k] = qi
	}
	qi.pos = append(qi.pos, logOffset)
	qi.size = append(qi.size, size)
}

// complete finishes written appends: at once, or after the flush that covers
// them.
func (l *Log) complete(ok []*appendReq) {
	var wait bool
	for _, r := range ok {
		if l.cfg.Flush == FlushSync || r.flush {
			wait = true
			break
		}
	}
	if !wait {
		for _, r := range ok {
			r.done(r.positions, nil)
		}
		return
	}
	l.fmu.Lock()
	var now []*appendReq
	for _, r := range ok {
		if l.cfg.Flush == FlushSync || r.flush {
			l.waiters = append(l.waiters, flushWaiter{end: r.end, req: r})
		} else {
			now = append(now, r)
		}
	}
	l.fmu.Unlock()
	select {
	case l.flushWake <- struct{}{}:
	default:
	}
	for _, r := range now {
		r.done(r.positions, nil)
	}
}

// Flush syncs everything written so far and returns when it is durable.
func (l *Log) Flush() error {
	ch := make(chan error, 1)
	req := &appendReq{done: func(_ []Position, err error) { ch <- err }}
	l.fmu.Lock()
	req.end = l.end.Load()
	l.waiters = append(l.waiters, flushWaiter{end: req.end, req: req})
	l.fmu.Unlock()
	select {
	case l.flushWake <- struct{}{}:
	default:
	}
	return <-ch
}

// flusher syncs on demand (flush waiters) and every FlushInterval, and once
// more when the log closes.
func (l *Log) flusher() {
	defer close(l.flushDone)
	tick := time.NewTicker(l.cfg.FlushInterval)
	defer tick.Stop()
	for {
		select {
		case <-l.flushWake:
		case <-tick.C:
		case <-l.stopFlush:
			if !l.crashed {
				l.syncOnce()
			}
			l.fmu.Lock()
			rest := l.waiters
			l.waiters = nil
			l.fmu.Unlock()
			for _, w := range rest {
				w.req.done(nil, ErrClosed)
			}
			return
		}
		l.syncOnce()
	}
}

// syncOnce syncs every segment holding unsynced bytes, advances the flushed
// offset and the checkpoint, and releases the waiters it covers.
func (l *Log) syncOnce() {
	target := l.end.Load()
	var err error
	if target > l.flushed.Load() {
		start := time.Now()
		err = l.syncSegments(l.flushed.Load())
		l.Flushes.Add(1)
		l.FlushNanos.Add(int64(time.Since(start)))
		if err == nil {
			l.flushed.Store(target)
			l.writeCheckpoint(target)
		} else {
			l.log.Warn("commit log sync failed", "error", err)
		}
	}
	flushed := l.flushed.Load()
	l.fmu.Lock()
	i := 0
	for i < len(l.waiters) && l.waiters[i].end <= target {
		i++
	}
	done := make([]flushWaiter, i)
	copy(done, l.waiters[:i])
	l.waiters = append(l.waiters[:0], l.waiters[i:]...)
	l.fmu.Unlock()
	for _, w := range done {
		switch {
		case w.end <= flushed:
			w.req.done(w.req.positions, nil)
		default:
			w.req.done(nil, fmt.Errorf("storage: flush: %w", err))
		}
	}
}

// syncSegments syncs every segment from the one holding from to the last.
func (l *Log) syncSegments(from int64) error {
	l.mu.RLock()
	var segs []*segment
	for i, s := range l.segments {
		if i == len(l.segments)-1 || l.segments[i+1].base > from {
			segs = append(segs, s.acquire())
		}
	}
	l.mu.RUnlock()
	defer func() {
		for _, s := range segs {
			s.release()
		}
	}()
	for _, s := range segs {
		if err := s.f.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", s.name, err)
		}
	}
	return nil
}

// Close writes every queued append, syncs, writes the checkpoint and closes
// the files. Appends after Close fail with ErrClosed.
func (l *Log) Close() error {
	l.qmu.Lock()
	if l.closing {
		l.qmu.Unlock()
		return nil
	}
	l.closing = true
	l.qmu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	<-l.writerDone
	close(l.stopFlush)
	<-l.flushDone
	var err error
	if l.flushed.Load() < l.end.Load() {
		err = errors.New("storage: close: the final sync failed; unsynced records may be lost in a machine crash")
	}
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	if cerr := l.closeFiles(); err == nil {
		err = cerr
	}
	return err
}

func (l *Log) closeFiles() error {
	var errs []error
	for _, s := range l.segments {
		s.closeOnce.Do(func() { errs = append(errs, s.f.Close()) })
	}
	if l.checkpoint != nil {
		errs = append(errs, l.checkpoint.Close())
	}
	return errors.Join(errs...)
}

// segmentFor returns the segment holding log offset off and where that
// segment's readable bytes end (as a log offset). l.mu is held.
func (l *Log) segmentFor(off int64) (*segment, int64, bool) {
	i := sort.Search(len(l.segments), func(i int) bool { return l.segments[i].base > off }) - 1
	if i < 0 {
		return nil, 0, false
	}
	s := l.segments[i]
	return s, s.base + s.size, true
}
