package vfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// File is an open file used with positional reads and writes only. See the
// package documentation for what the storage package expects of it.
type File interface {
	io.ReaderAt
	io.WriterAt
	// Sync makes the file's data durable (fdatasync where the OS has it).
	Sync() error
	// Truncate changes the file's size.
	Truncate(size int64) error
	// Size returns the file's current size.
	Size() (int64, error)
	Close() error
	// Name is the path the file was opened with.
	Name() string
}

// FS creates, opens, renames, removes and lists files. See the package
// documentation for what the storage package expects of it.
type FS interface {
	// Create creates a new file, failing if it exists.
	Create(name string) (File, error)
	// OpenRW opens an existing file for reading and writing.
	OpenRW(name string) (File, error)
	Remove(name string) error
	// Rename renames a file, replacing newname if it exists.
	Rename(oldname, newname string) error
	// List returns the names (not paths) of the entries of dir, sorted.
	List(dir string) ([]string, error)
	// MkdirAll creates dir and any missing parents. Like mkdir(2), it
	// need not make them durable: a directory survives a power loss once
	// its parent is synced (see MkdirAllDurable).
	MkdirAll(dir string) error
	// SyncDir makes dir's entries (created, removed and renamed files and
	// directories) durable.
	SyncDir(dir string) error
}

// Default is the operating system's file system. Its File.Sync is
// fdatasync where the system has it (data and size, not timestamps). It
// creates files FileMode and directories DirMode: a log holds message
// bodies, which no other local user may read.
var Default FS = osFS{}

// The modes Default creates files and directories with (before the
// process's umask, which can only take bits away).
const (
	FileMode os.FileMode = 0o600
	DirMode  os.FileMode = 0o700
)

type osFS struct{}

type osFile struct{ *os.File }

func (f osFile) Sync() error { return fdatasync(f.File) }

func (f osFile) Size() (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

func (osFS) Create(name string) (File, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, FileMode)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) OpenRW(name string) (File, error) {
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) Remove(name string) error { return os.Remove(name) }

func (osFS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }

func (osFS) List(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names, nil
}

func (osFS) MkdirAll(dir string) error { return os.MkdirAll(dir, DirMode) }

// MkdirAllDurable creates dir and any missing parents in fsys and makes the
// whole path durable before it returns: a power loss afterwards leaves dir
// in place. It syncs the parent of every component of dir (of dir itself
// and of each directory above it, up to the root or, for a relative path,
// to "."), whether MkdirAll created it now or it existed: a process that
// died between creating a directory and syncing its parent leaves one that
// exists but would not survive a power loss. The parent of a component
// that existed is skipped if it cannot be synced for want of permission (a
// directory the caller may only pass through).
//
// It costs a List of dir and a SyncDir per component: call it where a
// directory is created or first used, not per write.
func MkdirAllDurable(fsys FS, dir string) error {
	dir = filepath.Clean(dir)
	created := map[string]bool{}
	for d := dir; ; {
		_, err := fsys.List(d)
		if !errors.Is(err, fs.ErrNotExist) {
			break // it exists (or is not a directory, which MkdirAll reports)
		}
		created[d] = true
		p := filepath.Dir(d)
		if p == d {
			break
		}
		d = p
	}
	if err := fsys.MkdirAll(dir); err != nil {
		return err
	}
	var path []string // dir and the directories above it
	for d := dir; filepath.Dir(d) != d; d = filepath.Dir(d) {
		path = append(path, d)
	}
	for i := len(path) - 1; i >= 0; i-- { // from the root down
		d := path[i]
		err := fsys.SyncDir(filepath.Dir(d))
		if err != nil && !created[d] && errors.Is(err, fs.ErrPermission) {
			continue
		}
		if err != nil {
			return fmt.Errorf("make %s durable: %w", dir, err)
		}
	}
	return nil
}

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(filepath.Clean(dir))
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, os.ErrInvalid) {
		return nil // some file systems cannot sync a directory
	}
	return err
}
