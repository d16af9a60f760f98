package broker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
)

// Authorization on the data and HA ports (Config.ClusterToken turns it
// on). The transport serves an unauthenticated connection nothing but AUTH
// and IDENTIFY; every other request is checked against the broker's copy
// of the registry's table by the wrapper its code is registered with
// (endpoints.go), before its handler runs: a SEND batch whole before
// anything of it is stored (one check per batch, not per message), a PULL
// on its topic, HA_FETCH, HA_ACK and RECOVER need cluster.
//
// The copy: every heartbeat reply carries the registry's ACL version; when
// it is not the copy's, the broker fetches the ACL (ACL_GET, with the
// cluster token) and swaps the table whole, so a principal removed or
// changed is refused within about a heartbeat. Until the first table is
// in, requests are answered BUSY (retriable).

// aclCopy is the broker's copy of the permission table.
type aclCopy struct {
	cluster auth.TokenHash // the cluster token's hash
	meta    interface {
		ClusterACL(ctx context.Context) (api.ACL, error)
	}
	log   hclog.Logger
	table atomic.Pointer[auth.Table]
	// views signals a newer heartbeat reply (the session's), whose ACL
	// version is the one to have.
	views viewSource
	saw   <-chan struct{}
	kicks chan struct{} // AUTHs of unknown tokens wait
	// revoke is called with each new table, after it is in: it closes the
	// connections of the credentials it no longer knows (set before run).
	revoke func(*auth.Table)

	// An AUTH whose token the copy does not know waits for one fetch made
	// for it, since the principal may be newer than the last heartbeat
	// (ferryctl acl add, then a producer at once). At most one such fetch
	// per unknownRefetch, and at most maxWaitingLogins waiting: a flood of
	// bad tokens costs the metaserver a few fetches a second and the
	// broker a bounded list.
	mu        sync.Mutex
	waiting   []*transport.Request // AUTHs waiting for the next fetch
	force     bool                 // fetch even if the version is the heartbeat's
	lastFetch time.Time            // when the last fetch for unknown tokens started
}

const (
	unknownRefetch   = 250 * time.Millisecond
	maxWaitingLogins = 256
)

var errNoTable = &protocol.Error{Status: protocol.StatusBusy, Message: "the broker has not loaded the permission table yet"}

func newACLCopy(clusterToken string, meta interface {
	ClusterACL(ctx context.Context) (api.ACL, error)
}, views viewSource, log hclog.Logger) *aclCopy {
	return &aclCopy{cluster: auth.HashToken(clusterToken), meta: meta, log: log, views: views, saw: views.subscribe(),
		kicks: make(chan struct{}, 1)}
}

// want returns the ACL version the last heartbeat reply named (0: none yet).
func (a *aclCopy) want() uint64 {
	if v := a.views.latest(); v != nil {
		return v.ACLVersion
	}
	return 0
}

// run fetches the ACL whenever a heartbeat reply names another version
// than the copy's, retrying a failed fetch after a pause, and for AUTHs of
// unknown tokens (at most one such fetch per unknownRefetch).
func (a *aclCopy) run(ctx context.Context) {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			a.mu.Lock()
			waiting := a.waiting
			a.waiting = nil
			a.mu.Unlock()
			for _, r := range waiting {
				r.ReplyError(protocol.ErrShuttingDown)
			}
			return
		case <-a.kicks:
		case <-a.saw:
		case <-retry.C:
		}
		// The AUTHs waiting now are answered from a fetch that starts after
		// they arrived: their token is known then, or the registry does not
		// know it either.
		a.mu.Lock()
		if wait := unknownRefetch - time.Since(a.lastFetch); a.force && wait > 0 {
			a.mu.Unlock()
			retry.Reset(wait)
			continue
		}
		force, waiting := a.force, a.waiting
		a.force, a.waiting = false, nil
		if force {
			a.lastFetch = time.Now()
		}
		a.mu.Unlock()
		if t := a.table.Load(); !force && t != nil && t.Version() == a.want() {
			continue
		}
		err := a.fetch(ctx)
		for _, r := range waiting {
			a.answerLogin(r, a.table.Load())
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			a.log.Warn("fetching the permission table failed; retrying", "error", err)
			retry.Reset(500 * time.Millisecond)
		}
	}
}

func (a *aclCopy) fetch(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	acl, err := a.meta.ClusterACL(cctx)
	if err != nil {
		return err
	}
	b := auth.Builtins{Cluster: a.cluster}
	if err := b.Admin.UnmarshalText([]byte(acl.AdminSHA256)); err != nil {
		return err
	}
	ps := make([]auth.Principal, 0, len(acl.Principals))
	for _, p := range acl.Principals {
		q := auth.Principal{Name: p.Name}
		if err := q.TokenHash.UnmarshalText([]byte(p.TokenSHA256)); err != nil {
			return err
		}
		perms, err := auth.ParsePermissions(p.Permissions)
		if err != nil {
			a.log.Warn("a principal's permissions do not parse here; it is given none", "principal", p.Name, "error", err)
		}
		q.Permissions = perms
		ps = append(ps, q)
	}
	t, err := auth.NewTable(acl.Version, ps, b)
	if err != nil {
		return err
	}
	old := a.table.Swap(t)
	if old == nil || old.Version() != t.Version() {
		a.log.Info("permission table loaded", "acl-version", t.Version(), "principals", len(ps))
		if old != nil && a.revoke != nil {
			a.revoke(t)
		}
	}
	return nil
}

// login serves AUTH. A token the copy does not know is looked up once
// more in a table fetched for it (unless one was fetched a moment ago), so
// that a principal made just now is not refused for the heartbeat it takes
// the broker to hear of it.
func (a *aclCopy) login(r *transport.Request) {
	t := a.table.Load()
	if t == nil {
		r.ReplyError(errNoTable)
		return
	}
	if !auth.BeginLogin(r) {
		return // in its backoff: answered later
	}
	if _, ok := t.AuthenticateHash(auth.HashToken(string(r.Body))); !ok {
		a.mu.Lock()
		wait := len(a.waiting) < maxWaitingLogins
		if wait {
			a.waiting = append(a.waiting, r)
			a.force = true
		}
		a.mu.Unlock()
		if wait {
			select {
			case a.kicks <- struct{}{}:
			default:
			}
			return // run answers it after the fetch
		}
	}
	a.answerLogin(r, t)
}

// answerLogin answers an AUTH by the table t: a wrong token after the
// gate's backoff.
func (a *aclCopy) answerLogin(r *transport.Request, t *auth.Table) {
	if t == nil {
		r.ReplyError(errNoTable)
		return
	}
	auth.AnswerLogin(r, r.Body, t, a.table.Load)
}

// check authorizes a request of code on target.
func (a *aclCopy) check(c auth.Conn, code protocol.Code, target auth.Target) error {
	t := a.table.Load()
	if t == nil {
		return errNoTable
	}
	return auth.Check(c, t, code, target)
}

// handleAuth serves AUTH on the data and HA ports.
func (b *Broker) handleAuth(r *transport.Request) {
	if b.acl == nil {
		_ = r.Reply(protocol.AppendAuthReply(nil, &protocol.AuthReply{}))
		return
	}
	b.acl.login(r)
}
