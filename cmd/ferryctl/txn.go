package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/internal/ops"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
)

func newTxnCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "txn",
		Short: "List and abort transactions",
		Long: `List the open transactions of the broker groups and abort one. A transaction is
named PRODUCER.EPOCH.NUMBER: its producer's id and epoch and its number. While
it is open, readers of committed messages read each queue it wrote only up to
its first message there; its broker aborts it at the broker's -txn-timeout.`,
	}
	cmd.AddCommand(newTxnLsCommand(g), newTxnAbortCommand(g))
	return cmd
}

type txnLsOptions struct {
	group    string
	producer uint64
}

func newTxnLsCommand(g *globalOptions) *cobra.Command {
	o := &txnLsOptions{}
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "Print the open transactions of every broker group, or one",
		Long: `Print the open transactions of every broker group (or --group's), oldest first,
as each group's master knows them: when each began, its age, the messages it
wrote there and, per queue, the first offset it holds back from readers of
committed messages. Then the recent transactions decided by someone other
than their producer (its checker, the timeout, exhausted checks, an operator).
A principal without describe sees only the transactions that wrote topics it
may send to, and no decisions. A group that cannot be asked is reported after
the others (exit 1, or 3 when it cannot be reached).`,
		Args: usageArgs(cobra.NoArgs),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, _ []string) error {
			return o.run(ctx, g, cl)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&o.group, "group", "", "only this broker group")
	f.Uint64Var(&o.producer, "producer", 0, "only this producer id's transactions")
	c := g.checker(f)
	c.name("group", "a broker group name", checkBrokerGroup)
	return cmd
}

func (o *txnLsOptions) run(ctx context.Context, g *globalOptions, cl *client.Client) error {
	lists, unasked, err := ops.TxnLists(ctx, cl, dialer(ctx), o.group, protocol.TxnListRequest{Producer: o.producer})
	if err != nil {
		return err
	}
	if err := printTxnLists(g, lists, time.Now()); err != nil {
		return err
	}
	return unasked
}

// printTxnLists writes the lists: JSON, or two tables (the open
// transactions, the decisions).
func printTxnLists(g *globalOptions, lists []protocol.TxnList, now time.Time) error {
	if g.json {
		return g.printer().print(lists, nil, nil)
	}
	var open, decided [][]string
	for _, l := range lists {
		for _, t := range l.Open {
			var qs []string
			for _, q := range t.Queues {
				qs = append(qs, fmt.Sprintf("%s/%d@%d", q.Topic, q.Queue, q.First))
			}
			open = append(open, []string{l.Group, t.ID, formatMillis(t.Began), age(now.UnixMilli() - t.Began), fmt.Sprint(t.Messages), strings.Join(qs, " ")})
		}
		for _, d := range l.Decided {
			outcome := "aborted"
			if d.Committed {
				outcome = "committed"
			}
			decided = append(decided, []string{l.Group, d.ID, outcome, d.By, formatMillis(d.At)})
		}
	}
	p := tablePrinter{g.out}
	if err := p.print(nil, []string{"GROUP", "TXN", "BEGAN", "AGE", "MESSAGES", "HOLDS-BACK (TOPIC/QUEUE@OFFSET)"}, open); err != nil {
		return err
	}
	if len(decided) > 0 {
		fmt.Fprintln(g.out)
		return p.print(nil, []string{"GROUP", "TXN", "DECISION", "BY", "AT"}, decided)
	}
	return nil
}

type txnAbortOptions struct{ group string }

// errNotAborted is txn abort's error for a transaction committed before.
var errNotAborted = errors.New("not aborted")

func newTxnAbortCommand(g *globalOptions) *cobra.Command {
	o := &txnAbortOptions{}
	cmd := &cobra.Command{
		Use:   "abort TXN --group GROUP",
		Short: "Abort an open transaction (admin)",
		Long: `Abort the open transaction TXN (PRODUCER.EPOCH.NUMBER, as txn ls prints it) at
its broker group's master: none of its messages is delivered, and readers of
committed messages go on past them. It prints the decision in force: aborted
(by this call or before), or committed before (exit 1). Needs admin.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			return o.run(ctx, g, cl, args[0])
		}),
	}
	f := cmd.Flags()
	f.StringVar(&o.group, "group", "", "the broker group holding the transaction (required)")
	c := g.checker(f)
	c.name("group", "a broker group name", checkBrokerGroup)
	_ = cmd.MarkFlagRequired("group")
	return cmd
}

func (o *txnAbortOptions) run(ctx context.Context, g *globalOptions, cl *client.Client, arg string) error {
	id, err := protocol.ParseTxnID(arg)
	if err != nil {
		return usageError{err}
	}
	outcome, err := ops.AbortTxn(ctx, cl, dialer(ctx), id, o.group)
	if err != nil {
		return err
	}
	if g.json {
		err = g.printer().print(map[string]any{"txn": id.String(), "group": o.group, "outcome": outcome}, nil, nil)
	} else {
		err = tablePrinter{g.out}.print(nil, []string{"TXN", "GROUP", "OUTCOME"}, [][]string{{id.String(), o.group, outcome}})
	}
	switch {
	case err != nil:
		return err
	case outcome == ops.CommittedBefore:
		return fmt.Errorf("%w: %s was committed before", errNotAborted, id)
	case outcome == ops.NotHere:
		return &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("transaction %s wrote nothing in group %s", id, o.group)}
	}
	return nil
}
