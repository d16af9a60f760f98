// Package storage is the broker's disk: a segmented, CRC-checked commit log
// with group commit, synchronous or asynchronous flush, per-queue indexes and
// crash recovery. It knows bytes and offsets, never the network.
package storage
