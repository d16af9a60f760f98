// Package metaserver is the Raft node of ferrymq's routing registry: it runs
// hashicorp/raft over the FSM of package fsm, serves route lookups on every
// node, takes broker heartbeats on the leader (a group's brokers past its
// master and first slave join it as more slaves), takes a master's changes
// of its group's sync set, and runs the leader-only judge that marks a
// broker group read-only when its master's heartbeats stop, writable again
// when they resume, and promotes the most caught-up member of the sync set
// when the master is lost.
//
// The judge and the heartbeat handler read time from Config.Clock, and the
// leader stamps the times it reads into the commands it applies, so the FSM
// stays deterministic and tests move a fake clock instead of sleeping
// (Server.WaitJudged tells them when the judge has seen the new time).
// Raft's own timings stay on the real clock.
package metaserver
