package producer

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// fakeBroker answers SEND like a broker: OK for every message, after a
// delay; BUSY for the whole request while it is failing; status for every
// message while status is set. A message whose body is "status:N" gets
// status N, and a request whose first message's body is "request:N" gets
// status N for the whole request. It heartbeats to the metaserver as its
// group's master, so the route points at it (unless meta is "": then the
// test gives the producer its routes).
//
// A fake broker can take requests on more addresses (listen), all sharing
// its log and dedupe model: a second address stands for a slave promoted
// with everything the master had. While an address hangs, it takes
// requests and never answers them (a SIGSTOPped master), after storing
// them if hang says so.
//
// Stamped messages go through a model of the broker's dedupe, per
// (producer, topic, queue), a delayed message's topic being its internal
// one (protocol.DelayTopic): a new epoch (or a producer not seen) must start
// at sequence 0, a lower epoch is PRODUCER_FENCED, a sequence already stored
// is DUPLICATE with the original offsets, one past the next is
// OUT_OF_ORDER_SEQUENCE. inject, if set, decides a message's answer first.
// Every message received is logged, and every one stored is kept per queue.
type fakeBroker struct {
	srv     *transport.Server
	delay   atomic.Int64 // nanoseconds
	failing atomic.Bool
	status  atomic.Uint32 // a protocol.Status for every message, if not 0
	batches atomic.Int64
	msgs    atomic.Int64
	stop    chan struct{}
	done    chan struct{}
	first   *fakeAddr // the address startFakeBroker listens on

	mu       sync.Mutex
	inject   func(m *protocol.Message, attempt int) (protocol.Status, injectMode)
	received []protocol.Message
	attempts map[string]int // by message id
	stored   map[qkey][]protocol.Message
	dedupe   map[dedupeKey]*dedupeState
	offset   atomic.Int64
	held     []func() // answers of hung requests, sent at cleanup
	// delayed is every pending record stored, by log offset, and what
	// became of it (DELAYED_CANCEL and DELAYED_STATE answer from it).
	delayed      map[int64]*protocol.DelayedState
	delayedCalls atomic.Int64 // DELAYED_CANCEL and DELAYED_STATE calls taken
}

// fakeAddr is one address of a fake broker.
type fakeAddr struct {
	srv  *transport.Server
	addr string
	hang atomic.Int32 // a hangMode
	reqs atomic.Int64 // SEND requests taken
	// notMaster: DELAYED_CANCEL and DELAYED_STATE are answered NOT_MASTER
	// (a replaced master); delayedCalls counts those taken here.
	notMaster    atomic.Bool
	delayedCalls atomic.Int64
	mu           sync.Mutex
	// epochs is the group epoch of every SEND taken, in order.
	epochs []uint32
}

// hangMode says what an address does with a SEND.
type hangMode int32

const (
	answer     hangMode = iota // as the model says
	hangBefore                 // never answered, nothing stored
	hangAfter                  // stored by the model, never answered
)

func (a *fakeAddr) epochsCopy() []uint32 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]uint32(nil), a.epochs...)
}

// injectMode says what an injected answer does.
type injectMode int

const (
	noInject  injectMode = iota // the model answers
	refuse                      // the injected status, nothing stored
	storeThen                   // stored (or found a duplicate) by the model, then answered the injected status
)

type dedupeKey struct {
	id    uint64
	topic string
	queue uint32
}

type dedupeState struct {
	epoch   uint16
	next    int64
	offsets map[int64]int64
}

// setInject sets the injected answers.
func (f *fakeBroker) setInject(fn func(m *protocol.Message, attempt int) (protocol.Status, injectMode)) {
	f.mu.Lock()
	f.inject = fn
	f.mu.Unlock()
}

// receivedCopy is every message received, in order.
func (f *fakeBroker) receivedCopy() []protocol.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]protocol.Message(nil), f.received...)
}

// storedIn is the messages stored in a queue, in order.
func (f *fakeBroker) storedIn(topic string, queue uint32) []protocol.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]protocol.Message(nil), f.stored[qkey{topic: topic, queue: queue}]...)
}

// pendingIn is the delayed messages stored pending for a queue (in its
// internal queue, protocol.DelayTopic(topic)), in order.
func (f *fakeBroker) pendingIn(topic string, queue uint32) []protocol.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]protocol.Message(nil), f.stored[qkey{topic: topic, queue: queue, delayed: true}]...)
}

// apply runs one message through the model and the injection. Under mu.
func (f *fakeBroker) apply(m protocol.Message, offset *atomic.Int64) protocol.SendResult {
	m.Body = append([]byte(nil), m.Body...)
	f.received = append(f.received, m)
	f.attempts[m.ID]++
	st, mode := protocol.StatusOK, noInject
	if f.inject != nil {
		st, mode = f.inject(&m, f.attempts[m.ID])
	}
	if mode == refuse {
		return protocol.SendResult{Status: st, QueueOffset: -1, LogOffset: -1}
	}
	res := protocol.SendResult{Status: protocol.StatusOK}
	// A delayed message is stored pending in its queue's internal queue,
	// and deduplicated there, apart from the queue's own messages.
	delayed := m.Schedule.Kind == protocol.ScheduleDelayed
	k := qkey{topic: m.Topic, queue: m.Queue, delayed: delayed}
	if p := m.Producer; !p.IsZero() {
		dk := dedupeKey{p.ID, m.Topic, m.Queue}
		if delayed {
			dk.topic = protocol.DelayTopic(m.Topic)
		}
		ds := f.dedupe[dk]
		switch {
		case ds != nil && p.Epoch < ds.epoch:
			return protocol.SendResult{Status: protocol.StatusProducerFenced}
		case ds == nil || p.Epoch > ds.epoch:
			if p.Seq != 0 {
				return protocol.SendResult{Status: protocol.StatusOutOfOrderSequence}
			}
			ds = &dedupeState{epoch: p.Epoch, offsets: map[int64]int64{}}
			f.dedupe[dk] = ds
		case p.Seq < ds.next:
			res = protocol.SendResult{Status: protocol.StatusDuplicate, QueueOffset: ds.offsets[p.Seq], LogOffset: ds.offsets[p.Seq]}
		case p.Seq > ds.next:
			return protocol.SendResult{Status: protocol.StatusOutOfOrderSequence}
		}
		if res.Status == protocol.StatusOK {
			ds.next++
			ds.offsets[p.Seq] = int64(len(f.stored[k]))
		}
	}
	if res.Status == protocol.StatusOK {
		res.QueueOffset = int64(len(f.stored[k]))
		res.LogOffset = offset.Add(1)
		f.stored[k] = append(f.stored[k], m)
		if delayed {
			f.delayed[res.LogOffset] = &protocol.DelayedState{Offset: res.LogOffset, Topic: m.Topic, Queue: m.Queue, ID: m.ID,
				DueAt: m.Schedule.At, State: protocol.DelayPending}
		}
		f.msgs.Add(1)
	}
	if mode == storeThen {
		return protocol.SendResult{Status: st}
	}
	return res
}

// bodyStatus is the status a "status:N" or "request:N" body asks for.
func bodyStatus(body []byte, prefix string) (protocol.Status, bool) {
	s, ok := strings.CutPrefix(string(body), prefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return protocol.Status(n), err == nil
}

func startFakeBroker(t *testing.T, meta string, group string) *fakeBroker {
	t.Helper()
	f := &fakeBroker{stop: make(chan struct{}), done: make(chan struct{}),
		attempts: map[string]int{}, stored: map[qkey][]protocol.Message{}, dedupe: map[dedupeKey]*dedupeState{},
		delayed: map[int64]*protocol.DelayedState{}}
	f.first = f.listen(t)
	f.srv = f.first.srv
	t.Cleanup(func() {
		close(f.stop)
		<-f.done
	})
	if meta == "" {
		close(f.done)
		return f
	}
	hb := api.Heartbeat{Group: group, Role: routing.RoleMaster, BrokerID: group, Addr: f.first.addr}
	cl, err := client.New(client.Config{Addrs: []string{meta}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Heartbeat(context.Background(), hb); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(f.done)
		defer cl.Close()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-f.stop:
				return
			case <-tick.C:
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, _ = cl.Heartbeat(ctx, hb)
				cancel()
			}
		}
	}()
	return f
}

// listen serves the fake broker on one more address, closed by Cleanup.
func (f *fakeBroker) listen(t *testing.T) *fakeAddr {
	t.Helper()
	a := &fakeAddr{srv: transport.NewServer(transport.ServerConfig{})}
	a.srv.Handle(protocol.CodeSend, func(r *transport.Request) {
		epoch, msgs, err := protocol.DecodeSendRequest(r.Body, nil)
		if err != nil {
			r.ReplyError(err)
			return
		}
		a.mu.Lock()
		a.epochs = append(a.epochs, epoch)
		a.mu.Unlock()
		f.batches.Add(1)
		if mode := hangMode(a.hang.Load()); mode != answer {
			f.mu.Lock()
			if mode == hangAfter {
				for i := range msgs {
					f.apply(msgs[i], &f.offset)
				}
			}
			f.held = append(f.held, func() {
				r.ReplyError(&protocol.Error{Status: protocol.StatusNotMaster, Message: "fake broker woke up replaced"})
			})
			f.mu.Unlock()
			a.reqs.Add(1)
			return
		}
		reply := func() {
			if f.failing.Load() {
				r.ReplyError(&protocol.Error{Status: protocol.StatusBusy, Message: "fake broker failing"})
				return
			}
			if st, ok := bodyStatus(msgs[0].Body, "request:"); ok {
				r.ReplyError(&protocol.Error{Status: st, Message: "fake broker asked to"})
				return
			}
			res := make([]protocol.SendResult, len(msgs))
			f.mu.Lock()
			for i := range res {
				st := protocol.Status(f.status.Load())
				if s, ok := bodyStatus(msgs[i].Body, "status:"); ok {
					st = s
				}
				if st != protocol.StatusOK {
					res[i] = protocol.SendResult{Status: st}
					continue
				}
				res[i] = f.apply(msgs[i], &f.offset)
			}
			f.mu.Unlock()
			_ = r.Reply(protocol.AppendSendResponse(nil, res))
		}
		a.reqs.Add(1)
		if d := time.Duration(f.delay.Load()); d > 0 {
			time.AfterFunc(d, reply)
			return
		}
		reply()
	})
	a.srv.Handle(protocol.CodeDelayedCancel, func(r *transport.Request) { f.delayedCall(a, r, true) })
	a.srv.Handle(protocol.CodeDelayedState, func(r *transport.Request) { f.delayedCall(a, r, false) })
	addr, err := a.srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a.addr = addr.String()
	t.Cleanup(func() {
		f.releaseHeld() // a server's Close waits for the answers it owes
		_ = a.srv.Close()
	})
	return a
}

// delayedCall answers DELAYED_CANCEL (cancel) or DELAYED_STATE as a broker
// does: NOT_FOUND for a log offset of no pending record; a cancel of a
// pending one cancels it (By "cancel"), of any other says what it is. While
// the broker is failing, BUSY; at an address marked notMaster, NOT_MASTER.
func (f *fakeBroker) delayedCall(a *fakeAddr, r *transport.Request, cancel bool) {
	f.delayedCalls.Add(1)
	a.delayedCalls.Add(1)
	if a.notMaster.Load() {
		r.ReplyError(&protocol.Error{Status: protocol.StatusNotMaster, Message: "fake broker replaced"})
		return
	}
	var ref protocol.DelayedRef
	if err := json.Unmarshal(r.Body, &ref); err != nil {
		r.ReplyError(&protocol.Error{Status: protocol.StatusInvalid, Message: err.Error()})
		return
	}
	if f.failing.Load() {
		r.ReplyError(&protocol.Error{Status: protocol.StatusBusy, Message: "fake broker failing"})
		return
	}
	f.mu.Lock()
	st := f.delayed[ref.Offset]
	var out protocol.DelayedState
	if st != nil {
		st.By = ""
		if cancel && st.State == protocol.DelayPending {
			st.State = protocol.DelayCancelled
			out = *st
			out.By = "cancel"
		} else {
			out = *st
		}
	}
	f.mu.Unlock()
	if st == nil {
		r.ReplyError(&protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("no pending record at log offset %d", ref.Offset)})
		return
	}
	body, _ := json.Marshal(out)
	_ = r.Reply(body)
}

// releaseHeld answers the hung requests: NOT_MASTER, as a master that woke
// up to find itself replaced.
func (f *fakeBroker) releaseHeld() {
	f.mu.Lock()
	held := f.held
	f.held = nil
	f.mu.Unlock()
	for _, reply := range held {
		reply()
	}
}
