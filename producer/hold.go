package producer

import (
	"fmt"
	"slices"
	"time"

	"github.com/ferrymq/ferrymq/protocol"
)

// hold keeps a line busy for a retry's backoff, or until changed closes (a
// new master or epoch, the group writable again, or the queue routed to
// another group: the line goes at once, its backoff reset), then lets it
// go: records whose delivery deadline passed meanwhile fail; if the cached
// route sends the queue to another group, its records move there
// (moveOff); if it says the queue's group no longer takes writes, those
// that may move are dispatched again (leaveUnwritable). Runs under
// life.wg.
func (s *sink) hold(ln *line, d time.Duration, changed <-chan struct{}) {
	defer s.life.wg.Done()
	t := time.NewTimer(d)
	woken := false
	select {
	case <-t.C:
	case <-changed:
		t.Stop()
		woken = true
	case <-s.life.stop:
		t.Stop()
		return // Close fails what is left
	}
	q, version, known := s.host.queueRoute(ln.key.topic, ln.key.queue)
	s.mu.Lock()
	if woken {
		ln.fails = 0
	}
	if known && q.Group == s.group {
		s.see(viewOf(version, q))
	}
	s.expireLine(ln, time.Now(), ln.lastErr)
	var moved []*record
	if known && q.Group != s.group {
		moved = s.moveOff(ln)
	}
	if known && !q.Writable {
		s.leaveUnwritable(ln)
	}
	s.release(ln)
	s.sendLocked()
	s.unlock()
	for _, rec := range moved {
		s.host.dispatch(rec, true) // in order: a key's records pass its gate one after the other
	}
}

// moveOff empties a line whose queue the route gives to another group (it
// moved off a retired group) and returns its records, to be dispatched
// again, keyed ones too, in order, unstamped (the new group knows nothing
// of this producer's sequences), flagged if an attempt's outcome was
// unknown. Under mu.
func (s *sink) moveOff(ln *line) []*record {
	moved := slices.Clone(ln.recs)
	for _, rec := range moved {
		ln.bytes -= rec.size
		rec.unstamp(s.stats)
	}
	clear(ln.recs)
	ln.recs = ln.recs[:0]
	return moved
}

// leaveUnwritable dispatches again the records of a line whose group the
// route shows not taking writes and that may move, unstamped (flagged if
// an attempt's outcome was unknown): the line's records up to the last one
// whose stamp may be stored and that waits for the group (keyed, or
// keepsUnknown) stay, with their stamps; after them, keyed records stay and
// the others may move. Under mu.
func (s *sink) leaveUnwritable(ln *line) {
	now := s.cfg.clock.Now()
	kept := 0
	for i, rec := range ln.recs {
		if rec.maybe && rec.gen != 0 && (s.cfg.stays(rec) || s.keepsUnknown(rec, now)) {
			kept = i + 1
		}
	}
	keep := ln.recs[:0]
	for i, rec := range ln.recs {
		if i < kept || s.cfg.stays(rec) {
			keep = append(keep, rec)
			continue
		}
		ln.bytes -= rec.size
		rec.unstamp(s.stats)
		err := rec.lastErr
		if err == nil {
			err = &protocol.Error{Status: protocol.StatusReadOnly, Message: fmt.Sprintf("group %s is read-only in the route", s.group)}
		}
		s.retry = append(s.retry, ended{rec: rec, err: err})
	}
	clear(ln.recs[len(keep):])
	ln.recs = keep
}
