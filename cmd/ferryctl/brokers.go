package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
)

func newBrokersCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "brokers",
		Short: "List the broker groups: members, state and reasons, heartbeats, lag, idempotent producers and duplicates absorbed",
		Args:  usageArgs(cobra.NoArgs),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			groups, err := cl.Groups(ctx)
			if err != nil {
				return err
			}
			var rows [][]string
			for _, gi := range groups {
				reason := gi.Reason
				if reason == "" {
					reason = "-"
				}
				rows = append(rows, []string{gi.Name, gi.State, reason, orDash(gi.Master.Addr), orDash(gi.Slave.Addr),
					age(gi.MasterHeartbeatAgeMillis), age(gi.SlaveHeartbeatAgeMillis), fmt.Sprint(gi.Last.LagBytes),
					(time.Duration(gi.Last.LagMillis) * time.Millisecond).String(), fmt.Sprint(gi.Holders),
					fmt.Sprint(gi.Last.Producers), fmt.Sprint(gi.Last.Duplicates)})
			}
			if groups == nil {
				groups = []api.GroupInfo{}
			}
			return g.printer().print(groups, []string{"GROUP", "STATE", "REASONS", "MASTER", "SLAVE", "MASTER-HB", "SLAVE-HB", "LAG-BYTES", "LAG-TIME", "QUEUES", "PRODUCERS", "DUPLICATES"}, rows)
		}),
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func age(ms int64) string {
	if ms < 0 {
		return "never"
	}
	return (time.Duration(ms) * time.Millisecond).Round(time.Millisecond).String() + " ago"
}

func newBrokerCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{Use: "broker", Short: "Change a broker group's state"}
	for _, mode := range []struct {
		use      string
		readOnly bool
		short    string
	}{
		{"readonly", true, "Mark a group read-only (stays so until 'broker writable')"},
		{"writable", false, "Clear an admin's read-only mark"},
	} {
		cmd.AddCommand(&cobra.Command{
			Use:   mode.use + " GROUP",
			Short: mode.short,
			Args:  usageArgs(cobra.ExactArgs(1)),
			RunE: func(cmd *cobra.Command, args []string) error {
				cl, ctx, done, err := g.metaClient(cmd.Context())
				if err != nil {
					return err
				}
				defer done()
				grp, err := cl.SetGroupReadOnly(ctx, args[0], mode.readOnly)
				if err != nil {
					return err
				}
				reason := grp.Reasons.String()
				if reason == "" {
					reason = "-"
				}
				return g.printer().print(grp, []string{"GROUP", "STATE", "REASONS"}, [][]string{{grp.Name, grp.Reasons.State(), reason}})
			},
		})
	}
	return cmd
}
