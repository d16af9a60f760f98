package client

import (
	"context"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// AdmitGroup admits a pending or retired broker group: it may hold queues
// from now on. It returns the group.
func (c *Client) AdmitGroup(ctx context.Context, group string) (routing.Group, error) {
	return decode[routing.Group](c.call(ctx, protocol.CodeAdminAdmitGroup, api.AdmitGroupRequest{Group: group}, true))
}

// RetireGroup moves a dead broker group's queues to the other admitted,
// writable groups and retires it (GROUP_ACTIVE while one of its brokers may
// be alive, unless req.Force); req.DryRun only plans.
func (c *Client) RetireGroup(ctx context.Context, req api.RetireGroupRequest) (api.RetireGroupReply, error) {
	return decode[api.RetireGroupReply](c.call(ctx, protocol.CodeAdminRetireGroup, req, true))
}
