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
// assigned at append, in log order.
//
// # Files
//
// A log directory holds segment files named by the log offset of their first
// byte, as 20 decimal digits with the suffix ".log", one "checkpoint" file
// and, once retention has deleted segments, one "queues" file (see
// DeleteBefore). Segments are contiguous: a segment ends where the next
// begins. A
// record never spans two segments: when the next record would make the
// active segment larger than Config.SegmentSize, a new segment starts at the
// current end offset (so segments may be a little shorter than the size).
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
// # Recovery
//
// Open reads every segment in order and checks every record (length, CRC,
// version, topic and queue-offset continuity), rebuilding the per-queue
// indexes. The first bad record decides:
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
// # Flush
//
// FlushAsync (the default) syncs every Config.FlushInterval and on Close;
// an append completes once written to the page cache, unless it asks to wait
// for its flush. FlushSync completes an append only after fdatasync covers
// it; appends waiting at the same time share one sync. The sync runs on its
// own goroutine, so the writer keeps writing the next group meanwhile.
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
//
// Open refuses a Config with negative sizes or intervals or an unknown flush
// mode (Config.Validate names every bad field).
package storage
