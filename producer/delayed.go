package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// Cancel cancels the pending delayed message that h names (a Result's
// Handle) and returns what became of it: State protocol.DelayCancelled
// with By "cancel" when this call cancelled it; otherwise what had happened
// before: released (Released says at which queue offset and when), or
// cancelled by an earlier call (By ""). A pending record that retention
// moved (State protocol.DelayMoved) is followed to its new log offset
// (MovedTo), up to maxMoves times: the answer is then the new record's
// (its Offset the new one). A cancel whose answer was lost is sent again,
// so a message this call cancelled may be answered cancelled with By ""
// (the retry found it cancelled).
//
// The call goes to the master of h's group, found in the producer's routes
// (a topic it sent to that has a queue in the group), or else in the
// metaserver's list of groups (which needs the describe permission: a
// producer without it cancels only in groups its routes name). It is
// retried while the group has no master, its master changes, or the broker
// cannot be reached, until ctx ends (DeliveryTimeout if ctx has no
// deadline). Errors: protocol.ErrNotFound when the group has no pending
// record at h's offset (or no such group), protocol.ErrInvalid for a
// handle that names no group or a negative offset, protocol.ErrNotAuthorized
// without the produce permission on the message's topic, ErrClosed, and
// otherwise the context's error wrapping the last attempt's cause
// (ErrConnLost, ErrUnreachable, a retriable status).
func (c *Client) Cancel(ctx context.Context, h protocol.Handle) (protocol.DelayedState, error) {
	return c.delayedCall(ctx, protocol.CodeDelayedCancel, "cancel", h)
}

// DelayedState returns what became of the delayed message that h names:
// pending, released (and where), cancelled, or moved (see Cancel). It
// finds the group's master, retries and fails as Cancel does; it needs the
// produce or describe permission on the message's topic.
func (c *Client) DelayedState(ctx context.Context, h protocol.Handle) (protocol.DelayedState, error) {
	return c.delayedCall(ctx, protocol.CodeDelayedState, "delayed state", h)
}

// maxMoves bounds how many moved pending records a call follows (each
// move is a retention pass over the record's segment: a long delay sees a
// few).
const maxMoves = 64

// delayedCall makes a DELAYED_CANCEL or DELAYED_STATE call (what names it
// in errors) for h at its group's master, retrying what can be retried.
func (c *Client) delayedCall(ctx context.Context, code protocol.Code, what string, h protocol.Handle) (protocol.DelayedState, error) {
	fail := func(err error) (protocol.DelayedState, error) {
		return protocol.DelayedState{}, fmt.Errorf("producer: %s %s: %w", what, h, err)
	}
	switch {
	case c.life.closed.Load():
		return fail(ErrClosed)
	case h.Group == "" || h.Offset < 0:
		return fail(&protocol.Error{Status: protocol.StatusInvalid, Message: "a handle names a broker group and a log offset >= 0"})
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.deliveryTimeout)
		defer cancel()
	}
	body, _ := json.Marshal(protocol.DelayedRef{Offset: h.Offset, DueAt: h.DueAt})
	var lastErr error
	avoid := "" // a master that answered NOT_MASTER, or could not be reached
	moves := 0
	for attempt := 1; ; attempt++ {
		addr, err := c.groupMaster(ctx, h.Group, avoid)
		if err == nil {
			var st protocol.DelayedState
			st, err = c.callDelayed(ctx, addr, h.Group, code, body)
			if err == nil && st.State == protocol.DelayMoved && st.MovedTo > st.Offset && moves < maxMoves {
				// Retention moved the pending record: ask about its new one.
				moves++
				body, _ = json.Marshal(protocol.DelayedRef{Offset: st.MovedTo, DueAt: h.DueAt})
				attempt = 0
				continue
			}
			if err == nil {
				return st, nil
			}
			if protocol.StatusOf(err).RefreshesRoute() || clientcore.KindOf(err) == clientcore.KindUnreachable {
				avoid = addr // not the master, or not answering: look again
			}
		}
		lastErr = err
		switch {
		case c.life.closed.Load() || clientcore.KindOf(err) == clientcore.KindClosed:
			return fail(ofKind(ErrClosed, "%w", err))
		case ctx.Err() != nil:
			return fail(fmt.Errorf("%w (last attempt: %w)", ctx.Err(), lastErr))
		case !clientcore.Retriable(err):
			return fail(err)
		}
		t := time.NewTimer(c.cfg.backoff(attempt, time.Second))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fail(fmt.Errorf("%w (last attempt: %w)", ctx.Err(), lastErr))
		case <-c.life.stop:
			t.Stop()
			return fail(ofKind(ErrClosed, "%w", lastErr))
		}
	}
}

// callDelayed makes one call of code to a group's master at addr and
// decodes its DelayedState.
func (c *Client) callDelayed(ctx context.Context, addr, group string, code protocol.Code, body []byte) (protocol.DelayedState, error) {
	conn := c.wire.conn(addr)
	if conn == nil {
		return protocol.DelayedState{}, ErrClosed
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.requestTimeout)
	defer cancel()
	resp, err := conn.Call(cctx, code, body)
	switch {
	case errors.Is(err, transport.ErrClosed):
		return protocol.DelayedState{}, ofKind(ErrClosed, "group %s at %s: %w", group, addr, err)
	case errors.Is(err, transport.ErrConnLost):
		return protocol.DelayedState{}, ofKind(ErrConnLost, "group %s at %s: %w", group, addr, err)
	case err != nil:
		return protocol.DelayedState{}, fmt.Errorf("group %s at %s: %w", group, addr, err)
	}
	var st protocol.DelayedState
	if err := json.Unmarshal(resp.Body, &st); err != nil {
		return protocol.DelayedState{}, fmt.Errorf("group %s at %s: %w: %s answer: %w", group, addr, protocol.ErrMalformed, code, err)
	}
	return st, nil
}

// groupMaster is the address of a broker group's master: the newest
// (highest epoch) that the producer's cached routes name, unless that is
// avoid (it did not answer as the master: those routes are refreshed);
// else the metaserver's, from its list of groups, or, when the metaserver
// refuses that list (no describe permission), the cached one after all.
// An error is a status: NOT_FOUND for a group the metaserver does not
// know, NO_ROUTE (retriable) while it has no master.
func (c *Client) groupMaster(ctx context.Context, group, avoid string) (string, error) {
	var best routing.QueueRoute
	var topics []string
	c.router.cache.Range(func(topic string, e *clientcore.Entry[*topicPlan]) {
		if !e.Known {
			return
		}
		for _, q := range e.Route.Queues {
			if q.Group != group || q.Master == "" {
				continue
			}
			if len(topics) == 0 || topics[len(topics)-1] != topic {
				topics = append(topics, topic)
			}
			if best.Master == "" || q.Epoch > best.Epoch {
				best = q
			}
		}
	})
	if best.Master != "" && best.Master != avoid {
		return best.Master, nil
	}
	for _, t := range topics {
		c.router.refreshSoon(t)
	}
	lctx, cancel := context.WithTimeout(ctx, c.cfg.requestTimeout)
	defer cancel()
	groups, err := c.meta.Groups(lctx)
	if err != nil {
		if best.Master != "" && errors.Is(err, protocol.ErrNotAuthorized) {
			return best.Master, nil
		}
		return "", metaErr("group lookup", err)
	}
	for _, g := range groups {
		if g.Name != group {
			continue
		}
		if g.Master.Addr == "" {
			return "", &protocol.Error{Status: protocol.StatusNoRoute, Message: fmt.Sprintf("group %s has no master", group)}
		}
		return g.Master.Addr, nil
	}
	return "", &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("no broker group %q", group)}
}
