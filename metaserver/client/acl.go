package client

import (
	"context"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
)

// SetPrincipal creates or replaces a principal (admin; leader): its
// token's SHA-256 in hex ("" none) and permissions. A non-zero
// req.ExpectVersion that is not the ACL's version gets CONFLICT.
func (c *Client) SetPrincipal(ctx context.Context, req api.ACLSetRequest) (api.ACLChangeReply, error) {
	return decode[api.ACLChangeReply](c.call(ctx, protocol.CodeAdminACLSet, req, true))
}

// RemovePrincipal removes a principal (admin; leader).
func (c *Client) RemovePrincipal(ctx context.Context, req api.ACLRemoveRequest) (api.ACLChangeReply, error) {
	return decode[api.ACLChangeReply](c.call(ctx, protocol.CodeAdminACLRemove, req, true))
}

// ACL lists the principals (admin; leader).
func (c *Client) ACL(ctx context.Context) (api.ACL, error) {
	return decode[api.ACL](c.call(ctx, protocol.CodeAdminACLList, struct{}{}, true))
}

// ClusterACL is the brokers' copy of the table (cluster; leader): the
// principals without their token hashes, and whose each of tokenSHA256
// (hashes in hex) is.
func (c *Client) ClusterACL(ctx context.Context, tokenSHA256 []string) (api.ACL, error) {
	return decode[api.ACL](c.call(ctx, protocol.CodeACLGet, api.ACLGetRequest{TokenSHA256: tokenSHA256}, true))
}
