package broker

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

// sendBatch is one SEND request in flight. Every message is its own future:
// it completes once, with a status and, when stored, its offsets, either at
// the checks, when the commit log has it (NORMAL), or when the slave
// confirmed it or the wait ran out (HIGH). The last message to complete
// answers the request with every result, in order.
//
// results[i] is written only by message i's completion, before it
// decrements pending; the goroutine that brings pending to zero reads them
// all, so the atomic counter orders every write before the read.
type sendBatch struct {
	b       *Broker
	req     *transport.Request
	size    int
	start   time.Time
	results []protocol.SendResult
	pending atomic.Int64
}

func (sb *sendBatch) complete(i int, res protocol.SendResult) {
	sb.results[i] = res
	sb.done1()
}

func (sb *sendBatch) done1() {
	if sb.pending.Add(-1) != 0 {
		return
	}
	refused := 0
	for _, r := range sb.results {
		if r.Status != protocol.StatusOK {
			refused++
		}
	}
	st := &sb.b.stats
	st.Refused.Add(int64(refused))
	st.Batches.Add(1)
	st.BatchNanos.Add(int64(time.Since(sb.start)))
	_ = sb.req.Reply(protocol.AppendSendResponse(make([]byte, 0, 4+18*len(sb.results)), sb.results))
	sb.b.release(sb.size)
}

// handleSend runs on a worker: it decodes the batch, checks every message,
// appends the good ones as one group and returns; the answer goes out from
// the completions.
func (b *Broker) handleSend(r *transport.Request) {
	if b.closing.Load() {
		r.ReplyError(&protocol.Error{Status: protocol.StatusShuttingDown, Message: "broker " + b.cfg.ID + " is shutting down"})
		return
	}
	size := len(r.Body)
	if !b.admit(size) {
		r.ReplyError(&protocol.Error{Status: protocol.StatusBusy, Message: fmt.Sprintf("broker %s has too many requests in flight", b.cfg.ID)})
		return
	}
	msgs, raws, err := protocol.DecodeSendRequestRaw(r.Body)
	if err != nil {
		b.release(size)
		r.ReplyError(err)
		return
	}
	sb := &sendBatch{b: b, req: r, size: size, start: time.Now(), results: make([]protocol.SendResult, len(msgs))}
	sb.pending.Store(int64(len(msgs)) + 1) // +1: the handler's own hold, dropped at the end

	// Check every message; the good ones are stored as they came, in the
	// encoding the producer sent (it aliases the request's buffer, which the
	// commit log copies before the append completes).
	good := make([]int, 0, len(msgs))
	checks := b.newBatchCheck()
	for i := range msgs {
		if st := checks.check(&msgs[i]); st != protocol.StatusOK {
			sb.complete(i, protocol.SendResult{Status: st})
			continue
		}
		good = append(good, i)
	}
	if len(good) > 0 {
		entries := make([]storage.Entry, len(good))
		for j, i := range good {
			entries[j] = storage.Entry{Topic: msgs[i].Topic, Queue: msgs[i].Queue, Payload: raws[i]}
		}
		b.store.AppendAsync(entries, false, func(pos []storage.Position, err error) {
			b.appended(sb, msgs, good, pos, err)
		})
	}
	sb.done1()
}

// appended completes the stored messages of a batch. It runs on the commit
// log's writer or flusher goroutine, so it only records results and hands
// HIGH messages to the replication waiters.
func (b *Broker) appended(sb *sendBatch, msgs []protocol.Message, good []int, pos []storage.Position, err error) {
	if err != nil {
		st := statusOfStoreError(err)
		b.log.Warn("append failed", "messages", len(good), "status", st.String(), "error", err)
		for _, i := range good {
			sb.complete(i, protocol.SendResult{Status: st})
		}
		return
	}
	var bytes int64
	for j, i := range good {
		bytes += int64(len(msgs[i].Body))
		res := protocol.SendResult{Status: protocol.StatusOK, QueueOffset: pos[j].QueueOffset, LogOffset: pos[j].LogOffset}
		if msgs[i].Reliability == protocol.High {
			b.repl.await(pos[j].End, func(st protocol.Status) {
				res.Status = st
				sb.complete(i, res)
			})
			continue
		}
		sb.complete(i, res)
	}
	b.stats.MessagesIn.Add(int64(len(good)))
	b.stats.BytesIn.Add(bytes)
	b.repl.notify()
}

// batchCheck decides whether each message of one batch may be appended
// here. The broker's role, its writability and the slave's lag are read
// once per batch, not per message.
type batchCheck struct {
	b        *Broker
	state    protocol.Status // NOT_MASTER, READ_ONLY or OK for the whole batch
	lagKnown bool
	lagging  bool
}

func (b *Broker) newBatchCheck() batchCheck {
	c := batchCheck{b: b, state: protocol.StatusOK}
	switch {
	case !b.IsMaster():
		c.state = protocol.StatusNotMaster
	case !b.Writable():
		c.state = protocol.StatusReadOnly
	}
	return c
}

func (c *batchCheck) check(m *protocol.Message) protocol.Status {
	if c.state != protocol.StatusOK {
		return c.state
	}
	if err := m.Validate(); err != nil {
		return protocol.StatusOf(err)
	}
	if !c.b.routedHere(m.Topic, m.Queue) {
		return protocol.StatusNoRoute
	}
	if m.Reliability == protocol.High {
		if !c.lagKnown {
			c.lagging, c.lagKnown = c.b.repl.lagging(), true
		}
		if c.lagging {
			return protocol.StatusSlaveLagging
		}
	}
	return protocol.StatusOK
}
