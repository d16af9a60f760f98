package broker

import (
	"fmt"
	"slices"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

// The request codes the broker serves, each registered through one table
// (endpoints) with the check authorization makes before its handler runs:
// its access. A code is either open (AUTH and IDENTIFY, which come before a
// principal exists: openCodes) or checked against the code's rule in the
// registry's permission table (package auth), on what the request names.
// register is the only place that hands a handler to a transport server,
// and it refuses an endpoint whose access is neither, so a code cannot be
// served unchecked. With authorization off (no Config.ClusterToken) the
// wrappers check nothing and add no work.

// openCodes are the codes served to a connection with no principal.
var openCodes = []protocol.Code{protocol.CodeIdentify, protocol.CodeAuth}

// port is one of the broker's listeners.
type port uint8

const (
	dataPort port = iota // producers and consumers
	haPort               // the group's slave, and a former master's RECOVER
)

// endpoint is one request code on one port.
type endpoint struct {
	port   port
	code   protocol.Code
	access access
	// replySize estimates each request's answer for the transport's
	// admission (nil: transport.DefaultReplySize).
	replySize transport.ReplySize
	// inline: transport.HandleOrderedInline (SEND: one at a time per
	// connection, in arrival order, on the reader when alone).
	inline bool
	// releases: the handler releases each request's body when done with it
	// (transport's Releases; SEND, once the commit log copied the batch).
	releases bool
}

// access is a code's handler with the check made before it: wrap returns
// the handler for code, checking against acl (nil: authorization off).
type access struct {
	open bool // served to anyone: openCodes only
	wrap func(acl *aclCopy, code protocol.Code) transport.Handler
}

// open serves h to anyone.
func open(h transport.Handler) access {
	return access{open: true, wrap: func(*aclCopy, protocol.Code) transport.Handler { return h }}
}

// byPrincipal serves h once the code's rule allows the connection's
// principal a request that names no topic (HA_FETCH, HA_ACK, RECOVER:
// cluster). A refusal is NOT_AUTHORIZED naming what is lacking, or BUSY
// before the first permission table is in.
func byPrincipal(h transport.Handler) access {
	return access{wrap: func(acl *aclCopy, code protocol.Code) transport.Handler {
		if acl == nil {
			return h
		}
		return func(r *transport.Request) {
			if err := acl.check(r, code, auth.Target{}); err != nil {
				r.ReplyError(err)
				return
			}
			h(r)
		}
	}}
}

// byTarget decodes a request (a malformed one is answered with the
// decoder's error) and serves it once the code's rule allows the
// connection's principal what target says it names: a SEND's topics, a
// PULL's topic. The handler gets the request decoded, so it is decoded
// once.
func byTarget[T any](decode func([]byte) (T, error), target func(T) auth.Target, serve func(*transport.Request, T)) access {
	return access{wrap: func(acl *aclCopy, code protocol.Code) transport.Handler {
		return func(r *transport.Request) {
			req, err := decode(r.Body)
			if err != nil {
				r.ReplyError(err)
				return
			}
			if acl != nil {
				if err := acl.check(r, code, target(req)); err != nil {
					r.ReplyError(err)
					return
				}
			}
			serve(r, req)
		}
	}}
}

// byRecordTopic serves a request that names a record of the log (a delayed
// message's handle) rather than a topic: the code's rule must first allow
// the principal some topic (nothing is read for a stranger), then the
// record is read and the rule checked against its topic.
func byRecordTopic(read func([]byte) (pendingRecord, error), serve func(*transport.Request, pendingRecord)) access {
	return access{wrap: func(acl *aclCopy, code protocol.Code) transport.Handler {
		return func(r *transport.Request) {
			if acl != nil {
				if err := acl.check(r, code, auth.Target{}); err != nil {
					r.ReplyError(err)
					return
				}
			}
			p, err := read(r.Body)
			if err != nil {
				r.ReplyError(err)
				return
			}
			if acl != nil {
				if err := acl.check(r, code, auth.Topic(p.msg.Topic)); err != nil {
					r.ReplyError(err)
					return
				}
			}
			serve(r, p)
		}
	}}
}

// endpoints lists every request code the broker serves. The handlers read
// the broker's parts when called, not here.
func (b *Broker) endpoints() []endpoint {
	haFetchSize := func([]byte) int { return haAnswerSize(b.cfg.HAFetchBytes) }
	return []endpoint{
		{port: dataPort, code: protocol.CodeSend, inline: true, releases: true, replySize: sendReplyEstimate,
			access: byTarget(decodeSend, sendRequest.target, func(r *transport.Request, q sendRequest) { b.send.handle(r, q) })},
		{port: dataPort, code: protocol.CodePull, replySize: pullReplySize,
			access: byTarget(protocol.DecodePullRequest, pullTarget, func(r *transport.Request, q protocol.PullRequest) {
				handlePull(b.pulls.store, b.sess.claim, b.pulls, r, q)
			})},
		{port: dataPort, code: protocol.CodeQueueCount, access: byTarget(decodeQueueCount, func(q protocol.QueueCountRequest) auth.Target {
			return auth.Topic(q.Topic)
		}, b.handleQueueCount)},
		{port: dataPort, code: protocol.CodeLookup, access: byPrincipal(b.handleLookup)},
		{port: dataPort, code: protocol.CodeDelayedCancel, access: byRecordTopic(b.decodeDelayedRef, b.handleDelayedCancel)},
		{port: dataPort, code: protocol.CodeDelayedState, access: byRecordTopic(b.decodeDelayedRef, b.handleDelayedState)},
		{port: dataPort, code: protocol.CodeDelayedList, access: byPrincipal(b.handleDelayedList)},
		{port: dataPort, code: protocol.CodeTxnEnd, access: byPrincipal(b.handleTxnEnd)},
		{port: dataPort, code: protocol.CodeTxnList, access: byPrincipal(b.handleTxnList)},
		{port: dataPort, code: protocol.CodeIdentify, access: open(b.handleIdentify)},
		{port: dataPort, code: protocol.CodeAuth, access: open(b.handleAuth)},

		{port: haPort, code: protocol.CodeAuth, access: open(b.handleAuth)},
		{port: haPort, code: protocol.CodeHAFetch, replySize: haFetchSize, access: byPrincipal(func(r *transport.Request) { b.roles.serveFetch(r) })},
		{port: haPort, code: protocol.CodeHAAck, access: byPrincipal(func(r *transport.Request) { b.roles.serveAck(r) })},
		{port: haPort, code: protocol.CodeRecover, access: byPrincipal(b.handleRecover)},
	}
}

// register hands e's handler, wrapped in its check, to srv. It panics on an
// endpoint whose access is missing, or open for a code not in openCodes: a
// programming error that must not reach a server.
func (e endpoint) register(srv *transport.Server, acl *aclCopy) {
	switch {
	case e.access.wrap == nil:
		panic(fmt.Sprintf("broker: request code %v registered without an access check", e.code))
	case e.access.open && !slices.Contains(openCodes, e.code):
		panic(fmt.Sprintf("broker: request code %v registered open; only %v are", e.code, openCodes))
	}
	h := e.access.wrap(acl, e.code)
	if e.inline {
		srv.HandleOrderedInline(e.code, h, e.replySize)
	} else {
		srv.HandleWithReply(e.code, h, e.replySize)
	}
	if e.releases {
		srv.Releases(e.code)
	}
}

// target is what a SEND names: every topic of its batch, checked at once,
// so a batch with one topic its principal may not produce to is refused
// whole before anything of it is stored.
func (q sendRequest) target() auth.Target {
	var topics []string
	for i := range q.msgs {
		if t := q.msgs[i].Topic; len(topics) == 0 || topics[len(topics)-1] != t {
			topics = append(topics, t)
		}
	}
	return auth.Target{Topics: topics}
}

// pullTarget is what a PULL names: its topic (consume, any group).
func pullTarget(q protocol.PullRequest) auth.Target { return auth.Topic(q.Topic) }
