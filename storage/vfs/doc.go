// Package vfs is the file-system interface of ferrymq's commit log
// (package storage). Every disk access of the log goes through an FS, so a
// program can put the log on another file system, and a test can make the
// disk fail on purpose.
//
// Default is the operating system's file system. ErrorFS wraps any FS and
// makes chosen operations fail: by kind of operation, by path and by count
// ("the 3rd write to a segment file", "every sync after the 10th"), with an
// error that errors.Is matches with ErrInjected and with a chosen cause such
// as syscall.ENOSPC. It is how the storage tests check that a full disk, a
// failed sync or a failed rename loses no acknowledged record.
//
// MemFS is an in-memory FS that models what a power loss keeps (see
// Power loss below); MkdirAllDurable creates a directory so that a power
// loss cannot take it.
//
// # Implementing FS
//
// The log relies on these properties of an FS and its Files:
//
//   - Files are used with positional reads and writes only (ReadAt,
//     WriteAt); the log never seeks. ReadAt follows io.ReaderAt: reading
//     past the end of the file returns io.EOF.
//   - A File is used from several goroutines at once: reads run while the
//     writer writes and while another goroutine syncs. Its methods must be
//     safe for that, as an *os.File is.
//   - Sync makes the file's written data durable; SyncDir makes the
//     creations, removals and renames in a directory durable. An FS that
//     keeps no data across a crash may make both do nothing.
//   - MkdirAll, like mkdir(2), need not make what it creates durable: a
//     directory survives a power loss once its parent is synced, and so
//     does everything in it. The log creates its directories with
//     MkdirAllDurable.
//   - Create fails if the file exists (an error matching fs.ErrExist).
//     OpenRW and Remove of a missing file fail with an error matching
//     fs.ErrNotExist.
//   - Rename replaces newname if it exists, atomically: after a crash the
//     name refers to the old file or the new one, never to neither.
//   - A removed file stays readable and writable through the Files already
//     open on it until they are closed, as on POSIX systems: retention
//     removes a segment that a reader may still be reading.
//   - List returns the names of a directory's entries (not their paths),
//     sorted.
//
// # Power loss
//
// A power loss keeps of a file what its last Sync made durable, and of a
// directory the entries its last SyncDir made durable; a directory whose
// entry in its parent was not synced is lost with everything in it. So
// whoever creates, renames or removes a file whose existence matters syncs
// its directory before relying on it (before acknowledging a record written
// to it, before counting a checkpoint), and creates directories with
// MkdirAllDurable.
//
// MemFS holds that model. It keeps, per file, the bytes as of its last
// Sync and the writes and truncations since, in order; per directory, the
// entries as of its last SyncDir and the creations, removals and renames
// since, in order. CrashClone returns the file system a power loss would
// leave, everything in it durable, and leaves the MemFS as it was;
// CutPower takes that image and makes every later call fail with
// ErrPowerOff, as a machine without power does nothing more; CutPowerAt
// arms it for the nth mutating call from now (a creation, removal, rename,
// MkdirAll, SyncDir, write, sync or truncation), which does not run. With
// CrashOptions.Rand the image keeps a random part of what was not synced,
// as a page cache that wrote some of it back does: each page of a file is
// as of its own random number of the file's unsynced changes (a page a
// truncation dropped whole is not written back, so that truncation leaves
// it as it was unless a later write touches it), the file's size is as of
// another random number of them, and each directory holds its entries as
// of a random number of its unsynced changes (a rename within a directory
// is one change; across directories, a removal from one and a creation in
// the other). Without Rand nothing unsynced survives. MemFS does not model
// a disk that fails, or a sync that reports success and loses data; wrap
// it in an ErrorFS for failures.
//
// Paths are those of package path/filepath: the log joins its directory and
// its file names with filepath.Join.
package vfs
