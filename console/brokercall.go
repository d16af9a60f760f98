package console

import (
	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/ops"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/sdk"
)

// Calls to the brokers: made with the session's own token, so the brokers
// check its permissions as they would on the wire; with authorization off,
// none. A certificate session has no token and is refused the pages that
// call brokers (page.brokers, errCertBrokers).

// token is the credential the session's broker calls present ("": none).
func (q *query) token() string { return q.s.token }

// dial connects to a broker with the session's credential.
func (q *query) dial() ops.Dial { return q.c.dialWith(q.token()) }

func (c *Console) dialWith(token string) ops.Dial {
	cfg := transport.ClientConfig{TLS: c.cfg.TLS, Login: auth.TokenLogin(token)}
	return func(addr string) *transport.Client { return transport.NewClient(addr, cfg) }
}

// producer is a producer SDK client with the session's credential, for an
// action that sends (a resend) or acts on a delayed message; the caller
// closes it.
func (q *query) producer() (*producer.Client, error) {
	return producer.New(sdk.MetaAddrs(q.c.cfg.MetaAddrs...), sdk.TLS(q.c.cfg.TLS), sdk.Token(q.token()),
		producer.DeliveryTimeout(q.c.cfg.CallTimeout), producer.RequestTimeout(q.c.cfg.CallTimeout))
}
