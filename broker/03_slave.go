package broker

import (
	"context"
	"time"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

// slaveLoop copies the master's log: it fetches from its own end offset,
// appends what comes back at the same offsets, and fetches again (which
// acknowledges the append). After any error it backs off and reconnects.
func (b *Broker) slaveLoop() {
	var cl *transport.Client
	var clAddr string
	defer func() {
		if cl != nil {
			_ = cl.Close()
		}
	}()
	backoff := 50 * time.Millisecond
	sleep := func() bool {
		t := time.NewTimer(backoff)
		defer t.Stop()
		backoff = min(2*backoff, 2*time.Second)
		select {
		case <-b.ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	for b.ctx.Err() == nil {
		addr, _ := b.masterHA.Load().(string)
		if addr == "" {
			if !sleep() {
				return
			}
			continue
		}
		if cl == nil || clAddr != addr {
			if cl != nil {
				_ = cl.Close()
			}
			cl, clAddr = transport.NewClient(addr, transport.ClientConfig{}), addr
		}
		from := b.store.EndOffset()
		req := protocol.AppendHAFetchRequest(nil, &protocol.HAFetchRequest{
			Offset: from, MaxBytes: uint32(b.cfg.HAFetchBytes), WaitMillis: uint32(b.cfg.HAFetchWait.Milliseconds()),
		})
		ctx, cancel := context.WithTimeout(b.ctx, b.cfg.HAFetchWait+5*time.Second)
		resp, err := cl.Call(ctx, protocol.CodeHAFetch, req)
		cancel()
		if err != nil {
			if b.ctx.Err() == nil {
				b.log.Debug("fetch from the master failed", "master", addr, "error", err)
			}
			if !sleep() {
				return
			}
			continue
		}
		fr, err := protocol.DecodeHAFetchResponse(resp.Body)
		if err == nil && len(fr.Records) > 0 {
			_, err = b.store.AppendRaw(from, fr.Records, false)
		}
		if err != nil {
			b.log.Warn("copying the master's log failed", "offset", from, "error", err)
			if !sleep() {
				return
			}
			continue
		}
		backoff = 50 * time.Millisecond
	}
}
