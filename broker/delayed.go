package broker

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/broker/delay"
	"github.com/ferrymq/ferrymq/broker/txn"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

// delayer keeps this broker's delayed messages: it admits them on the send
// path (the maximum delay, the topics' quotas), follows the timer index
// (package delay) on both roles, and while this broker is the writable
// master fires what is due, cancels, and moves pending records out of
// retention's way. One goroutine (run) does all of the writing, so a fire,
// a cancel and a move of the same record are decided one after another,
// each against the index as the log holds it: a record is released,
// cancelled or moved once.
//
// Firing appends, in one append, the released copy to the target queue and
// its release mark to the pending record's queue, the copy first. A crash
// or a failover can cut between the two only at the log's end: the copy
// is then the log's last record when a broker takes over as master, and
// repair writes the missing mark before anything fires.
type delayer struct {
	group string
	idx   *delay.Index
	log   *storage.Log
	roles *roles
	lease *writeLease
	pulls *longPoll
	// txns says whether a pending message of a transaction may be
	// released: once it committed (an aborted one's is cancelled).
	txns  *txns
	stats *Stats
	clock clockwork.Clock
	lg    hclog.Logger

	maxDelay time.Duration
	quota    int64
	tick     time.Duration

	wake chan struct{} // capacity 1: delayed messages were stored
	reqs chan *delayReq
	cut  atomic.Bool // the log was cut back (a truncation): rebuild the index first

	lastRep   *replication // run's: the replication repair last ran for
	lastReset time.Time    // run's: when the index was last rebuilt
	warned    string       // run's: the last warning, logged once
}

// delayDir, in the broker's directory, holds the timer index's files.
const delayDir = "delay"

// fireBatch is the most due messages released in one append.
const fireBatch = 256

// delayReq is a cancel or a move, carried out by run.
type delayReq struct {
	cancel *pendingRecord // a cancel of this record
	before int64          // else: move what is pending before this log offset
	done   chan delayAnswer
}

type delayAnswer struct {
	state protocol.DelayedState
	end   int64        // the log end the answer's append reached (-1: none)
	high  bool         // the cancel mark of a HIGH message: wait for the sync set
	rep   *replication // the replication the mark was appended under
	keep  int64        // a move: retention may delete the log before this offset
	err   error
}

// pendingRecord is a pending record read back from the log.
type pendingRecord struct {
	at  int64
	msg protocol.Message
}

func newDelayer(cfg Config, idx *delay.Index, log *storage.Log, roles *roles, lease *writeLease, pulls *longPoll, stats *Stats, lg hclog.Logger) *delayer {
	return &delayer{group: cfg.Group, idx: idx, log: log, roles: roles, lease: lease, pulls: pulls, stats: stats, clock: cfg.Clock, lg: lg,
		maxDelay: cfg.MaxDelay, quota: cfg.DelayQuota, tick: cfg.DelayTick,
		wake: make(chan struct{}, 1), reqs: make(chan *delayReq)}
}

// admit checks a delayed message on the send path: its time within the
// maximum delay (by this broker's clock; a time in the past is due now),
// and its topic under its quota of pending messages (as the index last
// followed the log: a batch in flight may pass it by its size).
func (d *delayer) admit(m *protocol.Message) protocol.Status {
	if d == nil {
		return protocol.StatusInvalid
	}
	if len(protocol.DelayTopicPrefix)+len(m.Topic) > protocol.MaxTopicLen {
		return protocol.StatusInvalid // its internal topic's name would not fit: topics of delayed messages are 7 shorter
	}
	if m.Schedule.At > d.clock.Now().Add(d.maxDelay).UnixMilli() {
		d.stats.DelayedRefused.Add(1)
		return protocol.StatusInvalid
	}
	if d.idx.Pending(m.Topic) >= d.quota {
		d.stats.DelayedRefused.Add(1)
		return protocol.StatusDelayQuota
	}
	return protocol.StatusOK
}

// appended tells run that delayed messages were stored (some may be due
// at once). It never blocks: it runs on the commit log's writer.
func (d *delayer) appended() {
	if d == nil {
		return
	}
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// truncated tells run that the log was cut back: the index is rebuilt
// before anything else.
func (d *delayer) truncated() {
	d.cut.Store(true)
	d.appended()
}

// run follows the index every tick, and as master fires, cancels and
// moves, until ctx ends.
func (d *delayer) run(ctx context.Context) {
	t := d.clock.NewTicker(d.tick)
	defer t.Stop()
	for {
		var req *delayReq
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		case <-d.wake:
		case req = <-d.reqs:
		}
		err := d.step()
		if req != nil {
			d.serve(req, err)
		}
	}
}

// errNotWritableMaster answers a cancel or a move on a broker that may not
// write delayed records.
var errNotWritableMaster = &protocol.Error{Status: protocol.StatusNotMaster, Message: "this broker is not its group's writable master"}

// step brings the index up to the log and, as the writable master, fires
// what is due. It returns why this broker may not write delayed records
// now (nil: it may).
func (d *delayer) step() error {
	if err := d.follow(); err != nil {
		return err
	}
	rep := d.roles.replication()
	if rep == nil || !d.lease.valid() {
		d.lastRep = nil // a later takeover repairs again
		return errNotWritableMaster
	}
	if rep != d.lastRep {
		// Taken over since the last step: the follower, stopped before the
		// replication was set, may have appended releases after the follow
		// above; follow them before anything is decided.
		if err := d.follow(); err != nil {
			return err
		}
		if err := d.repair(); err != nil {
			d.warn("cannot check the log's last record for a release without its mark", err)
			return &protocol.Error{Status: protocol.StatusStoreError, Message: "the timer index: " + err.Error()}
		}
		d.lastRep = rep
	}
	d.fire(rep)
	return nil
}

// resetBackoff is the least time between two rebuilds of the timer index
// after it failed.
const resetBackoff = time.Second

// follow brings the index up to the log. An index that failed (a cut log,
// a failed write or read of its files) is rebuilt from the log, at most
// once per resetBackoff: it is derived state, so a rebuild is always safe.
func (d *delayer) follow() error {
	if d.cut.Swap(false) {
		now := d.clock.Now()
		if now.Sub(d.lastReset) < resetBackoff {
			d.cut.Store(true)
			return &protocol.Error{Status: protocol.StatusStoreError, Message: "the timer index is being rebuilt"}
		}
		d.lastReset = now
		if err := d.idx.Reset(); err != nil {
			d.cut.Store(true)
			d.warn("cannot rebuild the timer index", err)
			return &protocol.Error{Status: protocol.StatusStoreError, Message: "the timer index: " + err.Error()}
		}
		d.lg.Info("rebuilt the timer index from the log")
	}
	if err := d.idx.Follow(); err != nil {
		d.cut.Store(true) // rebuilt at the next step
		d.warn("cannot follow the log into the timer index; it is rebuilt from the log", err)
		return &protocol.Error{Status: protocol.StatusStoreError, Message: "the timer index: " + err.Error()}
	}
	return nil
}

// writable reports whether this broker may still append delayed records
// under rep: rep is still its replication, and the write lease holds.
func (d *delayer) writable(rep *replication) bool {
	return rep != nil && d.roles.replication() == rep && d.lease.valid()
}

func (d *delayer) warn(msg string, err error) {
	if s := msg + ": " + err.Error(); s != d.warned {
		d.warned = s
		d.lg.Warn(msg, "error", err)
	}
}

// repair writes the release mark of a released copy that is the last
// record of the log this broker took over (the mark did not make it).
func (d *delayer) repair() error {
	at := d.roles.takeoverTail.Load()
	if at < 0 {
		return nil
	}
	ri, err := d.log.ReadRecordAt(at)
	if err != nil {
		if errors.Is(err, storage.ErrOutOfRange) {
			return nil // retention took it, or the log is empty
		}
		return err
	}
	m, err := protocol.DecodeMessage(ri.Payload)
	if err != nil || m.Schedule.Kind != protocol.ScheduleReleased || ri.Topic != m.Topic {
		return nil
	}
	e, _, ok, err := d.idx.Claim(m.Schedule.Ref, m.Schedule.At)
	if err != nil || !ok {
		return err // marked already, or not pending: nothing to repair
	}
	mark := releaseMark(&m, e.At, ri.Size)
	_, err = d.log.Append([]storage.Entry{{Topic: protocol.DelayTopic(e.Topic), Queue: e.Queue, Payload: mark}}, false)
	d.idx.Release(e.At, err == nil)
	if err == nil {
		d.lg.Info("marked a release that a crash or a failover left without its mark", "pending-record", e.At, "released", at)
	}
	return err
}

// fire releases what is due, a batch per append, earliest first.
func (d *delayer) fire(rep *replication) {
	for range 64 { // then run serves requests and follows again
		if !d.writable(rep) {
			return // a master that lost its lease or stepped down fires nothing
		}
		now := d.clock.Now()
		due := d.idx.Due(now, fireBatch)
		if len(due) == 0 {
			return
		}
		entries := make([]storage.Entry, 0, 2*len(due))
		released := make([]protocol.Message, 0, len(due))
		blocked := 0                     // messages of open transactions: left pending
		marked := make([]bool, len(due)) // a record is appended that resolves it
		recs, errs := d.readPendings(due)
		for i, e := range due {
			rec, err := recs[i], errs[i]
			if err != nil {
				if !d.unreadable(e, err, &entries) {
					continue // tried again later (or gone with its segment)
				}
				marked[i] = true
				continue
			}
			if rec.msg.Txn != 0 {
				switch d.txns.state(protocol.TxnOf(&rec.msg)) {
				case txn.Open:
					blocked++ // released once its transaction commits
					continue
				case txn.Aborted:
					// Never released: the index resolves it at the mark.
					marked[i] = true
					d.stats.DelayedCancelled.Add(1)
					entries = append(entries, storage.Entry{Topic: protocol.DelayTopic(rec.msg.Topic), Queue: rec.msg.Queue,
						Payload: cancelMark(&rec.msg, e.At)})
					continue
				}
			}
			marked[i] = true
			cp := rec.msg
			cp.Producer, cp.Txn = protocol.ProducerStamp{}, 0
			if rec.msg.Schedule.Ref < 0 {
				cp.Properties = withoutOrigin(cp.Properties) // not moved: whatever it says is no origin
			}
			cp.Schedule = protocol.Schedule{Kind: protocol.ScheduleReleased, At: rec.msg.Schedule.At, Ref: e.At}
			payload := protocol.AppendMessage(nil, &cp)
			entries = append(entries,
				storage.Entry{Topic: cp.Topic, Queue: cp.Queue, Payload: payload},
				storage.Entry{Topic: protocol.DelayTopic(cp.Topic), Queue: cp.Queue,
					Payload: releaseMark(&rec.msg, e.At, storage.RecordSize(cp.Topic, len(payload)))})
			released = append(released, cp)
		}
		var pos []storage.Position
		var err error
		if len(entries) > 0 {
			pos, err = d.log.Append(entries, false)
		}
		for i, e := range due {
			d.idx.Release(e.At, err == nil && marked[i])
		}
		if err != nil {
			d.warn("cannot append released delayed messages; they stay pending", err)
			return
		}
		if len(entries) == 0 && blocked > 0 {
			return // all that is due waits for its transaction: look again at the next tick
		}
		at := d.clock.Now()
		for _, e := range due {
			d.stats.DelayedLateness.Observe(max(at.Sub(time.UnixMilli(e.DueAt)), 0).Seconds())
		}
		d.stats.DelayedFired.Add(int64(len(released)))
		d.stats.DelayedFireBatches.Add(1)
		d.wakeReaders(released, entries, pos)
		rep.notify()
	}
}

// unreadable handles a due (or moving) pending record e that could not be
// read: one that is not a delayed message at all (its bytes say so) gets a
// cancel mark appended to entries, counted and logged, and unreadable
// returns true; one that failed to read (an I/O error, or a segment
// retention deleted: the index then drops it) stays pending, and false.
func (d *delayer) unreadable(e delay.Entry, err error, entries *[]storage.Entry) bool {
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Status != protocol.StatusNotFound {
		d.warn("cannot read a pending delayed message; it stays pending", err)
		return false
	}
	d.lg.Error("a pending record is not a delayed message; it is cancelled", "pending-record", e.At, "topic", e.Topic, "queue", e.Queue, "error", err)
	d.stats.DelayedUnreadable.Add(1)
	m := protocol.Message{Topic: e.Topic, Queue: e.Queue, Schedule: protocol.Schedule{At: e.DueAt}}
	*entries = append(*entries, storage.Entry{Topic: protocol.DelayTopic(e.Topic), Queue: e.Queue, Payload: cancelMark(&m, e.At)})
	return true
}

// wakeReaders wakes the PULLs parked on the queues that got released
// copies (every other entry of an append, the marks between them).
func (d *delayer) wakeReaders(released []protocol.Message, entries []storage.Entry, pos []storage.Position) {
	good := make([]int, 0, len(released))
	ps := make([]storage.Position, 0, len(released))
	r := 0
	for j, e := range entries {
		if _, internal := protocol.IsDelayTopic(e.Topic); !internal {
			good = append(good, r)
			ps = append(ps, pos[j])
			r++
		}
	}
	d.pulls.appended(released, good, ps)
}

// readPending reads the pending record at log offset at and checks it is
// one.
func (d *delayer) readPending(at int64) (pendingRecord, error) {
	ri, err := d.log.ReadRecordAt(at)
	if err != nil {
		return pendingRecord{}, err
	}
	return pendingOf(ri)
}

// readPendings is readPending of every entry of due, with one read for
// each run of them close together in the log (a due batch was mostly
// sent together: a read per record cost more than the bytes between).
func (d *delayer) readPendings(due []delay.Entry) ([]pendingRecord, []error) {
	recs, errs := make([]pendingRecord, len(due)), make([]error, len(due))
	order := make([]int, len(due))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(due[a].At, due[b].At) })
	for k := 0; k < len(order); {
		first := due[order[k]]
		end, n := first.At+int64(first.Size), 1
		for k+n < len(order) {
			e := due[order[k+n]]
			if e.At < end || e.At-end > pendingGap || e.At+int64(e.Size)-first.At > pendingRead {
				break
			}
			end, n = e.At+int64(e.Size), n+1
		}
		raw, err := d.log.ReadRaw(first.At, int(end-first.At))
		for _, i := range order[k : k+n] {
			e := due[i]
			if off := int(e.At - first.At); err == nil && e.Size > 0 && off+e.Size <= len(raw) {
				if ri, derr := storage.DecodeRecord(raw[off:off+e.Size], e.At); derr == nil {
					recs[i], errs[i] = pendingOf(ri)
					continue
				}
			}
			// Past a segment's end, or not what the index says: read alone.
			recs[i], errs[i] = d.readPending(e.At)
		}
		k += n
	}
	return recs, errs
}

// A run of pending records read at once has gaps of at most pendingGap
// bytes and spans at most pendingRead.
const (
	pendingGap  = 16 << 10
	pendingRead = 1 << 20
)

// pendingOf checks that ri is a pending delayed record.
func pendingOf(ri storage.RecordInfo) (pendingRecord, error) {
	at := ri.Offset
	m, err := protocol.DecodeMessage(ri.Payload)
	if err != nil {
		return pendingRecord{}, &protocol.Error{Status: protocol.StatusNotFound,
			Message: fmt.Sprintf("the record at log offset %d is not a message: %v", at, err)}
	}
	if m.Schedule.Kind != protocol.ScheduleDelayed || ri.Topic != protocol.DelayTopic(m.Topic) || ri.Queue != m.Queue {
		return pendingRecord{}, &protocol.Error{Status: protocol.StatusNotFound,
			Message: fmt.Sprintf("the record at log offset %d is not a delayed message", at)}
	}
	return pendingRecord{at: at, msg: m}, nil
}

// withoutOrigin is props without protocol.DelayedOriginProperty (props
// itself when it has none: the common case costs no copy).
func withoutOrigin(props []protocol.Property) []protocol.Property {
	if !slices.ContainsFunc(props, isOrigin) {
		return props
	}
	return slices.DeleteFunc(slices.Clone(props), isOrigin)
}

func isOrigin(p protocol.Property) bool { return p.Key == protocol.DelayedOriginProperty }

// releaseMark encodes the mark that says the pending record at of m was
// released as a record of size bytes, right before the mark.
func releaseMark(m *protocol.Message, at int64, size int) []byte {
	mk := protocol.Message{ID: m.ID, Topic: m.Topic, Queue: m.Queue, Reliability: m.Reliability, Timestamp: m.Timestamp,
		Schedule: protocol.Schedule{Kind: protocol.ScheduleReleaseMark, At: m.Schedule.At, Ref: at},
		Body:     binary.BigEndian.AppendUint32(nil, uint32(size))}
	return protocol.AppendMessage(nil, &mk)
}

// cancelMark encodes the mark that says the pending record at of m was
// cancelled.
func cancelMark(m *protocol.Message, at int64) []byte {
	mk := protocol.Message{ID: m.ID, Topic: m.Topic, Queue: m.Queue, Reliability: m.Reliability, Timestamp: m.Timestamp,
		Schedule: protocol.Schedule{Kind: protocol.ScheduleCancelMark, At: m.Schedule.At, Ref: at}}
	return protocol.AppendMessage(nil, &mk)
}

// serve carries out a cancel or a move on run's goroutine; notNow is why
// this broker may not write delayed records now (nil: it may).
func (d *delayer) serve(req *delayReq, notNow error) {
	if notNow != nil {
		if req.cancel == nil {
			req.done <- d.keepFrom(req.before) // a slave, or no lease: keep what is pending
			return
		}
		req.done <- delayAnswer{end: -1, err: notNow}
		return
	}
	if req.cancel != nil {
		req.done <- d.cancel(req.cancel)
		return
	}
	req.done <- d.move(req.before)
}

// keepFrom is where retention must stop when it cannot move what is
// pending before before: at the earliest pending record (claimed ones
// included: run has none claimed between its steps).
func (d *delayer) keepFrom(before int64) delayAnswer {
	es, err := d.idx.PendingBefore(before, 1<<20)
	if err != nil {
		return delayAnswer{end: -1, err: err}
	}
	for _, e := range es {
		before = min(before, e.At)
		d.idx.Release(e.At, false)
	}
	return delayAnswer{end: -1, keep: before}
}

// cancel claims the pending record and appends its cancel mark; a record
// no longer pending is answered with what became of it.
func (d *delayer) cancel(p *pendingRecord) delayAnswer {
	due := p.msg.Schedule.At
	_, _, ok, err := d.idx.Claim(p.at, due)
	if err != nil {
		return delayAnswer{end: -1, err: err}
	}
	if !ok {
		st, err := d.describe(p)
		return delayAnswer{state: st, end: -1, err: err}
	}
	rep := d.roles.replication()
	if !d.writable(rep) {
		d.idx.Release(p.at, false)
		return delayAnswer{end: -1, err: errNotWritableMaster}
	}
	pos, err := d.log.Append([]storage.Entry{{Topic: protocol.DelayTopic(p.msg.Topic), Queue: p.msg.Queue, Payload: cancelMark(&p.msg, p.at)}}, false)
	d.idx.Release(p.at, err == nil)
	if err != nil {
		return delayAnswer{end: -1, err: &protocol.Error{Status: statusOfStoreError(err), Message: err.Error()}}
	}
	d.stats.DelayedCancelled.Add(1)
	rep.notify()
	st := d.stateOf(p)
	st.State, st.By = protocol.DelayCancelled, "cancel"
	return delayAnswer{state: st, end: pos[0].End, high: p.msg.Reliability == protocol.High, rep: rep}
}

// move appends again every record pending before the log offset before,
// as a moved record that replaces it (the same message, due at the same
// time: its handle follows), so retention may delete its segment.
func (d *delayer) move(before int64) delayAnswer {
	for {
		rep := d.roles.replication()
		if !d.writable(rep) {
			return d.keepFrom(before)
		}
		es, err := d.idx.PendingBefore(before, fireBatch)
		if err != nil {
			return delayAnswer{end: -1, err: err}
		}
		if len(es) == 0 {
			return delayAnswer{end: -1, keep: before}
		}
		entries := make([]storage.Entry, 0, len(es))
		marked := make([]bool, len(es))
		keep := before
		for i, e := range es {
			rec, err := d.readPending(e.At)
			if err != nil {
				if marked[i] = d.unreadable(e, err, &entries); !marked[i] {
					keep = min(keep, e.At) // not moved: its segment stays
				}
				continue
			}
			marked[i] = true
			mv := rec.msg
			mv.Producer = protocol.ProducerStamp{} // its producer's sequences stay with the record retention deletes
			// Its origin: the record it moves, unless that is a move itself,
			// whose origin it keeps (as the index reads it: a move without
			// the property, from before it, names its origin by its Ref). A
			// first record's property is no origin: a retry's copy of a
			// released message, a recovered move, a producer's own.
			origin := e.At
			if rec.msg.Schedule.Ref >= 0 {
				origin = rec.msg.Schedule.Ref
				if o := protocol.DelayedOrigin(&rec.msg); o >= 0 {
					origin = o
				}
			}
			mv.Schedule.Ref = e.At
			props := withoutOrigin(mv.Properties)
			mv.Properties = append(props[:len(props):len(props)], // a copy: rec's stay as read
				protocol.Property{Key: protocol.DelayedOriginProperty, Value: strconv.FormatInt(origin, 10)})
			entries = append(entries, storage.Entry{Topic: protocol.DelayTopic(mv.Topic), Queue: mv.Queue, Payload: protocol.AppendMessage(nil, &mv)})
		}
		if len(entries) > 0 {
			_, err = d.log.Append(entries, false)
		}
		for i, e := range es {
			d.idx.Release(e.At, err == nil && marked[i])
		}
		if err != nil {
			return delayAnswer{end: -1, err: err}
		}
		rep.notify()
		d.stats.DelayedMoved.Add(int64(len(entries)))
		if keep < before {
			return delayAnswer{end: -1, keep: keep}
		}
		if err := d.idx.Follow(); err != nil {
			return delayAnswer{end: -1, err: err}
		}
	}
}

// call hands req to run and waits for its answer.
func (d *delayer) call(ctx context.Context, req *delayReq) delayAnswer {
	req.done = make(chan delayAnswer, 1)
	select {
	case d.reqs <- req:
	case <-ctx.Done():
		return delayAnswer{end: -1, err: ctx.Err()}
	}
	select {
	case a := <-req.done:
		return a
	case <-ctx.Done():
		return delayAnswer{end: -1, err: ctx.Err()}
	}
}

// stateOf is what p is, without its fate.
func (d *delayer) stateOf(p *pendingRecord) protocol.DelayedState {
	return protocol.DelayedState{Offset: p.at, Topic: p.msg.Topic, Queue: p.msg.Queue, ID: p.msg.ID, DueAt: p.msg.Schedule.At}
}

// describe tells what became of the pending record p: pending, released
// (and where: the released copy's queue offset and store time), cancelled
// or moved.
func (d *delayer) describe(p *pendingRecord) (protocol.DelayedState, error) {
	st := d.stateOf(p)
	s, err := d.idx.State(p.at, p.msg.Schedule.At)
	if err == nil && s.Kind == delay.StatePending {
		// Released or cancelled since the index last followed the log (its
		// mark is appended, not yet read back): follow, and ask again.
		if err = d.idx.Follow(); err == nil {
			s, err = d.idx.State(p.at, p.msg.Schedule.At)
		}
	}
	if err != nil {
		return st, err
	}
	switch s.Kind {
	case delay.StatePending:
		st.State = protocol.DelayPending
	case delay.StateCancelled:
		st.State = protocol.DelayCancelled
	case delay.StateMoved:
		st.State, st.MovedTo = protocol.DelayMoved, s.MovedTo
	case delay.StateReleased:
		st.State = protocol.DelayReleased
		rel := &protocol.DelayedRelease{LogOffset: s.ReleasedAt, QueueOffset: -1}
		if ri, err := d.log.ReadRecordAt(s.ReleasedAt); err == nil {
			rel.QueueOffset, rel.At = ri.QueueOffset, ri.StoreTime
		}
		st.Released = rel
	default:
		return st, &protocol.Error{Status: protocol.StatusNotFound,
			Message: fmt.Sprintf("the timer index has no delayed message at log offset %d (before the log's start, or not followed yet)", p.at)}
	}
	return st, nil
}

// retainFrom is retention's question before it deletes the log before
// offset before: as the writable master, the delayed messages pending
// there are moved (appended again) first; otherwise, or when they could not
// be, retention stops at the earliest of them, which the master moves (the
// slave gets the moved copies and their marks by replication).
func (d *delayer) retainFrom(ctx context.Context, before int64) int64 {
	a := d.call(ctx, &delayReq{before: before})
	if a.err != nil {
		d.lg.Warn("retention cannot tell which delayed messages are pending; it deletes nothing", "error", a.err)
		return d.log.StartOffset()
	}
	return a.keep
}

// DelayedSummary is what a broker's metrics say of its pending delayed
// messages.
type DelayedSummary struct {
	Now       time.Time
	NextDue   *time.Time // nil: none pending
	ByHorizon []DelayedHorizon
}

// DelayedHorizon counts the pending messages due in one span: "1m" (before
// a minute from now, overdue ones included), "1h", "1d" (from the span
// before it on), "later".
type DelayedHorizon struct {
	Label   string
	Pending int64
}

// ClockSkew is the registry leader's clock minus this broker's, as the last
// heartbeat reply showed it (within half a round trip): delayed messages
// are due by this broker's clock.
func (b *Broker) ClockSkew() time.Duration { return time.Duration(b.sess.skew.Load()) }

// Delayed summarises the pending delayed messages for the metrics.
func (b *Broker) Delayed() DelayedSummary {
	idx := b.delays.idx
	now := b.cfg.Clock.Now()
	s := DelayedSummary{Now: now}
	if next, ok := idx.NextDue(); ok {
		t := time.UnixMilli(next)
		s.NextDue = &t
	}
	total := idx.Pending("")
	within := func(h time.Duration, width time.Duration) int64 {
		var n int64
		limit := int(h/width) + 2
		for _, bk := range idx.Buckets("", width, limit) {
			if bk.Start < now.Add(h).UnixMilli() {
				n += bk.Pending
			}
		}
		return n
	}
	m, h, d := within(time.Minute, 10*time.Second), within(time.Hour, time.Minute), within(24*time.Hour, time.Hour)
	s.ByHorizon = []DelayedHorizon{{"1m", m}, {"1h", max(h-m, 0)}, {"1d", max(d-h, 0)}, {"later", max(total-d, 0)}}
	return s
}
