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
// Paths are those of package path/filepath: the log joins its directory and
// its file names with filepath.Join.
package vfs
