// Package metaserver is the Raft node of ferrymq's routing registry: it runs
// hashicorp/raft over the FSM of package fsm, serves route lookups on every
// node, takes broker heartbeats on the leader, and runs the leader-only judge
// that marks a broker group read-only when its heartbeats stop or its slave
// lags, and writable again when it recovers.
package metaserver
