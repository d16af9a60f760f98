package vfs

import (
	"sync"
	"syscall"
)

// FaultFS wraps an FS and fails writes or syncs on demand, to test how a
// caller survives a full disk or an I/O error. Its zero faults pass every
// call through. It is safe for concurrent use.
type FaultFS struct {
	FS FS

	mu sync.Mutex
	// writeErr fails every WriteAt; partial writes this many bytes first.
	writeErr    error
	partial     int
	syncErr     error
	writes      int
	syncs       int
	syncedSizes map[string]int64
}

// NewFaultFS wraps fs.
func NewFaultFS(fs FS) *FaultFS {
	return &FaultFS{FS: fs, syncedSizes: make(map[string]int64)}
}

// FailWrites makes every later WriteAt fail with err (nil stops failing)
// after writing the first partial bytes of its buffer, as a disk filling up
// mid-write does.
func (f *FaultFS) FailWrites(err error, partial int) {
	f.mu.Lock()
	f.writeErr, f.partial = err, partial
	f.mu.Unlock()
}

// FailSyncs makes every later Sync fail with err (nil stops failing).
func (f *FaultFS) FailSyncs(err error) {
	f.mu.Lock()
	f.syncErr = err
	f.mu.Unlock()
}

// ErrNoSpace is the error of a full disk.
var ErrNoSpace error = syscall.ENOSPC

// Counts returns how many writes and syncs succeeded.
func (f *FaultFS) Counts() (writes, syncs int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.writes, f.syncs
}

// SyncedSize returns the size file name had at its last successful Sync: the
// bytes a machine crash could not take away.
func (f *FaultFS) SyncedSize(name string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.syncedSizes[name]
}

func (f *FaultFS) wrap(file File, err error) (File, error) {
	if err != nil {
		return nil, err
	}
	return &faultFile{File: file, fs: f}, nil
}

func (f *FaultFS) Create(name string) (File, error) { return f.wrap(f.FS.Create(name)) }
func (f *FaultFS) OpenRW(name string) (File, error) { return f.wrap(f.FS.OpenRW(name)) }
func (f *FaultFS) Remove(name string) error         { return f.FS.Remove(name) }
func (f *FaultFS) Rename(o, n string) error         { return f.FS.Rename(o, n) }
func (f *FaultFS) List(dir string) ([]string, error) {
	return f.FS.List(dir)
}
func (f *FaultFS) MkdirAll(dir string) error { return f.FS.MkdirAll(dir) }
func (f *FaultFS) SyncDir(dir string) error  { return f.FS.SyncDir(dir) }

type faultFile struct {
	File
	fs *FaultFS
}

func (ff *faultFile) WriteAt(p []byte, off int64) (int, error) {
	ff.fs.mu.Lock()
	err, partial := ff.fs.writeErr, ff.fs.partial
	ff.fs.mu.Unlock()
	if err != nil {
		n := min(partial, len(p))
		if n > 0 {
			if _, werr := ff.File.WriteAt(p[:n], off); werr != nil {
				return 0, werr
			}
		}
		return n, err
	}
	n, werr := ff.File.WriteAt(p, off)
	if werr == nil {
		ff.fs.mu.Lock()
		ff.fs.writes++
		ff.fs.mu.Unlock()
	}
	return n, werr
}

func (ff *faultFile) Sync() error {
	ff.fs.mu.Lock()
	err := ff.fs.syncErr
	ff.fs.mu.Unlock()
	if err != nil {
		return err
	}
	size, serr := ff.File.Size()
	if serr != nil {
		return serr
	}
	if err := ff.File.Sync(); err != nil {
		return err
	}
	ff.fs.mu.Lock()
	ff.fs.syncs++
	ff.fs.syncedSizes[ff.Name()] = size
	ff.fs.mu.Unlock()
	return nil
}
