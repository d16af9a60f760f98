package producer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// buffer accounts for the records between SendAsync and their promises:
// at most MaxBuffered records and bytes, a sender waiting for room (or
// failing at once with FailWhenFull), and each record's completion, once.
type buffer struct {
	maxRecords   int
	maxBytes     int64
	failWhenFull bool
	stop         <-chan struct{} // closed by Close: waiters give up
	kick         func()          // has every sink send what may leave now

	mu      sync.Mutex
	records int
	bytes   int64
	waiters int
	space   chan struct{} // closed when room frees and someone waits

	flushing atomic.Int32
	// starved counts senders waiting for buffer room: while one waits,
	// sinks send what is ready without lingering (nothing joins it until
	// room frees, which needs answers to what is buffered).
	starved atomic.Int32
}

func newBuffer(cfg *config, stop <-chan struct{}, kick func()) *buffer {
	return &buffer{maxRecords: cfg.maxRecords, maxBytes: cfg.maxBytes, failWhenFull: cfg.failWhenFull,
		stop: stop, kick: kick, space: make(chan struct{})}
}

// hurry reports whether sinks should send what is ready without lingering:
// a Flush waits, or a sender waits for room.
func (b *buffer) hurry() bool { return b.flushing.Load() > 0 || b.starved.Load() > 0 }

// acquire takes buffer room for one message. When there is none, the
// sinks send what lingers at once (as Kafka's accumulator does when its
// memory is exhausted): the sender adds nothing more until answers free
// room, so lingering would only delay them.
func (b *buffer) acquire(ctx context.Context, size int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	room := func() bool {
		return b.records < b.maxRecords && (b.records == 0 || b.bytes+int64(size) <= b.maxBytes)
	}
	if !room() {
		if b.failWhenFull {
			return fmt.Errorf("%w: %d messages, %d bytes buffered", ErrBufferFull, b.maxRecords, b.maxBytes)
		}
		b.starved.Add(1)
		defer b.starved.Add(-1)
		b.mu.Unlock()
		b.kick()
		b.mu.Lock()
	}
	if err := b.wait(ctx, room); err != nil {
		return fmt.Errorf("producer: waiting for buffer room: %w", err)
	}
	b.records++
	b.bytes += int64(size)
	return nil
}

// drain waits until every record buffered has its result, ctx ends or the
// producer stops, having sinks send what lingers meanwhile.
func (b *buffer) drain(ctx context.Context) error {
	b.flushing.Add(1)
	defer b.flushing.Add(-1)
	b.kick()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.wait(ctx, func() bool { return b.records == 0 })
}

// wait waits until ready holds, ctx ends or the producer stops. mu is held
// on entry and on return; release wakes the waiters.
func (b *buffer) wait(ctx context.Context, ready func() bool) error {
	for !ready() {
		b.waiters++
		ch := b.space
		b.mu.Unlock()
		var err error
		select {
		case <-ch:
		case <-ctx.Done():
			err = ctx.Err()
		case <-b.stop:
			err = ErrClosed
		}
		b.mu.Lock()
		b.waiters--
		if err != nil {
			return err
		}
	}
	return nil
}

// release frees the room of n records of bytes in all, waking the
// goroutines waiting for room once.
func (b *buffer) release(n, bytes int) {
	b.mu.Lock()
	b.records -= n
	b.bytes -= int64(bytes)
	if b.waiters > 0 {
		close(b.space)
		b.space = make(chan struct{})
	}
	b.mu.Unlock()
}

// finish completes a record exactly once.
func (b *buffer) finish(rec *record, res Result, err error) {
	if !rec.done.CompareAndSwap(false, true) {
		return
	}
	b.release(1, rec.size)
	rec.promise(res, err)
}

// finishAll completes records as finish does, releasing their buffer room
// in one go (one wake-up for a sender waiting for room, not one per
// record) before calling their promises, in order. It may clear entries
// of es.
func (b *buffer) finishAll(es []ended) {
	n, bytes := 0, 0
	for i := range es {
		if !es[i].rec.done.CompareAndSwap(false, true) {
			es[i].rec = nil // finished already
			continue
		}
		n++
		bytes += es[i].rec.size
	}
	if n == 0 {
		return
	}
	b.release(n, bytes)
	for _, e := range es {
		if e.rec != nil {
			e.rec.promise(e.res, e.err)
		}
	}
}

// bodyBufs keeps the buffers SEND bodies were encoded into, for the next
// batches: a batch is up to MaxBatchBytes (1 MiB by default), and a buffer
// made anew for each (or kept in a sync.Pool, which every GC empties) costs
// an allocation, page faults on fresh memory and GC work per batch. It
// keeps at most keep buffers (MaxInflightPerGroup), like Kafka's pool of
// batch buffers; an idle producer holds them.
type bodyBufs struct {
	mu    sync.Mutex
	keep  int
	limit int // the largest body a batch of MaxBatchBytes makes
	bufs  [][]byte
}

// get returns an empty buffer of at least n bytes' capacity.
func (p *bodyBufs) get(n int) []byte {
	p.mu.Lock()
	for i := len(p.bufs) - 1; i >= 0; i-- {
		if b := p.bufs[i]; cap(b) >= n {
			p.bufs[i] = p.bufs[len(p.bufs)-1]
			p.bufs[len(p.bufs)-1] = nil
			p.bufs = p.bufs[:len(p.bufs)-1]
			p.mu.Unlock()
			return b[:0]
		}
	}
	p.mu.Unlock()
	// A power of two from 64 KiB, but no more than a full batch needs: a
	// batch near the cap gets a buffer that every later batch fits in.
	size := 64 << 10
	for size < n {
		size *= 2
	}
	if size > p.limit {
		size = max(n, p.limit)
	}
	return make([]byte, 0, size)
}

// put gives a buffer back, dropping it if enough are kept (the smallest
// kept one, if b is larger).
func (p *bodyBufs) put(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.bufs) < p.keep {
		p.bufs = append(p.bufs, b[:0])
		return
	}
	small := 0
	for i := range p.bufs {
		if cap(p.bufs[i]) < cap(p.bufs[small]) {
			small = i
		}
	}
	if len(p.bufs) > 0 && cap(p.bufs[small]) < cap(b) {
		p.bufs[small] = b[:0]
	}
}
