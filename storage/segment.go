package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/ferrymq/ferrymq/storage/vfs"
)

// segment is one segment file: the records from log offset base on.
type segment struct {
	base int64
	name string
	f    vfs.File
	size int64 // bytes written; changed by the writer under Log.mu

	// Readers and the flusher hold a reference while they use the file
	// outside Log.mu; a segment removed by retention is closed by whoever
	// drops the last reference.
	refs      atomic.Int32
	removed   atomic.Bool
	closeOnce sync.Once
}

// acquire takes a reference; Log.mu must be held (read or write) so the
// segment cannot be removed meanwhile.
func (s *segment) acquire() *segment {
	s.refs.Add(1)
	return s
}

func (s *segment) release() {
	if s.refs.Add(-1) == 0 && s.removed.Load() {
		s.close()
	}
}

func (s *segment) close() { s.closeOnce.Do(func() { _ = s.f.Close() }) }

func (l *Log) segmentPath(base int64) string {
	return filepath.Join(l.cfg.Dir, fmt.Sprintf("%020d.log", base))
}

// createSegment creates the segment file starting at base and makes its
// name durable. If the file was created but its directory could not be
// synced, it returns the segment with the error: the caller removes it.
func (l *Log) createSegment(base int64) (*segment, error) {
	name := l.segmentPath(base)
	f, err := l.fs.Create(name)
	if err != nil {
		return nil, fmt.Errorf("storage: create segment %s: %w", name, err)
	}
	s := &segment{base: base, name: name, f: f}
	if err := l.fs.SyncDir(l.cfg.Dir); err != nil {
		return s, fmt.Errorf("storage: sync dir %s: %w", l.cfg.Dir, err)
	}
	return s, nil
}

// discard closes and removes a segment that never held a published record.
func (l *Log) discard(s *segment) error {
	s.close()
	if err := l.fs.Remove(s.name); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", s.name, err)
	}
	return nil
}

// publish makes a written group visible to readers: new segments, sizes,

// segment's readable bytes end (as a log offset). l.mu is held.
func (l *Log) segmentFor(off int64) (*segment, int64, bool) {
	i := sort.Search(len(l.segments), func(i int) bool { return l.segments[i].base > off }) - 1
	if i < 0 {
		return nil, 0, false
	}
	s := l.segments[i]
	return s, s.base + s.size, true
}
