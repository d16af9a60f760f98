package producer

import (
	"context"
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
// group's master, so the route points at it.
//
// Stamped messages go through a model of the broker's dedupe, per
// (producer, topic, queue): a new epoch (or a producer not seen) must start
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

	mu       sync.Mutex
	inject   func(m *protocol.Message, attempt int) (protocol.Status, injectMode)
	received []protocol.Message
	attempts map[string]int // by message id
	stored   map[qkey][]protocol.Message
	dedupe   map[dedupeKey]*dedupeState
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
	return append([]protocol.Message(nil), f.stored[qkey{topic, queue}]...)
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
	k := qkey{m.Topic, m.Queue}
	if p := m.Producer; !p.IsZero() {
		dk := dedupeKey{p.ID, m.Topic, m.Queue}
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
	f := &fakeBroker{srv: transport.NewServer(transport.ServerConfig{}), stop: make(chan struct{}), done: make(chan struct{}),
		attempts: map[string]int{}, stored: map[qkey][]protocol.Message{}, dedupe: map[dedupeKey]*dedupeState{}}
	var offset atomic.Int64
	f.srv.Handle(protocol.CodeSend, func(r *transport.Request) {
		_, msgs, err := protocol.DecodeSendRequest(r.Body, nil)
		if err != nil {
			r.ReplyError(err)
			return
		}
		f.batches.Add(1)
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
				res[i] = f.apply(msgs[i], &offset)
			}
			f.mu.Unlock()
			_ = r.Reply(protocol.AppendSendResponse(nil, res))
		}
		if d := time.Duration(f.delay.Load()); d > 0 {
			time.AfterFunc(d, reply)
			return
		}
		reply()
	})
	addr, err := f.srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(client.Config{Addrs: []string{meta}})
	if err != nil {
		t.Fatal(err)
	}
	hb := api.Heartbeat{Group: group, Role: routing.RoleMaster, BrokerID: group, Addr: addr.String()}
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
	t.Cleanup(func() {
		close(f.stop)
		<-f.done
		_ = f.srv.Close()
	})
	return f
}
