package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// Lookup returns the message stored at a send's handle
// (producer.Result.Handle): its queue and offsets, when it was stored,
// which of its group's brokers hold it, its id, key, tag, properties and
// body, and the reads of it its broker remembers (Deliveries: which member
// of which group, when). It is NOT_FOUND when no message is there (retention
// deleted it, or the handle is wrong) or when its topic is one this
// consumer's principal may not consume.
func (c *Consumer) Lookup(ctx context.Context, handle protocol.Handle) (protocol.FoundMessage, error) {
	groups, err := c.brokerGroups(ctx)
	if err != nil {
		return protocol.FoundMessage{}, err
	}
	for _, g := range groups {
		if g.Name != handle.Group {
			continue
		}
		reply, err := clientcore.LookupIn(ctx, c.brokerCall, g, protocol.LookupRequest{Offset: &handle.Offset})
		if err != nil {
			return protocol.FoundMessage{}, err
		}
		if len(reply.Messages) == 0 {
			break
		}
		return reply.Messages[0], nil
	}
	return protocol.FoundMessage{}, &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("%s: no message this consumer may read", handle)}
}

// FindQuery asks Find for the messages of an ID (and the retry copies and
// dead letters of it) or of a Key, stored between Since and Until (zero:
// unbounded), at most Limit from each broker group (0: 20), from Cursor (a
// FindPage's; "": the newest).
type FindQuery struct {
	ID, Key      string
	Since, Until time.Time
	Limit        int
	Cursor       string
}

// FindPage is a page of Find: the messages newest first, how many found
// were of topics this consumer's principal may not consume, and the cursor
// of the rest ("": none).
type FindPage = clientcore.LookupPage

// Find returns a page of the messages of an id or a key, from every broker
// group, newest first. Each group reads the key tables of the log ranges in
// the window (a bounded amount a page), so a long window takes several
// pages: call again with the page's Cursor until it is "".
func (c *Consumer) Find(ctx context.Context, q FindQuery) (FindPage, error) {
	if (q.ID == "") == (q.Key == "") {
		return FindPage{}, &protocol.Error{Status: protocol.StatusInvalid, Message: "consumer: Find wants one of ID and Key"}
	}
	req := protocol.LookupRequest{ID: q.ID, Key: q.Key, Limit: q.Limit}
	if !q.Since.IsZero() {
		req.Since = q.Since.UnixMilli()
	}
	if !q.Until.IsZero() {
		req.Until = q.Until.UnixMilli()
	}
	groups, err := c.brokerGroups(ctx)
	if err != nil {
		return FindPage{}, err
	}
	return clientcore.LookupAll(ctx, c.brokerCall, groups, req, q.Cursor)
}

// brokerGroups returns the broker groups that are not retired.
func (c *Consumer) brokerGroups(ctx context.Context) ([]routing.Group, error) {
	if c.meta == nil {
		return nil, errors.New("consumer: lookups need the metaservers (MetaAddrs)")
	}
	infos, err := c.meta.Groups(ctx)
	if err != nil {
		return nil, err
	}
	var out []routing.Group
	for _, gi := range infos {
		if gi.Admission != routing.Retired {
			out = append(out, gi.Group)
		}
	}
	return out, nil
}

// brokerCall makes one call on the consumer's connection to a broker.
func (c *Consumer) brokerCall(ctx context.Context, addr string, code protocol.Code, body []byte) ([]byte, error) {
	tc, err := c.pool.Get(addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrClosed, err)
	}
	resp, err := tc.Call(ctx, code, body)
	return resp.Body, err
}
