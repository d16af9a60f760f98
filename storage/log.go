package storage

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/storage/vfs"
)

// Entry is one message to append.
type Entry struct {
	Topic   string
	Queue   uint32
	Payload []byte
	// Producer stamps the entry for deduplication (see the package doc);
	// zero: stored without checks. It must be the stamp that
	// Config.ProducerStamp reads from Payload.
	Producer ProducerStamp
	// Recovered appends a record that a failover cut from the old master's
	// log (see Recovered records in the package doc): it is flagged, it is
	// skipped as a duplicate if its stamp is stored already or its message
	// id was appended to its queue while a Watch of the queue is open, and
	// its stamp otherwise joins the deduplication state only where it is
	// the next one its producer's state expects: it never refuses, fences
	// or renumbers a live producer.
	Recovered bool
	// Requires makes the entry's append conditional: it is written only if
	// the deduplication state holds, for each requirement, the producer in
	// the queue at the epoch with the sequence stored (in this group's
	// earlier entries too); else its Position's Err is ErrMissingRecords
	// and nothing of it is written. A transaction's commit mark requires
	// the last message its producer was told was stored in each queue.
	Requires []Requirement
}

// Requirement is one condition of Entry.Requires.
type Requirement struct {
	Topic    string
	Queue    uint32
	Producer uint64
	Epoch    uint16
	Seq      int64
}

// Position is where an appended entry landed.
type Position struct {
	QueueOffset int64 // the entry's offset in its queue
	LogOffset   int64 // the log offset of its record
	End         int64 // the log offset just past its record
	// Duplicate: the entry was already stored, and the offsets are the
	// original's; each is -1 when the original is older than the state
	// remembers (LogOffset and End alone are -1 when retention deleted it).
	Duplicate bool
	// Err refuses this entry (ErrOutOfOrderSequence or ErrProducerFenced):
	// nothing was stored for it and the offsets are -1.
	Err error
}

// StoredEntry is an entry read back from a queue.
type StoredEntry struct {
	QueueOffset int64
	LogOffset   int64
	StoreTime   int64 // unix milliseconds
	Payload     []byte
	Recovered   bool // appended again after a failover (Entry.Recovered)
	// Fingerprint is the record's fingerprint (Config.Fingerprint of its
	// payload) as the index holds it.
	Fingerprint uint32
}

// Log is a segmented commit log. Appends from any goroutine are queued and
// written by one writer goroutine in groups (group commit); a flusher
// goroutine syncs. Reads run alongside and see only whole records that were
// written. All methods are safe for concurrent use.
type Log struct {
	cfg Config
	fs  vfs.FS
	log hclog.Logger

	// The append queue, fed by Append and drained by the writer.
	qmu     sync.Mutex
	queue   []*appendReq
	closing bool
	wake    chan struct{}
	// writing is the writer token: set while one goroutine (the writer
	// goroutine, or an appender writing its own group inline, see enqueue)
	// writes. Whoever holds it owns what the writer owns.
	writing bool

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
	// brokenSeen publishes broken for Broken (readers off the writer).
	brokenSeen atomic.Pointer[error]
	// gen counts truncations (Truncate); changed under mu. A read plans
	// under mu and fails if gen moved before its bytes were read, since the
	// bytes past a truncation point may since hold other records.
	gen atomic.Uint64

	// Flush waiters, fed by the writer and released by the flusher.
	fmu       sync.Mutex
	waiters   []flushWaiter // in log order
	flushWake chan struct{}

	checkpoint vfs.File
	retainMu   sync.Mutex // serializes DeleteBefore (and Truncate with it)
	// syncMu serializes syncOnce with Truncate, which moves the flushed
	// offset and the checkpoint back.
	syncMu sync.Mutex
	// crashed makes Close skip its final sync, as a killed process would
	// (tests only).
	crashed    bool
	writerDone chan struct{}
	stopFlush  chan struct{}
	flushDone  chan struct{}
	buf        []byte   // the writer's scratch buffer
	fpBuf      []uint32 // the writer's: fingerprints of a group's records
	prod       producerTable
	pt         pretoucher
	scanned    int64 // records Open read (after the index chunks)
	// scanLimit, during recovery, is the checkpoint: the records before it
	// are synced, so the chunks of cuts up to it are written at once
	// rather than held in memory until Open ends. -1 otherwise.
	scanLimit int64

	// The index on disk (indexer.go). idxMu serializes the indexer's
	// chunk writes with Truncate and DeleteBefore; chunks (the files the
	// queues' parts read, in log order) changes under mu with idxMu held.
	idxMu      sync.Mutex
	idxDirMade bool // idxMu: the index directory was made durable
	chunks     []*indexChunk
	openChunks openChunks // the chunk files open, for reads
	cutMu      sync.Mutex
	cuts       []indexCut            // cut, not yet written
	cutFrom    int64                 // writer-owned: where the next cut starts
	lastAt     int64                 // writer-owned, changed under mu: log offset of the last record indexed
	watches    map[queueKey][]*Watch // writer-owned: open watches by queue (recovered.go)
	idxFailing bool                  // indexer-owned: the last chunk write failed
	// keys holds the key refs of the records past the last index chunk
	// written, in log order (lookup.go); changed under mu, never below
	// its length. kc is the writer's collector of a group's refs.
	keys    keyTail
	kc      keyCollector
	idxWake chan struct{}
	stopIdx chan struct{}
	idxDone chan struct{}
}

// Open opens (or creates) the log in cfg.Dir, recovering it after a crash.
// It refuses a Config that does not pass Validate.
func Open(cfg Config) (*Log, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	l := &Log{
		cfg:        cfg,
		fs:         cfg.FS,
		log:        cfg.Logger,
		wake:       make(chan struct{}, 1),
		index:      make(map[queueKey]*queueIndex),
		flushWake:  make(chan struct{}, 1),
		writerDone: make(chan struct{}),
		stopFlush:  make(chan struct{}),
		flushDone:  make(chan struct{}),
		lastAt:     -1,
		scanLimit:  -1,
		idxWake:    make(chan struct{}, 1),
		stopIdx:    make(chan struct{}),
		idxDone:    make(chan struct{}),
	}
	l.prod.init(cfg)
	if err := vfs.MkdirAllDurable(l.fs, cfg.Dir); err != nil {
		return nil, fmt.Errorf("storage: create %s: %w", cfg.Dir, err)
	}
	began := time.Now()
	if err := l.recover(); err != nil {
		l.closeFiles()
		return nil, err
	}
	l.log.Info("opened the commit log", "start", l.segments[0].base, "end", l.end.Load(),
		"segments", len(l.segments), "index_chunks", len(l.chunks), "records_read", l.scanned, "took", time.Since(began))
	l.pt.window = cfg.Pretouch
	l.startPretouch(l.segments[len(l.segments)-1])
	go l.writer()
	go l.flusher()
	go l.indexer()
	l.wakeIndexer() // cuts made by recovery
	return l, nil
}

// EndOffset is the log offset just past the last record written.
func (l *Log) EndOffset() int64 { return l.end.Load() }

// FlushedOffset is the log offset up to which the log is synced to disk.
func (l *Log) FlushedOffset() int64 { return l.flushed.Load() }

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
	l.stopPretouch()
	if err := l.pt.cut(l.segments[len(l.segments)-1], l.segments[len(l.segments)-1].size); err != nil {
		l.log.Warn("cutting the pre-touched zeros at close failed; the next Open cuts them", "error", err)
	}
	close(l.stopFlush)
	<-l.flushDone
	if !l.crashed {
		// The rest of the index goes to disk too, so that the next Open
		// reads no record.
		l.mu.RLock()
		l.maybeCut(true)
		l.mu.RUnlock()
	}
	close(l.stopIdx)
	<-l.idxDone
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
	for _, c := range l.chunks {
		c.close()
		if kt := c.keys.Load(); kt != nil {
			kt.f.close()
		}
	}
	return errors.Join(errs...)
}

// segmentFor returns the segment holding log offset off and where that
