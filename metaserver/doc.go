// Package metaserver is the Raft node of ferrymq's routing registry: it runs
// hashicorp/raft over the FSM of package fsm, serves route lookups on every
// node, takes broker heartbeats on the leader, and runs the leader-only judge
// that marks a broker group read-only when its heartbeats stop or its slave
// lags, and writable again when it recovers.
//
// The judge and the heartbeat handler read time from Config.Clock, and the
// leader stamps the times it reads into the commands it applies, so the FSM
// stays deterministic and tests move a fake clock instead of sleeping
// (Server.WaitJudged tells them when the judge has seen the new time).
// Raft's own timings stay on the real clock.
package metaserver
