// Package api is the control plane's message vocabulary: the bodies that
// brokers, producers and the admin CLI exchange with the metaserver
// (heartbeats and their replies, topic and group administration, Raft
// membership and status). Both sides share it: the metaserver server
// decodes requests into these types and the typed client in
// metaserver/client encodes them, so neither imports the other for its
// messages. (The server still uses the client, but only to forward work
// to the leader.)
//
// The bodies are JSON: they are small and rare next to the data path, and
// readable in captures. Route lookups, which are hot, are not here: they
// use routing's binary encoding.
//
// It imports only routing, and the import rule in internal/lint keeps it
// to protocol and routing.
package api
