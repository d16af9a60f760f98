package storage

import (
	"fmt"
	"time"
)

// flushWaiter is an append (or a Flush) waiting for the sync that covers end.
type flushWaiter struct {
	end int64
	req *appendReq
}

// Flush syncs everything written so far and returns when it is durable.
func (l *Log) Flush() error {
	ch := make(chan error, 1)
	req := &appendReq{done: func(_ []Position, err error) { ch <- err }}
	l.fmu.Lock()
	req.end = l.end.Load()
	l.waiters = append(l.waiters, flushWaiter{end: req.end, req: req})
	l.fmu.Unlock()
	select {
	case l.flushWake <- struct{}{}:
	default:
	}
	return <-ch
}

// flusher syncs on demand (flush waiters) and every FlushInterval, and once
// more when the log closes.
func (l *Log) flusher() {
	defer close(l.flushDone)
	tick := time.NewTicker(l.cfg.FlushInterval)
	defer tick.Stop()
	for {
		select {
		case <-l.flushWake:
		case <-tick.C:
		case <-l.stopFlush:
			if !l.crashed {
				l.syncOnce()
			}
			l.fmu.Lock()
			rest := l.waiters
			l.waiters = nil
			l.fmu.Unlock()
			for _, w := range rest {
				w.req.done(nil, ErrClosed)
			}
			return
		}
		l.syncOnce()
	}
}

// syncOnce syncs every segment holding unsynced bytes, advances the flushed
// offset and the checkpoint, and releases the waiters it covers.
func (l *Log) syncOnce() {
	l.syncMu.Lock()
	target := l.end.Load()
	var err error
	if target > l.flushed.Load() {
		start := time.Now()
		err = l.syncSegments(l.flushed.Load())
		took := time.Since(start)
		l.Flushes.Add(1)
		l.FlushNanos.Add(int64(took))
		if l.cfg.OnSync != nil {
			l.cfg.OnSync(took)
		}
		if err == nil {
			l.flushed.Store(target)
			l.writeCheckpoint(target)
			l.wakeIndexer()
		} else {
			l.log.Warn("commit log sync failed", "error", err)
		}
	}
	flushed := l.flushed.Load()
	l.syncMu.Unlock()
	l.fmu.Lock()
	i := 0
	for i < len(l.waiters) && l.waiters[i].end <= target {
		i++
	}
	done := make([]flushWaiter, i)
	copy(done, l.waiters[:i])
	l.waiters = append(l.waiters[:0], l.waiters[i:]...)
	l.fmu.Unlock()
	for _, w := range done {
		switch {
		case w.end <= flushed:
			w.req.done(w.req.positions, nil)
		default:
			w.req.done(nil, fmt.Errorf("storage: flush: %w", err))
		}
	}
}

// syncSegments syncs every segment from the one holding from to the last.
func (l *Log) syncSegments(from int64) error {
	l.mu.RLock()
	var segs []*segment
	for i, s := range l.segments {
		if i == len(l.segments)-1 || l.segments[i+1].base > from {
			segs = append(segs, s.acquire())
		}
	}
	l.mu.RUnlock()
	defer func() {
		for _, s := range segs {
			s.release()
		}
	}()
	for _, s := range segs {
		if err := s.f.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", s.name, err)
		}
	}
	return nil
}
