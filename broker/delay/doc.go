// Package delay is a broker's timer index: which delayed messages of its
// log are pending, and when each is due. It is derived from the log alone
// (the slave builds the same one from the same bytes) and costs bounded
// memory: only the entries due within Config.Window are held in memory,
// the rest are in bucket files on disk.
//
// # Records it reads
//
// Every record of an internal topic protocol.DelayTopic(t) (the log's
// queues whose topic has the prefix protocol.DelayTopicPrefix) is a
// protocol message whose Schedule says what it is:
//
//   - ScheduleDelayed: a pending entry of topic t, queue q (the record's
//     queue), due at Schedule.At. Ref -1, or the log offset of an entry that
//     retention moved (the older one is then resolved as moved, to this one).
//   - ScheduleReleaseMark: the entry at Ref (due at At) was released; the
//     mark's body is the released record's size (u32 big-endian), and the
//     released record sits right before the mark in the log.
//   - ScheduleCancelMark: the entry at Ref (due at At) was cancelled.
//
// A mark is always in the same queue as its entry, after it. Other records
// (and records of other topics) are not the index's business.
//
// # Files
//
// Config.Dir holds bucket files (one per Config.BucketWidth of due time,
// named by the bucket's start in unix milliseconds, 20 digits, ".dly") and
// far files (one per hour of due time, "far-" and the hour's start) of
// fixed-size items {kind, queue, size, dueAt, at, ref, CRC} (see item in
// bucket.go) appended as the index follows the log. An item goes to its
// bucket's file, or, when the bucket is not loaded and starts an hour or
// more after now, to its hour's far file: entries due far ahead, spread
// over many buckets, then cost a few far files to sync at a checkpoint
// rather than a file per bucket; a bucket's items are those of its file
// and those of its far file that fall in it (loading it reads both). With
// a BucketWidth that does not divide an hour there are no far files. And
// it holds a checkpoint
// (written to a temporary name, synced, renamed, directory synced; see
// checkpoint.go): the log offset W up to which every delay record is in
// the synced files, the next queue offset of every delay queue, per
// bucket the number of its file's items and its pending entries per
// queue, and per far file the number of its items, as of W. W never passes the log's FlushedOffset. An item's at
// is the log offset of the record it comes from: an entry is an item of
// its own; a mark, and a move, is a resolution item naming its entry
// (ref), in the entry's bucket. Open loads the checkpoint and follows the
// log from W to its end; it believes only the number of items the
// checkpoint gives each file: what follows them (items at or past
// W, which are derived again, or a torn write) is ignored and overwritten.
// An item that appears twice counts once. A missing or bad checkpoint, or
// one that covers more log than the log holds (it was truncated meanwhile),
// rebuilds the index from the whole log (only the delay queues are read).
//
// # Following
//
// The index follows each delay queue with its own cursor, reading records
// through the log's queue index (Log.Read), never the whole log. Follow
// reads every delay queue's records before the log's end, in steps of at
// most 32 MiB of log, and applies each step's records in log order. Items
// are buffered in memory and written to their bucket files (the page
// cache) at the next checkpoint, or sooner when 4 MiB are buffered or a
// bucket is read. When a checkpoint is due Follow first follows to the
// flushed offset F (when it is behind), then, under the index's lock,
// writes the buffered items to their files and takes a snapshot: the
// files written since the last checkpoint and the checkpoint's bytes at
// W = min(F, what it followed) (the counts as of W are the counts now less
// what the records at or past W did, which the index remembers, a few
// bytes a record, until a checkpoint passes them). A goroutine of its own
// then, without the lock, syncs those files and only then writes the
// checkpoint; W moves when it is written. One checkpoint is in flight at
// a time; Close and Reset wait for it, and one that fails breaks the
// index (Follow returns its error until Reset). A follow of many records
// (a rebuild, a backlog) writes a checkpoint between its steps when the
// journal passes 256k records. A checkpoint costs a sync per file written
// since the last one, and writes every bucket's and group's counts (about
// 50 bytes each) under the lock.
//
// A log cut behind what the index followed makes Follow fail
// (ErrLogBehind, or storage.ErrReadTruncated when the cut happens under a
// read): the caller calls Reset, which drops every file and rebuilds.
// Records below the log's start are gone: their entries are neither
// pending nor known (StateUnknown), and a bucket file whose items are all
// below both the start and W is removed at a checkpoint.
//
// # Memory
//
// Entries due more than an hour (the span of a far file) ahead are
// counted per far file, by its group: pending entries per queue, and per
// bucket of its span (a u32 each, for Buckets), not per bucket: a group
// costs about 1.6 KiB whatever it holds, so what is known of entries due
// far ahead costs memory by the hour of due time, not by the bucket or
// the entry (90 days: 2160 groups, about 3.5 MiB). A group is split, its
// buckets given their structs and counts from its far file (one read of
// it), when its span comes within an hour (or Config.Window) of now, or
// when a lookup (Claim, State), a mark or a move names an entry of it,
// or retention or PendingBefore reach its entries; it then stays split.
// Buckets, for a group not split, reads its far file only for a topic
// and a width under an hour, and only while its buckets can still be
// among the first limit. Pending counts are under a lock of their own:
// Pending never waits for the index's lock, which Follow and Due hold
// over disk reads.
//
// Every bucket the index knows costs about 200 bytes (its counts, its
// file's state), whether or not it is loaded, and the checkpoint about 50
// bytes; with far files (a BucketWidth that divides an hour) the buckets
// that have one are those within about an hour of now, those split by a
// lookup, and those before now not yet dropped.
// The entries held in memory are those of the loaded buckets: the buckets that start before
// now + Config.Window, in order, while their entries stay under
// Config.MaxLoaded (the earliest bucket with pending entries always
// loads, and Due loads a bucket whose start is due whatever MaxLoaded
// says), plus at most 4 buckets outside the window that a lookup read
// (Claim, State, a mark for one of their entries), plus claimed entries.
// A bucket whose entries are all resolved and whose time has passed is
// dropped from memory (its file stays until the log's start passes it).
//
// # Claims
//
// Due, Claim and PendingBefore claim entries; a claimed entry is pending
// (State says so) but not returned by Due, Claim or PendingBefore, nor by
// NextDue, until Release. Release(at, true) says the entry's mark (or its
// moved copy) was appended: the entry stays claimed until Follow applies
// the mark, which resolves it (whichever comes first, Release or the
// mark, the outcome is the same).
//
// A bucket file item that does not check out within the items the
// checkpoint counts is an ErrCorrupt error from the call that reads it
// (Due and NextDue, which return none, log it); a Follow that meets one
// fails until Reset.
//
// The zero value is not usable; Open makes an Index. All methods are safe
// for concurrent use.
package delay
