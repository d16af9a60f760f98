// Package broker is a ferrymq broker: it takes SEND batches, checks and
// appends every message on its own off the network goroutines, answers the
// batch when its last message is done, replicates the commit log from master
// to slave, sends heartbeats to the metaserver and enforces the read-only
// state it is given, and serves PULL reads.
package broker
