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

// ActAsField is the request body's field that names Config.ActAs, and
// ActProofField the one carrying Config.ActProof.
const (
	ActAsField    = "act_as"
	ActProofField = "act_proof"
)

// withActor returns the JSON object body with the fields naming actor and
// its proof added; a body that is not an object (a route lookup's topic
// name) goes as it is, and the server checks it as the connection's
// principal.
func withActor(body []byte, actor, proof string) []byte {
	if actor == "" || len(body) < 2 || body[0] != '{' {
		return body
	}
	name, _ := json.Marshal(actor) // strings: never fail
	pr, _ := json.Marshal(proof)
	out := make([]byte, 0, len(body)+len(ActAsField)+len(ActProofField)+len(name)+len(pr)+8)
	out = append(out, `{"`+ActAsField+`":`...)
	out = append(out, name...)
	out = append(out, `,"`+ActProofField+`":`...)
	out = append(out, pr...)
	if rest := bytes.TrimSpace(body[1:]); len(rest) > 0 && rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, body[1:]...)
}
