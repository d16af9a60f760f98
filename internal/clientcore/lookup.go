package clientcore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// Lookups: the SDK's and ferryctl's LOOKUP over every broker group.

// NotServing reports whether a failed call means the broker is not
// serving (down, stopping, not the master, busy), so that another member
// of its group should be asked.
func NotServing(err error) bool {
	return errors.Is(err, transport.ErrConnLost) || errors.Is(err, protocol.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, protocol.ErrNotMaster) ||
		errors.Is(err, protocol.ErrShuttingDown) || errors.Is(err, protocol.ErrBusy)
}

// Caller makes one call to the broker at addr.
type Caller func(ctx context.Context, addr string, code protocol.Code, body []byte) ([]byte, error)

// LookupIn asks a broker group's master (or, when it is not serving, its
// slaves in turn) a LOOKUP.
func LookupIn(ctx context.Context, call Caller, g routing.Group, q protocol.LookupRequest) (protocol.LookupReply, error) {
	body, err := json.Marshal(q)
	if err != nil {
		return protocol.LookupReply{}, err
	}
	err = fmt.Errorf("broker group %s has no broker", g.Name)
	for _, b := range append([]routing.Broker{g.Master}, g.Slaves...) {
		if b.Addr == "" {
			continue
		}
		var resp []byte
		if resp, err = call(ctx, b.Addr, protocol.CodeLookup, body); err == nil {
			var reply protocol.LookupReply
			err = json.Unmarshal(resp, &reply)
			return reply, err
		}
		if !NotServing(err) {
			break
		}
	}
	return protocol.LookupReply{}, err
}

// LookupPage is a page of a lookup over several groups: the messages found
// newest first, how many were hidden (topics the principal may not
// consume), and the cursor of the rest ("" none).
type LookupPage struct {
	Messages []protocol.FoundMessage
	Hidden   int
	Cursor   string
}

// LookupAll asks q of each group (by id or key; q.Before is ignored) from
// where cursor says (a LookupPage's; "": every group from its newest) and
// merges the answers newest first.
func LookupAll(ctx context.Context, call Caller, groups []routing.Group, q protocol.LookupRequest, cursor string) (LookupPage, error) {
	before, err := ParseLookupCursor(cursor)
	if err != nil {
		return LookupPage{}, err
	}
	var page LookupPage
	var next []string
	for _, g := range groups {
		at, named := before[g.Name]
		if before != nil && !named {
			continue // searched to its start
		}
		gq := q
		gq.Before = at
		reply, err := LookupIn(ctx, call, g, gq)
		if err != nil {
			return LookupPage{}, fmt.Errorf("broker group %s: %w", g.Name, err)
		}
		page.Messages = append(page.Messages, reply.Messages...)
		page.Hidden += reply.Hidden
		if reply.Next > 0 {
			next = append(next, g.Name+":"+strconv.FormatInt(reply.Next, 10))
		}
	}
	slices.SortStableFunc(page.Messages, func(a, b protocol.FoundMessage) int { return cmp.Compare(b.StoreTime, a.StoreTime) })
	page.Cursor = strings.Join(next, ",")
	return page, nil
}

// ParseLookupCursor reads a LookupPage's cursor: GROUP:OFFSET pairs,
// comma-separated ("": nil, every group from its newest).
func ParseLookupCursor(s string) (map[string]int64, error) {
	if s == "" {
		return nil, nil
	}
	out := map[string]int64{}
	for _, part := range strings.Split(s, ",") {
		i := strings.LastIndexByte(part, ':')
		at, err := strconv.ParseInt(part[i+1:], 10, 64)
		if i <= 0 || err != nil || at <= 0 {
			return nil, fmt.Errorf("lookup cursor %.64q: want GROUP:OFFSET pairs, offsets above 0", s)
		}
		out[part[:i]] = at
	}
	return out, nil
}
