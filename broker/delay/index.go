package delay

import (
	"container/heap"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
	"github.com/ferrymq/ferrymq/storage/vfs"
)

var (
	// ErrClosed is returned by calls on a closed index.
	ErrClosed = errors.New("delay: the index is closed")
	// ErrCorrupt marks a bucket file item that does not check out.
	ErrCorrupt = errors.New("delay: corrupt bucket file")
	// ErrLogBehind is returned by Follow when the log no longer holds what
	// the index followed (it was truncated): the caller calls Reset.
	ErrLogBehind = errors.New("delay: the log was cut behind the index; Reset it")
)

// Config configures an Index.
type Config struct {
	Log *storage.Log // the log it follows (required)
	Dir string       // its own directory (required), for example <log dir>/delay
	FS  vfs.FS       // default vfs.Default
	Now func() time.Time
	// BucketWidth is the due-time width of one bucket file. Default 10 s.
	BucketWidth time.Duration
	// Window: entries due before now+Window are held in memory (their
	// buckets are loaded). Default 30 s.
	Window time.Duration
	// MaxLoaded caps the entries held in memory: a bucket is loaded only
	// while the loaded entries stay under it (the earliest bucket is always
	// loaded, whatever its size). Default 1 << 20.
	MaxLoaded int
	// CheckpointEvery is how often Follow writes the checkpoint. Default
	// 1 s. A checkpoint that took long (it syncs every bucket file written
	// since the last, and writes every bucket's counts) holds the next off
	// for 20 times as long, so checkpoints cost at most about 5% of the
	// time.
	CheckpointEvery time.Duration
	Logger          hclog.Logger
}

// Entry is one pending delayed message.
type Entry struct {
	At    int64  // its record's log offset (the handle's offset)
	Size  int    // its record's size
	DueAt int64  // unix milliseconds
	Topic string // the target topic (the delay topic without its prefix)
	Queue uint32
}

// State is what the index knows of one entry.
type State struct {
	Kind StateKind
	// MarkAt is the log offset of the release or cancel mark; for a
	// release, ReleasedAt (= MarkAt - ReleasedSize) is the released record.
	MarkAt, ReleasedAt int64
	MovedTo            int64 // for StateMoved: the entry that replaced it
}

// StateKind says what became of an entry.
type StateKind uint8

const (
	StateUnknown   StateKind = iota // no such entry in the index (not a delay record, or before the log's start)
	StatePending                    // waiting (or claimed, see Claim)
	StateReleased                   // a release mark follows it
	StateCancelled                  // a cancel mark follows it
	StateMoved                      // retention moved it (MovedTo)
)

// Bucket is the pending count of one span of due time (see Buckets).
type Bucket struct {
	Start   int64 // unix milliseconds
	Pending int64
}

// Stats for metrics.
type Stats struct {
	Pending, Loaded int64
	Buckets         int
	Followed        int64 // W: the log offset the checkpoint covers
}

// farSpan is the span of due time of a far file (see group).
const farSpan = time.Hour

// stepBytes bounds the log range one step of a follow reads, and so the
// records it holds at once: 4 MiB of 100-byte messages is about 25k
// records (a variable for tests).
var stepBytes int64 = 4 << 20

// keepRecs is the most records whose buffers a follow keeps for the next
// step (a busy master's every step fills them; dropped, they made most of
// the garbage a follow left).
const keepRecs = 1 << 15

// maxBuffered bounds the items a follow buffers in memory before it
// writes them to their bucket files (it writes them at every checkpoint
// anyway): one write per bucket per checkpoint rather than per follow.
const maxBuffered = 4 << 20

// readBytes is how much one queue read asks for.
const readBytes = 256 << 10

// cacheBuckets is how many buckets outside the window stay materialized
// after a lookup (Claim, State, a mark that resolves one of their entries).
const cacheBuckets = 4

// queueState is one delay queue the index follows.
type queueState struct {
	topic  string // the delay topic
	target string
	queue  uint32
	next   int64 // the next queue offset to read
}

type queueKey struct {
	topic string
	queue uint32
}

// An Index is a broker's timer index. See the package documentation.
type Index struct {
	cfg     Config
	l       *storage.Log
	fs      vfs.FS
	logger  hclog.Logger
	widthMs int64

	mu        sync.Mutex
	closed    bool
	broken    error // a follow failed half-way: only Reset helps
	queues    []*queueState
	qids      map[queueKey]uint32
	pos       int64 // every delay record before it is applied
	w         int64 // the checkpoint's offset
	start     int64 // the log's start as the index applied it
	buckets   map[int64]*bucket
	groups    map[int64]*group // far files by number (start / farMs)
	farMs     int64            // the span of a far file; 0: none
	nextSplit int64            // at or below the number of every group not split (math.MaxInt64: none)
	nowMs     int64            // the time of the follow in progress
	unloaded  bucketHeap       // buckets not materialized (lazily: check on pop)
	mat       []int64          // ids of the materialized buckets, ascending
	matEnts   int64            // entries held by materialized buckets
	penMu     sync.Mutex       // guards topicPen and total (Pending never waits on mu)
	topicPen  map[string]int64
	penDelta  []int64 // by queue number: changes not yet in topicPen (see publishPending)
	total     int64
	claims    map[int64]*ent
	journal   journal // what the records since W did, for a checkpoint at an earlier offset
	spareBuf  []byte  // a buffer for the items of the next store to buffer some (see flushBuf)
	cpAdded   int64   // journal.added at the last checkpoint
	trimmed   int64   // the journal holds every effect at or past it: no checkpoint below it
	rbuf      []byte  // the buffer of the log reads
	cpBuf     []byte  // for a checkpoint's bytes (their records live only while read)
	lastCP    time.Time
	cpTook    time.Duration // how long the last checkpoint took (real time)
	cpBusy    chan struct{} // closed when the checkpoint in flight is written; nil: none
	useTick   int64
	files     map[int64]*openFile
	fileUse   int64
	touched   []*store // files with buffered items (maybe written since)
	bufBytes  int      // about the bytes of buffered items
	dirty     []*store // written since the last checkpoint
	cpWritten bool     // the checkpoint holds this state's W
	recs      []rec
	scratch   []rec // for mergeRuns
	runs      []int
}

// rec is one delay record read by a step.
type rec struct {
	at, qoff int64
	qid      uint32
	size     int32
	sc       protocol.Schedule
	relSize  uint32
	origin   int64 // a moved record's first pending record (its handle), else -1
}

// effect is what one record did, undone to write a checkpoint at an
// offset before it.
type effect struct {
	at, qoff int64
	qid      uint32
	s        *store  // the file it added an item to, or nil
	b        *bucket // the bucket of that item
	g        *group  // or, when its group was not split, its group
	bid      int64   // then the number of its bucket
	pq       uint32  // the queue number whose pending count changed
	dp       int8
	ref      int64 // for a resolution, the entry
}

// Open loads the index from cfg.Dir and follows cfg.Log to its end.
func Open(cfg Config) (*Index, error) {
	if cfg.Log == nil || cfg.Dir == "" {
		return nil, errors.New("delay: Config.Log and Config.Dir are required")
	}
	if cfg.BucketWidth < 0 || cfg.Window < 0 || cfg.MaxLoaded < 0 || cfg.CheckpointEvery < 0 {
		return nil, errors.New("delay: negative BucketWidth, Window, MaxLoaded or CheckpointEvery")
	}
	if cfg.FS == nil {
		cfg.FS = vfs.Default
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.BucketWidth == 0 {
		cfg.BucketWidth = 10 * time.Second
	}
	if cfg.BucketWidth < time.Millisecond {
		return nil, errors.New("delay: BucketWidth under a millisecond")
	}
	if cfg.Window == 0 {
		cfg.Window = 30 * time.Second
	}
	if cfg.MaxLoaded == 0 {
		cfg.MaxLoaded = 1 << 20
	}
	if cfg.CheckpointEvery == 0 {
		cfg.CheckpointEvery = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	x := &Index{cfg: cfg, l: cfg.Log, fs: cfg.FS, logger: cfg.Logger.Named("delay"),
		widthMs: cfg.BucketWidth.Milliseconds(), files: map[int64]*openFile{}}
	if far := farSpan.Milliseconds(); x.widthMs < far && far%x.widthMs == 0 {
		x.farMs = far
	}
	if err := vfs.MkdirAllDurable(x.fs, cfg.Dir); err != nil {
		return nil, fmt.Errorf("delay: create %s: %w", cfg.Dir, err)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.clear()
	ok, err := x.loadCheckpoint()
	if !ok {
		x.clear()
	}
	if err != nil {
		x.logger.Warn("rebuilding the delay index from the log", "reason", err)
	}
	if !ok {
		if err := x.rebuild(); err != nil {
			x.closeFiles()
			return nil, err
		}
		return x, nil
	}
	if err := x.follow(x.cfg.Now(), true); err != nil {
		x.logger.Warn("rebuilding the delay index from the log", "reason", err)
		if err := x.rebuild(); err != nil {
			x.closeFiles()
			return nil, err
		}
		return x, nil
	}
	x.removeStrays()
	return x, nil
}

// removeStrays removes the bucket files the index does not know (made
// after the checkpoint it opened, for records the log no longer holds).
func (x *Index) removeStrays() {
	names, err := x.fs.List(x.cfg.Dir)
	if err != nil {
		x.logger.Warn("cannot list the delay index directory", "error", err)
		return
	}
	for _, n := range names {
		var start int64
		if _, err := fmt.Sscanf(n, "far-%020d.dly", &start); err == nil && farName(start) == n {
			if _, ok := x.groups[start/max(x.farMs, 1)]; ok && x.farMs > 0 && start%x.farMs == 0 {
				continue
			}
		} else if _, err := fmt.Sscanf(n, "%020d.dly", &start); err != nil || bucketName(start) != n {
			continue
		} else if _, ok := x.buckets[start/x.widthMs]; ok && start%x.widthMs == 0 {
			continue
		}
		if err := x.fs.Remove(filepath.Join(x.cfg.Dir, n)); err != nil {
			x.logger.Warn("cannot remove a stray bucket file", "file", n, "error", err)
		}
	}
}

// clear drops the state in memory (not the files).
func (x *Index) clear() {
	x.closeFiles()
	x.broken = nil
	x.queues = nil
	x.qids = map[queueKey]uint32{}
	x.pos, x.w, x.start = 0, 0, 0
	x.buckets = map[int64]*bucket{}
	x.groups = map[int64]*group{}
	x.nextSplit = math.MaxInt64
	x.unloaded = nil
	x.mat = nil
	x.matEnts = 0
	x.penMu.Lock()
	x.topicPen = map[string]int64{}
	x.total = 0
	x.penMu.Unlock()
	x.penDelta = nil
	x.claims = map[int64]*ent{}
	x.journal.reset()
	x.trimmed = 0
	x.dirty = nil
	x.touched = nil
	x.bufBytes = 0
	x.cpWritten = false
}

func (x *Index) closeFiles() error {
	var errs []error
	for id := range x.files {
		if err := x.closeFile(id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// rebuild drops every file and follows the whole log. The checkpoint goes
// first (its removal synced): a crash half-way leaves no checkpoint that
// counts on a removed bucket file.
func (x *Index) rebuild() error {
	x.clear()
	cp := filepath.Join(x.cfg.Dir, checkpointName)
	if err := x.fs.Remove(cp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delay: remove %s: %w", cp, err)
	}
	if err := x.fs.SyncDir(x.cfg.Dir); err != nil {
		return fmt.Errorf("delay: sync %s: %w", x.cfg.Dir, err)
	}
	names, err := x.fs.List(x.cfg.Dir)
	if err != nil {
		return fmt.Errorf("delay: list %s: %w", x.cfg.Dir, err)
	}
	for _, n := range names {
		if err := x.fs.Remove(filepath.Join(x.cfg.Dir, n)); err != nil {
			return fmt.Errorf("delay: remove %s: %w", n, err)
		}
	}
	if err := x.fs.SyncDir(x.cfg.Dir); err != nil {
		return fmt.Errorf("delay: sync %s: %w", x.cfg.Dir, err)
	}
	return x.follow(x.cfg.Now(), true)
}

// Close stops and releases the index; it writes a last checkpoint.
func (x *Index) Close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil
	}
	x.closed = true
	x.waitCheckpoint()
	var err error
	if x.broken == nil {
		err = x.checkpoint()
	}
	return errors.Join(err, x.closeFiles())
}

// Follow reads the delay records appended since the last call, up to the
// log's end, into the index, and writes the checkpoint when one is due.
// The broker calls it before taking due entries and on a timer.
func (x *Index) Follow() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return ErrClosed
	}
	if x.broken != nil {
		return x.broken
	}
	return x.follow(x.cfg.Now(), false)
}

func (x *Index) follow(now time.Time, forceCP bool) error {
	err := x.followLog(now, forceCP)
	x.publishPending()
	if err != nil {
		x.broken = err
		return err
	}
	x.adjust(now.UnixMilli())
	return nil
}

func (x *Index) followLog(now time.Time, forceCP bool) error {
	x.nowMs = now.UnixMilli()
	if err := x.applyStart(); err != nil {
		return err
	}
	end := x.l.EndOffset()
	if end < x.pos {
		return fmt.Errorf("%w (it followed to %d, the log ends at %d)", ErrLogBehind, x.pos, end)
	}
	if forceCP || (x.cpBusy == nil && now.Sub(x.lastCP) >= max(x.cfg.CheckpointEvery, 20*x.cpTook)) {
		if f := x.l.FlushedOffset(); f > x.pos {
			if err := x.advance(min(f, end)); err != nil {
				return err
			}
		}
		if err := x.checkpointNow(forceCP); err != nil {
			return err
		}
		x.lastCP = now
	}
	for x.pos < end {
		if err := x.step(min(end, x.pos+stepBytes)); err != nil {
			return err
		}
		x.trimJournal()
		if x.journal.added-x.cpAdded > maxJournal {
			// A long follow (a rebuild, a backlog): a checkpoint keeps
			// what it did so far, and lets the journal of the records
			// before it go. The one in flight first (the lock is let go
			// meanwhile: all before x.pos is applied).
			x.waitCheckpoint()
			if x.closed {
				return ErrClosed
			}
			if x.broken != nil {
				return x.broken
			}
			if err := x.checkpointNow(forceCP); err != nil {
				return err
			}
		}
	}
	return nil
}

// trimJournal forgets the effects no checkpoint will undo: those before
// the log's flushed offset (and x.pos), the lowest a checkpoint is taken
// at from now on (both only grow until a Reset). Unflushed records are
// what the journal holds then, not all since the last checkpoint (which
// can be seconds apart when a checkpoint syncs many files).
func (x *Index) trimJournal() {
	f := min(x.l.FlushedOffset(), x.pos)
	x.trimmed = max(x.trimmed, f) // a Truncate can take the flushed offset below it
	x.journal.drop(sort.Search(x.journal.len(), func(i int) bool { return x.journal.at(i).at >= f }))
}

// maxJournal is how many records a follow applies before it writes a
// checkpoint between steps.
const maxJournal = 1 << 18

// checkpointNow writes the checkpoint under the lock (wait), or starts
// it.
func (x *Index) checkpointNow(wait bool) error {
	x.cpAdded = x.journal.added
	if wait {
		return x.checkpoint()
	}
	return x.startCheckpoint()
}

// advance applies the delay records before to, a step of at most
// stepBytes of log at a time.
func (x *Index) advance(to int64) error {
	for x.pos < to {
		if err := x.step(min(to, x.pos+stepBytes)); err != nil {
			return err
		}
	}
	return nil
}

// step reads every delay queue's records before to and applies them in
// log order.
func (x *Index) step(to int64) error {
	type q struct {
		topic       string
		queue       uint32
		first, next int64
	}
	var qs []q
	x.l.Queues(func(topic string, queue uint32, first, next int64) {
		if _, ok := protocol.IsDelayTopic(topic); ok {
			qs = append(qs, q{topic, queue, first, next})
		}
	})
	recs, runs := x.recs[:0], x.runs[:0]
	for _, lq := range qs {
		runs = append(runs, len(recs))
		qid := x.queueID(lq.topic, lq.queue)
		qst := x.queues[qid]
		if qst.next < lq.first {
			qst.next = lq.first // retention deleted them: they are gone
		}
		for done := false; !done && qst.next < lq.next; {
			got := 0
			buf, err := x.l.ReadAppend(x.rbuf[:0], lq.topic, lq.queue, qst.next, readBytes, func(dst []byte, e storage.StoredEntry) []byte {
				got++
				if done = done || e.LogOffset >= to; done {
					return dst
				}
				recs = append(recs, x.decodeRec(lq.topic, qid, e))
				qst.next = e.QueueOffset + 1
				return dst
			})
			if cap(buf) <= 2*readBytes {
				x.rbuf = buf[:0] // kept: the buffer of every read
			}
			if errors.Is(err, storage.ErrOutOfRange) {
				if first, _ := x.l.QueueRange(lq.topic, lq.queue); first > qst.next {
					qst.next = first
					continue
				}
			}
			if err != nil {
				return fmt.Errorf("delay: read %s/%d at %d: %w", lq.topic, lq.queue, qst.next, err)
			}
			if got == 0 {
				break
			}
		}
	}
	recs, x.scratch = mergeRuns(recs, runs, x.scratch)
	x.runs = runs[:0]
	for i := range recs {
		if err := x.apply(&recs[i]); err != nil {
			return err
		}
	}
	x.recs = recs[:0]
	if cap(recs) > keepRecs || cap(x.scratch) > keepRecs {
		x.recs, x.scratch = nil, nil // a step of many records: not kept
	}
	if x.bufBytes > maxBuffered {
		if err := x.flushAll(); err != nil {
			return err
		}
	}
	x.pos = to
	return nil
}

// decodeRec reads what the index keeps of the delay record e of topic
// (queue number qid).
func (x *Index) decodeRec(topic string, qid uint32, e storage.StoredEntry) rec {
	r := rec{at: e.LogOffset, qoff: e.QueueOffset, qid: qid, size: int32(storage.RecordSize(topic, len(e.Payload))), origin: -1}
	sc, ok := protocol.PeekSchedule(e.Payload)
	if !ok {
		x.logger.Warn("an undecodable delay record", "log-offset", e.LogOffset)
		return r
	}
	r.sc = sc
	if sc.Kind == protocol.ScheduleDelayed && sc.Ref >= 0 {
		// A move (rare): its origin is in its properties; the first move's
		// is the record it moves.
		r.origin = sc.Ref
		if m, err := protocol.DecodeMessage(e.Payload); err == nil {
			if o := protocol.DelayedOrigin(&m); o >= 0 {
				r.origin = o
			}
		}
	}
	if sc.Kind == protocol.ScheduleReleaseMark {
		m, err := protocol.DecodeMessage(e.Payload)
		if err != nil || len(m.Body) != 4 {
			r.sc.Kind = protocol.ScheduleNone
			x.logger.Warn("a release mark without its size", "log-offset", e.LogOffset)
		} else {
			r.relSize = binary.BigEndian.Uint32(m.Body)
		}
	}
	return r
}

// mergeRuns sorts recs by log offset, given that it is runs of sorted
// records (one per queue read) starting at the indexes runs: merged two
// by two (a queue's records are in log order, so this is much cheaper
// than a sort). It returns the sorted records (in recs or scratch) and
// the other buffer.
func mergeRuns(recs []rec, runs []int, scratch []rec) (sorted, spare []rec) {
	runs = append(runs, len(recs))
	for len(runs) > 2 {
		scratch = slices.Grow(scratch[:0], len(recs))[:len(recs)]
		merged := runs[:0]
		for i := 0; i+1 < len(runs); i += 2 {
			lo, mid, hi := runs[i], runs[i+1], len(recs)
			if i+2 < len(runs) {
				hi = runs[i+2]
			}
			merged = append(merged, lo)
			a, b, k := lo, mid, lo
			for a < mid && b < hi {
				if recs[b].at < recs[a].at {
					scratch[k] = recs[b]
					b++
				} else {
					scratch[k] = recs[a]
					a++
				}
				k++
			}
			k += copy(scratch[k:], recs[a:mid])
			copy(scratch[k:], recs[b:hi])
		}
		merged = append(merged, len(recs))
		recs, scratch = scratch, recs
		runs = merged
	}
	return recs, scratch
}

func sign(v int64) int64 {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}

func (x *Index) queueID(topic string, queue uint32) uint32 {
	k := queueKey{topic, queue}
	if id, ok := x.qids[k]; ok {
		return id
	}
	target, _ := protocol.IsDelayTopic(topic)
	id := uint32(len(x.queues))
	x.queues = append(x.queues, &queueState{topic: topic, target: target, queue: queue})
	x.qids[k] = id
	return id
}

func (x *Index) bucketID(dueAt int64) int64 {
	if dueAt < 0 {
		return 0
	}
	return dueAt / x.widthMs
}

func (x *Index) bucketFor(dueAt int64) (*bucket, error) {
	id := x.bucketID(dueAt)
	b := x.buckets[id]
	if b == nil {
		if err := x.splitFor(id); err != nil {
			return nil, err
		}
		b = x.buckets[id]
	}
	if b == nil {
		b = x.newBucket(id)
		b.minAt, b.maxAt = 1<<63-1, -1
		x.buckets[id] = b
	}
	return b, nil
}

// splitFor splits the group of bucket id, when it is not split.
func (x *Index) splitFor(id int64) error {
	if g := x.groups[x.groupID(id)]; g != nil && !g.split {
		return x.splitGroup(g)
	}
	return nil
}

// splitGroup gives each bucket of g's span its struct and its counts,
// from g's far file.
func (x *Index) splitGroup(g *group) error {
	items, err := x.readItems(&g.store, g.npending == 0 && g.maxAt < x.start)
	if err != nil {
		return err
	}
	byID := map[int64][]item{}
	for _, it := range items {
		id := x.bucketID(it.dueAt)
		byID[id] = append(byID[id], it)
	}
	for id, its := range byID {
		b := x.newBucket(id)
		b.minAt, b.maxAt = 1<<63-1, -1
		pend := map[int64]item{} // pending entries
		for _, it := range its {
			b.maxAt = max(b.maxAt, it.at)
			if it.kind == itemEntry && it.at >= x.start {
				pend[it.at] = it
			}
		}
		resolveItems(pend, its)
		for at, it := range pend {
			b.addPending(it.qid, 1)
			g.addPending(it.qid, -1)
			b.minAt = min(b.minAt, at)
		}
		x.buckets[id] = b
		if b.npending > 0 {
			b.inHeap = true
			heap.Push(&x.unloaded, b)
		}
	}
	if g.npending != 0 {
		// Not what the follow counted: the far file's items are what is
		// believed.
		x.logger.Warn("a far file's counts do not match what the index counted", "far-file", farName(g.id*x.farMs), "difference", g.npending)
		for _, qc := range slices.Clone(g.pending) {
			x.count(&g.counts, qc.qid, -qc.n)
		}
		x.publishPending()
	}
	g.split = true
	g.counts = counts{minAt: 1<<63 - 1}
	g.fine = nil
	return nil
}

// resolveItems deletes from pend (entries by log offset) those a mark or
// move of items names.
func resolveItems(pend map[int64]item, items []item) {
	for _, it := range items {
		if e, ok := pend[it.ref]; ok && it.kind != itemEntry && names(it, e.qid, e.dueAt) {
			delete(pend, it.ref)
		}
	}
}

// farCounts reads g's far file: the pending entries of topic ("" all) of
// each bucket of its span.
func (x *Index) farCounts(g *group, topic string) (map[int64]int64, error) {
	items, err := x.readItems(&g.store, g.npending == 0 && g.maxAt < x.start)
	if err != nil {
		return nil, err
	}
	pend := map[int64]item{}
	for _, it := range items {
		if it.kind == itemEntry && it.at >= x.start {
			pend[it.at] = it
		}
	}
	resolveItems(pend, items)
	out := map[int64]int64{}
	for _, it := range pend {
		if topic == "" || x.queues[it.qid].target == topic {
			out[x.bucketID(it.dueAt)]++
		}
	}
	return out, nil
}

// splitDue splits the groups whose span starts before horizon.
func (x *Index) splitDue(horizon int64) error {
	for x.farMs > 0 && x.nextSplit != math.MaxInt64 && x.nextSplit*x.farMs < horizon {
		if g := x.groups[x.nextSplit]; g != nil && !g.split {
			if err := x.splitGroup(g); err != nil {
				return err
			}
		}
		x.nextSplit = math.MaxInt64
		for gid, g := range x.groups {
			if !g.split {
				x.nextSplit = min(x.nextSplit, gid)
			}
		}
	}
	return nil
}

// anyBucketIn reports whether a bucket of group gid's span has a struct.
func (x *Index) anyBucketIn(gid int64) bool {
	n := x.farMs / x.widthMs
	for id := gid * n; id < (gid+1)*n; id++ {
		if x.buckets[id] != nil {
			return true
		}
	}
	return false
}

// addFar adds the entry r, due more than farMs ahead with no bucket
// struct, to its group when that group is not split: ok false when it is.
func (x *Index) addFar(r *rec) bool {
	id := x.bucketID(r.sc.At)
	if x.farMs == 0 || x.buckets[id] != nil || id*x.widthMs < x.nowMs+x.farMs {
		return false
	}
	gid := x.groupID(id)
	g := x.groups[gid]
	if g == nil {
		g = x.newGroup(gid)
		g.split = x.anyBucketIn(gid)
		x.groups[gid] = g
		if !g.split {
			x.nextSplit = min(x.nextSplit, gid)
		}
	}
	if g.split {
		return false
	}
	s := &g.store
	x.buffer(s, item{kind: itemEntry, qid: r.qid, size: uint32(r.size), dueAt: r.sc.At, at: r.at, ref: r.origin})
	g.maxAt = max(g.maxAt, r.at)
	ef := effect{at: r.at, qoff: r.qoff, qid: r.qid, s: s, g: g, bid: id, pq: r.qid, ref: -1}
	if r.at >= x.start {
		ef.dp = 1
		x.count(&g.counts, r.qid, 1)
		g.minAt = min(g.minAt, r.at)
		if g.fine == nil {
			g.fine = make([]uint32, x.farMs/x.widthMs)
		}
		g.fine[id-gid*x.farMs/x.widthMs]++
	}
	x.journal.add(ef)
	return true
}

func (x *Index) newBucket(id int64) *bucket {
	return &bucket{store: store{key: id}, id: id}
}

// groupID is the number of the far file of bucket id.
func (x *Index) groupID(id int64) int64 {
	if x.farMs == 0 {
		return -1
	}
	return id * x.widthMs / x.farMs
}

func (x *Index) newGroup(gid int64) *group {
	return &group{store: store{key: -1 - gid}, counts: counts{minAt: 1<<63 - 1}, id: gid, maxAt: -1}
}

// flushAll writes every buffered item to its file.
func (x *Index) flushAll() error {
	for _, st := range x.touched {
		if st.dead {
			continue
		}
		if err := x.flushBuf(st); err != nil {
			return err
		}
	}
	x.touched = x.touched[:0]
	x.bufBytes = 0
	return nil
}

// addItem adds it to b: to its own file, or to its far file when b is
// not loaded and starts farMs or more after now.
func (x *Index) addItem(b *bucket, it item) *store {
	s := &b.store
	if x.farMs > 0 && b.st == nil && b.id*x.widthMs >= x.nowMs+x.farMs {
		gid := x.groupID(b.id)
		g := x.groups[gid]
		if g == nil {
			g = x.newGroup(gid)
			g.split = true // b has its struct
			x.groups[gid] = g
		}
		g.maxAt = max(g.maxAt, it.at)
		s = &g.store
	}
	x.buffer(s, it)
	b.maxAt = max(b.maxAt, it.at)
	return s
}

func (x *Index) apply(r *rec) error {
	switch r.sc.Kind {
	case protocol.ScheduleDelayed:
		if err := x.addEntry(r); err != nil {
			return err
		}
		if r.sc.Ref >= 0 {
			return x.resolve(r, itemMoved)
		}
	case protocol.ScheduleReleaseMark:
		return x.resolve(r, itemReleased)
	case protocol.ScheduleCancelMark:
		return x.resolve(r, itemCancelled)
	default:
		x.journal.add(effect{at: r.at, qoff: r.qoff, qid: r.qid})
	}
	return nil
}

func (x *Index) addEntry(r *rec) error {
	if x.addFar(r) {
		return nil
	}
	b, err := x.bucketFor(r.sc.At)
	if err != nil {
		return err
	}
	s := x.addItem(b, item{kind: itemEntry, qid: r.qid, size: uint32(r.size), dueAt: r.sc.At, at: r.at, ref: r.origin})
	if r.origin >= 0 && b.st != nil {
		b.st.move(r.origin, r.at)
	}
	ef := effect{at: r.at, qoff: r.qoff, qid: r.qid, s: s, b: b, pq: r.qid, ref: -1}
	if r.at >= x.start {
		ef.dp = 1
		x.count(&b.counts, r.qid, 1)
		b.minAt = min(b.minAt, r.at)
		if b.st != nil {
			if _, dup := b.st.ents[r.at]; !dup {
				e := &ent{at: r.at, dueAt: r.sc.At, size: r.size, qid: r.qid, st: State{Kind: StatePending}, hidx: -1}
				b.st.ents[r.at] = e
				heap.Push(&b.st.h, e)
				x.matEnts++
			}
		} else if !b.inHeap {
			b.inHeap = true
			heap.Push(&x.unloaded, b)
		}
	}
	x.journal.add(ef)
	return nil
}

func (x *Index) count(b *counts, qid uint32, d int64) {
	b.addPending(qid, d)
	if int(qid) >= len(x.penDelta) {
		x.penDelta = append(x.penDelta, make([]int64, int(qid)+1-len(x.penDelta))...)
	}
	x.penDelta[qid] += d
}

// publishPending applies the counts' changes since the last call to what
// Pending reads: once a follow, not once a record (a send's admission
// reads them).
func (x *Index) publishPending() {
	x.penMu.Lock()
	for qid, d := range x.penDelta {
		if d != 0 {
			x.topicPen[x.queues[qid].target] += d
			x.total += d
			x.penDelta[qid] = 0
		}
	}
	x.penMu.Unlock()
}

// resolve applies a mark (or a move) to the entry it names.
func (x *Index) resolve(r *rec, kind uint8) error {
	b, err := x.bucketFor(r.sc.At)
	if err != nil {
		return err
	}
	ef := effect{at: r.at, qoff: r.qoff, qid: r.qid, b: b, ref: r.sc.Ref}
	it := item{kind: kind, qid: r.qid, dueAt: r.sc.At, at: r.at, ref: r.sc.Ref}
	if kind == itemReleased {
		it.size = r.relSize
	}
	if r.sc.Ref >= x.start && b.npending > 0 {
		st, err := x.stateOf(b, true)
		if err != nil {
			return err
		}
		if e := st.ents[r.sc.Ref]; e != nil && e.st.Kind == StatePending && names(it, e.qid, e.dueAt) {
			e.st = resolution(it)
			st.remove(e)
			e.hold = holdNone
			delete(x.claims, e.at)
			x.count(&b.counts, e.qid, -1)
			ef.pq, ef.dp = e.qid, -1
		}
	}
	if kind == itemMoved && b.st != nil {
		b.st.move(r.sc.Ref, r.at)
	}
	ef.s = x.addItem(b, it)
	x.journal.add(ef)
	return nil
}

// stateOf materializes b (reading its file) unless it is; keep says it
// stays materialized (as a cached bucket when outside the window).
func (x *Index) stateOf(b *bucket, keep bool) (*bstate, error) {
	x.useTick++
	b.used = x.useTick
	if b.st != nil {
		return b.st, nil
	}
	st, err := x.loadState(b)
	if err != nil || !keep {
		return st, err
	}
	x.materialize(b, st, true)
	x.evictCache(b)
	return st, nil
}

func (x *Index) materialize(b *bucket, st *bstate, cached bool) {
	b.st, b.cached = st, cached
	x.matEnts += int64(len(st.ents))
	i, _ := slices.BinarySearch(x.mat, b.id)
	x.mat = slices.Insert(x.mat, i, b.id)
}

func (x *Index) dematerialize(b *bucket) {
	x.matEnts -= int64(len(b.st.ents))
	b.st, b.cached = nil, false
	if i, ok := slices.BinarySearch(x.mat, b.id); ok {
		x.mat = slices.Delete(x.mat, i, i+1)
	}
	if b.npending > 0 && !b.inHeap {
		b.inHeap = true
		heap.Push(&x.unloaded, b)
	}
}

// evictCache drops the least recently used cached buckets beyond
// cacheBuckets (never keep).
func (x *Index) evictCache(keep *bucket) {
	for {
		var cached []*bucket
		for _, id := range x.mat {
			if b := x.buckets[id]; b.cached && b != keep {
				cached = append(cached, b)
			}
		}
		if len(cached) < cacheBuckets {
			return
		}
		lru := cached[0]
		for _, b := range cached {
			if b.used < lru.used {
				lru = b
			}
		}
		x.dematerialize(lru)
	}
}

// adjust materializes the buckets the window reaches (in order, while
// MaxLoaded allows) and drops the past ones fully resolved.
func (x *Index) adjust(now int64) {
	limit := now + x.cfg.Window.Milliseconds()
	if err := x.splitDue(max(limit, now+x.farMs)); err != nil {
		x.logger.Error("cannot read a far file of the delay index", "error", err)
	}
	for i := 0; i < len(x.mat); {
		b := x.buckets[x.mat[i]]
		if b.npending == 0 && (b.id+1)*x.widthMs <= now {
			x.dematerialize(b)
			continue
		}
		if b.cached && b.id*x.widthMs < limit {
			b.cached = false
		}
		i++
	}
	for {
		b := x.firstUnloaded()
		if b == nil || b.id*x.widthMs >= limit {
			return
		}
		if x.matEnts+b.npending > int64(x.cfg.MaxLoaded) && x.pendingLoadedBefore(b.id) {
			return
		}
		if err := x.load(b); err != nil {
			x.logger.Error("cannot load a bucket of the delay index", "bucket", b.id*x.widthMs, "error", err)
			return
		}
	}
}

// pendingLoadedBefore reports whether a materialized bucket before id
// holds a pending entry.
func (x *Index) pendingLoadedBefore(id int64) bool {
	for _, mid := range x.mat {
		if mid < id && x.buckets[mid].npending > 0 {
			return true
		}
	}
	return false
}

// applyStart drops the entries retention deleted (below the log's start).
func (x *Index) applyStart() error {
	start := x.l.StartOffset()
	if start <= x.start {
		return nil
	}
	// x.start moves last: loadState leaves out what is below it.
	defer func() { x.start = start }()
	for _, g := range x.groups {
		if !g.split && g.npending > 0 && g.minAt < start {
			if err := x.splitGroup(g); err != nil {
				return err
			}
		}
	}
	for _, b := range x.buckets {
		if b.npending == 0 || b.minAt >= start {
			continue
		}
		st, err := x.stateOf(b, false)
		if err != nil {
			return err
		}
		minAt := int64(1<<63 - 1)
		for at, e := range st.ents {
			if at >= start {
				if e.st.Kind == StatePending {
					minAt = min(minAt, at)
				}
				continue
			}
			if e.st.Kind == StatePending {
				x.count(&b.counts, e.qid, -1)
				delete(x.claims, at)
			}
			if b.st != nil {
				st.remove(e)
				delete(st.ents, at)
				x.matEnts--
			}
		}
		b.minAt = minAt
	}
	return nil
}

func (x *Index) entry(e *ent) Entry {
	q := x.queues[e.qid]
	return Entry{At: e.at, Size: int(e.size), DueAt: e.dueAt, Topic: q.target, Queue: q.queue}
}

// Due returns up to max entries due at or before now, earliest first (by
// due time, then log offset: keyed messages due at the same time keep
// their order), and claims them: they are not returned again, nor claimed
// by Claim, until Release.
func (x *Index) Due(now time.Time, max int) []Entry {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed || x.broken != nil {
		return nil
	}
	ms := now.UnixMilli()
	x.adjust(ms)
	var out []Entry
	for i := 0; len(out) < max; i++ {
		// The next bucket in due order: a materialized one, or the earliest
		// unloaded one, loaded now whatever MaxLoaded says (what is due must
		// go out, earliest first).
		u := x.firstUnloaded()
		if u != nil && u.id*x.widthMs <= ms && (i >= len(x.mat) || u.id < x.mat[i]) {
			if err := x.load(u); err != nil {
				x.logger.Error("cannot load a bucket of the delay index", "bucket", u.id*x.widthMs, "error", err)
				break
			}
		}
		if i >= len(x.mat) || x.mat[i]*x.widthMs > ms {
			break
		}
		st := x.buckets[x.mat[i]].st
		for len(out) < max && len(st.h) > 0 && st.h[0].dueAt <= ms {
			e := heap.Pop(&st.h).(*ent)
			e.hold = holdClaimed
			x.claims[e.at] = e
			out = append(out, x.entry(e))
		}
	}
	return out
}

// firstUnloaded is the earliest bucket with pending entries that is not
// materialized, or nil.
func (x *Index) firstUnloaded() *bucket {
	for len(x.unloaded) > 0 {
		b := x.unloaded[0]
		if x.buckets[b.id] == b && b.st == nil && b.npending > 0 {
			return b
		}
		heap.Pop(&x.unloaded)
		b.inHeap = false
	}
	return nil
}

// load materializes the first unloaded bucket b.
func (x *Index) load(b *bucket) error {
	st, err := x.loadState(b)
	if err != nil {
		return err
	}
	heap.Pop(&x.unloaded)
	b.inHeap = false
	x.materialize(b, st, false)
	return nil
}

// lookup finds the entry at (at, dueAt), materializing its bucket.
func (x *Index) lookup(at, dueAt int64) (*ent, *bucket, error) {
	if x.closed {
		return nil, nil, ErrClosed
	}
	if x.broken != nil {
		return nil, nil, x.broken
	}
	if at < x.start {
		return nil, nil, nil
	}
	if c := x.claims[at]; c != nil && c.dueAt == dueAt {
		return c, x.buckets[x.bucketID(dueAt)], nil
	}
	if err := x.splitFor(x.bucketID(dueAt)); err != nil {
		return nil, nil, err
	}
	b := x.buckets[x.bucketID(dueAt)]
	if b == nil {
		return nil, nil, nil
	}
	st, err := x.stateOf(b, true)
	if err != nil {
		return nil, nil, err
	}
	e := st.ents[at]
	if e != nil && e.dueAt != dueAt {
		e = nil
	}
	return e, b, nil
}

// Claim claims the pending entry at (at, dueAt) for a cancel or a move
// (reading its bucket from disk if it is not loaded): ok false with its
// state when it is not pending or is claimed already.
func (x *Index) Claim(at, dueAt int64) (e Entry, st State, ok bool, err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	en, b, err := x.lookup(at, dueAt)
	if err != nil || en == nil {
		return Entry{}, State{}, false, err
	}
	if en.st.Kind != StatePending || en.hold != holdNone {
		return x.entry(en), en.st, false, nil
	}
	if b != nil && b.st != nil && b.st.ents[at] == en {
		b.st.remove(en)
	}
	en.hidx = -1
	en.hold = holdClaimed
	x.claims[at] = en
	return x.entry(en), en.st, true, nil
}

// Release ends a claim: done says its mark (or, for a move, its new entry)
// was appended, and Follow will find it; !done returns it to pending.
func (x *Index) Release(at int64, done bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	e := x.claims[at]
	if e == nil {
		return
	}
	if e.st.Kind != StatePending {
		delete(x.claims, at)
		return
	}
	if done {
		e.hold = holdDone
		return
	}
	e.hold = holdNone
	delete(x.claims, at)
	if b := x.buckets[x.bucketID(e.dueAt)]; b != nil && b.st != nil && b.st.ents[at] == e && e.hidx < 0 {
		heap.Push(&b.st.h, e)
	}
}

// MovedTo follows the moves of the entry that was at log offset at, due
// at dueAt (retention appended it again, perhaps more than once): the log
// offset of its newest record, and false when the index knows of no move
// of it. Unlike State it answers after the segments of the older records
// were deleted, for as long as the entry's bucket is kept.
func (x *Index) MovedTo(at, dueAt int64) (int64, bool, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return 0, false, ErrClosed
	}
	if x.broken != nil {
		return 0, false, x.broken
	}
	id := x.bucketID(dueAt)
	if err := x.splitFor(id); err != nil {
		return 0, false, err
	}
	b := x.buckets[id]
	if b == nil {
		return 0, false, nil
	}
	st, err := x.stateOf(b, true)
	if err != nil {
		return 0, false, err
	}
	to, ok := st.moved[at]
	for hops := 0; ok && hops < 1<<10; hops++ {
		next, again := st.moved[to]
		if !again || next <= to {
			break
		}
		to = next
	}
	return to, ok, nil
}

// State tells what became of the entry at (at, dueAt): a lookup reads its
// bucket from disk when it is not loaded.
func (x *Index) State(at, dueAt int64) (State, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	e, _, err := x.lookup(at, dueAt)
	if err != nil || e == nil {
		return State{}, err
	}
	return e.st, nil
}

// NextDue is the due time of the earliest pending entry that is not
// claimed (ok false: none).
func (x *Index) NextDue() (dueAt int64, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed || x.broken != nil {
		return 0, false
	}
	x.adjust(x.cfg.Now().UnixMilli())
	for {
		var best *ent
		for _, id := range x.mat {
			if st := x.buckets[id].st; len(st.h) > 0 {
				best = st.h[0]
				break
			}
		}
		u := x.firstUnloaded()
		// The earliest group not split with pending entries.
		var fg *group
		for _, g := range x.groups {
			if !g.split && g.npending > 0 && (fg == nil || g.id < fg.id) {
				fg = g
			}
		}
		if fg != nil && (best == nil || best.dueAt >= fg.id*x.farMs) && (u == nil || u.id*x.widthMs >= fg.id*x.farMs) {
			if err := x.splitGroup(fg); err != nil {
				x.logger.Error("cannot read a far file of the delay index", "far-file", farName(fg.id*x.farMs), "error", err)
				return fg.id * x.farMs, true
			}
			continue
		}
		if u == nil || (best != nil && best.dueAt < u.id*x.widthMs) {
			if best == nil {
				return 0, false
			}
			return best.dueAt, true
		}
		// The earliest pending bucket is not loaded (MaxLoaded): look.
		if _, err := x.stateOf(u, true); err != nil {
			x.logger.Error("cannot load a bucket of the delay index", "bucket", u.id*x.widthMs, "error", err)
			return u.id * x.widthMs, true
		}
	}
}

// Pending counts the pending entries of topic ("" all).
func (x *Index) Pending(topic string) int64 {
	x.penMu.Lock()
	defer x.penMu.Unlock()
	if topic == "" {
		return x.total
	}
	return x.topicPen[topic]
}

// Buckets counts the pending entries per bucket of width (a multiple of
// BucketWidth, else rounded up to one), earliest first, at most limit
// buckets, of topic ("" all).
func (x *Index) Buckets(topic string, width time.Duration, limit int) []Bucket {
	x.mu.Lock()
	defer x.mu.Unlock()
	n := (width.Milliseconds() + x.widthMs - 1) / x.widthMs
	if n < 1 {
		n = 1
	}
	sums := map[int64]int64{}
	for id, b := range x.buckets {
		if b.npending == 0 {
			continue
		}
		var c int64
		if topic == "" {
			c = b.npending
		} else {
			for _, qc := range b.pending {
				if x.queues[qc.qid].target == topic {
					c += qc.n
				}
			}
		}
		if c > 0 {
			sums[id/n*n*x.widthMs] += c
		}
	}
	// The groups not split, in order: from their counts when each falls
	// in one bucket of width, from their fine counts (topic "") or their
	// far files (a topic) else, until limit buckets come before them.
	var gs []*group
	for _, g := range x.groups {
		if !g.split && g.npending > 0 {
			gs = append(gs, g)
		}
	}
	slices.SortFunc(gs, func(a, b *group) int { return int(sign(a.id - b.id)) })
	span := n * x.widthMs
	nf := x.farMs / x.widthMs
groups:
	for _, g := range gs {
		gstart := g.id * x.farMs
		switch {
		case (span%x.farMs == 0) || topic == "":
			if span%x.farMs == 0 {
				c := g.npending
				if topic != "" {
					c = 0
					for _, qc := range g.pending {
						if x.queues[qc.qid].target == topic {
							c += qc.n
						}
					}
				}
				if c > 0 {
					sums[gstart/span*span] += c
				}
				continue
			}
			for i, c := range g.fine {
				if c > 0 {
					sums[(g.id*nf+int64(i))/n*span] += int64(c)
				}
			}
		default:
			if limit >= 0 {
				before := 0
				for s := range sums {
					if s+span <= gstart {
						before++
					}
				}
				if before >= limit {
					break groups
				}
			}
			cs, err := x.farCounts(g, topic)
			if err != nil {
				x.logger.Error("cannot read a far file of the delay index", "far-file", farName(gstart), "error", err)
				continue
			}
			for id, c := range cs {
				sums[id/n*span] += c
			}
		}
	}
	out := make([]Bucket, 0, len(sums))
	for s, c := range sums {
		out = append(out, Bucket{Start: s, Pending: c})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	if limit >= 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}

// PendingBefore returns up to max pending, unclaimed entries whose records
// start before log offset off (what retention would delete), earliest
// record first, and claims them (see Claim).
func (x *Index) PendingBefore(off int64, max int) ([]Entry, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil, ErrClosed
	}
	if x.broken != nil {
		return nil, x.broken
	}
	for _, g := range x.groups {
		if !g.split && g.npending > 0 && g.minAt < off {
			if err := x.splitGroup(g); err != nil {
				return nil, err
			}
		}
	}
	var cand []*ent
	for _, b := range x.buckets {
		if b.npending == 0 || b.minAt >= off {
			continue
		}
		st, err := x.stateOf(b, false)
		if err != nil {
			return nil, err
		}
		minAt := int64(1<<63 - 1)
		for at, e := range st.ents {
			if e.st.Kind != StatePending {
				continue
			}
			minAt = min(minAt, at)
			if at < off && e.hold == holdNone {
				cand = append(cand, e)
			}
		}
		b.minAt = minAt
	}
	slices.SortFunc(cand, func(a, b *ent) int { return int(sign(a.at - b.at)) })
	if len(cand) > max {
		cand = cand[:max]
	}
	out := make([]Entry, len(cand))
	for i, e := range cand {
		if b := x.buckets[x.bucketID(e.dueAt)]; b.st != nil && b.st.ents[e.at] == e {
			b.st.remove(e)
		}
		e.hidx = -1 // it may come from a bucket read for this call only
		e.hold = holdClaimed
		x.claims[e.at] = e
		out[i] = x.entry(e)
	}
	return out, nil
}

// UnmarkedTail reports a released record at the very end of the log whose
// release mark is missing (a crash or a failover cut between the two
// records of one append): the entry it released, which the new master
// marks before it fires anything. ok is false when the last record is not
// a released copy, or its entry is not pending here.
func (x *Index) UnmarkedTail() (e Entry, releasedAt int64, ok bool, err error) {
	at, _, has, err := x.l.LastRecord()
	if err != nil || !has {
		return Entry{}, 0, false, err
	}
	ri, err := x.l.ReadRecordAt(at)
	if err != nil {
		return Entry{}, 0, false, err
	}
	sc, good := protocol.PeekSchedule(ri.Payload)
	if !good || sc.Kind != protocol.ScheduleReleased {
		return Entry{}, 0, false, nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	en, _, err := x.lookup(sc.Ref, sc.At)
	if err != nil || en == nil || en.st.Kind != StatePending {
		return Entry{}, 0, false, err
	}
	out := x.entry(en)
	if out.Topic != ri.Topic || out.Queue != ri.Queue {
		return Entry{}, 0, false, nil
	}
	return out, at, true, nil
}

// Reset drops everything and rebuilds from the log (after the log was
// truncated).
func (x *Index) Reset() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return ErrClosed
	}
	x.waitCheckpoint()
	if x.closed {
		return ErrClosed
	}
	return x.rebuild()
}

// Stats returns the index's counts for metrics.
func (x *Index) Stats() Stats {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.penMu.Lock()
	total := x.total
	x.penMu.Unlock()
	return Stats{Pending: total, Loaded: x.matEnts, Buckets: len(x.buckets), Followed: x.w}
}
