package auth

import (
	"context"
	"errors"

	"github.com/ferrymq/ferrymq/protocol"
)

// TokenLogin is a client's bearer token, presented with AUTH first thing
// on every connection (it implements transport.Login: set it as
// transport.ClientConfig.Login). A server that does not recognise it
// answers NOT_AUTHORIZED, which fails every call on that connection
// ("transport: AUTH to ADDR: ferrymq: NOT_AUTHORIZED: token not
// recognised"). A server that predates AUTH (UNKNOWN_CODE) checks no
// credentials: the connection is used as it is. "" presents nothing.
type TokenLogin string

// Login presents the token with call.
func (t TokenLogin) Login(ctx context.Context, call func(ctx context.Context, code protocol.Code, body []byte) (protocol.Frame, error)) error {
	if t == "" {
		return nil
	}
	_, err := call(ctx, protocol.CodeAuth, []byte(t))
	if errors.Is(err, protocol.ErrUnknownCode) {
		return nil
	}
	return err
}
