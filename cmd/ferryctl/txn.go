package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
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
	req, _ := json.Marshal(protocol.TxnListRequest{Producer: o.producer})
	lists := []protocol.TxnList{}
	unasked, err := eachGroupMaster(ctx, cl, o.group, func(ctx context.Context, gi api.GroupInfo, tc *transport.Client) error {
		var l protocol.TxnList
		if err := callJSON(ctx, tc, protocol.CodeTxnList, req, &l); err != nil {
			return err
		}
		lists = append(lists, l)
		return nil
	})
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
	gr, err := groupNamed(ctx, cl, o.group)
	if err != nil {
		return err
	}
	if gr.Master.Addr == "" {
		return &protocol.Error{Status: protocol.StatusReadOnly, Message: fmt.Sprintf("group %s has no master", o.group)}
	}
	// The registry decides first (the transaction may be on other groups:
	// the first decision there is every group's), then the group applies.
	d, err := cl.DecideTxn(ctx, api.TxnDecideRequest{Producer: id.Producer, Epoch: id.Epoch, Number: id.Number, By: protocol.TxnByAdmin,
		Groups: []string{o.group}})
	if err != nil {
		return err
	}
	req, _ := json.Marshal(protocol.TxnEndRequest{Producer: id.Producer, Epoch: id.Epoch, Number: id.Number, Commit: d.Committed, By: protocol.TxnByAdmin})
	var rep protocol.TxnEndReply
	if err := callBrokerJSON(ctx, gr.Master.Addr, protocol.CodeTxnEnd, req, &rep); err != nil {
		return err
	}
	_ = cl.TxnDone(ctx, api.TxnDoneRequest{Producer: id.Producer, Epoch: id.Epoch, Number: id.Number, Groups: []string{o.group}})
	outcome := "aborted"
	switch {
	case rep.Committed:
		outcome = "committed-before"
	case rep.Queues == 0:
		outcome = "not-here"
	case rep.Queues < 0:
		outcome = "aborted-before"
	}
	if g.json {
		err = g.printer().print(map[string]any{"txn": id.String(), "group": o.group, "outcome": outcome}, nil, nil)
	} else {
		err = tablePrinter{g.out}.print(nil, []string{"TXN", "GROUP", "OUTCOME"}, [][]string{{id.String(), o.group, outcome}})
	}
	switch {
	case err != nil:
		return err
	case rep.Committed:
		return fmt.Errorf("%w: %s was committed before", errNotAborted, id)
	case rep.Queues == 0:
		return &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("transaction %s wrote nothing in group %s", id, o.group)}
	}
	return nil
}

// callBrokerJSON calls a broker with a JSON request and decodes its JSON
// answer into out.
func callBrokerJSON(ctx context.Context, addr string, code protocol.Code, req []byte, out any) error {
	return callBroker(ctx, addr, func(ctx context.Context, tc *transport.Client) error { return callJSON(ctx, tc, code, req, out) })
}

// callJSON makes a call with a JSON request and decodes its JSON answer
// into out.
func callJSON(ctx context.Context, tc *transport.Client, code protocol.Code, req []byte, out any) error {
	resp, err := tc.Call(ctx, code, req)
	if err != nil {
		return err
	}
	return json.Unmarshal(resp.Body, out)
}

// eachGroupMaster calls fn with the master of every broker group that is
// not retired (or of the group named only), one after another. A group
// that has no master or whose call fails is reported in unasked (after the
// others were asked); err is a failure to list the groups, or NOT_FOUND
// for a named group that does not exist.
func eachGroupMaster(ctx context.Context, cl *client.Client, only string,
	fn func(ctx context.Context, gi api.GroupInfo, tc *transport.Client) error) (unasked, err error) {
	groups, err := cl.Groups(ctx)
	if err != nil {
		return nil, err
	}
	var errs []error
	found := false
	for _, gi := range groups {
		if only != "" && gi.Name != only || only == "" && gi.Admission == routing.Retired {
			continue
		}
		found = true
		if gi.Master.Addr == "" {
			errs = append(errs, fmt.Errorf("group %s has no master", gi.Name))
			continue
		}
		if err := callBroker(ctx, gi.Master.Addr, func(ctx context.Context, tc *transport.Client) error { return fn(ctx, gi, tc) }); err != nil {
			errs = append(errs, fmt.Errorf("group %s at %s: %w", gi.Name, gi.Master.Addr, err))
		}
	}
	if only != "" && !found {
		return nil, &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("no broker group %s", shown(only))}
	}
	return errors.Join(errs...), nil
}
