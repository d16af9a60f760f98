// Package ops is what ferryctl and the web console share to read and act on
// a cluster as an operator does: read a queue from its group's master (or,
// when the master does not answer, its slave), find the first offset
// stored at or after a time, look messages up by handle, id or key, ask
// every broker group's master a question (delayed messages, transactions)
// and abort a transaction through the registry then the group.
//
// It holds no credential: every function takes a Dial that makes a
// connection to a broker with the caller's own (ferryctl's token and TLS
// flags, a console session's token), so the brokers check the caller's
// permissions as they would on the wire.
package ops
