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
// Answers are read by whoever holds the connection's read token: a reader
// goroutine, or a call that is alone on a plaintext connection, which reads
// its own answer and saves the hand-over between goroutines (see
// docs/decisions/lone-call-reads-its-answer.md).
//
// # Server
//
// A Server accepts connections; each has a read goroutine and a write
// goroutine. The read goroutine decodes frames and hands requests to the
// worker pool, so a slow handler never stalls the reading of other
// requests; it runs a handler itself only for a lone request of a code
// registered with HandleOrderedInline (see Inline hand-offs). A handler answers with Request.Reply, at once
// or later from any goroutine (the broker answers a SEND batch when its last
// message is stored). Responses from every goroutine are coalesced by the
// connection's writer into few large writes. A malformed frame, a frame over
// protocol.MaxFrameSize, or a response sent to the server closes that one
// connection; the others keep being served. An unknown request code is
// answered with StatusUnknownCode.
//
// # Admission before trust
//
// The transport knows no request code. What a connection may do before it
// is trusted is a Gate's to say (ServerConfig.Gate; package auth's Gate is
// the servers' one): Open lets a connection in or refuses it (answered BUSY,
// like one over MaxConns); the gate's per-connection Admission sets the
// deadline and size cap of each frame of an untrusted connection and
// decides which of its requests reach their handlers; it is told when a
// handler trusts the connection (Request.Authenticate) and when the
// connection closes. A trusted connection costs the gate nothing: the
// reader asks it nothing more. Without a gate a connection is trusted once
// its TLS client certificate was verified or it sent a request of a
// registered code. Either way an untrusted connection's frames are read as
// their bytes arrive, so a peer that declares a large frame and sends
// little makes the server hold little.
//
// A client proves who it is with a Login (ClientConfig.Login;
// auth.TokenLogin presents a token with AUTH), run first on every
// connection it dials.
//
// # Ordered codes
//
// The workers run a connection's requests in parallel, so two requests
// pipelined on one connection may be handled in either order. A code
// registered with Server.HandleOrdered (the broker's SEND: per-key order and
// idempotent producers need a connection's messages appended in the order
// they were sent) is run one at a time per connection, in arrival order: a
// connection's next ordered request starts once the handler of the previous
// one returned, not once it was answered, so completion stays asynchronous.
// All the ordered codes of a connection share one sequence; other
// connections, and unordered codes of the same connection, are not held
// behind it (nor ordered with it).
//
// No goroutine waits for a request's turn. The reader hands a connection's
// ordered request to the workers only when none of that connection's is
// with them; otherwise it appends it to the connection's ordered queue and
// reads on. The worker that finishes one runs the next queued one itself,
// and after orderedBatch in a row offers it back to the task queue (if there
// is room), so a busy connection does not keep a worker from the others. A
// slow handler thus holds one worker, whatever its connection has queued
// behind it. Queued requests count like the others: they were admitted
// (their replies' bytes reserved) and hold a MaxInflightPerConn slot, so the
// queue is bounded by both. On Close, the workers run every queued one.
//
// # Inline hand-offs
//
// Each hand-off between goroutines that sleep costs a thread wake-up when
// the process is otherwise idle (tens of microseconds on a small VM), so a
// lone request is served with as few as possible. A request of a code
// registered with HandleOrderedInline that arrives alone (no ordered request
// of its connection in flight, nothing more read from the socket) runs on
// the connection's reader; one that arrives with others goes to the workers,
// so a busy connection keeps being read and its requests batched. An answer
// made while its handler runs waits in the buffer until the handler
// returns; then the goroutine that ran the handler (reader or worker) writes
// it itself if no write is in progress and nothing else of its connection's
// ordered sequence is queued, with one non-blocking write that never waits
// on the peer: what the socket does not take (a peer that reads slowly) is
// left to the writer goroutine, which writes it before anything else. Answers
// made at any other time wake the writer goroutine. A client's caller writes
// its request itself when no write is in progress. So a lone SEND to an
// idle broker is read, handled and answered by one goroutine.
//
// # Who may block, and on what
//
// Replying never blocks: Request.Reply, ReplyError, ReplyStatus and
// ReplyGuarded append the response to the connection's buffer and return;
// the writer goroutine writes it (or the handler's goroutine, with a write
// that never waits). So the goroutines that answer (the broker's commit log
// writer and flusher, its HA loop) never wait on a peer's socket, whatever
// the peer does. A guarded reply (Guard) is vetted once more by whichever
// goroutine writes it, just before the piece of output holding its first
// byte goes to the socket: the
// broker turns acknowledgements into LEASE_LOST there if its write lease
// ended while the answer waited.
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
// # Files
//
// server.go holds the Server, its config, registration and Close; accept.go
// the acceptor, MaxConns and the BUSY refusal; gate.go the Gate contract and
// its enforcement; conn.go a connection's read loop (framing, frame caps,
// admission) and its writer goroutine; dispatch.go the workers and the
// ordered and inline hand-offs; request.go Request and its replies;
// writer.go the coalescing writer and Guard; tls.go the handshakes; frame.go
// the frame reader; client.go the Client.
//
// # Goroutines
//
// Client: per live connection, one reader and one writer; Close stops them.
// Server: one acceptor, a reader and a writer per connection, and the
// workers (ordered requests run on them too: no goroutine per connection);
// Close stops reading, lets the workers run every request already read
// (those queued on a connection's ordered queue included), waits (up to a
// grace period) for them to be answered, flushes the answers (each peer
// getting at most WriteTimeout to read them), and stops all of them.
package transport
