package producer

import (
	"context"
	"strconv"
	"strings"
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
type fakeBroker struct {
	srv     *transport.Server
	delay   atomic.Int64 // nanoseconds
	failing atomic.Bool
	status  atomic.Uint32 // a protocol.Status for every message, if not 0
	batches atomic.Int64
	msgs    atomic.Int64
	stop    chan struct{}
	done    chan struct{}
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
	f := &fakeBroker{srv: transport.NewServer(transport.ServerConfig{}), stop: make(chan struct{}), done: make(chan struct{})}
	var offset atomic.Int64
	f.srv.Handle(protocol.CodeSend, func(r *transport.Request) {
		msgs, err := protocol.DecodeSendRequest(r.Body, nil)
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
			for i := range res {
				st := protocol.Status(f.status.Load())
				if s, ok := bodyStatus(msgs[i].Body, "status:"); ok {
					st = s
				}
				res[i] = protocol.SendResult{Status: st}
				if st == protocol.StatusOK {
					f.msgs.Add(1)
					res[i].QueueOffset = offset.Add(1)
				}
			}
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
