package clientcore

import (
	"crypto/tls"
	"log/slog"

	"github.com/ferrymq/ferrymq/sdkmetrics"
)

// Opt is an option of an SDK client, in the style of franz-go's sealed
// options: its method is unexported and this package internal, so only
// ferrymq's packages make options. An option is shared (SharedOpt: package
// sdk's, accepted by every SDK's New) or one SDK's own (Own, wrapped by the
// SDK in a type that carries its marker method, so that the compiler
// refuses a consumer option given to producer.New).
type Opt interface{ apply(*Options) }

// Options is what New's options are applied to.
type Options struct {
	Shared
	own any // the SDK's own configuration: a pointer its Own options apply to
}

// Shared is the configuration every SDK client has.
type Shared struct {
	// MetaAddrs are the metaserver nodes' RPC addresses.
	MetaAddrs []string
	// TLS, when set, is spoken to the metaservers and the brokers (nil:
	// plaintext).
	TLS *tls.Config
	// Token is presented (AUTH) on every connection ("": none).
	Token string
	// Logger is never nil once applied: a discarding one by default.
	Logger *slog.Logger
	// Metrics is never nil once applied: sdkmetrics.Nop by default.
	Metrics sdkmetrics.Hooks
}

// SharedOpt sets part of Shared. Every SDK's New accepts it: it carries
// each SDK's marker method.
type SharedOpt struct{ f func(*Shared) }

func (o SharedOpt) apply(c *Options) {
	if o.f != nil { // the zero SharedOpt (a zero sdk.Opt) sets nothing
		o.f(&c.Shared)
	}
}

// ProducerOpt marks an option producer.New accepts.
func (SharedOpt) ProducerOpt() {}

// ConsumerOpt marks an option consumer.New accepts.
func (SharedOpt) ConsumerOpt() {}

// Share returns a shared option setting what f sets.
func Share(f func(*Shared)) SharedOpt { return SharedOpt{f} }

// OwnOpt sets part of one SDK's own configuration, a T.
type OwnOpt[T any] struct{ f func(*T) }

func (o OwnOpt[T]) apply(c *Options) {
	if t, ok := c.own.(*T); ok {
		o.f(t)
	}
}

// Own returns an option setting what f sets of an SDK's own configuration.
func Own[T any](f func(*T)) OwnOpt[T] { return OwnOpt[T]{f} }

// discard is the default logger: an SDK logs nothing unless given one.
var discard = slog.New(slog.DiscardHandler)

// Apply applies opts in order (nil ones are skipped): the SDK's own to own,
// the shared ones to the returned Shared, whose Logger and Metrics it
// fills with their defaults.
func Apply[O Opt, T any](own *T, opts []O) Shared {
	o := Options{own: own}
	for _, opt := range opts {
		if Opt(opt) == nil {
			continue
		}
		opt.apply(&o)
	}
	if o.Logger == nil {
		o.Logger = discard
	}
	if o.Metrics == nil {
		o.Metrics = sdkmetrics.Nop{}
	}
	return o.Shared
}

// Validate reports each problem of s through bad: MetaAddrs is required
// (unless required is false: tests replace every use of the metaserver),
// and none of them may be empty.
func (s *Shared) Validate(required bool, bad func(format string, args ...any)) {
	if len(s.MetaAddrs) == 0 && required {
		bad("MetaAddrs is required")
	}
	for _, a := range s.MetaAddrs {
		if a == "" {
			bad("MetaAddrs has an empty address")
			break
		}
	}
}
