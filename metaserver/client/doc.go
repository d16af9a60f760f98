// Package client is the typed metaserver client that brokers, producers and
// the admin CLI use: it knows several metaserver addresses, follows
// NOT_LEADER answers to the leader, and fails over when a node is down.
// The messages it sends and receives are package metaserver/api's.
package client
