package storage

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
)

// Pre-touching (Config.Pretouch): a goroutine writes zeros into the active
// segment ahead of the writer, so that the writer's appends land on pages
// the file already has (in the page cache, with blocks allocated) instead
// of extending the file a group at a time, as RocketMQ warms its mapped
// files. The zeros past the log's end are never part of the log: the
// segment's size in memory is the log's, a roll cuts the old segment's
// zeros before the next segment is created, Close cuts them, Truncate cuts
// them with the records, and recovery cuts them as the end of the log.
//
// The writer and the toucher never write the same bytes: the toucher writes
// only at or past touched, under pt.mu, and at or past wend, the end the
// writer announced; the writer writes below touched without the lock, and
// past it only after announcing its end under pt.mu.
type pretoucher struct {
	window int64 // how far ahead of the writer to touch; 0: off

	mu      sync.Mutex
	seg     *segment     // the active segment; nil: nothing to touch
	touched atomic.Int64 // segment offset up to which seg holds (or may hold) zeros or records
	wend    atomic.Int64 // segment offset up to which the writer writes
	failed  bool         // a zero write failed: stop touching this segment

	wake chan struct{}
	stop chan struct{}
	done chan struct{}
}

const pretouchChunk = 1 << 20

var zeroChunk = make([]byte, pretouchChunk)

func (p *pretoucher) on() bool { return p.window > 0 }

// start starts the toucher on the active segment s, whose size is size.
func (l *Log) startPretouch(s *segment) {
	p := &l.pt
	if !p.on() {
		return
	}
	p.wake, p.stop, p.done = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	p.setSegment(s, s.size)
	go l.pretouch()
	p.kick()
}

func (p *pretoucher) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// setSegment makes s, whose bytes end at size, the segment to touch;
// p.mu is held or the toucher is not running.
func (p *pretoucher) setSegment(s *segment, size int64) {
	p.seg, p.failed = s, false
	p.touched.Store(size)
	p.wend.Store(size)
}

// pretouch runs until Close, touching up to window past the writer's end.
func (l *Log) pretouch() {
	p := &l.pt
	defer close(p.done)
	for {
		select {
		case <-p.wake:
		case <-p.stop:
			return
		}
		for l.touchOnce() {
			select {
			case <-p.stop:
				return
			default:
			}
		}
	}
}

// touchOnce writes one chunk of zeros, if one is due; it reports whether
// it did.
func (l *Log) touchOnce() bool {
	p := &l.pt
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.seg
	if s == nil || p.failed {
		return false
	}
	at := max(p.touched.Load(), p.wend.Load())
	limit := min(p.wend.Load()+p.window, l.cfg.SegmentSize)
	if at >= limit {
		return false
	}
	n := min(int64(pretouchChunk), limit-at)
	if _, err := s.f.WriteAt(zeroChunk[:n], at); err != nil {
		// Part of it may be written: touched then says how far zeros may
		// reach, for roll and cut to take them away. The writer extends
		// the file itself from now on, as without touching.
		p.touched.Store(at + n)
		p.failed = true
		l.log.Warn("pre-touching the segment failed; appends extend it instead", "segment", s.name, "error", err)
		return false
	}
	p.touched.Store(at + n)
	return true
}

// beforeWrite is called by the writer before it writes segment s up to
// segment offset end.
func (p *pretoucher) beforeWrite(s *segment, end int64) {
	if !p.on() {
		return
	}
	if end > p.touched.Load() {
		p.mu.Lock() // waits for a zero write in progress
		if p.seg == s {
			p.wend.Store(end)
		}
		p.mu.Unlock()
	} else {
		p.wend.Store(end)
	}
	if end+p.window/2 > p.touched.Load() {
		p.kick()
	}
}

// roll is called by the writer before it creates the segment that follows
// prev, whose records end at segment offset end: prev loses its zeros
// first, so that a crash never leaves zeros inside the log (only a whole
// next segment may follow prev).
func (p *pretoucher) roll(prev *segment, end int64) error {
	if !p.on() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// The cut is synced before the next segment exists: a crash must not
	// bring the zeros back inside the log once records follow. If it
	// fails, prev keeps its zeros: the writer undoes the roll and goes on
	// with prev (use keeps touched).
	if err := p.cutLocked(prev, end, true); err != nil {
		return err
	}
	p.seg = nil
	return nil
}

// cutLocked cuts s back to end if zeros may reach past it, and syncs the
// cut if asked; p.mu is held.
func (p *pretoucher) cutLocked(s *segment, end int64, sync bool) error {
	if p.touched.Load() <= end {
		return nil
	}
	err := s.f.Truncate(end)
	if err == nil && sync {
		err = s.f.Sync()
	}
	if err != nil {
		return fmt.Errorf("storage: cut the zeros of %s at %d: %w", s.name, end, err)
	}
	return nil
}

// use makes s, whose bytes end at size, the segment to touch: after a
// roll, an undone roll, or a truncation.
func (p *pretoucher) use(s *segment, size int64) {
	if !p.on() {
		return
	}
	p.mu.Lock()
	touched := p.touched.Load()
	same := s == p.seg
	p.setSegment(s, size)
	if same && touched > size {
		// Still the segment being touched (a write or roll undone): its
		// zeros may reach as far as before.
		p.touched.Store(touched)
	}
	p.mu.Unlock()
	p.kick()
}

// cut stops touching and cuts the zeros of the active segment s, whose
// records end at size (Close and Truncate). The caller calls use again if
// the log goes on.
func (p *pretoucher) cut(s *segment, size int64) error {
	if !p.on() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seg = nil
	if err := p.cutLocked(s, size, false); err != nil {
		return err
	}
	p.touched.Store(size)
	return nil
}

// stopPretouch stops the toucher (Close).
func (l *Log) stopPretouch() {
	if l.pt.on() && l.pt.stop != nil {
		close(l.pt.stop)
		<-l.pt.done
	}
}

// zerosFrom reports whether segment s holds only zeros from segment offset
// at to its end (the rest of a pre-touched segment): read a chunk at a time.
func zerosFrom(s *segment, at int64) (bool, error) {
	buf := make([]byte, pretouchChunk)
	for at < s.size {
		n := min(int64(len(buf)), s.size-at)
		if _, err := s.f.ReadAt(buf[:n], at); err != nil {
			return false, err
		}
		if !bytes.Equal(buf[:n], zeroChunk[:n]) {
			return false, nil
		}
		at += n
	}
	return true, nil
}
