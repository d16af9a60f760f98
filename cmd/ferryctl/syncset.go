package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/internal/ops"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/routing"
)

// ferryctl broker set-group and remove-slave: how many copies a group's
// HIGH messages need, and taking a slave out of its group
// (metaserver/fsm/syncset.go).

type setGroupOptions struct {
	minInSync int
	ack       string
}

// ackWant is what --ack takes.
var ackWant = fmt.Sprintf("all, or quorum:K with K from 2 to %d copies (the master's counted)", fsm.MaxMinInSync)

// parseAck reads --ack: "all" is 0 (every member of the sync set), and
// "quorum:K" is K copies.
func parseAck(s string) (int, error) {
	if s == "all" {
		return 0, nil
	}
	k, ok := strings.CutPrefix(s, "quorum:")
	if !ok {
		return 0, errWant
	}
	n, err := strconv.Atoi(k)
	if err != nil || n < 2 || n > fsm.MaxMinInSync {
		return 0, errWant
	}
	return n, nil
}

// ackWord is a group's ack policy as --ack takes it.
func ackWord(quorum int) string {
	if quorum == 0 {
		return "all"
	}
	return fmt.Sprintf("quorum:%d", quorum)
}

// highWord is whether a group takes HIGH messages: its sync set's copies
// (the master's counted) against the copies it needs.
func highWord(g routing.Group) string {
	copies := fmt.Sprintf("%d/%d", len(g.InSync)+1, g.MinCopies())
	if !g.HighAllowed() {
		return copies + " REFUSED"
	}
	return copies + " ok"
}

func newBrokerSetGroupCommand(g *globalOptions) *cobra.Command {
	o := &setGroupOptions{}
	cmd := &cobra.Command{
		Use:   "set-group GROUP",
		Short: "Set how many copies a broker group's HIGH messages need (--min-insync) and at how many they are answered (--ack)",
		Long: fmt.Sprintf(`Set how many copies a broker group's HIGH messages need.

--min-insync N: with fewer than N copies in the group's sync set (its master
and the slaves that hold every HIGH message it answered), the master refuses
HIGH sends before storing them (NOT_ENOUGH_REPLICAS, which the producer
retries); NORMAL sends are written all the same. 1 to %d, or 0 for the
default, %d.

--ack all waits for every member of the sync set before a HIGH message is
answered; --ack quorum:K answers it once K copies (the master's counted)
hold it, for lower tail latency: a failover then waits to hear from enough
members to be sure one holds it. A quorum above --min-insync raises the
minimum to it.

A flag not given keeps the group's value. Prints the group's policy and
whether it takes HIGH messages now (copies in the set / copies needed).
Needs admin.`, fsm.MaxMinInSync, routing.DefaultMinInSync),
		Args: usageArgs(cobra.ExactArgs(1)),
	}
	cmd.RunE = g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
		setMin, setAck := cmd.Flags().Changed("min-insync"), cmd.Flags().Changed("ack")
		if !setMin && !setAck {
			return usageError{errors.New("set-group: give --min-insync, --ack or both")}
		}
		req := api.GroupPolicyRequest{Group: args[0]}
		if !setMin || !setAck {
			// Keep the value not given: read the group's.
			cur, err := groupNamed(ctx, cl, args[0])
			if err != nil {
				return err
			}
			req.MinInSync, req.AckQuorum = cur.MinInSync, cur.AckQuorum
		}
		if setMin {
			req.MinInSync = o.minInSync
		}
		if setAck {
			req.AckQuorum, _ = parseAck(o.ack) // checked as the flag was parsed
		}
		grp, err := cl.SetGroupPolicy(ctx, req)
		if err != nil {
			return err
		}
		return g.printer().print(grp, []string{"GROUP", "MIN-INSYNC", "ACK", "IN-SYNC", "HIGH"},
			[][]string{{grp.Name, fmt.Sprint(grp.MinCopies()), ackWord(grp.AckQuorum), inSyncWord(grp), highWord(grp)}})
	})
	f := cmd.Flags()
	f.IntVar(&o.minInSync, "min-insync", 0, "copies of a HIGH message, the master's counted, below which HIGH is refused (0: the default)")
	f.StringVar(&o.ack, "ack", "all", "when a HIGH message is answered: all (every member of the sync set) or quorum:K")
	c := g.checker(f)
	c.intRange("min-insync", 0, fsm.MaxMinInSync)
	c.wrap("ack", ackWant, func(s string) error {
		_, err := parseAck(s)
		return err
	})
	return cmd
}

// inSyncWord lists a group's sync set, "-" when empty.
func inSyncWord(g routing.Group) string {
	if len(g.InSync) == 0 {
		return "-"
	}
	return strings.Join(g.InSync, ",")
}

// groupNamed returns the group called name as the leader has it.
func groupNamed(ctx context.Context, cl *client.Client, name string) (routing.Group, error) {
	return ops.GroupNamed(ctx, cl, name)
}

type removeSlaveOptions struct{ group string }

func newBrokerRemoveSlaveCommand(g *globalOptions) *cobra.Command {
	o := &removeSlaveOptions{}
	cmd := &cobra.Command{
		Use:     "remove-slave BROKER-ID --group GROUP",
		Aliases: []string{"remove"},
		Short:   "Take a stopped slave out of its broker group and its sync set",
		Long: `Take a slave out of its broker group and out of the group's sync set.

Stop the broker first: a slave heard within the session is refused
(GROUP_ACTIVE, exit 1), since its next heartbeat would join it again. So is
the group's master (stop it, and a failover promotes one of its slaves), and
a broker the group does not name (NOT_FOUND, listing the slaves). Removing a
member of the sync set may leave the group with fewer copies than its
min in-sync: HIGH sends are refused then (the HIGH column says so) until
another slave has caught up. Needs admin.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			if o.group == "" {
				return usageError{errors.New("remove-slave: --group is required: the group the slave belongs to")}
			}
			grp, err := cl.RemoveSlave(ctx, api.RemoveSlaveRequest{Group: o.group, Broker: args[0]})
			if err != nil {
				return err
			}
			slaves := make([]string, len(grp.Slaves))
			for i, b := range grp.Slaves {
				slaves[i] = b.ID
			}
			return g.printer().print(grp, []string{"GROUP", "MASTER", "SLAVES", "IN-SYNC", "HIGH"},
				[][]string{{grp.Name, orDash(grp.Master.ID), orDash(strings.Join(slaves, ",")), inSyncWord(grp), highWord(grp)}})
		}),
	}
	cmd.Flags().StringVar(&o.group, "group", "", "the broker group the slave belongs to")
	g.checker(cmd.Flags()).name("group", "a broker group name", checkBrokerGroup)
	return cmd
}
