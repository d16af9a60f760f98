package console

import (
	"errors"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/ops"
	"github.com/ferrymq/ferrymq/protocol"
)

// The Delayed page: each broker group's pending delayed messages (how
// many, the next due, per bucket of due time and per topic), what became
// of a delayed message named by its handle, and a form that cancels one.
//
// Who may do what: the lists need describe (DELAYED_LIST's rule); a
// handle's state needs produce or describe on its topic (DELAYED_STATE's),
// a cancel produce on it (DELAYED_CANCEL's): the topic is known once the
// state is read, so a cancel reads it first, checks, then cancels. Calls
// go with the session's credential; the brokers check them again.

// delayedData is what the page shows.
type delayedData struct {
	Lists   []protocol.DelayedList
	Pager   pager
	Filter  string
	NoList  string // why the lists are not shown
	Unasked string // groups that could not be asked
	Bucket  time.Duration
	Now     int64
	Handle  string
	State   *protocol.DelayedState
	Where   string
	Outcome string // a cancel's, from the form
	Cancel  bool   // the state shown may be cancelled by this principal
}

const (
	maxDelayBuckets = 1000
	maxDelayBucket  = 366 * 24 * time.Hour
)

func delayed(q *query) (any, error) {
	v := q.r.URL.Query()
	d := &delayedData{Filter: v.Get("q"), Handle: v.Get("handle"), Outcome: strings.Join(q.notesOf(), "; ")}
	if d.Handle != "" {
		if err := delayedState(q, d); err != nil {
			return nil, err
		}
	}
	return d, delayedLists(q, d, v)
}

// delayedLists reads every group's pending delayed messages (describe).
func delayedLists(q *query, d *delayedData, v url.Values) error {
	secs, err := intParam(v, "bucket", 60, 1, int(maxDelayBucket/time.Second))
	if err != nil {
		return err
	}
	limit, err := intParam(v, "limit", 100, 1, maxDelayBuckets)
	if err != nil {
		return err
	}
	topic := v.Get("topic")
	if topic != "" {
		if err := protocol.ValidateTopic(topic); err != nil {
			return bad("%v", err)
		}
	}
	d.Bucket = time.Duration(secs) * time.Second
	if err := q.allow(protocol.CodeDelayedList, auth.Target{}); err != nil {
		d.NoList = "the pending delayed messages of the groups are listed to who may describe the cluster; look one up by its handle"
		return nil
	}
	release, err := q.slot()
	if err != nil {
		return err
	}
	defer release()
	lists, unasked, err := ops.DelayedLists(q.ctx, q.meta(), q.dial(), "", protocol.DelayedListRequest{Topic: topic,
		BucketMillis: d.Bucket.Milliseconds(), Limit: limit})
	if err != nil {
		return err
	}
	if unasked != nil {
		d.Unasked = unasked.Error()
	}
	sort.Slice(lists, func(i, j int) bool { return lists[i].Group < lists[j].Group })
	d.Lists, d.Pager, err = pageOf(q, lists, func(l protocol.DelayedList) string { return l.Group })
	d.Now = time.Now().UnixMilli()
	return err
}

// parseDelayedHandle reads a delayed message's handle (GROUP@OFFSET/DUE).
func parseDelayedHandle(s string) (protocol.Handle, error) {
	if len(s) > maxParamLen {
		return protocol.Handle{}, bad("the handle is longer than %d characters", maxParamLen)
	}
	h, err := protocol.ParseHandle(s)
	if err != nil || h.Offset < 0 || protocol.ValidateName("group", h.Group, 255, protocol.TopicNameChars) != nil {
		return protocol.Handle{}, bad("handle %q: want GROUP@OFFSET/DUE, as a delayed send printed it", protocol.Clip(s))
	}
	return h, nil
}

// delayedState shows what became of the delayed message d.Handle names.
func delayedState(q *query, d *delayedData) error {
	h, err := parseDelayedHandle(d.Handle)
	if err != nil {
		return err
	}
	st, err := readDelayedState(q, h)
	if err != nil {
		return err
	}
	d.State, d.Where = &st, ops.DelayedWhere(st, time.Now())
	d.Cancel = st.State == protocol.DelayPending && q.allow(protocol.CodeDelayedCancel, auth.Topic(st.Topic)) == nil
	return nil
}

// readDelayedState asks the handle's group and checks the principal may
// see the message's topic (a certificate session's call went with the
// cluster token: this is the only check).
func readDelayedState(q *query, h protocol.Handle) (protocol.DelayedState, error) {
	release, err := q.slot()
	if err != nil {
		return protocol.DelayedState{}, err
	}
	defer release()
	p, err := q.producer()
	if err != nil {
		return protocol.DelayedState{}, err
	}
	defer p.Close()
	st, err := p.DelayedState(q.ctx, h)
	if errors.Is(err, protocol.ErrNotFound) || errors.Is(err, protocol.ErrInvalid) {
		return st, bad("%s: no delayed message there", protocol.Clip(h.String()))
	}
	if err != nil {
		return st, err
	}
	if err := q.allow(protocol.CodeDelayedState, auth.Topic(st.Topic)); err != nil {
		return protocol.DelayedState{}, err
	}
	return st, nil
}

// cancelDelayed cancels the pending delayed message the form's handle
// names (produce on its topic), and shows what became of it.
func cancelDelayed(q *query) (string, error) {
	h, err := parseDelayedHandle(q.r.PostFormValue("handle"))
	if err != nil {
		return "", err
	}
	st, err := readDelayedState(q, h)
	if err != nil {
		return "", err
	}
	if err := q.allow(protocol.CodeDelayedCancel, auth.Topic(st.Topic)); err != nil {
		return "", err
	}
	release, err := q.slot()
	if err != nil {
		return "", err
	}
	defer release()
	p, err := q.producer()
	if err != nil {
		return "", err
	}
	defer p.Close()
	st, err = p.Cancel(q.ctx, h)
	if err != nil {
		return "", err
	}
	outcome := "not cancelled: it is " + st.State
	switch {
	case st.State == protocol.DelayCancelled && st.By == "cancel":
		outcome = "cancelled"
	case st.State == protocol.DelayCancelled:
		outcome = "cancelled before"
	case st.State == protocol.DelayReleased:
		outcome = "released before: not cancelled"
	}
	q.c.cfg.Logger.Info("console cancelled a delayed message", "principal", q.s.principal.Name, "handle", h.String(), "outcome", outcome)
	back := q.noted(outcome)
	back.Set("handle", h.String())
	return Prefix + "delayed?" + back.Encode(), nil
}
