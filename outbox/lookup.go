package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// maxLookupPages bounds the pages one lookup reads: a key with more
// messages in the window than that leaves its row undecided (retried later,
// never sent blind).
const maxLookupPages = 20

// errUndecided: a lookup could not say whether a message is stored.
var errUndecided = errors.New("outbox: cannot tell whether the message is stored")

// finder looks messages up by key in every broker group (LOOKUP, as
// consumer.Find does), with the relay's own metaserver client and
// connections.
type finder struct {
	meta *client.Client
	pool *clientcore.Pool
}

func newFinder(s clientcore.Shared) (*finder, error) {
	meta, err := client.New(client.Config{Addrs: s.MetaAddrs, Token: s.Token, Transport: transport.ClientConfig{TLS: s.TLS}})
	if err != nil {
		return nil, err
	}
	tc := transport.ClientConfig{TLS: s.TLS}
	if s.Token != "" {
		tc.Login = auth.TokenLogin(s.Token)
	}
	return &finder{meta: meta, pool: clientcore.NewPool(clientcore.PoolConfig{Transport: tc})}, nil
}

func (f *finder) close() {
	_ = f.pool.Close()
	_ = f.meta.Close()
}

// pass returns the lookups of one pass, which share the topics' groups.
func (f *finder) pass() *passLookups { return &passLookups{f: f, groups: map[string][]routing.Group{}} }

// passLookups are a pass's lookups: each topic's groups, asked once.
type passLookups struct {
	f      *finder
	groups map[string][]routing.Group
}

// groupsOf returns the groups a message of topic may be stored in, each
// with its master only: the groups of the topic's route (which its
// producers may read), and every group the metaserver knows (which needs
// describe) when a queue of the topic moved from another group.
func (pl *passLookups) groupsOf(ctx context.Context, topic string) ([]routing.Group, error) {
	if gs, ok := pl.groups[topic]; ok {
		return gs, nil
	}
	route, err := pl.f.meta.RouteExisting(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("route of %q: %w", topic, err)
	}
	seen := map[string]bool{}
	var out []routing.Group
	moved := false
	for _, q := range route.Queues {
		moved = moved || q.Base > 0
		if seen[q.Group] {
			continue
		}
		seen[q.Group] = true
		if q.Master == "" {
			return nil, fmt.Errorf("group %s of %q has no master", q.Group, topic)
		}
		out = append(out, routing.Group{Name: q.Group, Master: routing.Broker{Addr: q.Master}})
	}
	if moved {
		infos, err := pl.f.meta.Groups(ctx)
		if err != nil {
			return nil, fmt.Errorf("queues of %q moved from other groups, and the groups could not be listed (describe): %w", topic, err)
		}
		for _, gi := range infos {
			if !seen[gi.Name] && gi.Master.Addr != "" {
				seen[gi.Name] = true
				out = append(out, routing.Group{Name: gi.Name, Master: routing.Broker{Addr: gi.Master.Addr}})
			}
		}
	}
	pl.groups[topic] = out
	return out, nil
}

// stored says whether the message of row r is stored in its topic: a
// message of r's key carrying r's outbox id, stored since r's first attempt
// less margin, as each group's master says (a slave may lack the newest
// records). It fails (errUndecided) rather than answer false when it could
// not read everything: a group without a master or whose master did not
// answer, messages hidden from the relay's principal, more pages than
// maxLookupPages.
func (pl *passLookups) stored(ctx context.Context, r *row, margin time.Duration) (bool, error) {
	groups, err := pl.groupsOf(ctx, r.topic)
	if err != nil {
		return false, fmt.Errorf("%w: %w", errUndecided, err)
	}
	f := pl.f
	q := protocol.LookupRequest{Key: sendKey(r), Limit: protocol.MaxLookupLimit}
	if since := r.attemptedAt - margin.Milliseconds(); since > 0 {
		q.Since = since
	}
	cursor := ""
	for range maxLookupPages {
		page, err := clientcore.LookupAll(ctx, f.call, groups, q, cursor)
		if err != nil {
			return false, fmt.Errorf("%w: lookup of %s: %w", errUndecided, r.msgID, err)
		}
		for _, m := range page.Messages {
			if m.Topic == r.topic && m.Properties[IDProperty] == r.msgID {
				return true, nil
			}
		}
		if page.Hidden > 0 {
			return false, fmt.Errorf("%w: %d messages of key %q hidden: the relay's principal needs consume on %q", errUndecided, page.Hidden, q.Key, r.topic)
		}
		if cursor = page.Cursor; cursor == "" {
			return false, nil
		}
	}
	return false, fmt.Errorf("%w: key %q has more than %d pages of messages since %d", errUndecided, q.Key, maxLookupPages, q.Since)
}

func (f *finder) call(ctx context.Context, addr string, code protocol.Code, body []byte) ([]byte, error) {
	tc, err := f.pool.Get(addr)
	if err != nil {
		return nil, err
	}
	resp, err := tc.Call(ctx, code, body)
	return resp.Body, err
}

// sendKey is the key row r is sent with: its own, else its outbox id.
func sendKey(r *row) string {
	if r.key != "" {
		return r.key
	}
	return r.msgID
}
