package storage

import "fmt"

// appendReq is one queued append (of entries or of raw records) and, once
// the writer has placed it, its result.
type appendReq struct {
	entries []Entry
	// raw != nil makes this a raw append of whole records at rawOffset.
	raw       []byte
	rawOffset int64
	flush     bool
	done      func([]Position, error)
	trunc     *truncateReq // non-nil: a Truncate, run by the writer between groups
	run       func()       // non-nil: run by the writer between groups (Watch)
	base      *baseReq     // non-nil: a SetQueueBase, run by the writer between groups
	queued    bool         // never written inline by its caller (AppendQueued)

	positions []Position
	err       error
	end       int64
}

// Append appends entries as one group and waits until they are written (and
// synced, in FlushSync mode or when flush is true). It returns each entry's
// position, in order. Either every entry is appended or none is, except
// stamped entries answered as duplicates or refused (Position.Duplicate,
// Position.Err), which are not written and take no queue offset.
func (l *Log) Append(entries []Entry, flush bool) ([]Position, error) {
	type res struct {
		pos []Position
		err error
	}
	ch := make(chan res, 1)
	l.AppendAsync(entries, flush, func(p []Position, err error) { ch <- res{p, err} })
	r := <-ch
	return r.pos, r.err
}

// AppendAsync queues entries as one group and calls done exactly once with
// their positions or an error, when Append would have returned. done runs on
// the goroutine that wrote the group or synced it: the log's writer or
// flusher goroutine, or the caller itself, before AppendAsync returns, when
// the log was idle and the caller wrote its group inline (see enqueue). It
// must be quick and must not call back into the log's append methods.
func (l *Log) AppendAsync(entries []Entry, flush bool, done func([]Position, error)) {
	l.appendAsync(entries, flush, false, done)
}

// AppendQueued is AppendAsync that never writes the group on the caller's
// goroutine: the writer goroutine takes it, with whatever else is queued,
// and done runs there. A caller that appends under a lock of its own (to
// keep its appends in the order it admits them) holds the lock only for
// the queuing, and its appends still share group commits.
func (l *Log) AppendQueued(entries []Entry, flush bool, done func([]Position, error)) {
	l.appendAsync(entries, flush, true, done)
}

func (l *Log) appendAsync(entries []Entry, flush, queued bool, done func([]Position, error)) {
	for _, e := range entries {
		if err := l.checkEntry(e); err != nil {
			done(nil, err)
			return
		}
	}
	if len(entries) == 0 {
		done(nil, nil)
		return
	}
	l.enqueue(&appendReq{entries: entries, flush: flush, done: done, queued: queued})
}

func (l *Log) checkEntry(e Entry) error {
	if e.Topic == "" || len(e.Topic) > maxTopicLen {
		return fmt.Errorf("%w: topic must be 1 to %d bytes, got %d", ErrInvalidEntry, maxTopicLen, len(e.Topic))
	}
	if len(e.Payload) > l.cfg.MaxPayloadSize {
		return fmt.Errorf("%w: payload of %d bytes over the cap %d", ErrInvalidEntry, len(e.Payload), l.cfg.MaxPayloadSize)
	}
	if e.Producer.ID != 0 && e.Producer.Seq < 0 {
		return fmt.Errorf("%w: negative producer sequence %d", ErrInvalidEntry, e.Producer.Seq)
	}
	return nil
}

// AppendRaw appends whole records copied from another log (a slave copying
// its master): data must start at this log's end offset, hold only whole,
// valid records, and continue every queue's offsets (a queue the log holds
// no record of may start past its next offset: its master set a base,
// queuebase.go). The log then holds the same bytes at the same offsets, and
// the stamps of its records (Config.ProducerStamp) join the deduplication
// state without checks. It returns the new end offset.
func (l *Log) AppendRaw(offset int64, data []byte, flush bool) (int64, error) {
	if len(data) == 0 {
		return l.end.Load(), nil
	}
	type res struct {
		end int64
		err error
	}
	ch := make(chan res, 1)
	req := &appendReq{raw: data, rawOffset: offset, flush: flush}
	req.done = func(_ []Position, err error) { ch <- res{req.end, err} }
	l.enqueue(req)
	r := <-ch
	return r.end, r.err
}

// enqueue hands req to the writer. When the log is idle (nothing queued,
// no group being written) the calling goroutine takes the writer token and
// writes req as a group of its own, inline: a lone append then costs no
// goroutine wake-up. Otherwise req joins the queue, which the writer
// goroutine drains in groups. The token and the queue change together under
// qmu, and a caller takes the token only when the queue is empty and nobody
// holds it, so every append queued before req has been written when req is:
// appends are written in the order enqueue took them, whoever writes them,
// and exactly one goroutine at a time is the writer. A truncation always
// goes to the writer goroutine.
func (l *Log) enqueue(req *appendReq) {
	l.qmu.Lock()
	if l.closing {
		l.qmu.Unlock()
		req.done(nil, ErrClosed)
		return
	}
	if !l.writing && len(l.queue) == 0 && req.trunc == nil && !req.queued {
		l.writing = true
		l.qmu.Unlock()
		l.writeBatch([]*appendReq{req})
		l.qmu.Lock()
		l.writing = false
		// Appends queued meanwhile (and Close, which waits for the writer
		// goroutine) are the writer goroutine's from here.
		wake := len(l.queue) > 0 || l.closing
		l.qmu.Unlock()
		if wake {
			l.wakeWriter()
		}
		return
	}
	l.queue = append(l.queue, req)
	// A writer that holds the token takes the queue when it is done; only
	// an idle log needs its writer goroutine woken.
	idle := !l.writing
	l.qmu.Unlock()
	if idle {
		l.wakeWriter()
	}
}

func (l *Log) wakeWriter() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}
