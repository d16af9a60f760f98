// Package loadgen is ferrymq's load generator: it sends messages through
// the producer SDK as fast as the cluster takes them (or at a set rate),
// optionally consumes them with a consumer group, and measures throughput
// and latency. `ferryctl bench` is a thin command over Run; the measurement
// scripts under scripts/ drive it through that command.
//
// A run is bounded by a message count, a duration or both, and stops early
// when its context ends. Every goroutine a run starts has ended when Run
// returns.
//
// It uses only what a user's program may use (the SDKs and the metaserver
// client), so what it measures is what an application would see.
package loadgen
