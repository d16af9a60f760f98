package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
)

func newMetaCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{Use: "meta", Short: "Inspect and change the metaserver Raft cluster"}
	cmd.AddCommand(newMetaStatusCommand(g), newMetaAddVoterCommand(g), newMetaRemoveVoterCommand(g))
	return cmd
}

func printRaft(g *globalOptions, st api.RaftStatus) error {
	var rows [][]string
	for _, m := range st.Members {
		role := "follower"
		if m.Leader {
			role = "leader"
		}
		rows = append(rows, []string{m.ID, m.RaftAddr, orDash(m.RPCAddr), m.Suffrage, role})
	}
	if !g.json {
		fmt.Fprintf(g.out, "leader %s (%s), term %d, last index %d, commit index %d (as seen by %s)\n",
			orDash(st.LeaderID), orDash(st.LeaderAddr), st.Term, st.LastIndex, st.CommitIndex, st.Node)
	}
	return g.printer().print(st, []string{"ID", "RAFT-ADDR", "RPC-ADDR", "SUFFRAGE", "ROLE"}, rows)
}

func newMetaStatusCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the Raft cluster: members, leader, term, last index",
		Args:  usageArgs(cobra.NoArgs),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			st, err := cl.RaftStatus(ctx)
			if err != nil {
				return err
			}
			return printRaft(g, st)
		}),
	}
}

type voterOptions struct{ raftAddr, rpcAddr string }

func newMetaAddVoterCommand(g *globalOptions) *cobra.Command {
	o := &voterOptions{}
	cmd := &cobra.Command{
		Use:   "add-voter ID",
		Short: "Add a metaserver node (started without bootstrapping) as a voter",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			st, err := cl.AddVoter(ctx, api.VoterRequest{ID: args[0], RaftAddr: o.raftAddr, RPCAddr: o.rpcAddr})
			if err != nil {
				return err
			}
			return printRaft(g, st)
		}),
	}
	cmd.Flags().StringVar(&o.raftAddr, "raft-addr", "", "the node's raft address")
	cmd.Flags().StringVar(&o.rpcAddr, "rpc-addr", "", "the node's RPC address")
	_ = cmd.MarkFlagRequired("raft-addr")
	_ = cmd.MarkFlagRequired("rpc-addr")
	return cmd
}

func newMetaRemoveVoterCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "remove-voter ID",
		Short: "Remove a metaserver node from the cluster",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			st, err := cl.RemoveVoter(ctx, args[0])
			if err != nil {
				return err
			}
			return printRaft(g, st)
		}),
	}
}
