package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/routing"
)

func newTopicsCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "topics",
		Short: "List the topics",
		Args:  usageArgs(cobra.NoArgs),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			topics, err := cl.Topics(ctx)
			if err != nil {
				return err
			}
			var rows [][]string
			for _, t := range topics {
				r := routing.Route{Queues: make([]routing.QueueRoute, len(t.Queues))}
				for i, grp := range t.Queues {
					r.Queues[i].Group = grp
				}
				rows = append(rows, []string{t.Name, fmt.Sprint(len(t.Queues)), strings.Join(r.Groups(), ","), fmt.Sprint(t.Version)})
			}
			if topics == nil {
				topics = []routing.Topic{}
			}
			return g.printer().print(topics, []string{"TOPIC", "QUEUES", "GROUPS", "VERSION"}, rows)
		}),
	}
}

type topicCreateOptions struct {
	queues int
	groups []string
}

func newTopicCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{Use: "topic", Short: "Manage topics"}
	cmd.AddCommand(newTopicCreateCommand(g), newTopicAddQueuesCommand(g))
	return cmd
}

func newTopicCreateCommand(g *globalOptions) *cobra.Command {
	o := &topicCreateOptions{}
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a topic with queues spread over the admitted, writable broker groups",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			r, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: args[0], Queues: o.queues, Groups: o.groups})
			if err != nil {
				return err
			}
			return printRoute(g, r)
		}),
	}
	cmd.Flags().IntVar(&o.queues, "queues", 8, "number of queues")
	cmd.Flags().StringSliceVar(&o.groups, "groups", nil, "place the queues on these groups, comma-separated (default: every writable group)")
	c := g.checker(cmd.Flags())
	c.intRange("queues", 1, maxQueues)
	c.name("groups", "broker group names, comma-separated", func(s string) error {
		for _, grp := range strings.Split(s, ",") {
			if err := checkBrokerGroup(strings.TrimSpace(grp)); err != nil {
				return err
			}
		}
		return nil
	})
	return cmd
}

func newTopicAddQueuesCommand(g *globalOptions) *cobra.Command {
	var count int
	cmd := &cobra.Command{
		Use:   "add-queues NAME",
		Short: "Add queues to a topic",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			r, err := cl.AddQueues(ctx, args[0], count)
			if err != nil {
				return err
			}
			return printRoute(g, r)
		}),
	}
	cmd.Flags().IntVar(&count, "count", 1, "queues to add")
	g.checker(cmd.Flags()).intRange("count", 1, maxQueues)
	return cmd
}

func printRoute(g *globalOptions, r routing.Route) error {
	var rows [][]string
	for _, q := range r.Queues {
		state := "RW"
		if !q.Writable {
			state = "RO"
		}
		rows = append(rows, []string{r.Topic, fmt.Sprint(q.Queue), q.Group, q.Master, state})
	}
	return g.printer().print(r, []string{"TOPIC", "QUEUE", "GROUP", "MASTER", "STATE"}, rows)
}
