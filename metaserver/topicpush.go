package metaserver

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/protocol"
)

const (
	// maxWatchWait caps a ROUTE_WATCH's WaitMillis.
	maxWatchWait = 30 * time.Second
	// maxPushTopics and maxPushQueues bound one ROUTE_WATCH answer: at most
	// that many topics, and that many of their queue ids in all (the newest
	// topic always goes, whatever its size).
	maxPushTopics = 256
	maxPushQueues = 16384
	// maxWatchers bounds the brokers the leader keeps watch state for.
	maxWatchers = 4096
)

// routePush hands the leader's topic changes to the brokers of the groups
// that hold them, so that a topic is writable as soon as its creation is
// answered (DESIGN.md, "Route push").
//
// Each broker keeps one ROUTE_WATCH long poll at the leader, naming the
// registry version through which it has taken in its group's topics. The
// leader answers it at once when a topic with a queue on the group changed
// after that version, else parks it (no goroutine: a timer, and the
// topic-change path, answer it) until such a change, its wait, a step-down
// or Close. The broker asks again at once with the answer's version; that
// next watch is its acknowledgement. A topic creation or queue addition
// (createTopic, addQueues, and the auto-create of a route lookup, which
// goes through createTopic on the leader) waits for the acknowledgement of
// the master of every group holding the topic's queues, at most
// Config.RoutePushWait; brokers that do not watch (an older broker, or one
// unheard for that long) are not waited for.
type routePush struct {
	fsm   *fsm.FSM
	clock clockwork.Clock
	log   hclog.Logger
	wait  time.Duration // Config.RoutePushWait

	mu sync.Mutex
	// gen moves at every step-down: a watch read under an older one was
	// let in by a leadership that ended, and is answered NOT_LEADER.
	gen      uint64
	closed   bool
	watchers map[string]*watcher // by broker id; cleared at a step-down
	// acked is closed, and replaced, whenever a watcher's version moves.
	acked chan struct{}
}

// watcher is one broker's watch state.
type watcher struct {
	group   string
	version uint64 // the broker has taken in its group's topics through version
	parked  *parkedWatch
	// answered is when its last watch was answered: a broker that does
	// not ask again within RoutePushWait of an answer is taken for gone.
	answered time.Time
	// stalled: a topic change gave up waiting for this broker; later ones
	// do not wait for it until it watches again.
	stalled bool
}

// parkedWatch is a ROUTE_WATCH waiting for a change of its group's topics.
type parkedWatch struct {
	r     *transport.Request
	req   api.RouteWatch
	timer clockwork.Timer
}

func (p *routePush) init(cfg Config, f *fsm.FSM, log hclog.Logger) {
	p.fsm, p.clock, p.log, p.wait = f, cfg.Clock, log, cfg.RoutePushWait
	p.watchers = map[string]*watcher{}
	p.acked = make(chan struct{})
}

// handleRouteWatch serves ROUTE_WATCH on the leader.
func (s *Server) handleRouteWatch(r *transport.Request) {
	if !s.started.Load() {
		r.ReplyError(&protocol.Error{Status: protocol.StatusBusy, Message: "metaserver node is starting"})
		return
	}
	var req api.RouteWatch
	if err := json.Unmarshal(r.Body, &req); err != nil {
		r.ReplyError(&protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("decode %v request: %v", r.Code, err)})
		return
	}
	if err := s.authorize(r, r.Code, auth.Target{}); err != nil {
		r.ReplyError(err)
		return
	}
	if req.Group == "" || req.BrokerID == "" || req.WaitMillis < 0 {
		r.ReplyError(invalid("route watch needs a group, a broker id and a wait of 0 or more milliseconds"))
		return
	}
	gen := s.push.generation() // before the leadership check: see routePush.gen
	if !s.IsLeader() {
		if s.raft.State() == raft.Leader {
			r.ReplyError(&protocol.Error{Status: protocol.StatusBusy, Message: "leader is not ready yet"})
			return
		}
		_ = r.ReplyStatus(protocol.StatusNotLeader, []byte(s.leaderRPC()))
		return
	}
	s.push.watch(r, req, gen)
}

func (p *routePush) generation() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gen
}

// watch records what the broker has taken in and answers, or parks, its
// request.
func (p *routePush) watch(r *transport.Request, req api.RouteWatch, gen uint64) {
	now := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		r.ReplyError(protocol.ErrShuttingDown)
		return
	case p.gen != gen:
		_ = r.ReplyStatus(protocol.StatusNotLeader, nil)
		return
	}
	w := p.watchers[req.BrokerID]
	if w == nil {
		if len(p.watchers) >= maxWatchers {
			p.forgetLocked(now)
		}
		if len(p.watchers) >= maxWatchers {
			r.ReplyError(&protocol.Error{Status: protocol.StatusBusy, Message: fmt.Sprintf("%d brokers watch routes already", maxWatchers)})
			return
		}
		w = &watcher{}
		p.watchers[req.BrokerID] = w
	}
	if pw := w.parked; pw != nil {
		// The broker's earlier watch: it asks again only once that one
		// failed on its side, so nobody reads this answer. (Were two
		// brokers to share an id, the error makes each back off instead
		// of both replacing each other's watch in a loop.)
		w.parked, w.answered = nil, now
		pw.timer.Stop()
		pw.r.ReplyError(&protocol.Error{Status: protocol.StatusConflict,
			Message: fmt.Sprintf("a later route watch of broker %s replaced this one", req.BrokerID)})
	}
	if w.group != req.Group || w.version != req.Version {
		w.group, w.version = req.Group, req.Version
		close(p.acked)
		p.acked = make(chan struct{})
	}
	w.stalled = false
	reply := p.changes(req.Group, req.Version)
	wait := min(time.Duration(req.WaitMillis)*time.Millisecond, maxWatchWait)
	if len(reply.Topics) > 0 || reply.Partial || wait == 0 {
		w.answered = now
		replyJSON(r, reply)
		return
	}
	pw := &parkedWatch{r: r, req: req}
	w.parked = pw
	pw.timer = p.clock.AfterFunc(wait, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if w.parked == pw {
			p.answerLocked(w)
		}
	})
}

// forgetLocked drops the watch state of brokers with no parked watch that
// did not ask again for maxWatchWait after their last answer.
func (p *routePush) forgetLocked(now time.Time) {
	for id, w := range p.watchers {
		if w.parked == nil && now.Sub(w.answered) > maxWatchWait {
			delete(p.watchers, id)
		}
	}
}

// answerLocked answers w's parked watch with what changed since it.
func (p *routePush) answerLocked(w *watcher) {
	pw := w.parked
	w.parked, w.answered = nil, p.clock.Now()
	pw.timer.Stop()
	replyJSON(pw.r, p.changes(pw.req.Group, pw.req.Version))
}

func replyJSON(r *transport.Request, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		r.ReplyError(fmt.Errorf("encode %v response: %w", r.Code, err))
		return
	}
	_ = r.Reply(body)
}

// changes is the answer to a watch of group from version since: the
// topics with a queue on the group that changed after it, within the
// bounds of one answer.
func (p *routePush) changes(group string, since uint64) api.RouteWatchReply {
	version, topics, more := p.fsm.TopicsChanged(group, since, maxPushTopics)
	if since > version {
		// Newer than the registry: the broker saw another registry. It
		// starts over.
		version, topics, _ = p.fsm.TopicsChanged(group, 0, maxPushTopics)
		more = true
	}
	reply := api.RouteWatchReply{Version: version, Partial: more}
	first, budget := len(topics), maxPushQueues
	for first > 0 {
		n := mineCount(topics[first-1].Queues, group)
		if first < len(topics) && n > budget {
			reply.Partial = true
			break
		}
		budget -= n
		first--
	}
	for _, t := range topics[first:] {
		pt := api.PushedTopic{Name: t.Name, Queues: uint32(len(t.Queues))}
		for q, g := range t.Queues {
			// A queue moved here by a retirement must be taken up at its
			// base first: the broker's lookup does that (its first SEND is
			// answered NO_ROUTE meanwhile).
			if g == group && p.fsm.QueueState(t.Name, uint32(q)).Base == 0 {
				pt.Mine = append(pt.Mine, uint32(q))
			}
		}
		reply.Topics = append(reply.Topics, pt)
	}
	return reply
}

func mineCount(queues []string, group string) int {
	n := 0
	for _, g := range queues {
		if g == group {
			n++
		}
	}
	return n
}

// changed answers the parked watches of groups, whose topics just changed.
func (p *routePush) changed(groups []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.watchers {
		if w.parked != nil && slices.Contains(groups, w.group) {
			p.answerLocked(w)
		}
	}
}

// await waits until the master of every group in groups that watches has
// taken in the registry through version, ctx ends, or RoutePushWait
// passes. It returns the masters it stopped waiting for.
func (p *routePush) await(ctx context.Context, version uint64, groups []string) []string {
	var timer clockwork.Timer
	for {
		p.mu.Lock()
		missing := p.missingLocked(version, groups)
		acked := p.acked
		p.mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		if timer == nil {
			timer = p.clock.NewTimer(p.wait)
			defer timer.Stop()
		}
		select {
		case <-acked:
		case <-timer.Chan():
			p.stall(version, missing)
			return missing
		case <-ctx.Done():
			return missing
		}
	}
}

// stall marks the brokers a topic change gave up waiting for, unless they
// have caught up meanwhile.
func (p *routePush) stall(version uint64, ids []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		if w := p.watchers[id]; w != nil && w.version < version {
			w.stalled = true
		}
	}
}

// missingLocked returns the masters of groups that watch and have not
// taken in the registry through version. A master that does not watch,
// whose last watch was answered more than RoutePushWait ago without its
// asking again, or that an earlier change gave up waiting for (stalled) is
// not waited for, nor is that of a read-only group (it refuses every SEND
// anyway).
func (p *routePush) missingLocked(version uint64, groups []string) []string {
	now := p.clock.Now()
	var missing []string
	for _, name := range groups {
		g, ok := p.fsm.Group(name)
		if !ok || g.Master.ID == "" || !g.Writable() {
			continue
		}
		w := p.watchers[g.Master.ID]
		if w == nil || w.group != name || w.version >= version || w.stalled || w.parked == nil && now.Sub(w.answered) > p.wait {
			continue
		}
		missing = append(missing, g.Master.ID)
	}
	return missing
}

// release ends a leadership: every parked watch is answered NOT_LEADER
// (its broker asks the new leader) and the watch state is dropped, since a
// later leadership learns it afresh.
func (p *routePush) release() { p.end(false) }

// close answers every parked watch SHUTTING_DOWN and every later one too.
func (p *routePush) close() { p.end(true) }

func (p *routePush) end(closing bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gen++
	p.closed = p.closed || closing
	for _, w := range p.watchers {
		if pw := w.parked; pw != nil {
			w.parked = nil
			pw.timer.Stop()
			if closing {
				pw.r.ReplyError(protocol.ErrShuttingDown)
			} else {
				_ = pw.r.ReplyStatus(protocol.StatusNotLeader, nil)
			}
		}
	}
	p.watchers = map[string]*watcher{}
	close(p.acked)
	p.acked = make(chan struct{})
}

// pushTopic is called on the leader once a topic was created or grew
// (changed) or found to exist (a create with IfMissing): it hands the
// topic to the watching brokers of its groups and waits, at most
// RoutePushWait, until their masters have it. A follower of the
// registry's raft also learns the change before a queue addition is
// answered (a barrier), so a producer asking it for the route right after
// sees the new queues.
func (s *Server) pushTopic(ctx context.Context, name string, changed, barrier bool) {
	t, ok := s.fsm.Topic(name)
	if !ok {
		return
	}
	var groups []string
	for _, g := range t.Queues {
		if !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
	}
	if changed {
		s.push.changed(groups)
	}
	if barrier {
		timeout := s.cfg.RoutePushWait
		if dl, ok := ctx.Deadline(); ok {
			timeout = min(timeout, time.Until(dl))
		}
		if err := s.raft.Barrier(timeout).Error(); err != nil {
			s.log.Debug("barrier after a topic change failed; followers learn it with raft's next append", "topic", name, "error", err)
		}
	}
	start := s.cfg.Clock.Now()
	if missing := s.push.await(ctx, t.Version, groups); len(missing) > 0 {
		s.log.Info("answering a topic change that some brokers have not learned; they answer NO_ROUTE until they look the topic up",
			"topic", name, "brokers", missing, "waited", s.cfg.Clock.Since(start))
	}
}
