// Package auth is ferrymq's permission model: who a peer is (a Principal,
// found by the bearer token it presents or, later, by its TLS
// certificate's identity) and what it may do (its Permissions, checked per
// request code by Authorize).
//
// # Permissions
//
//	admin                                  everything, the ACL and Raft membership included
//	cluster                                what servers do to each other: broker heartbeats,
//	                                       ROUTE_GET, HA fetch and ack, a follower's forwards
//	describe                               read-only admin: groups, topics, Raft status, consumer groups
//	produce:<topic-pattern>                SEND to matching topics, their route lookups, INIT_PRODUCER
//	consume:<topic-pattern>:<group-pattern> PULL of matching topics; consumer heartbeats, commits
//	                                       and group reads of matching groups on matching topics
//
// A pattern is an exact name, a prefix ending in '*' ("orders.*" matches
// "orders.eu" and "orders."; "orders*" matches "orders" and "ordersx"), or
// "*" (every name). ParsePermission gives the canonical form back with
// String. The rule of every request code is in Authorize.
//
// # Tables
//
// A Table is an immutable snapshot of the principals: the ones the registry
// holds (metaserver/fsm, applied through Raft) and two built-in ones that
// are never in the registry, the bootstrap admin and the cluster (the
// servers' shared secret), each known only by the SHA-256 of its token.
// Holders swap whole tables (an atomic.Pointer), so a check reads no lock.
// The registry never stores a token, only its hash: Authenticate hashes the
// token it is given and looks the hash up, so its time does not depend on
// how much of a token matches a stored one.
//
// # Before authentication
//
// A Gate is a server's admission of connections that have not
// authenticated (it implements transport.Gate, which this package does not
// import): AUTH and IDENTIFY only, a cap on how many such connections are
// open and a share of it per source (the oldest evicted at the cap), a
// frame cap and deadlines (GateConfig). A server serves AUTH with
// BeginLogin and AnswerLogin: a wrong token is answered late, from a timer,
// and costs the connection and its source (backoff.go). When its table
// changes, a server closes the connections whose identity the new table
// does not know (Revoked, with transport.Server.DropConns). A client
// presents its token with TokenLogin (a transport.Login).
//
// This package does no I/O; a Gate is given the time for admission and
// times held-back answers with GateConfig.Clock. NewToken is its one use
// of randomness; the registry's state machine never calls it.
package auth
