// Package sdk holds the options that every ferrymq SDK client takes, defined
// once: producer.New and consumer.New accept each of them beside their own.
//
//	meta, tok := sdk.MetaAddrs("127.0.0.1:7101"), sdk.Token(token)
//	p, err := producer.New(meta, tok, sdk.Logger(slog.Default()), producer.Linger(0))
//	c, err := consumer.New("billing", []string{"orders"}, meta, tok)
//
// Options are sealed (franz-go's style): only ferrymq's packages make them.
package sdk

import (
	"crypto/tls"
	"log/slog"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/sdkmetrics"
)

// Opt is an option every SDK client accepts (producer.Opt and consumer.Opt
// alike).
type Opt struct{ clientcore.SharedOpt }

// MetaAddrs sets the metaserver nodes' RPC addresses. Required.
func MetaAddrs(addrs ...string) Opt {
	addrs = append([]string(nil), addrs...)
	return Opt{clientcore.Share(func(s *clientcore.Shared) { s.MetaAddrs = addrs })}
}

// TLS makes the client speak TLS with cfg to the metaservers and the
// brokers (a consumer's dead letters included): it verifies their
// certificates with cfg.RootCAs (the system's roots when nil) and presents
// cfg's certificate to servers that require one (tlsconf.ClientConfig
// makes cfg from -tls-ca, -tls-cert and -tls-key). A failed handshake fails
// the call like a lost connection, with an error that names the likely
// cause. Default nil: plaintext.
func TLS(cfg *tls.Config) Opt {
	return Opt{clientcore.Share(func(s *clientcore.Shared) { s.TLS = cfg })}
}

// Token is the credential the client presents (AUTH) on every connection to
// the metaservers and the brokers of a cluster with authorization on: a
// token that ferryctl acl add printed. A producer's principal needs produce
// on its topics; a consumer's, consume on its group's topics and produce on
// %DLQ%GROUP for dead letters. A refusal fails what it concerns at once
// with protocol.ErrNotAuthorized, whose text names the permission missing;
// it is not retried. Default "": none.
func Token(token string) Opt {
	return Opt{clientcore.Share(func(s *clientcore.Shared) { s.Token = token })}
}

// Logger sets the client's logger (nil: none). Messages are constant
// phrases, variable data in key-value pairs, an error under "err" or
// "error": retries and degraded states at Warn, state changes at Info.
// Default: none (a library writes nothing its application did not ask
// for).
func Logger(l *slog.Logger) Opt {
	return Opt{clientcore.Share(func(s *clientcore.Shared) { s.Logger = l })}
}

// Metrics gives the client's metric events to h (nil: none). The producer
// reports its Stats counters and the duration of each SEND request
// (sdkmetrics lists them); the consumer reports none (its numbers are in
// its Stats). sdkmetrics/prom's Metrics exports them to Prometheus under
// the names its documentation lists. Default: none.
func Metrics(h sdkmetrics.Hooks) Opt {
	return Opt{clientcore.Share(func(s *clientcore.Shared) { s.Metrics = h })}
}
