package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

// slaveLog is the part of the commit log that the follower writes.
type slaveLog interface {
	EndOffset() int64
	AppendRaw(offset int64, data []byte, flush bool) (int64, error)
	LastRecord() (at int64, crc uint32, ok bool, err error)
}

// masterLink fetches from one master's HA address and acknowledges to it.
type masterLink interface {
	// Fetch returns the answer and its release, which says its Records
	// (read into a recycled buffer) are no longer used; release is never
	// nil, and a caller that does not call it leaves the buffer to the
	// garbage collector.
	Fetch(ctx context.Context, req protocol.HAFetchRequest) (resp protocol.HAFetchResponse, release func(), err error)
	// Ack sends an HA_ACK without waiting for the master: it returns once
	// the acknowledgement is on its way (or could not be sent).
	Ack(ctx context.Context, ack protocol.HAAck) error
	Close() error
}

// dialMaster opens a link to a master's HA address over the transport:
// one connection for fetches and one for acknowledgements. An ack must not
// wait behind a parked fetch: the master's connection reader admits a
// request only while the answers it owes fit in its write buffer, and a
// parked fetch has reserved a whole answer's worth. Fetch answers are read
// into recycled buffers (transport.ClientConfig.PooledAnswers), given back
// once appended: a fresh buffer per answer (up to 4 MiB, cleared by the
// allocator, then collected and returned to the OS) was a fifth of the
// slave's CPU.
func dialMaster(addr string) masterLink { return masterDialer(nil, "")(addr) }

// masterDialer is dialMaster over TLS with tlsCfg (nil: plaintext),
// presenting token (the cluster's; "": none).
func masterDialer(tlsCfg *tls.Config, token string) func(addr string) masterLink {
	return func(addr string) masterLink {
		cfg := transport.ClientConfig{TLS: tlsCfg, Login: auth.TokenLogin(token)}
		fetches := cfg
		fetches.PooledAnswers = true
		return &transportLink{c: transport.NewClient(addr, fetches), acks: transport.NewClient(addr, cfg)}
	}
}

type transportLink struct{ c, acks *transport.Client }

func (l *transportLink) Fetch(ctx context.Context, req protocol.HAFetchRequest) (protocol.HAFetchResponse, func(), error) {
	resp, release, err := l.c.CallPooled(ctx, protocol.CodeHAFetch, protocol.AppendHAFetchRequest(nil, &req))
	if err != nil {
		release()
		return protocol.HAFetchResponse{}, func() {}, err
	}
	a, err := decodeFetchAnswer(req, resp.Body)
	if err != nil {
		release()
		return protocol.HAFetchResponse{}, func() {}, err
	}
	return a, release, nil
}

// decodeFetchAnswer decodes the answer to req: with its start offset when
// req is sequenced.
func decodeFetchAnswer(req protocol.HAFetchRequest, body []byte) (protocol.HAFetchResponse, error) {
	if req.Sequenced {
		return protocol.DecodeHAFetchResponseSequenced(body)
	}
	return protocol.DecodeHAFetchResponse(body)
}

func (l *transportLink) Ack(ctx context.Context, ack protocol.HAAck) error {
	return l.acks.Send(ctx, protocol.CodeHAAck, protocol.AppendHAAck(nil, &ack))
}

func (l *transportLink) Close() error { return errors.Join(l.c.Close(), l.acks.Close()) }

// follower is the slave's side of HA sync in one epoch. It copies in a
// pipeline of two goroutines, so that appending one answer overlaps the
// transfer of the next:
//
//   - the fetcher keeps two fetches in flight (fetchAhead): the first from
//     the received end (the log end plus what it has received and not yet
//     appended), each next one following the one before it, so the master
//     answers it from where its answer to that one ended; it hands each
//     answer to the appender, then sends one more fetch;
//   - the appender appends each answer at its offset, then acknowledges the
//     new log end to the master (a oneway HA_ACK).
//
// Every fetch also carries the log end when it was sent as its Acked, so an
// acknowledgement lost with a connection is repeated by the next fetch. What
// the slave acknowledges is always its own log end after an append: bytes it
// holds. At most one answer waits for the appender, so the fetcher is at
// most three answers ahead and stops fetching while the appender is stuck.
// A master that refuses numbered fetches (one older than them) is fetched
// from one fetch at a time (single).
//
// Every fetch and ack names the slave and its epoch; an answer from a master
// of another epoch ends the pipeline. After any error the pipeline is
// drained and the follower backs off and starts again from its log end.
// roles starts one per epoch and master.
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
	// onDiverged is told, once, that the master refused this log as not a
	// prefix of its own (LOG_DIVERGED); the follower then stops. nil: it
	// goes on retrying.
	onDiverged func(error)
	// serial fetches only once the previous answer is appended, with the
	// next fetch as the acknowledgement and no HA_ACK: the protocol before
	// the pipeline, kept for BenchmarkReplicationHigh's comparison.
	serial  bool
	failing bool // the last copy failed (owned by run's goroutine)
	// single: one fetch at a time, unsequenced (a master that refuses
	// sequenced fetches, one older than them; owned by run's goroutine).
	single bool
	seq    uint32 // the last sequenced fetch's number (owned by the fetcher)
}

// chunk is an answer received and not yet appended.
type chunk struct {
	offset   int64
	records  []byte
	release  func()        // gives records' buffer back once appended
	appended chan struct{} // closed once appended; only when serial
}

func (f *follower) run(ctx context.Context) {
	link := f.dial(f.addr)
	defer func() { _ = link.Close() }()
	backoff := 50 * time.Millisecond
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
		progressed, err := f.stream(ctx, link)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, protocol.ErrLogDiverged) && f.onDiverged != nil {
			f.lg.Error("the master refuses this slave's log: it is not a prefix of the master's", "master", f.addr, "error", err)
			f.onDiverged(err)
			return
		}
		if progressed {
			backoff = 50 * time.Millisecond
		}
		if !f.failing {
			f.lg.Warn("copying from the master failed; retrying with backoff", "master", f.addr, "error", err)
		}
		f.failing = true // logged once per outage
		if !sleep() {
			return
		}
	}
}

// stream runs the pipeline from the log end until an error (or ctx ends),
// which it returns once both goroutines have stopped; progressed reports
// whether any fetch was answered.
func (f *follower) stream(ctx context.Context, link masterLink) (progressed bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	chunks := make(chan chunk, 1)
	appendErr := make(chan error, 1)
	go func() {
		err := f.appendLoop(ctx, link, chunks)
		cancel() // stop the fetcher (a parked fetch ends at once)
		appendErr <- err
	}()
	progressed, err = f.fetchLoop(ctx, link, chunks)
	cancel()
	if aerr := <-appendErr; aerr != nil {
		err = aerr // the first cause: the fetcher saw only the cancellation
	}
	return progressed, err
}

// heard notes an answer of the master's, whose log then ended at
// masterEnd: copying works again (said once after a failure). It returns
// true: the stream progressed.
func (f *follower) heard(masterEnd int64) bool {
	if f.failing {
		f.lg.Info("copying from the master again", "master", f.addr)
		f.failing = false
	}
	if f.masterEnd != nil {
		f.masterEnd.Store(masterEnd)
	}
	return true
}

// fetchLoop fetches from the received end and hands the answers over.
func (f *follower) fetchLoop(ctx context.Context, link masterLink, chunks chan<- chunk) (progressed bool, err error) {
	next := f.log.EndOffset() // the received end
	// The first fetch names the log's last record: the master checks that it
	// is its own record there, so the copy continues a prefix of its log.
	at, crc, check, err := f.log.LastRecord()
	if err != nil {
		return false, fmt.Errorf("read the log's last record: %w", err)
	}
	if !f.serial && !f.single {
		return f.fetchAhead(ctx, link, chunks, protocol.HAFetchRequest{
			Offset: next, Acked: next, MaxBytes: uint32(f.fetchBytes),
			WaitMillis: uint32(f.fetchWait.Milliseconds()), Epoch: f.epoch, BrokerID: f.id,
			Check: check, CheckAt: at, CheckCRC: crc,
		})
	}
	for {
		fctx, cancel := context.WithTimeout(ctx, f.fetchWait+5*time.Second)
		resp, release, err := link.Fetch(fctx, protocol.HAFetchRequest{
			Offset: next, Acked: f.log.EndOffset(), MaxBytes: uint32(f.fetchBytes),
			WaitMillis: uint32(f.fetchWait.Milliseconds()), Epoch: f.epoch, BrokerID: f.id,
			Check: check, CheckAt: at, CheckCRC: crc,
		})
		cancel()
		check = false
		if err != nil {
			return progressed, err
		}
		if resp.Epoch != f.epoch {
			return progressed, fmt.Errorf("the master at %s serves epoch %d, this slave follows epoch %d", f.addr, resp.Epoch, f.epoch)
		}
		progressed = f.heard(resp.MasterEnd)
		if len(resp.Records) == 0 {
			release()
			continue
		}
		c := chunk{offset: next, records: resp.Records, release: release}
		if f.serial {
			c.appended = make(chan struct{})
		}
		select {
		case chunks <- c:
		case <-ctx.Done():
			return progressed, ctx.Err()
		}
		next += int64(len(resp.Records))
		if f.serial {
			select {
			case <-c.appended:
			case <-ctx.Done():
				return progressed, ctx.Err()
			}
		}
	}
}

// fetched is the outcome of a fetch in flight.
type fetched struct {
	resp    protocol.HAFetchResponse
	release func()
	err     error
}

// pendingFetch is a sequenced fetch in flight.
type pendingFetch struct {
	seq  uint32
	done chan fetched // capacity 1
}

// fetchAhead is fetchLoop keeping two fetches in flight: first (from the
// received end), then each one following the one before it (from where
// the master's answer to that one ends), so a fetch waits at the master
// while the answer to the previous one travels and new bytes go out as
// soon as the master has them. Every answer carries its start offset,
// which must be the received end: otherwise the stream stops and starts
// again from the log end.
func (f *follower) fetchAhead(ctx context.Context, link masterLink, chunks chan<- chunk, first protocol.HAFetchRequest) (progressed bool, err error) {
	var queue []pendingFetch
	defer func() {
		for _, p := range queue { // they end with ctx, cancelled first
			if r := <-p.done; r.err == nil {
				r.release()
			}
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Numbers start at random, so a fetch of this stream hardly ever names
	// one the master answered in an earlier stream (or to an earlier
	// process); if one does, its answer's start shows it.
	f.seq = rand.Uint32()
	send := func(req protocol.HAFetchRequest) {
		f.seq++
		req.Sequenced, req.Seq = true, f.seq
		p := pendingFetch{seq: f.seq, done: make(chan fetched, 1)}
		queue = append(queue, p)
		go func() {
			fctx, cancel := context.WithTimeout(ctx, f.fetchWait+5*time.Second)
			resp, release, err := link.Fetch(fctx, req)
			cancel()
			p.done <- fetched{resp, release, err}
		}()
	}
	next := first.Offset // the received end
	follow := func() {
		req := first
		req.Offset, req.Acked, req.Check = next, min(f.log.EndOffset(), next), false
		req.Follows, req.After = true, queue[len(queue)-1].seq
		send(req)
	}
	send(first)
	follow()
	for answered := false; ; answered = true {
		var r fetched
		select {
		case r = <-queue[0].done:
		case <-ctx.Done():
			return progressed, ctx.Err()
		}
		queue = queue[1:]
		if r.err != nil {
			if !answered && errors.Is(r.err, protocol.ErrInvalid) {
				// A master older than sequenced fetches: one at a time.
				f.lg.Warn("the master refuses sequenced fetches; fetching one at a time", "master", f.addr, "error", r.err)
				f.single = true
			}
			return progressed, r.err
		}
		resp := r.resp
		if resp.Epoch != f.epoch {
			r.release()
			return progressed, fmt.Errorf("the master at %s serves epoch %d, this slave follows epoch %d", f.addr, resp.Epoch, f.epoch)
		}
		if resp.Start != next {
			r.release()
			return progressed, fmt.Errorf("the master's answer starts at %d, not at the received end %d", resp.Start, next)
		}
		progressed = f.heard(resp.MasterEnd)
		if len(resp.Records) == 0 {
			r.release()
		} else {
			select {
			case chunks <- chunk{offset: next, records: resp.Records, release: r.release}:
			case <-ctx.Done():
				r.release()
				return progressed, ctx.Err()
			}
			next += int64(len(resp.Records))
		}
		follow()
	}
}

// appendLoop appends what the fetcher received, in order, and acknowledges
// each append.
func (f *follower) appendLoop(ctx context.Context, link masterLink, chunks <-chan chunk) error {
	for {
		var c chunk
		select {
		case c = <-chunks:
		case <-ctx.Done():
			return nil
		}
		end, err := f.log.AppendRaw(c.offset, c.records, false)
		c.release() // the log copied the records
		if err != nil {
			return fmt.Errorf("append the master's records at %d: %w", c.offset, err)
		}
		if f.appended != nil {
			f.appended()
		}
		if c.appended != nil {
			close(c.appended) // serial: the next fetch acknowledges it
			continue
		}
		// Best effort: if it is lost, the next fetch carries the same end.
		_ = link.Ack(ctx, protocol.HAAck{Acked: end, Epoch: f.epoch, BrokerID: f.id})
	}
}
