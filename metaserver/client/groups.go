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

// AlterSyncSet (a group's master) replaces the group's sync set on the
// leader; it returns the group as the registry has it after the change.
// When the epoch, the master or the set's version moved, the error is a
// *protocol.Error with StatusConflict: the master re-reads the group (its
// heartbeat reply has it) and decides again.
func (c *Client) AlterSyncSet(ctx context.Context, req api.AlterSyncSetRequest) (routing.Group, error) {
	return decode[routing.Group](c.call(ctx, protocol.CodeAlterSyncSet, req, true))
}

// SetGroupPolicy sets how many copies a group's HIGH messages need
// (req.MinInSync) and at how many they are answered (req.AckQuorum); it
// returns the group.
func (c *Client) SetGroupPolicy(ctx context.Context, req api.GroupPolicyRequest) (routing.Group, error) {
	return decode[routing.Group](c.call(ctx, protocol.CodeAdminGroupPolicy, req, true))
}

// RemoveSlave removes a slave from its group and from the group's sync set;
// it returns the group.
func (c *Client) RemoveSlave(ctx context.Context, req api.RemoveSlaveRequest) (routing.Group, error) {
	return decode[routing.Group](c.call(ctx, protocol.CodeAdminRemoveSlave, req, true))
}
