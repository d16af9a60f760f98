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
// # Who may block, and on what
//
// Replying never blocks: Request.Reply, ReplyError and ReplyStatus append the
// response to the connection's buffer and return; the writer goroutine
// writes it. So the goroutines that answer (the broker's commit log writer
// and flusher, its HA loop) never wait on a peer's socket, whatever the peer
// does.
//
// What one connection may queue is bounded where requests come in instead:
// its read goroutine, which is the one goroutine allowed to wait on that
// peer's behalf, admits a request (hands it to a handler) only while the
// reply bytes buffered or being written, plus the bytes reserved for the
// replies of requests admitted and not yet answered, plus this request's
// reservation, fit in ServerConfig.MaxWriteBuffer; when nothing is buffered
// or reserved it admits the request whatever its size, so a single reply
// larger than the bound cannot deadlock. A request's reservation is its
// code's estimate of its reply (Server.HandleWithReply registers a ReplySize;
// Handle uses DefaultReplySize) plus the frame header; it is released when
// the reply is queued, whose bytes then count until written. Besides,
// MaxInflightPerConn bounds how many requests of one connection are
// unanswered, and a full worker queue also makes readers wait. While a
// reader waits, its peer's requests stay unread in the socket: backpressure
// on that peer alone. The bound holds as far as the estimates are upper
// bounds of the replies.
//
// A peer that stops reading stops its own requests being admitted once its
// buffer fills; and if a socket write makes no progress for
// ServerConfig.WriteTimeout, the connection is closed with one warning that
// names the peer, its unsent answers are dropped, and the replies to its
// requests still unanswered return an error (and are dropped too).
//
// On the client side, callers are the ones slowed down: a call waits for
// room while ClientConfig.MaxWriteBuffer bytes of requests are buffered (up
// to its context), and a lone call writes its request itself, holding the
// socket for at most ClientConfig.WriteTimeout. The client's reader never
// waits on anything but the socket (a response goes to a buffered channel),
// and its writer goroutine serves that one connection's callers only. A
// server that reads nothing for WriteTimeout fails the connection: its
// pending calls fail with ErrConnLost and the next call dials again.
//
// # Goroutines
//
// Client: per live connection, one reader and one writer; Close stops them.
// Server: one acceptor, a reader and a writer per connection, and the
// workers; Close stops reading, waits (up to a grace period) for every
// request already read to be answered, flushes the answers (each peer
// getting at most WriteTimeout to read them), and stops all of them.
package transport
