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

// ClusterACL is ACL for the servers' copies of the table (cluster; leader).
func (c *Client) ClusterACL(ctx context.Context) (api.ACL, error) {
	return decode[api.ACL](c.call(ctx, protocol.CodeACLGet, struct{}{}, true))
}
