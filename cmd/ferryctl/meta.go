package main

import (
	"context"
	"fmt"
	"strings"
	"time"

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
	var memberTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the Raft cluster: each member asked directly for its role, term, applied index and last contact with the leader",
		Long: `Show the Raft cluster. The configuration comes from any metaserver; then every member is asked
at its RPC address, all at once and each for at most --member-timeout, for its own view. A member that
does not answer is shown unreachable, with the error, never as a follower.

Columns: ROLE as the member reports it; LAST-CONTACT, how long ago it last heard from the leader (by its
raft stats; "-" on the leader); APPLIED, its applied index; BEHIND, how far its applied index is behind
the leader's; REACHABLE, yes, or no and why.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			st, err := cl.MetaStatus(ctx, memberTimeout)
			if err != nil {
				return err
			}
			if err := printMetaStatus(g, st); err != nil {
				return err
			}
			for _, m := range st.Members {
				if m.Reachable {
					return nil
				}
			}
			// A configuration came, but no member answered for itself.
			return fmt.Errorf("meta status: none of the %d members answered within --member-timeout %v", len(st.Members), memberTimeout)
		}),
	}
	cmd.Flags().DurationVar(&memberTimeout, "member-timeout", time.Second, "how long to wait for each member's answer")
	g.checker(cmd.Flags()).durationRange("member-timeout", minMemberTimeout, maxMemberTimeout)
	return cmd
}

// Bounds of meta status --member-timeout.
const (
	minMemberTimeout = 10 * time.Millisecond
	maxMemberTimeout = time.Minute
)

// printMetaStatus prints the members as each reported itself.
func printMetaStatus(g *globalOptions, st api.MetaStatus) error {
	if st.Members == nil {
		st.Members = []api.MemberStatus{}
	}
	var rows [][]string
	for _, m := range st.Members {
		role, contact, applied, behind, reachable := "-", "-", "-", "-", "yes"
		if !m.Reachable {
			reachable = "no: " + m.Error
		} else {
			role = strings.ToLower(m.State)
			applied = fmt.Sprint(m.AppliedIndex)
			switch {
			case m.State == "Leader":
			case m.LastContactMillis < 0:
				contact = "never"
			default:
				contact = age(m.LastContactMillis)
			}
			if m.AppliedBehind >= 0 {
				behind = fmt.Sprint(m.AppliedBehind)
			}
		}
		rows = append(rows, []string{m.ID, m.RaftAddr, orDash(m.RPCAddr), m.Suffrage, role, contact, applied, behind, reachable})
	}
	if !g.json {
		down := 0
		for _, m := range st.Members {
			if !m.Reachable {
				down++
			}
		}
		if st.LeaderID == "" {
			fmt.Fprintf(g.out, "no leader: no reachable member says it leads")
		} else {
			fmt.Fprintf(g.out, "leader %s (%s), term %d, last index %d, commit index %d, applied index %d",
				st.LeaderID, orDash(st.LeaderAddr), st.Term, st.LastIndex, st.CommitIndex, st.AppliedIndex)
		}
		fmt.Fprintf(g.out, "; %d of %d members reachable\n", len(st.Members)-down, len(st.Members))
	}
	return g.printer().print(st, []string{"ID", "RAFT-ADDR", "RPC-ADDR", "SUFFRAGE", "ROLE", "LAST-CONTACT", "APPLIED", "BEHIND", "REACHABLE"}, rows)
}

type voterOptions struct {
	raftAddr, rpcAddr string
	force             bool
}

// voterCheckTimeout bounds add-voter's question to the new node.
const voterCheckTimeout = 2 * time.Second

func newMetaAddVoterCommand(g *globalOptions) *cobra.Command {
	o := &voterOptions{}
	cmd := &cobra.Command{
		Use:   "add-voter ID",
		Short: "Add a metaserver node (started without bootstrapping) as a voter",
		Long: `Add a metaserver node, started without -peers, as a voter. The node is asked
first at --rpc-addr for its Raft status: it must answer, as the metaserver ID, or
nothing is changed (exit 1). A voter that is not running costs the cluster its
fault tolerance and fills the leader's log; --force adds it all the same.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			if !o.force {
				// The cluster first (unreachable: exit 3, as for any
				// command), then the node.
				if _, err := cl.RaftStatus(ctx); err != nil {
					return err
				}
				if err := checkNewVoter(ctx, cl, args[0], o.rpcAddr); err != nil {
					return err
				}
			}
			st, err := cl.AddVoter(ctx, api.VoterRequest{ID: args[0], RaftAddr: o.raftAddr, RPCAddr: o.rpcAddr})
			if err != nil {
				return err
			}
			return printRaft(g, st)
		}),
	}
	cmd.Flags().StringVar(&o.raftAddr, "raft-addr", "", "the node's raft address")
	cmd.Flags().StringVar(&o.rpcAddr, "rpc-addr", "", "the node's RPC address")
	cmd.Flags().BoolVar(&o.force, "force", false, "add the voter without asking the node first (it may not be running)")
	g.checker(cmd.Flags()).bool("force")
	_ = cmd.MarkFlagRequired("raft-addr")
	_ = cmd.MarkFlagRequired("rpc-addr")
	return cmd
}

// checkNewVoter asks the node at rpcAddr for its Raft status: it must
// answer, and be the metaserver id. Its error is the cluster's refusal
// (exit 1), whatever kept the node from answering.
func checkNewVoter(ctx context.Context, cl *client.Client, id, rpcAddr string) error {
	st, err := cl.NodeStatus(ctx, rpcAddr, voterCheckTimeout)
	if err != nil {
		return fmt.Errorf("meta add-voter %s: the node at --rpc-addr %s does not answer (%v): start it first (without -peers), or give --force",
			shown(id), rpcAddr, err)
	}
	if st.Node != id {
		return fmt.Errorf("meta add-voter %s: the node at --rpc-addr %s is the metaserver %s, not %s", shown(id), rpcAddr, shown(st.Node), shown(id))
	}
	return nil
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
