package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// Dial makes a connection to the broker at addr with the caller's
// credential and TLS settings; the caller of Dial closes it.
type Dial func(addr string) *transport.Client

// Call runs fn on a new connection to the broker at addr, closed after.
func Call(ctx context.Context, dial Dial, addr string, fn func(context.Context, *transport.Client) error) error {
	tc := dial(addr)
	defer tc.Close()
	return fn(ctx, tc)
}

// With runs fn on a connection to the broker at addr: a new one (Dial.With)
// or one the caller keeps for several calls.
type With func(ctx context.Context, addr string, fn func(context.Context, *transport.Client) error) error

// With runs fn on a new connection to addr, closed after (Call).
func (d Dial) With(ctx context.Context, addr string, fn func(context.Context, *transport.Client) error) error {
	return Call(ctx, d, addr, fn)
}

// Caller is dial as a clientcore.Caller: one call on a new connection.
func Caller(dial Dial) clientcore.Caller {
	return func(ctx context.Context, addr string, code protocol.Code, body []byte) (out []byte, err error) {
		err = Call(ctx, dial, addr, func(ctx context.Context, tc *transport.Client) error {
			resp, err := tc.Call(ctx, code, body)
			out = resp.Body
			return err
		})
		return out, err
	}
}

// CallJSON makes a call with a JSON request and decodes its JSON answer
// into out.
func CallJSON(ctx context.Context, tc *transport.Client, code protocol.Code, req []byte, out any) error {
	resp, err := tc.Call(ctx, code, req)
	if err != nil {
		return err
	}
	return json.Unmarshal(resp.Body, out)
}

// CallBrokerJSON is CallJSON on a new connection to addr.
func CallBrokerJSON(ctx context.Context, dial Dial, addr string, code protocol.Code, req []byte, out any) error {
	return Call(ctx, dial, addr, func(ctx context.Context, tc *transport.Client) error { return CallJSON(ctx, tc, code, req, out) })
}

// Note is told what a read did besides the expected (a fallback to the
// slave); nil says nothing.
type Note func(format string, args ...any)

func (n Note) say(format string, args ...any) {
	if n != nil {
		n(format, args...)
	}
}

// OnQueueBroker runs fn against a queue's group master or, when the master
// does not answer (it cannot be reached, times out, or says it is not the
// master or is shutting down) and the group has a slave, against the
// slave, saying so through note. With a slave to fall back on, the master
// gets half of the time left. fn may make several calls; on a fallback it
// starts again on the slave.
func OnQueueBroker(ctx context.Context, with With, qr routing.QueueRoute, topic string, note Note, fn func(context.Context, *transport.Client) error) error {
	if qr.Master == "" && qr.Slave == "" {
		return fmt.Errorf("queue %d of %s: its group %s has no broker", qr.Queue, topic, qr.Group)
	}
	var masterErr error
	if qr.Master != "" {
		mctx, cancel := ctx, context.CancelFunc(func() {})
		if deadline, ok := ctx.Deadline(); ok && qr.Slave != "" {
			mctx, cancel = context.WithTimeout(ctx, time.Until(deadline)/2)
		}
		err := with(mctx, qr.Master, fn)
		cancel()
		if err == nil {
			return nil
		}
		masterErr = fmt.Errorf("read from the master %s: %w", qr.Master, err)
		if qr.Slave == "" || !clientcore.NotServing(err) || ctx.Err() != nil {
			return masterErr
		}
		note.say("the master %s did not answer (%v); reading from the slave %s", qr.Master, err, qr.Slave)
	} else {
		note.say("group %s has no master; reading from the slave %s", qr.Group, qr.Slave)
	}
	if err := with(ctx, qr.Slave, fn); err != nil {
		return errors.Join(masterErr, fmt.Errorf("read from the slave %s: %w", qr.Slave, err))
	}
	note.say("read from the slave %s", qr.Slave)
	return nil
}

// ReadQueue reads up to limit messages of a queue from its group's master
// or, when the master does not answer, from the slave (see OnQueueBroker).
func ReadQueue(ctx context.Context, dial Dial, qr routing.QueueRoute, req protocol.PullRequest, limit int, note Note) ([]protocol.StoredMessage, error) {
	var msgs []protocol.StoredMessage
	err := OnQueueBroker(ctx, dial.With, qr, req.Topic, note, func(ctx context.Context, tc *transport.Client) error {
		r := req
		var err error
		msgs, err = Pull(ctx, tc, &r, limit)
		return err
	})
	return msgs, err
}

// PullOnce sends one PULL. NO_ROUTE, which a broker answers while it
// looks up the route of a queue its log holds nothing of (a queue moved to
// its group), is asked again every 50 ms until ctx ends.
func PullOnce(ctx context.Context, tc *transport.Client, req *protocol.PullRequest) (protocol.PullResponse, error) {
	for {
		resp, err := tc.Call(ctx, protocol.CodePull, protocol.AppendPullRequest(nil, req))
		if errors.Is(err, protocol.ErrNoRoute) {
			select {
			case <-ctx.Done():
				return protocol.PullResponse{}, err
			case <-time.After(50 * time.Millisecond):
				continue
			}
		}
		if err != nil {
			return protocol.PullResponse{}, err
		}
		return protocol.DecodePullResponse(resp.Body) // bodies alias the response buffer, which is not reused
	}
}

// Pull reads up to limit messages from a broker, from req.Offset on (left
// at the offset after the last answer's).
func Pull(ctx context.Context, tc *transport.Client, req *protocol.PullRequest, limit int) ([]protocol.StoredMessage, error) {
	var out []protocol.StoredMessage
	if limit <= 0 {
		return nil, nil
	}
	for len(out) < limit {
		pr, err := PullOnce(ctx, tc, req)
		if err != nil {
			return nil, err
		}
		out = append(out, pr.Messages...)
		// An answer with a filter may hold nothing and still move on.
		if pr.NextOffset <= req.Offset || pr.NextOffset >= pr.MaxOffset {
			break
		}
		req.Offset = pr.NextOffset
	}
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// OffsetForTime finds the first offset in [lo, hi) whose message was stored
// at or after at (unix ms), or hi if none was, by binary search with probe,
// which reads one message at an offset (store times grow along a queue). A
// log start that moves up under the search (retention) moves lo with it.
func OffsetForTime(lo, hi, at int64, probe func(offset int64) (protocol.PullResponse, error)) (int64, error) {
	for lo < hi {
		mid := lo + (hi-lo)/2
		pr, err := probe(mid)
		if err != nil {
			return 0, err
		}
		// Each round moves hi down to mid (or less) or lo past mid.
		lo = max(lo, pr.MinOffset)
		if len(pr.Messages) == 0 { // the log ends before mid: it was cut
			hi = max(lo, mid)
			continue
		}
		m := pr.Messages[0]
		if m.StoreTime >= at {
			hi = max(lo, min(m.QueueOffset, mid))
		} else {
			lo = max(lo, mid+1, m.QueueOffset+1)
		}
	}
	return lo, nil
}

// QueueOffsetForTime asks a queue's broker (tc) for its log start and end
// and finds the first offset stored at or after at (unix ms) in them.
func QueueOffsetForTime(ctx context.Context, tc *transport.Client, topic string, queue uint32, at int64) (offset, start, end int64, err error) {
	probe := func(offset int64) (protocol.PullResponse, error) {
		return PullOnce(ctx, tc, &protocol.PullRequest{Topic: topic, Queue: queue, Offset: offset, MaxBytes: 1})
	}
	pr, err := probe(0)
	if err != nil {
		return 0, 0, 0, err
	}
	offset, err = OffsetForTime(pr.MinOffset, pr.MaxOffset, at, probe)
	return offset, pr.MinOffset, pr.MaxOffset, err
}

// GroupNamed is the broker group name, NOT_FOUND when there is none.
func GroupNamed(ctx context.Context, cl *client.Client, name string) (routing.Group, error) {
	groups, err := cl.Groups(ctx)
	if err != nil {
		return routing.Group{}, err
	}
	for _, gi := range groups {
		if gi.Name == name {
			return gi.Group, nil
		}
	}
	return routing.Group{}, &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("broker group %q does not exist", name)}
}

// LookupIn asks a broker group's master (or, when it does not answer, its
// slaves in turn) a LOOKUP.
func LookupIn(ctx context.Context, dial Dial, gi routing.Group, q protocol.LookupRequest) (protocol.LookupReply, error) {
	return clientcore.LookupIn(ctx, Caller(dial), gi, q)
}

// LiveGroups are the broker groups that are not retired.
func LiveGroups(ctx context.Context, cl *client.Client) ([]routing.Group, error) {
	groups, err := cl.Groups(ctx)
	if err != nil {
		return nil, err
	}
	var gs []routing.Group
	for _, gi := range groups {
		if gi.Admission != routing.Retired {
			gs = append(gs, gi.Group)
		}
	}
	return gs, nil
}

// FindAll asks every broker group that is not retired a LOOKUP by id or
// key from where cursor says, and returns what they found newest first.
func FindAll(ctx context.Context, cl *client.Client, dial Dial, q protocol.LookupRequest, cursor string) (clientcore.LookupPage, error) {
	gs, err := LiveGroups(ctx, cl)
	if err != nil {
		return clientcore.LookupPage{}, err
	}
	return clientcore.LookupAll(ctx, Caller(dial), gs, q, cursor)
}

// EachGroupMaster calls fn with the master of every broker group that is
// not retired (or of the group named only), one after another. A group
// that has no master or whose call fails is reported in unasked (after the
// others were asked); err is a failure to list the groups, or NOT_FOUND
// for a named group that does not exist.
func EachGroupMaster(ctx context.Context, cl *client.Client, dial Dial, only string,
	fn func(ctx context.Context, gi api.GroupInfo, tc *transport.Client) error) (unasked, err error) {
	groups, err := cl.Groups(ctx)
	if err != nil {
		return nil, err
	}
	var errs []error
	found := false
	for _, gi := range groups {
		if only != "" && gi.Name != only || only == "" && gi.Admission == routing.Retired {
			continue
		}
		found = true
		if gi.Master.Addr == "" {
			errs = append(errs, fmt.Errorf("group %s has no master", gi.Name))
			continue
		}
		if err := Call(ctx, dial, gi.Master.Addr, func(ctx context.Context, tc *transport.Client) error { return fn(ctx, gi, tc) }); err != nil {
			errs = append(errs, fmt.Errorf("group %s at %s: %w", gi.Name, gi.Master.Addr, err))
		}
	}
	if only != "" && !found {
		return nil, &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("no broker group %s", protocol.Clip(only))}
	}
	return errors.Join(errs...), nil
}

// DelayedLists asks every group's master (or only's) for its pending
// delayed messages; unasked as EachGroupMaster's.
func DelayedLists(ctx context.Context, cl *client.Client, dial Dial, only string, q protocol.DelayedListRequest) (lists []protocol.DelayedList, unasked, err error) {
	return groupLists(ctx, cl, dial, only, protocol.CodeDelayedList, q, func(l *protocol.DelayedList) *string { return &l.Group })
}

// TxnLists asks every group's master (or only's) for its open
// transactions and recent decisions; unasked as EachGroupMaster's.
func TxnLists(ctx context.Context, cl *client.Client, dial Dial, only string, q protocol.TxnListRequest) (lists []protocol.TxnList, unasked, err error) {
	return groupLists(ctx, cl, dial, only, protocol.CodeTxnList, q, func(l *protocol.TxnList) *string { return &l.Group })
}

// groupLists asks every group's master (or only's) the JSON request q of
// code and collects the answers, each naming its group (group: where an
// answer says it; filled in when the broker left it empty).
func groupLists[L any](ctx context.Context, cl *client.Client, dial Dial, only string, code protocol.Code, q any,
	group func(*L) *string) (lists []L, unasked, err error) {
	req, _ := json.Marshal(q)
	lists = []L{}
	unasked, err = EachGroupMaster(ctx, cl, dial, only, func(ctx context.Context, gi api.GroupInfo, tc *transport.Client) error {
		var l L
		if err := CallJSON(ctx, tc, code, req, &l); err != nil {
			return err
		}
		if g := group(&l); *g == "" {
			*g = gi.Name
		}
		lists = append(lists, l)
		return nil
	})
	return lists, unasked, err
}

// Abort outcomes: what AbortTxn found.
const (
	Aborted         = "aborted"          // by this call
	AbortedBefore   = "aborted-before"   // decided aborted before
	CommittedBefore = "committed-before" // too late: it committed
	NotHere         = "not-here"         // the group holds nothing of it
)

// AbortTxn aborts transaction id at group's master: the registry decides
// first (the transaction may be on other groups: the first decision there
// is every group's), then the group applies it. It returns the outcome.
func AbortTxn(ctx context.Context, cl *client.Client, dial Dial, id protocol.TxnID, group string) (string, error) {
	gr, err := GroupNamed(ctx, cl, group)
	if err != nil {
		return "", err
	}
	if gr.Master.Addr == "" {
		return "", &protocol.Error{Status: protocol.StatusReadOnly, Message: fmt.Sprintf("group %s has no master", group)}
	}
	d, err := cl.DecideTxn(ctx, api.TxnDecideRequest{Producer: id.Producer, Epoch: id.Epoch, Number: id.Number, By: protocol.TxnByAdmin,
		Groups: []string{group}})
	if err != nil {
		return "", err
	}
	req, _ := json.Marshal(protocol.TxnEndRequest{Producer: id.Producer, Epoch: id.Epoch, Number: id.Number, Commit: d.Committed, By: protocol.TxnByAdmin})
	var rep protocol.TxnEndReply
	if err := CallBrokerJSON(ctx, dial, gr.Master.Addr, protocol.CodeTxnEnd, req, &rep); err != nil {
		return "", err
	}
	_ = cl.TxnDone(ctx, api.TxnDoneRequest{Producer: id.Producer, Epoch: id.Epoch, Number: id.Number, Groups: []string{group}})
	switch {
	case rep.Committed:
		return CommittedBefore, nil
	case rep.Queues == 0:
		return NotHere, nil
	case rep.Queues < 0:
		return AbortedBefore, nil
	}
	return Aborted, nil
}

// DelayedWhere says where a delayed message is: when a pending one is
// due, where and when a released one went (and how late), where a moved
// one is.
func DelayedWhere(st protocol.DelayedState, now time.Time) string {
	switch {
	case st.State == protocol.DelayPending:
		return DueIn(st.DueAt, now.UnixMilli())
	case st.State == protocol.DelayReleased && st.Released != nil:
		r := st.Released
		return fmt.Sprintf("queue offset %d (log offset %d) at %s, %v after due", r.QueueOffset, r.LogOffset, FormatMillis(r.At),
			time.Duration(r.At-st.DueAt)*time.Millisecond)
	case st.State == protocol.DelayMoved:
		return fmt.Sprintf("moved to log offset %d", st.MovedTo)
	}
	return "-"
}

// DueIn says how far a due time (unix ms) is from now (unix ms): "in 5m0s",
// "due 2s ago", or "-" for none.
func DueIn(due, now int64) string {
	switch {
	case due == 0:
		return "-"
	case due >= now:
		return "in " + (time.Duration(due-now) * time.Millisecond).String()
	}
	return "due " + (time.Duration(now-due) * time.Millisecond).String() + " ago"
}

// ConsumerGroup returns one consumer group, or an error naming it (wrapping
// protocol.ErrNotFound) when the metaserver does not know it.
func ConsumerGroup(ctx context.Context, cl *client.Client, name string) (api.ConsumerGroupInfo, error) {
	infos, err := cl.ConsumerGroups(ctx, name)
	if errors.Is(err, protocol.ErrNotFound) {
		return api.ConsumerGroupInfo{}, fmt.Errorf("no consumer group %q: %w", name, err)
	}
	if err != nil {
		return api.ConsumerGroupInfo{}, err
	}
	for _, info := range infos {
		if info.Name == name {
			return info, nil
		}
	}
	return api.ConsumerGroupInfo{}, fmt.Errorf("no consumer group %q: %w", name, protocol.ErrNotFound)
}
