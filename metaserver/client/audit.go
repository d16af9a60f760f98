package client

import (
	"bytes"
	"context"
	"encoding/json"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
)

// AuditList is a page of the registry's audit records, newest first
// (describe; leader).
func (c *Client) AuditList(ctx context.Context, req api.AuditListRequest) (api.AuditList, error) {
	return decode[api.AuditList](c.call(ctx, protocol.CodeAuditList, req, true))
}

// ActAsField is the request body's field that names Config.ActAs.
const ActAsField = "act_as"

// withActor returns the JSON object body with the field naming actor
// added; a body that is not an object (a route lookup's topic name) goes
// as it is, and the server checks it as the connection's principal.
func withActor(body []byte, actor string) []byte {
	if actor == "" || len(body) < 2 || body[0] != '{' {
		return body
	}
	name, _ := json.Marshal(actor) // a string: never fails
	out := make([]byte, 0, len(body)+len(ActAsField)+len(name)+4)
	out = append(out, `{"`+ActAsField+`":`...)
	out = append(out, name...)
	if rest := bytes.TrimSpace(body[1:]); len(rest) > 0 && rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, body[1:]...)
}
