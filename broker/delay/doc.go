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
// named by the bucket's start) of fixed-size items {kind, size, dueAt, at,
// ref, CRC} appended as the index follows the log, and a checkpoint
// (written to a temporary name, synced, renamed, directory synced): the log
// offset W up to which every delay record is in the synced bucket files,
// the next queue offset of every delay queue, and per bucket and per topic
// the counts as of W. W never passes the log's FlushedOffset. Open loads
// the checkpoint and follows the log from W to its end; items at or past W
// found in bucket files are ignored (they are derived again), and an item
// that appears twice counts once. A missing or bad checkpoint rebuilds the
// index from the whole log (only the delay queues are read).
//
// The zero value is not usable; Open makes an Index. All methods are safe
// for concurrent use.
package delay
