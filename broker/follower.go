package broker

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

// slaveLog is the part of the commit log that the follower writes.
type slaveLog interface {
	EndOffset() int64
	AppendRaw(offset int64, data []byte, flush bool) (int64, error)
}

// masterLink fetches from one master's HA address.
type masterLink interface {
	Fetch(ctx context.Context, req protocol.HAFetchRequest) (protocol.HAFetchResponse, error)
	Close() error
}

// dialMaster opens a link to a master's HA address over the transport.
func dialMaster(addr string) masterLink {
	return &transportLink{c: transport.NewClient(addr, transport.ClientConfig{})}
}

type transportLink struct{ c *transport.Client }

func (l *transportLink) Fetch(ctx context.Context, req protocol.HAFetchRequest) (protocol.HAFetchResponse, error) {
	resp, err := l.c.Call(ctx, protocol.CodeHAFetch, protocol.AppendHAFetchRequest(nil, &req))
	if err != nil {
		return protocol.HAFetchResponse{}, err
	}
	return protocol.DecodeHAFetchResponse(resp.Body)
}

func (l *transportLink) Close() error { return l.c.Close() }

// follower is the slave's side of HA sync in one epoch: it fetches from
// its own log end, appends what comes back at the same offsets, and fetches
// again, which acknowledges the append. Every fetch names the slave and its
// epoch; an answer from a master of another epoch is dropped. After any
// error it backs off and reconnects. roles starts one per epoch and master.
type follower struct {
	id         string // this broker's id, which the master checks
	epoch      uint32
	addr       string // the master's HA address
	log        slaveLog
	dial       func(addr string) masterLink
	fetchBytes int
	fetchWait  time.Duration
	clock      clockwork.Clock
	lg         hclog.Logger
	masterEnd  *atomic.Int64 // the master's log end in the last answer
	appended   func()        // called after each append (wakes parked PULLs); may be nil
}

func (f *follower) run(ctx context.Context) {
	link := f.dial(f.addr)
	defer func() { _ = link.Close() }()
	addr := f.addr
	backoff := 50 * time.Millisecond
	failing := false // logged once per outage
	sleep := func() bool {
		t := f.clock.NewTimer(backoff)
		defer t.Stop()
		backoff = min(2*backoff, time.Second)
		select {
		case <-ctx.Done():
			return false
		case <-t.Chan():
			return true
		}
	}
	for ctx.Err() == nil {
		if err := f.copyOnce(ctx, link); err != nil {
			if ctx.Err() == nil && !failing {
				f.lg.Warn("copying from the master failed; retrying with backoff", "master", addr, "error", err)
			}
			failing = true
			if !sleep() {
				return
			}
			continue
		}
		if failing {
			f.lg.Info("copying from the master again", "master", addr)
		}
		failing = false
		backoff = 50 * time.Millisecond
	}
}

// copyOnce fetches once from the log end and appends what came back.
func (f *follower) copyOnce(ctx context.Context, link masterLink) error {
	from := f.log.EndOffset()
	fctx, cancel := context.WithTimeout(ctx, f.fetchWait+5*time.Second)
	defer cancel()
	resp, err := link.Fetch(fctx, protocol.HAFetchRequest{
		Offset: from, MaxBytes: uint32(f.fetchBytes), WaitMillis: uint32(f.fetchWait.Milliseconds()),
		Epoch: f.epoch, BrokerID: f.id,
	})
	if err != nil {
		return err
	}
	if resp.Epoch != f.epoch {
		return fmt.Errorf("the master at %s serves epoch %d, this slave follows epoch %d", f.addr, resp.Epoch, f.epoch)
	}
	if f.masterEnd != nil {
		f.masterEnd.Store(resp.MasterEnd)
	}
	if len(resp.Records) == 0 {
		return nil
	}
	if _, err := f.log.AppendRaw(from, resp.Records, false); err != nil {
		return fmt.Errorf("append the master's records at %d: %w", from, err)
	}
	if f.appended != nil {
		f.appended()
	}
	return nil
}
