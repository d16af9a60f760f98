package broker

import (
	"context"
	"errors"
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
//
// ACL_GET gives the principals' names and permissions, not their token
// hashes: the broker asks whose the tokens are that were presented to it
// (their hashes), and the table it builds knows those tokens only
// (docs/decisions/broker-token-checks.md). Each fetch asks again about
// every token the last one matched, so a rotated or removed token drops
// out with the fetch that follows the change; a token presented for the
// first time is asked about in a fetch made for it.

// aclCopy is the broker's copy of the permission table.
type aclCopy struct {
	cluster auth.TokenHash // the cluster token's hash
	meta    aclSource
	log     hclog.Logger
	table   atomic.Pointer[auth.Table]
	// views signals a newer heartbeat reply (the session's), whose ACL
	// version is the one to have.
	views viewSource
	saw   <-chan struct{}
	kicks chan struct{} // logins of unknown tokens wait
	// revoke is called with each new table, after it is in: it closes the
	// connections of the credentials it no longer knows (set before run).
	revoke func(*auth.Table)

	// known are the token hashes the last fetch matched (the registry
	// principals' and the bootstrap admin's presented here): the next
	// fetch asks about them again. Only run touches it.
	known []auth.TokenHash

	// A login whose token the copy does not know waits for one fetch made
	// for it, since the principal may be newer than the last heartbeat
	// (ferryctl acl add, then a producer at once), and the copy knows no
	// token it was not asked about. At most one such fetch per
	// unknownRefetch, and at most maxWaitingLogins waiting: a flood of
	// bad tokens costs the metaserver a few fetches a second and the
	// broker a bounded list.
	mu        sync.Mutex
	waiting   []waiter  // logins waiting for the next fetch
	force     bool      // fetch even if the version is the heartbeat's
	lastFetch time.Time // when the last fetch for unknown tokens started
}

// aclSource is where the copy comes from: the metaservers.
type aclSource interface {
	ClusterACL(ctx context.Context, tokenSHA256 []string) (api.ACL, error)
}

// waiter is a login waiting for a fetch that asks about its token.
type waiter struct {
	hash   auth.TokenHash
	answer func(t *auth.Table) // with the table after the fetch (nil: none)
}

const (
	unknownRefetch   = 250 * time.Millisecond
	maxWaitingLogins = 256
)

var errNoTable = &protocol.Error{Status: protocol.StatusBusy, Message: "the broker has not loaded the permission table yet"}

func newACLCopy(clusterToken string, meta aclSource, views viewSource, log hclog.Logger) *aclCopy {
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
// than the copy's, retrying a failed fetch after a pause, and for logins
// of unknown tokens (at most one such fetch per unknownRefetch).
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
			for _, w := range waiting {
				w.answer(nil)
			}
			return
		case <-a.kicks:
		case <-a.saw:
		case <-retry.C:
		}
		// The logins waiting now are answered from a fetch that starts
		// after they arrived and asks about their tokens: their token is
		// known then, or the registry does not know it either.
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
		err := a.fetch(ctx, waiting)
		t := a.table.Load()
		for _, w := range waiting {
			w.answer(t)
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

// fetch loads the table, asking about the tokens known and those waiting.
func (a *aclCopy) fetch(ctx context.Context, waiting []waiter) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ask := make([]string, 0, len(a.known)+len(waiting))
	asked := make(map[auth.TokenHash]bool, cap(ask))
	for _, h := range a.known {
		asked[h] = true
		ask = append(ask, h.String())
	}
	for _, w := range waiting {
		if !asked[w.hash] && !w.hash.IsZero() && w.hash != a.cluster {
			asked[w.hash] = true
			ask = append(ask, w.hash.String())
		}
	}
	acl, err := a.meta.ClusterACL(cctx, ask)
	if err != nil {
		return err
	}
	b := auth.Builtins{Cluster: a.cluster}
	if err := b.Admin.UnmarshalText([]byte(acl.AdminSHA256)); err != nil {
		return err
	}
	hashOf := make(map[string]auth.TokenHash, len(acl.Tokens))
	for text, name := range acl.Tokens {
		var h auth.TokenHash
		if err := h.UnmarshalText([]byte(text)); err != nil {
			return err
		}
		hashOf[name] = h
	}
	known := make([]auth.TokenHash, 0, len(hashOf)+1)
	if !b.Admin.IsZero() {
		known = append(known, b.Admin)
	}
	ps := make([]auth.Principal, 0, len(acl.Principals))
	for _, p := range acl.Principals {
		q := auth.Principal{Name: p.Name, TokenHash: hashOf[p.Name]}
		// A metaserver from before ACL_GET stopped giving hashes gives
		// every principal's.
		if p.TokenSHA256 != "" {
			if err := q.TokenHash.UnmarshalText([]byte(p.TokenSHA256)); err != nil {
				return err
			}
		}
		if !q.TokenHash.IsZero() && asked[q.TokenHash] {
			known = append(known, q.TokenHash)
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
	a.known = known
	old := a.table.Swap(t)
	if old == nil || old.Version() != t.Version() {
		a.log.Info("permission table loaded", "acl-version", t.Version(), "principals", len(ps))
		if old != nil && a.revoke != nil {
			a.revoke(t)
		}
	}
	return nil
}

// wait has w answered after the next fetch made for unknown tokens, and
// reports whether it will be (false: too many wait already).
func (a *aclCopy) wait(w waiter) bool {
	a.mu.Lock()
	ok := len(a.waiting) < maxWaitingLogins
	if ok {
		a.waiting = append(a.waiting, w)
		a.force = true
	}
	a.mu.Unlock()
	if ok {
		select {
		case a.kicks <- struct{}{}:
		default:
		}
	}
	return ok
}

// login serves AUTH. A token the copy does not know is looked up in a
// table fetched for it (unless one was fetched a moment ago), so that a
// principal made just now, or a token not presented here before, is not
// refused.
func (a *aclCopy) login(r *transport.Request) {
	t := a.table.Load()
	if t == nil {
		r.ReplyError(errNoTable)
		return
	}
	if !auth.BeginLogin(r) {
		return // in its backoff: answered later
	}
	h := auth.HashToken(string(r.Body))
	if _, ok := t.AuthenticateHash(h); !ok && a.wait(waiter{hash: h, answer: func(t *auth.Table) { a.answerLogin(r, t) }}) {
		return // run answers it after the fetch
	}
	a.answerLogin(r, t)
}

// authenticate returns the principal whose token is token, looking an
// unknown token up as login does; false if there is none (or ctx ended
// first). errNoTable before the first table.
func (a *aclCopy) authenticate(ctx context.Context, token string) (auth.Principal, bool, error) {
	t := a.table.Load()
	if t == nil {
		return auth.Principal{}, false, errNoTable
	}
	h := auth.HashToken(token)
	if p, ok := t.AuthenticateHash(h); ok {
		return p, true, nil
	}
	done := make(chan *auth.Table, 1)
	if !a.wait(waiter{hash: h, answer: func(t *auth.Table) { done <- t }}) {
		return auth.Principal{}, false, nil
	}
	select {
	case t = <-done:
	case <-ctx.Done():
		return auth.Principal{}, false, ctx.Err()
	}
	if t == nil {
		return auth.Principal{}, false, protocol.ErrShuttingDown
	}
	p, ok := t.AuthenticateHash(h)
	return p, ok, nil
}

// answerLogin answers an AUTH by the table t (nil: the broker stops): a
// wrong token after the gate's backoff.
func (a *aclCopy) answerLogin(r *transport.Request, t *auth.Table) {
	if t == nil {
		r.ReplyError(protocol.ErrShuttingDown)
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

// errAuthOff answers a principal lookup on a broker without authorization.
var errAuthOff = errors.New("authorization is off on this broker")

// Authenticate returns the principal whose token is token by the broker's
// copy of the permission table (a token not presented here before is
// looked up at the metaservers first, as an AUTH is); false if none. It
// fails before the broker has its first copy, and with authorization off.
func (b *Broker) Authenticate(ctx context.Context, token string) (auth.Principal, bool, error) {
	if b.acl == nil {
		return auth.Principal{}, false, errAuthOff
	}
	return b.acl.authenticate(ctx, token)
}

// LookupPrincipal returns the registry principal named name (a TLS client
// certificate's name) by the broker's copy of the permission table.
func (b *Broker) LookupPrincipal(name string) (auth.Principal, bool, error) {
	if b.acl == nil {
		return auth.Principal{}, false, errAuthOff
	}
	t := b.acl.table.Load()
	if t == nil {
		return auth.Principal{}, false, errNoTable
	}
	p, ok := t.Lookup(name)
	return p, ok, nil
}

// holds reports whether the connection's principal holds a permission of
// kind (admin holds every kind): what an answer may show beyond what the
// request's rule already allowed.
func (a *aclCopy) holds(c auth.Conn, kind auth.Kind) bool {
	return a.holdsAny(c, kind, auth.KindAdmin)
}

// holdsOnly reports whether the connection's principal holds a permission
// of kind itself.
func (a *aclCopy) holdsOnly(c auth.Conn, kind auth.Kind) bool { return a.holdsAny(c, kind, kind) }

func (a *aclCopy) holdsAny(c auth.Conn, kind, or auth.Kind) bool {
	t := a.table.Load()
	if t == nil {
		return false
	}
	p, err := auth.Resolve(c, t)
	if err != nil {
		return false
	}
	for _, q := range p.Permissions {
		if q.Kind == kind || q.Kind == or {
			return true
		}
	}
	return false
}
