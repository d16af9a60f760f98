// Package transport is ferrymq's framed TCP layer: a multiplexed client and a
// server that dispatches requests by code to handlers on a bounded worker
// pool. Frames are the ones of package protocol.
//
// # Client
//
// A Client talks to one address over one connection and keeps many calls in
// flight on it: each request gets an opaque id, a pending-call entry, and a
// deadline (the context's, or Config.CallTimeout). A response is matched to
// its call by opaque. When the connection is lost every pending call fails at
// once with ErrConnLost, and the next call dials again.
//
// # Server
//
// A Server accepts connections; each has a read goroutine and a write
// goroutine. The read goroutine only decodes frames and hands requests to the
// worker pool (it never runs a handler), so a slow handler never stalls the
// reading of other requests. A handler answers with Request.Reply, at once
// or later from any goroutine (the broker answers a SEND batch when its last
// message is stored). Responses from every goroutine are coalesced by the
// connection's writer into few large writes. A malformed frame, a frame over
// protocol.MaxFrameSize, or a response sent to the server closes that one
// connection; the others keep being served. An unknown request code is
// answered with StatusUnknownCode.
//
// # Goroutines
//
// Client: per live connection, one reader and one writer; Close stops them.
// Server: one acceptor, a reader and a writer per connection, and the
// workers; Close stops reading, waits (up to a grace period) for every
// request already read to be answered, flushes the answers, and stops all of
// them.
package transport
