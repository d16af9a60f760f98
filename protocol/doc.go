// Package protocol defines ferrymq's one binary wire protocol: the frame that
// every link uses (producer to broker, broker to metaserver, slave to master,
// CLI to metaserver), the request codes, the table of status codes, and the
// hand-written encodings of the hot-path bodies (SEND batches and their
// per-message results, PULL requests and responses).
//
// # Frame
//
// All integers are big-endian.
//
//	offset size field
//	0      4    total length of the frame in bytes, this field included
//	4      2    magic 0xFE77
//	6      1    version (1)
//	7      1    flags: bit 0 response, bit 1 oneway
//	8      2    code: the request code (echoed in the response)
//	10     2    status: 0 in a request; the status code in a response
//	12     4    opaque: the request id chosen by the caller, echoed in the response
//	16     2    header length H
//	18     H    header (small, free-form; empty on the hot path)
//	18+H   ...  body
//
// A frame is at most MaxFrameSize bytes; a message body at most
// MaxMessageSize. A response whose status is not OK carries the error text in
// its body.
//
// # Encoding rules
//
// Encoders append to a caller's buffer (AppendXxx(dst, ...) []byte) and never
// allocate beyond growing it. Decoders never panic on any input, check every
// length against the bytes that are really there before allocating, and
// report the first problem as an error wrapping ErrMalformed. Decoded byte
// slices (message bodies) alias the input buffer: the caller must not reuse
// the buffer while the decoded values are in use.
package protocol
