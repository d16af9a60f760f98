package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
)

// ferryctl broker add-group and retire-group: which broker groups may hold
// queues, and moving a dead group's queues (metaserver/fsm/groups.go).

func newBrokerAddGroupCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "add-group GROUP",
		Short: "Admit a broker group that registered while the metaservers admit groups by hand (-admit-groups=manual), or a retired one: it takes queues from now on",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			grp, err := cl.AdmitGroup(ctx, args[0])
			if err != nil {
				return err
			}
			return g.printer().print(grp, []string{"GROUP", "ADMISSION", "STATE", "MASTER", "SLAVE"},
				[][]string{{grp.Name, admissionWord(grp.Admission), grp.Reasons.State(), member(grp.Master.ID, grp.Master.Addr), member(grp.Slave.ID, grp.Slave.Addr)}})
		}),
	}
}

type retireGroupOptions struct {
	force, dryRun bool
}

func newBrokerRetireGroupCommand(g *globalOptions) *cobra.Command {
	o := &retireGroupOptions{}
	cmd := &cobra.Command{
		Use:   "retire-group GROUP",
		Short: "Move a dead broker group's queues to the other admitted, writable groups and retire it",
		Long: `Move every queue of a dead broker group to the other admitted, writable
groups, and retire the group. A queue keeps its number; its new group takes
it up at an offset past every offset the registry knows of it (the ends its
master reported in its heartbeats, the consumer groups' committed offsets),
so offsets only grow; messages the dead group stored after its last report
stay on its disk. Consumer groups keep their committed offsets. The group's
brokers are refused from then on, until 'ferryctl broker add-group GROUP'.

It is refused while a broker of the group has heartbeated within the
session, or the metaserver leader has led for less than a session. --force
retires a live group: its master takes writes until its lease ends (at most
a session), and those messages are lost to the queues' new groups.
--dry-run prints the plan and changes nothing.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			r, err := cl.RetireGroup(ctx, api.RetireGroupRequest{Group: args[0], Force: o.force, DryRun: o.dryRun})
			if err != nil {
				return err
			}
			var rows [][]string
			for _, m := range r.Moved {
				committed := "-"
				if m.Committed >= 0 {
					committed = fmt.Sprint(m.Committed)
				}
				rows = append(rows, []string{m.Topic, fmt.Sprint(m.Queue), m.To, fmt.Sprint(m.Base), fmt.Sprint(m.KnownEnd), committed})
			}
			queues := fmt.Sprintf("%d queues", len(r.Moved))
			if len(r.Moved) == 1 {
				queues = "1 queue"
			}
			what := fmt.Sprintf("retired %s: %s moved", r.Group.Name, queues)
			if r.DryRun {
				what = fmt.Sprintf("dry run: retiring %s would move %s", r.Group.Name, queues)
			}
			if len(rows) > 0 {
				rows = append(rows, []string{""})
			}
			rows = append(rows, []string{what})
			return g.printer().print(r, []string{"TOPIC", "QUEUE", "TO", "BASE", "KNOWN-END", "COMMITTED"}, rows)
		}),
	}
	f := cmd.Flags()
	f.BoolVar(&o.force, "force", false, "retire the group even if a broker of it may be alive")
	f.BoolVar(&o.dryRun, "dry-run", false, "print where each queue would go and from which offset, and change nothing")
	c := g.checker(f)
	c.bool("force")
	c.bool("dry-run")
	return cmd
}
