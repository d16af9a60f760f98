package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

// Recovering a failover's cut tail (DESIGN.md, "Failover", rule of the
// recovered tail). A master that a failover replaced comes back as the
// slave and cuts the records its successor never had into a side file
// (roles.go): NORMAL messages it acknowledged alone, and messages that were
// in flight. Unless the broker runs with -failover-tail=discard, it hands
// them to its group's master (RECOVER, on the HA port), which appends
// every one it does not hold yet again, once, flagged as recovered:
//
//   - a message held already is one its producer retried at the new master
//     with the same stamp, or sent again under a new identity (after
//     OUT_OF_ORDER_SEQUENCE): the master reads the records of the tail's
//     queues from the cut on (up to RecoverWindow past the newest cut
//     record), and storage.Watch covers what is appended meanwhile, so
//     none is stored twice, whatever the order of retries and recovery;
//   - a recovered record's stamp joins the dedupe state only where it is its
//     producer's next sequence (storage.Entry.Recovered): a producer's late
//     retry of it is then a duplicate, and no live producer is refused;
//   - the message carries the property protocol.RecoveredProperty, and it lands
//     after what its queue took since the failover: the one exception to
//     per-key order.
//
// The former master keeps a marker beside the side file from before it cuts
// until its own log, copying from the master, holds the recovered records:
// a crash or a second failover at any point hands the tail over again
// (the master's checks make that idempotent), and a tail is never dropped
// before a copy of it is on two brokers.

// replayMarker is the suffix of the file beside a side file that says its
// records are to be handed to the master.
const replayMarker = ".recover"

// maxRecoverBatch bounds one RECOVER's records.
const maxRecoverBatch = 1 << 20

// handleRecover takes a former master's cut tail (on the HA port). The
// work (reading the log for copies, appending) runs on its own goroutine,
// one recovery at a time, and answers when done.
func (b *Broker) handleRecover(r *transport.Request) {
	q, err := protocol.DecodeRecoverRequest(r.Body)
	if err != nil {
		r.ReplyError(&protocol.Error{Status: protocol.StatusInvalid, Message: err.Error()})
		return
	}
	if !b.recovering.CompareAndSwap(false, true) {
		r.ReplyError(&protocol.Error{Status: protocol.StatusBusy, Message: "another recovery is running"})
		return
	}
	q.Records = slices.Clone(q.Records) // the request's buffer is the transport's once this returns
	b.goFunc(func(ctx context.Context) {
		defer b.recovering.Store(false)
		resp, err := b.recoverTail(ctx, q)
		if err != nil {
			r.ReplyError(err)
			return
		}
		_ = r.Reply(protocol.AppendRecoverResponse(nil, &resp))
	})
}

// recoverTail appends again the records of q that the log does not hold.
func (b *Broker) recoverTail(ctx context.Context, q protocol.RecoverRequest) (protocol.RecoverResponse, error) {
	if b.roles.replication() == nil || !b.sess.lease.validFor(q.Epoch) {
		return protocol.RecoverResponse{}, &protocol.Error{Status: protocol.StatusNotMaster,
			Message: fmt.Sprintf("broker %s is not the writable master of epoch %d", b.cfg.ID, q.Epoch)}
	}
	var recs []storage.RecordInfo
	var refs []storage.QueueRef
	seen := map[storage.QueueRef]bool{}
	var newest int64
	err := storage.ReadRecords(bytes.NewReader(q.Records), "recover request", q.From, func(ri storage.RecordInfo) error {
		recs = append(recs, ri)
		if ref := (storage.QueueRef{Topic: ri.Topic, Queue: ri.Queue}); !seen[ref] {
			seen[ref] = true
			refs = append(refs, ref)
		}
		newest = max(newest, ri.StoreTime)
		return nil
	})
	if err != nil {
		return protocol.RecoverResponse{}, &protocol.Error{Status: protocol.StatusInvalid, Message: err.Error()}
	}
	w, err := b.store.Watch(refs)
	if err != nil {
		return protocol.RecoverResponse{}, &protocol.Error{Status: protocol.StatusStoreError, Message: err.Error()}
	}
	defer func() { _ = w.Close() }()
	held, err := b.heldIDs(ctx, refs, q.Cut, w.End, newest+b.cfg.RecoverWindow.Milliseconds())
	if err != nil {
		return protocol.RecoverResponse{}, err
	}
	var resp protocol.RecoverResponse
	var entries []storage.Entry
	leftHere := 0
	delayedIDs := map[string]struct{}{} // delayed messages of this batch: a pending record and its move are one
	for _, ri := range recs {
		m, err := protocol.DecodeMessage(ri.Payload)
		if err != nil {
			return protocol.RecoverResponse{}, &protocol.Error{Status: protocol.StatusInvalid,
				Message: fmt.Sprintf("the record at log offset %d holds no message: %v", ri.Offset, err)}
		}
		if m.Txn != 0 || ri.Topic == protocol.TxnTopic {
			// A transaction's record or mark: a commit is answered only
			// once the sync set holds its mark, and so every record of
			// its transaction: one cut here was never committed (and a
			// commit of it here is refused: the records are missing).
			leftHere++
			continue
		}
		if k := m.Schedule.Kind; k != protocol.ScheduleNone && k != protocol.ScheduleDelayed {
			// A release (its copy and mark) or a cancel mark names a pending
			// record by its offset in the old master's log: this log's own
			// index decides what is pending here, and releases it once.
			leftHere++
			continue
		}
		if held[m.ID] {
			resp.Duplicates++
			continue
		}
		payload := ri.Payload
		if m.Schedule.Kind == protocol.ScheduleDelayed && m.Schedule.Ref >= 0 {
			if m.Schedule.Ref < q.Cut {
				// Retention's move of a record both logs hold: this log's
				// own index decides what became of that one.
				leftHere++
				continue
			}
			// The move of a record that was in the cut tail too: pending
			// here as itself, once (the first of the two is taken).
			m.Schedule.Ref = -1
			payload = protocol.AppendMessage(nil, &m)
		}
		if m.Schedule.Kind == protocol.ScheduleDelayed {
			if _, twice := delayedIDs[m.ID]; twice {
				resp.Duplicates++
				continue
			}
			delayedIDs[m.ID] = struct{}{}
		}
		if len(m.Properties) < protocol.MaxProperties {
			m.Properties = append(m.Properties, protocol.Property{Key: protocol.RecoveredProperty, Value: fmt.Sprintf("%d@%d", q.Epoch-1, ri.Offset)})
			if p := protocol.AppendMessage(nil, &m); len(p) <= protocol.MaxFrameSize-1024 {
				payload = p
			}
		}
		entries = append(entries, storage.Entry{Topic: ri.Topic, Queue: ri.Queue, Payload: payload,
			Producer: storage.ProducerStamp(m.Producer), Recovered: true})
	}
	if len(entries) > 0 {
		pos, err := b.store.Append(entries, false)
		if err != nil {
			return protocol.RecoverResponse{}, &protocol.Error{Status: protocol.StatusStoreError, Message: err.Error()}
		}
		for _, p := range pos {
			if p.Duplicate {
				resp.Duplicates++
			} else {
				resp.Stored++
			}
		}
		b.pulls.appendedAny() // parked PULLs of those queues see them
	}
	resp.End = b.store.EndOffset()
	b.stats.Recovered.Add(int64(resp.Stored))
	b.stats.RecoverDuplicates.Add(int64(resp.Duplicates))
	b.log.Info("appended again the records a failover cut from a former master", "from", q.BrokerID, "epoch", q.Epoch,
		"records", len(recs), "stored", resp.Stored, "held-already", resp.Duplicates, "left-to-this-log (releases, marks, moves, transactions)", leftHere, "log-end", resp.End)
	return resp, nil
}

// heldIDs returns the message ids of the records of queues in the log from
// log offset cut to end, up to record time until.
func (b *Broker) heldIDs(ctx context.Context, queues []storage.QueueRef, cut, end, until int64) (map[string]bool, error) {
	held := map[string]bool{}
queues:
	for _, q := range queues {
		from, err := b.store.QueueOffsetAt(q.Topic, q.Queue, cut)
		if err != nil {
			return nil, &protocol.Error{Status: protocol.StatusStoreError, Message: err.Error()}
		}
		for off := from; ; {
			if err := ctx.Err(); err != nil {
				return nil, &protocol.Error{Status: protocol.StatusShuttingDown, Message: "the broker is closing"}
			}
			es, err := b.store.Read(q.Topic, q.Queue, off, 1<<20)
			if err != nil {
				return nil, &protocol.Error{Status: protocol.StatusStoreError, Message: err.Error()}
			}
			if len(es) == 0 {
				break
			}
			for _, e := range es {
				if e.LogOffset >= end || e.StoreTime > until {
					continue queues
				}
				if id, ok := protocol.PeekMessageID(e.Payload); ok {
					held[id] = true
				}
			}
			off = es[len(es)-1].QueueOffset + 1
		}
	}
	return held, nil
}

// tailHandover hands a former master's cut tails to its group's master,
// one side file at a time, on its own goroutine.
type tailHandover struct {
	id     string
	dir    string // the data directory; side files are in dir/truncated
	log    *storage.Log
	epochs *epochState // the registry's word the roles last acted on
	dial   func(addr string) *transport.Client
	clock  clockwork.Clock
	lg     hclog.Logger
	stats  *Stats
	tails  chan string // side files cut since the broker started
}

// newTailHandover makes the handover of the broker cfg configures, nil
// with -failover-tail=discard (cfg.DiscardFailoverTail).
func newTailHandover(cfg Config, log *storage.Log, epochs *epochState, stats *Stats, lg hclog.Logger) *tailHandover {
	if cfg.DiscardFailoverTail {
		return nil
	}
	return &tailHandover{id: cfg.ID, dir: cfg.Dir, log: log, epochs: epochs, clock: cfg.Clock, lg: lg, stats: stats,
		tails: make(chan string, 64),
		dial: func(addr string) *transport.Client {
			return transport.NewClient(addr, transport.ClientConfig{TLS: cfg.TLSClient, Login: auth.TokenLogin(cfg.ClusterToken)})
		}}
}

// mark records, before a cut, that its side file is to be handed over.
func (h *tailHandover) mark(sideFile string) error {
	if err := os.MkdirAll(filepath.Dir(sideFile), dirMode); err != nil {
		return err
	}
	f, err := os.OpenFile(sideFile+replayMarker, os.O_RDWR|os.O_CREATE|os.O_TRUNC, fileMode)
	if err != nil {
		return err
	}
	err = errors.Join(f.Sync(), f.Close(), syncDir(filepath.Dir(sideFile)))
	return err
}

// unmark drops a side file's marker (its cut failed, or it was handed over).
func (h *tailHandover) unmark(sideFile string) {
	if err := os.Remove(sideFile + replayMarker); err != nil && !errors.Is(err, os.ErrNotExist) {
		h.lg.Warn("removing a handed-over tail's marker failed", "side-file", sideFile, "error", err)
	}
}

// cut takes a side file whose cut succeeded; it never blocks.
func (h *tailHandover) cut(sideFile string) {
	select {
	case h.tails <- sideFile:
	default:
		h.lg.Warn("too many cut tails waiting; this one is handed over at the next start", "side-file", sideFile)
	}
}

func (h *tailHandover) run(ctx context.Context) {
	markers, _ := filepath.Glob(filepath.Join(h.dir, sideDir, "*.log"+replayMarker))
	slices.Sort(markers)
	for _, m := range markers {
		side := strings.TrimSuffix(m, replayMarker)
		if _, err := os.Stat(side); err != nil {
			h.unmark(side) // the broker stopped between the marker and the cut: nothing was cut
			continue
		}
		h.handOver(ctx, side)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case side := <-h.tails:
			h.handOver(ctx, side)
		}
	}
}

// handOver hands one side file to the master until the master took every
// record and this broker's own log holds what the master appended.
func (h *tailHandover) handOver(ctx context.Context, side string) {
	var batches [][]byte
	var froms []int64
	var records int
	cut := int64(-1)
	err := storage.ReadRecordFile(side, func(ri storage.RecordInfo) error {
		if cut < 0 {
			cut = ri.Offset
		}
		raw := h.rawOf(ri)
		if n := len(batches); n == 0 || len(batches[n-1])+len(raw) > maxRecoverBatch {
			batches = append(batches, nil)
			froms = append(froms, ri.Offset)
		}
		batches[len(batches)-1] = append(batches[len(batches)-1], raw...)
		records++
		return nil
	})
	if err != nil {
		h.lg.Error("cannot read a cut tail to hand it over; it stays for the operator", "side-file", side, "error", err)
		return
	}
	backoff := 100 * time.Millisecond
	wait := func() bool {
		t := h.clock.NewTimer(backoff)
		defer t.Stop()
		backoff = min(2*backoff, 5*time.Second)
		select {
		case <-ctx.Done():
			return false
		case <-t.Chan():
			return true
		}
	}
	var stored, dups uint32
again:
	for {
		g := h.epochs.view.Load()
		if g == nil || g.Master.HAAddr == "" || g.Master.ID == "" {
			if !wait() {
				return
			}
			continue
		}
		epoch := g.Epoch
		var end int64
		stored, dups = 0, 0
		for i, batch := range batches {
			resp, err := h.send(ctx, g.Master.HAAddr, protocol.RecoverRequest{Epoch: epoch, BrokerID: h.id, From: froms[i], Cut: cut, Records: batch})
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				if !protocol.IsRetriable(err) && !errors.Is(err, transport.ErrConnLost) && protocol.StatusOf(err) != protocol.StatusUnknownCode {
					h.lg.Error("the master refuses this broker's cut tail; it stays in its side file for the operator", "side-file", side,
						"master", g.Master.ID, "error", err)
					return
				}
				if !wait() {
					return
				}
				continue again
			}
			stored += resp.Stored
			dups += resp.Duplicates
			end = max(end, resp.End)
		}
		// Kept until this broker's own copy holds what the master appended:
		// then the tail is on two brokers.
		for h.log.EndOffset() < end {
			if g := h.epochs.view.Load(); g == nil || g.Epoch != epoch {
				continue again // a failover meanwhile: hand it to the next master
			}
			if !wait() {
				return
			}
		}
		break
	}
	h.unmark(side)
	h.stats.TailsHandedOver.Add(1)
	h.stats.TailRecordsHandedOver.Add(int64(records))
	h.lg.Info("handed a cut tail to the master: it appended again what it did not hold", "side-file", side, "records", records,
		"stored", stored, "held-already", dups)
}

// rawOf is a record as it is on disk (RecordInfo does not keep the bytes).
func (h *tailHandover) rawOf(ri storage.RecordInfo) []byte { return storage.EncodeRecord(ri) }

func (h *tailHandover) send(ctx context.Context, addr string, q protocol.RecoverRequest) (protocol.RecoverResponse, error) {
	c := h.dial(addr)
	defer func() { _ = c.Close() }()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	resp, err := c.Call(cctx, protocol.CodeRecover, protocol.AppendRecoverRequest(nil, &q))
	if err != nil {
		return protocol.RecoverResponse{}, err
	}
	return protocol.DecodeRecoverResponse(resp.Body)
}
