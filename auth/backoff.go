package auth

import (
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/protocol"
)

// AUTH as a server serves it behind a Gate: a wrong token is answered
// late, and the later the more a connection or its source got wrong; a
// connection waiting for such an answer has no token checked; a connection
// is closed after MaxAuthFailures. No goroutine waits: a failure's answer
// is given by a timer (transport replies never block).

// LoginRequest is an AUTH request as a server's handler has it
// (transport.Request is one): its connection, the gate's admission of it
// (nil without a Gate), and its answers.
type LoginRequest interface {
	Conn
	Admission() Admission
	Reply(body []byte) error
	ReplyError(err error)
}

// errNotChecked answers an AUTH sent while the answer to a failed one of
// its connection (or too many of its source) was held back.
var errNotChecked = &protocol.Error{Status: protocol.StatusNotAuthorized,
	Message: "token not checked: AUTHs of this connection or its address failed just before; wait for their answers"}

// BeginLogin tells whether the token of r, an AUTH request, may be checked
// now (then call AnswerLogin). If not (r's connection is waiting for the
// answer to a failed AUTH, is being closed for failures, or its source has
// MaxUnauthPerSource answers held back), r failed: it is answered after
// its backoff, and BeginLogin returns false.
func BeginLogin(r LoginRequest) bool {
	a, _ := r.Admission().(*admission)
	if a == nil {
		return true
	}
	g := a.g
	g.mu.Lock()
	now := g.cfg.Clock.Now()
	src := g.sources[a.key]
	if !a.closed && a.failures < g.cfg.MaxAuthFailures && !a.checking && !now.Before(a.answerAt) &&
		(src == nil || src.held < g.cfg.MaxUnauthPerSource) {
		a.checking = true
		g.mu.Unlock()
		return true
	}
	a.failLocked(r, errNotChecked, now) // unlocks
	return false
}

// AnswerLogin answers r, an AUTH request that BeginLogin let through, by
// Login of token (its body) in t. A token t recognises is answered at
// once; should the server's table have changed meanwhile (current, the
// table now) to one that does not recognise it, the connection is closed,
// as the owner's sweep of revoked connections (Revoked) may have missed it.
// A token t does not recognise is answered after the gate's backoff.
func AnswerLogin(r LoginRequest, token []byte, t *Table, current func() *Table) {
	a, _ := r.Admission().(*admission)
	reply, err := Login(r, t, token)
	if a == nil {
		answerLogin(r, reply, err)
		return
	}
	g := a.g
	if err != nil {
		g.mu.Lock()
		a.checking = false
		a.failLocked(r, err, g.cfg.Clock.Now()) // unlocks
		return
	}
	g.mu.Lock()
	a.checking = false
	g.mu.Unlock()
	if now := current(); now != nil && now != t && Revoked(now)(r.Peer()) {
		r.ReplyError(errTokenUnknown)
		a.drop(ErrRevoked)
		return
	}
	answerLogin(r, reply, nil)
}

func answerLogin(r LoginRequest, reply protocol.AuthReply, err error) {
	if err != nil {
		r.ReplyError(err)
		return
	}
	_ = r.Reply(protocol.AppendAuthReply(nil, &reply))
}

// failLocked counts a failed AUTH r of a's connection at now and holds
// its answer err back: FailureDelay doubled per failure before it of the
// connection or its source, up to MaxFailureDelay, and after the answers
// held back before it. It warns (once per source per WarnInterval). Called
// with the gate's mu held, which it unlocks.
func (a *admission) failLocked(r LoginRequest, err error, now time.Time) {
	g := a.g
	g.failures.Add(1)
	src := g.sourceLocked(a.key, now)
	src.failures++
	src.last = now
	a.failures++
	n := max(a.failures, src.failures)
	delay := g.cfg.MaxFailureDelay
	if n <= 30 {
		delay = min(delay, g.cfg.FailureDelay<<(n-1))
	}
	at := now.Add(delay)
	if at.Before(a.answerAt) {
		at = a.answerAt // one connection's answers in order
	}
	a.answerAt = at
	if a.failures == g.cfg.MaxAuthFailures {
		msg := err.Error()
		if pe, ok := err.(*protocol.Error); ok {
			msg = pe.Message
		}
		err = &protocol.Error{Status: protocol.StatusNotAuthorized,
			Message: fmt.Sprintf("%s; %d AUTHs of this connection failed: it is closed", msg, a.failures)}
	}
	var warn int
	src.unwarned++
	if src.warned.IsZero() || now.Sub(src.warned) >= g.cfg.WarnInterval {
		warn, src.unwarned, src.warned = src.unwarned, 0, now
	}
	var now1 *heldAnswer
	if a.closed {
		now1 = &heldAnswer{r: r, err: err}
	} else {
		src.held++
		h := &heldAnswer{r: r, err: err}
		a.held = append(a.held, h)
		h.timer = g.cfg.Clock.AfterFunc(at.Sub(now), func() { a.give(h) })
	}
	g.mu.Unlock()
	if warn > 0 {
		g.cfg.Logger.Warn(fmt.Sprintf("failed AUTHs from %s: %d since the last warning (a wrong token, or one sent during the backoff of failures before it); their answers are held back up to %v and a connection is closed after %d",
			a.key, warn, g.cfg.MaxFailureDelay, g.cfg.MaxAuthFailures), "source", a.key, "failures", warn)
	}
	if now1 != nil {
		now1.r.ReplyError(now1.err)
	}
}

// give answers h, a failed AUTH of a's connection whose backoff is over
// (unless Closed gave it already). Once the connection has failed
// MaxAuthFailures times, its other held answers are given too, and it is
// closed.
func (a *admission) give(h *heldAnswer) {
	g := a.g
	g.mu.Lock()
	i := -1
	for j, x := range a.held {
		if x == h {
			i = j
			break
		}
	}
	if i < 0 {
		g.mu.Unlock()
		return
	}
	a.held = append(a.held[:i], a.held[i+1:]...)
	g.unholdLocked(a.key)
	var rest []*heldAnswer
	closing := a.failures >= g.cfg.MaxAuthFailures && !a.closed
	if closing {
		rest = a.takeHeldLocked()
	}
	g.mu.Unlock()
	h.r.ReplyError(h.err)
	for _, x := range rest {
		x.r.ReplyError(x.err)
	}
	if closing {
		a.drop(errTooManyFailures)
	}
}

// sourceLocked returns the record of the source key at now, made if
// missing (unless maxSources are remembered, none of whose failures are
// old), its failures forgotten FailureMemory after its last one.
func (g *Gate) sourceLocked(key string, now time.Time) *source {
	src := g.sources[key]
	if src == nil {
		if len(g.sources) >= maxSources {
			for k, s := range g.sources {
				if s.held == 0 && now.Sub(s.last) > g.cfg.FailureMemory && now.Sub(s.warned) >= g.cfg.WarnInterval {
					delete(g.sources, k)
				}
			}
			if len(g.sources) >= maxSources {
				return &source{} // not remembered: its connections' own backoff holds
			}
		}
		src = &source{}
		g.sources[key] = src
	}
	if src.held == 0 && now.Sub(src.last) > g.cfg.FailureMemory {
		src.failures = 0
	}
	return src
}

// unholdLocked notes that an answer held back for the source key was given.
func (g *Gate) unholdLocked(key string) {
	if src := g.sources[key]; src != nil && src.held > 0 {
		src.held--
	}
}

// Revoked returns, for a server's new table t, what tells the connections
// to close (transport.Server.DropConns's match, with ErrRevoked): those
// whose identity (the Session that Login or Resolve stored) t no longer
// knows — its principal was removed, or its token replaced.
func Revoked(t *Table) func(peer any) bool {
	return func(peer any) bool {
		s, ok := peer.(*Session)
		if !ok {
			return false
		}
		_, err := s.principal(t)
		return err != nil
	}
}
