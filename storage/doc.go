// Package storage is the broker's disk: a segmented, CRC-checked commit log
// with group commit, synchronous or asynchronous flush, per-queue indexes,
// raw access for replication, retention, and crash recovery. It knows bytes
// and offsets, never the network. All file access goes through a vfs.FS
// (package storage/vfs), so tests can make the disk fail on purpose.
//
// # Offsets
//
// A log offset is a byte position in the whole log: the first record is at
// 0 and each record starts where the previous one ended. A master and its
// slave hold byte-identical logs, so a log offset means the same record on
// both. Every (topic, queue) has its own dense queue offsets 0, 1, 2, ...,
// assigned at append, in log order; a queue that moved here from another
// log starts at its base instead (SetQueueBase, queuebase.go), and its
// records carry the base from its first on.
//
// # Files
//
// A log directory holds segment files named by the log offset of their first
// byte, as 20 decimal digits with the suffix ".log", one "checkpoint" file,
// the "index" directory of index chunk files (see Index) and their key
// tables (see Keys) and, once
// retention has deleted segments, one "queues" file (see DeleteBefore).
// Other subdirectories (such as one for the side files of truncations, see
// Side files) are ignored. Segments are contiguous: a segment ends where
// the next begins. A
// record never spans two segments: when the next record would make the
// active segment larger than Config.SegmentSize, a new segment starts at the
// current end offset (so segments may be a little shorter than the size).
//
// Nothing is relied on before a power loss would keep it (see package vfs,
// Power loss). The log creates its directory (with the directories above
// it) and the index directory with vfs.MkdirAllDurable, which syncs the
// parent of every component. A new segment's name is synced in the
// directory before a record is written to it; an index chunk, a key
// table, the queues file and a side file are written to a temporary name,
// synced, renamed and their directory synced before they count; removals
// are synced before the
// operation reports success. Open syncs the log directory once more after
// recovery: a segment or checkpoint that a killed process created, and
// whose name it never synced, is durable before new appends go to it.
// Directory syncs happen on these paths only, never per append.
//
// # Record format
//
// All integers are big-endian.
//
//	offset size field
//	0      4    L: length of the content (everything after the CRC)
//	4      4    CRC32C (Castagnoli) of the content
//	8      1    record version, 0xF1
//	9      1    flags, 0
//	10     2    T: topic length
//	12     T    topic
//	12+T   4    queue id
//	16+T   8    queue offset
//	24+T   8    store time, unix milliseconds
//	32+T   ...  payload (L - 24 - T bytes): the message as the broker encodes it
//
// # Checkpoint
//
// The checkpoint file holds the log offset up to which the log is known to
// be on disk (the last flush), with a CRC: 8 bytes offset, 4 bytes CRC32C of
// those 8 bytes, 4 bytes magic "FYCP". It is rewritten after every flush and
// never synced itself: a stale checkpoint is only more conservative. A
// missing, short or bad checkpoint counts as 0; one that cannot be read
// fails Open.
//
// # Index
//
// Each queue's records are found through its index: which log offset,
// size and fingerprint each queue offset has. The older part of it is on disk, in index
// chunk files; the newest part is in memory. The writer cuts the index
// after a group once the records since the last cut cover
// Config.IndexChunkBytes (64 MiB) of log, and Close cuts whatever is left;
// a cut holds the deduplication state as of its end. An indexer goroutine
// writes each cut's chunk once the log is synced past its end (a chunk
// never describes records that a crash could take back), then moves the
// chunk's entries out of memory. A chunk that cannot be written stays in
// memory and is tried again after the next sync.
//
// A chunk file, index/<20-digit log offset where it starts>.idx, is
// written to a temporary name, synced and renamed, its directory synced.
// All integers are big-endian:
//
//	header, 80 bytes: magic "FYIX", u16 version 2, u16 0; u64 from, u64 to
//	  (the log range it covers); u64 log offset and u32 CRC of the last
//	  record in that range; u32 queues, u64 entries; u32 directory bytes,
//	  u32 snapshot bytes; u32 CRC32C of the header's first 56 bytes and the
//	  directory; u32 CRC32C of the entries; u32 CRC32C of the snapshot;
//	  12 bytes 0
//	directory, per queue (ordered by topic, then queue): u16 topic length,
//	  topic, u32 queue, u64 first queue offset, u64 entries
//	entries, queue by queue in directory order, 16 bytes each: u64 log
//	  offset, u32 record size, u32 fingerprint
//	snapshot: the deduplication state as of the end of the range
//
// Memory: a queue costs about 100 bytes and about 56 more per chunk holding
// it; the entries in memory (16 bytes each) are those of the records since
// the last chunk written: about IndexChunkBytes of log (about 64k entries
// of 1 KiB messages), plus what the indexer has not written yet (it waits
// for a sync: at most a FlushInterval of appends). So memory grows with the
// number of queues and with log size / IndexChunkBytes, not with the number
// of messages; an Open that reads many records (the first with an index,
// or after the index directory was removed) writes each chunk as it goes.
// Each chunk carries the whole deduplication state (about 140 bytes per
// tracked producer and queue). A read of an older queue offset reads its
// entries from the chunk file (256 at a time, then twice as many per read
// up to 4096, so that a read that skips many entries reads the file in a
// few large pieces), checks each entry it reads a record for (inside the
// log, after the one before it) and that each record it then reads is the
// one the entry names: a damaged entry is a *CorruptError. A log keeps at
// most 64 chunk files open for reads, closing the least recently read (a
// reader of the whole history opens them again as it goes).
//
// A record's fingerprint is Config.Fingerprint of its payload (the broker
// gives a message's tag fingerprint), computed when the record is indexed:
// on append, on AppendRaw, and when Open or Truncate reads records. It is
// a function of the log, as the rest of the index is. ReadMatching and
// CountMatching judge entries by it without reading their records: a
// skipped record is neither decoded nor checked (its bytes are read only
// in passing, when it lies in a gap of at most readGap between two records
// read). A chunk of an older version (version 1 had entries of 12 bytes,
// without fingerprints) does not check out: Open drops it and rebuilds
// the index from the log, as it does for any bad chunk.
//
// # Keys
//
// With Config.LookupKeys, Lookup finds the records that hold a key (the
// broker gives a message's id and its keys) without reading the log.
// Each key is hashed with 64-bit FNV-1a, the same on every machine and
// after every restart. The refs of the records past the last index chunk
// written (per key: hash, log offset, store time; 24 bytes) are in
// memory, in log order, taken where fingerprints are (on append, before
// the writer publishes a group, on AppendRaw, and when Open or Truncate
// reads records); a truncation drops those past the cut and retention
// those it deletes. When the indexer writes a chunk, it first writes that
// range's key table, then moves the refs of the range out of memory with
// the chunk's entries.
//
// A key table, index/<20-digit log offset where its chunk starts>.keys, is
// written to a temporary name, synced and renamed, its directory synced,
// before its chunk file; it is removed with its chunk (retention,
// truncation, a chunk dropped by Open). All integers are big-endian:
//
//	header, 80 bytes: magic "FYKT", u16 version 1, u16 k (bloom hashes);
//	  u64 from, u64 to (its chunk's range); u64 log offset and u32 CRC of
//	  the last record of the range (as its chunk's header); u32 bloom
//	  bytes; u64 pairs; i64 min and max store time of the range's keyed
//	  records; u32 CRC32C of the bloom filter and fences; u32 CRC32C of
//	  the header's first 68 bytes; 8 bytes 0
//	bloom filter: about 10 bits per pair (a whole number of 8-byte words,
//	  none for no pair); bit i of a key is (lo + i*(hi|1)) mod the bits,
//	  lo and hi the halves of its hash, for i < k (7)
//	fences, per page of 170 pairs: the page's first pair's hash and log
//	  offset (u64, u64), u32 CRC32C of the page
//	pairs, sorted by hash then log offset, 24 bytes each: u64 hash, u64
//	  log offset, i64 store time
//
// A key table costs about 25 MB per GiB of log of 1 KiB messages with one
// key each (24 bytes a pair and about 1.25 of bloom filter). Open reads
// each key table's header and keeps it if it belongs to its chunk (same
// range and last record) and adds up; it removes key tables of no chunk
// and those that do not check out. A key table that is missing, does not
// check out (its bloom filter, fences or a page, checked as read) or
// cannot be read fails neither Open nor a lookup: the lookup reads that
// chunk's records instead, and the indexer rebuilds the table in the
// background after Open (one chunk per turn, between chunk writes, until
// Close), so a log written before key tables, or with LookupKeys unset,
// gets them.
//
// Lookup looks in the refs in memory, then in the chunks from the newest
// backwards: a chunk whose keyed records' store times miss the window is
// not read; otherwise its bloom filter and fences are read, and, if the
// filter may hold the key, the pages that may hold its pairs, found by a
// binary search in the fences (usually one page of 4 KiB). It returns the
// log offsets of the records with a key of that hash in the window, newest
// first, each once, at most Limit; Next is the last one returned when
// Limit is reached (the next call goes on below it), where to go on when
// MaxBytes of key tables and scanned records were read (a chunk is looked
// in whole or not at all, the first one always), and 0 once the log's
// start is reached. Records deleted by retention are not returned. A hash may
// collide: the caller reads each record and checks its key. A lookup holds
// no lock while it reads files: it holds each key table by a reference, as
// a read holds a chunk, and fails with ErrReadTruncated if it raced with a
// truncation. Measured (BenchmarkLookup, 1 GiB, 1M keys, page cache warm):
// a lookup of one key over the whole window reads about 1.4 MB (the 16
// chunks' bloom filters and fences, a page where a filter says maybe) and
// takes about 0.2 ms at p50, 0.4 ms at p99.
//
// # Recovery
//
// Open first reads the index chunks (their headers and directories) and
// keeps the chain it can trust: chunks that follow each other from the
// log's first byte, each ending at or before the checkpoint (so covering
// only synced records), with queue offsets that continue from chunk to
// chunk, the last one ending on a record the log holds with the CRC the
// chunk recorded, and its snapshot reading back. It removes every other
// chunk file. The deduplication state is the last chunk's snapshot, less
// what retention deleted since (runs before a queue's first offset).
// Records before the chain's end are neither read nor checked again: a
// corrupt one is found by the read that reaches it (a *CorruptError), as
// is a damaged chunk entry, since every read checks that the record it
// reads is the one the index names. Removing the index directory is always
// safe: Open then rebuilds it from every record, checking each. So Open
// reads chunk headers (one per IndexChunkBytes of log) and, when the
// checkpoint is sound, at most about IndexChunkBytes plus a FlushInterval's
// appends of records, however long the log: a clean Close leaves none to
// read. A chunk whose contents do not check out is dropped and rebuilt; one
// that cannot be read (an I/O error) fails Open.
//
// From the chain's end on, Open reads every segment in order and checks
// every record (length, CRC, version, topic and queue-offset continuity),
// rebuilding the per-queue indexes. The first bad record decides:
//
//   - at or past the checkpoint, it is a torn or corrupt tail: the log is
//     truncated there and later segments are removed (only records that were
//     never flushed can be lost, which is the contract of async flush);
//   - before the checkpoint, it is corruption in the middle of durable data:
//     Open fails with a *CorruptError naming the offset, and truncates nothing.
//
// A read error is never taken for a bad record: Open fails and truncates
// nothing. Records are checked against the format's limits, not against
// Config.MaxPayloadSize, which limits new appends only.
//
// # Pre-touching
//
// With Config.Pretouch (on by default with FlushAsync), a goroutine writes
// zeros into the active segment up to 8 MiB ahead of the writer, so that
// appends overwrite pages the file already has rather than extend it. The
// zeros are never part of the log: the segment's size is the log's, a roll
// cuts the old segment's zeros before the next segment is created (so
// zeros can only follow the log's end, in its last segment), Close and
// Truncate cut them, and recovery cuts them as it cuts a torn tail (they
// are past the checkpoint: the log's end is), logging them as zeros.
//
// # Group commit
//
// One goroutine at a time is the log's writer: it holds the writer token,
// places and writes a group, and owns what the writer owns (the segments'
// growth, the indexes' growth, the deduplication state, the index cuts). An
// append that finds the log idle (nothing queued, no group being written)
// is written by its own caller, as a group of its own, before AppendAsync
// returns: a lone append costs no goroutine wake-up. Appends that arrive
// while a group is being written are queued, and the writer goroutine,
// woken when the token is given back, takes everything queued as one group
// (first letting appenders that are already runnable join it). The token
// and the queue change together under one lock, and an append is written
// inline only when nothing is queued, so appends are written in the order
// they were queued, whoever writes them. A truncation always waits for the
// writer goroutine.
//
// # Flush
//
// FlushAsync (the default) syncs every Config.FlushInterval and on Close;
// an append completes once written to the page cache, unless it asks to wait
// for its flush. FlushSync completes an append only after fdatasync covers
// it; appends waiting at the same time share one sync. The sync runs on its
// own goroutine, so the writer keeps writing the next group meanwhile.
//
// # Idempotent appends
//
// An Entry with a Producer stamp (a producer id other than 0, an epoch and
// a sequence number in its queue) is checked before it is written, the way
// Kafka's log layer checks producer batches. The checks run on the writer
// (see Group commit), one group at a time in append order: two appends
// that race are decided in the order they were queued, and an entry sees the state left by every
// entry before it, earlier entries of its own group included. Per (queue,
// producer id):
//
//  1. no state (never seen, or forgotten): any sequence is accepted;
//  2. an epoch below the state's: ErrProducerFenced;
//  3. an epoch above it: only sequence 0 is accepted (a new instance
//     starts every queue at 0) and the state starts over in the new epoch;
//     another sequence gets ErrOutOfOrderSequence;
//  4. the same epoch, a sequence at or below the last one: a duplicate;
//  5. the same epoch, the last sequence plus one: accepted;
//  6. otherwise (a gap): ErrOutOfOrderSequence.
//
// The state of a pair is its epoch and its last 5 runs, a run being
// consecutive sequences stored at consecutive queue offsets (first
// sequence, last sequence, first queue offset): an accepted entry that
// continues the newest run extends it, else it starts a new run and the
// oldest is dropped. A producer alone in its queue thus stays one run;
// producers that interleave make a run per batch. A duplicate is answered
// with Position.Duplicate and the original's queue offset, log offset and
// end (from the queue's index, or from the group itself when the original
// is earlier in the same group); all three are -1 when the sequence is
// older than the remembered runs, and the log offset and end alone are -1
// when retention deleted the original. A refused entry gets Position.Err
// and -1 offsets. Neither is written nor takes a queue offset; the rest of
// the group is written as usual, all or nothing, and a group whose write
// fails leaves the state as it was. A duplicate in an append that waits for
// its flush is answered once the sync covers its group, so after its
// original. The group's own error (an I/O failure) stays the callback's
// error.
//
// The state is a pure function of the log. The stamp lives in the
// payload (the record format is unchanged): Config.ProducerStamp reads it
// back, and must give for every record appended from a stamped Entry that
// Entry's Producer. Every stored stamped record is applied without checks:
// a pair with no live state, or of another epoch, starts over at it, else
// it joins the runs as an accepted entry does. Recovery starts from the
// last index chunk's snapshot (see Index) and applies every record after
// it, and AppendRaw applies every record it copies, so a restarted
// broker and a slave (whose log is its master's bytes) hold the state the
// master held; a retried entry is answered from it after a failover too.
// Without the hook, the state of stamped appends lasts until Close.
//
// A pair not seen for Config.ProducerIdle (default 7 days), by record times
// (the store times Config.Now stamps, which a slave copies), is forgotten:
// a check at record time t treats a state last seen before t minus
// ProducerIdle as none, and at most once a minute of record time a sweep
// drops such states from memory. Sweeps only free memory; what a check
// sees does not depend on when they ran.
//
// Memory: a tracked pair costs a fixed 144-byte state (5 runs of 24 bytes,
// epoch, last-seen time) and its slot in its queue's map: about 175 bytes
// measured with many producers per queue, about 365 with a single producer
// per queue (the queue's map is then the pair's alone). It is bounded by
// the pairs seen within ProducerIdle, not by a count.
// ProducerStats reports the pairs tracked and the duplicates and refusals
// answered since Open.
//
// Recovery rebuilds it from the last index chunk's snapshot and the
// records after it, and drops from the snapshot what retention deleted
// (see Index): a producer whose last records retention deleted is
// forgotten at the next Open (rule 1 then accepts any sequence from it,
// and a retry of an entry older than the log is stored again).
//
// # Errors
//
// A failed write (ENOSPC, EIO), or a failure to create a new segment or to
// sync its directory, fails the appends of its group; the active segment is
// truncated back to where the write began and new segments are removed, so
// the log holds only whole records and later appends can succeed once space
// returns. A failed sync fails the appends waiting for it; their records stay
// in the log and may be durable, so a producer that retries may store a
// duplicate (at least once). If a failed write cannot even be undone (the
// truncation or a removal fails too), the log refuses every later append with
// ErrBroken until it is reopened; reads go on, and reopening recovers the
// log, where records of the group that broke it may then survive after all
// the others.
//
// A deletion (DeleteBefore) that fails reports the error and leaves a log
// that starts at a segment, on disk as in memory: the queue offsets are
// written before any segment goes, and segments are removed oldest first,
// stopping at the first that cannot be. Calling it again finishes the job.
// A power loss may also undo removals whose directory was not synced yet;
// either way the queues file may hold offsets for a later start than the
// log has, which recovery ignores for every queue that has records, and
// which a truncation rewrites first.
//
// Open refuses a Config with negative sizes or intervals or an unknown flush
// mode (Config.Validate names every bad field).
//
// # Truncation
//
// Truncate cuts the log back to a record boundary: a former master that
// rejoins its group as the slave cuts the records past the offset where
// the new master's epoch began, then copies from the new master, so both
// logs end byte-identical. It runs on the writer between groups, in this
// order, each step durable before the next:
//
//  1. sync everything written (the records before the offset must survive
//     a crash, and the checkpoint will claim them), and rewrite the queues
//     file, if there is one, for the log's start (a deletion that did not
//     finish, see Errors, leaves it for a later start, which would give a
//     queue whose every record is cut an offset past them);
//  2. rebuild, from the index chunks that end at or before the offset and
//     the records after the last of them, the per-queue indexes and the
//     producer deduplication state, as recovery would; an offset inside a
//     record is refused here (ErrNotBoundary);
//  3. write the side file: the cut records, byte for byte, to a temporary
//     name, synced, renamed, its directory synced;
//  4. remove the index chunks that end past the offset, and sync their
//     directory (they describe records about to be cut);
//  5. move the checkpoint back to the offset and sync it;
//  6. truncate the segment holding the offset there and sync it, then
//     remove the later segments, the last first, and sync the directory.
//
// A failure up to step 5 changes nothing but the index on disk (which a
// later Open rebuilds from the log). A crash before step 6 leaves the
// old log; a crash during or after it leaves the segment holding the offset
// cut, and the later segments, which no longer continue the log past its
// checkpoint, are removed by recovery (see Recovery): Open finds the log
// either unchanged or cut exactly at the offset. A failure in step 6 breaks
// the log (ErrBroken) until it is reopened. Reads that race with the cut
// fail with ErrReadTruncated rather than return bytes that new appends may
// have replaced: Truncate moves a generation number, under the lock reads
// plan with, when it cuts, and a read checks it after reading its bytes.
//
// # Side files
//
// A side file holds the records a truncation cut, in the record format of
// the segments, back to back, exactly as the log held them. It is named by
// SideFileName: the log offset of its first record as 20 decimal digits,
// "-epoch-", the epoch of the master whose log prevailed, ".log" (for
// instance truncated/00000000000000004096-epoch-3.log), so ReadRecordFile
// can give each record its log offset; it must not be in the log
// directory itself (a subdirectory such as "truncated" is fine: recovery
// only reads the directory's own *.log files). ReadRecordFile (and
// ReadRecords, on a stream) reads a side file or a segment record by
// record, checking every record. `ferryctl truncated FILE` prints one.
package storage
