package broker

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"pgregory.net/rapid"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// slowRegistry is a registry whose commits the model decides: a proposal
// waits until the model commits it (as the FSM would, compare-and-set) or
// refuses it, in any order against acks, appends and the clock.
type slowRegistry struct {
	mem     *memRegistry
	pending chan proposal
}

type proposal struct {
	req  api.AlterSyncSetRequest
	done chan routing.Group // closed without a value: refused
}

func (s *slowRegistry) alter(ctx context.Context, req api.AlterSyncSetRequest) (routing.Group, error) {
	p := proposal{req: req, done: make(chan routing.Group, 1)}
	select {
	case s.pending <- p:
	case <-ctx.Done():
		return routing.Group{}, ctx.Err()
	}
	select {
	case g, ok := <-p.done:
		if !ok {
			return routing.Group{}, &protocol.Error{Status: protocol.StatusConflict, Message: "refused by the model"}
		}
		return g, nil
	case <-ctx.Done():
		return routing.Group{}, ctx.Err()
	}
}

// The sync set's promise, over any interleaving of appends, acknowledgements
// (each slave acknowledges only what it holds), the clock, and commits or
// refusals of the master's proposals in any order and at any delay: every
// member of the registry's committed set holds every HIGH message answered
// OK, at every moment; no HIGH message is answered OK while the committed
// set is below the minimum; and every answer is given once.
func TestSyncSetModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		slaves := []string{"s1", "s2", "s3"}
		clock := clockwork.NewFakeClock()
		mem := newMemRegistry(testEpoch)
		for _, id := range slaves {
			mem.g.Slaves = append(mem.g.Slaves, routing.Broker{ID: id, Addr: id})
		}
		mem.g.MinInSync = rapid.IntRange(1, 4).Draw(rt, "min")
		reg := &slowRegistry{mem: mem, pending: make(chan proposal, 1)}
		log := &modelLog{}
		repl := modelRepl(log, clock)
		repl.alter = reg.alter
		repl.setGroup(mem.group(), testMaster)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()

		holds := map[string]int64{} // what each slave holds (and acknowledged)
		okMax := int64(0)           // the highest end of a HIGH message answered OK
		answered := map[int]protocol.Status{}
		type waiter struct {
			end int64
			st  chan protocol.Status
		}
		var waiters []waiter
		var inFlight *proposal

		check := func(what string) {
			// Collect answers; each exactly once.
			for i, w := range waiters {
				for len(w.st) > 0 {
					st := <-w.st
					if _, dup := answered[i]; dup {
						rt.Fatalf("%s: HIGH message %d answered twice", what, i)
					}
					answered[i] = st
					if st == protocol.StatusOK {
						okMax = max(okMax, w.end)
					}
				}
			}
			// Whom a failover may promote: the committed set and the
			// eligible members.
			g := mem.group()
			for _, id := range append(slices.Clone(g.InSync), g.Eligible...) {
				if holds[id] < okMax {
					rt.Fatalf("%s: %s, promotable (set %v, eligible %v), holds %d, below the HIGH message answered at %d",
						what, id, g.InSync, g.Eligible, holds[id], okMax)
				}
			}
		}
		ack := func(id string, end int64) {
			rep := make(chanReplier, 1)
			repl.handleAck(rep, protocol.AppendHAAck(nil, &protocol.HAAck{Acked: end, Epoch: testEpoch, BrokerID: id}))
			<-rep
		}
		// takeProposal picks up a proposal the replication loop sent.
		takeProposal := func() {
			if inFlight != nil {
				return
			}
			select {
			case p := <-reg.pending:
				inFlight = &p
			default:
			}
		}

		steps := rapid.IntRange(1, 60).Draw(rt, "steps")
		for i := range steps {
			takeProposal()
			switch rapid.IntRange(0, 5).Draw(rt, fmt.Sprintf("action%d", i)) {
			case 0: // a HIGH message
				end := log.append(rapid.Int64Range(1, 100).Draw(rt, "size"))
				w := waiter{end: end, st: make(chan protocol.Status, 2)}
				waiters = append(waiters, w)
				repl.await(end, func(st protocol.Status) {
					select {
					case w.st <- st:
					default: // a third answer: the check has seen two already
					}
				})
			case 1: // a slave copies and acknowledges
				id := rapid.SampledFrom(slaves).Draw(rt, "slave")
				if end := log.end(); holds[id] < end {
					holds[id] += rapid.Int64Range(1, end-holds[id]).Draw(rt, "copied")
				}
				ack(id, holds[id])
			case 2: // time passes, the loop steps
				clock.Advance(time.Duration(rapid.IntRange(1, 1500).Draw(rt, "ms")) * time.Millisecond)
				repl.step(ctx)
			case 3: // the registry commits the proposal in flight
				if inFlight != nil {
					g, err := mem.alter(ctx, inFlight.req)
					if err != nil {
						close(inFlight.done)
					} else {
						inFlight.done <- g
					}
					inFlight = nil
					proposalDone(rt, repl)
				}
			case 4: // or refuses it
				if inFlight != nil {
					close(inFlight.done)
					inFlight = nil
					proposalDone(rt, repl)
				}
			case 5: // a heartbeat reply brings the committed group
				repl.setGroup(mem.group(), testMaster)
			}
			check(fmt.Sprintf("step %d", i))
		}
		cancel()
		if inFlight != nil {
			close(inFlight.done)
		}
		proposalDone(rt, repl)
		check("the end")
	})
}

// modelLog is a master log of the model: only its end matters.
type modelLog struct{ n atomic.Int64 }

func (l *modelLog) append(size int64) int64                              { return l.n.Add(size) }
func (l *modelLog) end() int64                                           { return l.n.Load() }
func (l *modelLog) EndOffset() int64                                     { return l.n.Load() }
func (l *modelLog) ReadRawTo(dst []byte, _ int64, _ int) ([]byte, error) { return dst, nil }
func (l *modelLog) RecordAt(int64) (int64, uint32, error)                { return 0, 0, nil }
