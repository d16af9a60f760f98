package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/routing"
)

func newRoutesCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "routes [TOPIC]",
		Short: "Show where a topic's queues live (every topic's without TOPIC)",
		Args:  usageArgs(cobra.MaximumNArgs(1)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			var topics []string
			if len(args) == 1 {
				topics = args
			} else {
				all, err := cl.Topics(ctx)
				if err != nil {
					return err
				}
				for _, t := range all {
					topics = append(topics, t.Name)
				}
			}
			var routes []routing.Route
			var rows [][]string
			for _, t := range topics {
				r, err := cl.RouteExisting(ctx, t)
				if err != nil {
					return err
				}
				routes = append(routes, r)
				for _, q := range r.Queues {
					state := "RW"
					if !q.Writable {
						state = "RO"
					}
					rows = append(rows, []string{r.Topic, fmt.Sprint(q.Queue), q.Group, q.Master, state})
				}
			}
			return g.printer().print(routes, []string{"TOPIC", "QUEUE", "GROUP", "MASTER", "STATE"}, rows)
		}),
	}
}
