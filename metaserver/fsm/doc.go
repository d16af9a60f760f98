// Package fsm is the metaserver's pure, deterministic state machine: typed
// commands in (register a broker, set a group's state, create a topic, add
// queues), routing state out. It does no I/O, reads no clock and draws no
// random numbers: the leader stamps times into the commands, so every node
// that applies the same log reaches the same state.
package fsm
