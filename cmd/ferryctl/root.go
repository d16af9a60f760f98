package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
)

// Exit codes.
const (
	exitOK          = 0
	exitError       = 1 // the cluster answered with an error
	exitUsage       = 2 // bad flags or arguments
	exitUnreachable = 3 // no metaserver (or broker) could be reached
)

// globalOptions are the flags every command takes.
type globalOptions struct {
	meta    string
	json    bool
	timeout time.Duration
	out     io.Writer
}

func (g *globalOptions) addrs() []string {
	var out []string
	for _, a := range strings.Split(g.meta, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// metaClient returns a metaserver client and a context bounded by --timeout.
func (g *globalOptions) metaClient(ctx context.Context) (*client.Client, context.Context, func(), error) {
	cl, err := client.New(client.Config{Addrs: g.addrs(), CallTimeout: g.timeout})
	if err != nil {
		return nil, nil, nil, usageError{err}
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	return cl, ctx, func() { cancel(); _ = cl.Close() }, nil
}

// metaRun makes a command's RunE that opens a metaserver client bounded by
// --timeout for run and closes it after.
func (g *globalOptions) metaRun(run func(ctx context.Context, cl *client.Client, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		cl, ctx, done, err := g.metaClient(cmd.Context())
		if err != nil {
			return err
		}
		defer done()
		return run(ctx, cl, args)
	}
}

func (g *globalOptions) printer() printer {
	if g.json {
		return jsonPrinter{g.out}
	}
	return tablePrinter{g.out}
}

type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// usageArgs marks a wrong argument count as a usage error.
func usageArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return usageError{err}
		}
		return nil
	}
}

// newRootCommand builds ferryctl's command tree.
func newRootCommand(out io.Writer) *cobra.Command {
	g := &globalOptions{out: out}
	root := &cobra.Command{
		Use:           "ferryctl",
		Short:         "Inspect and drive a ferrymq cluster",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.PersistentFlags().StringVar(&g.meta, "meta", "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103", "metaserver RPC addresses, comma-separated")
	root.PersistentFlags().BoolVar(&g.json, "json", false, "print JSON instead of tables")
	root.PersistentFlags().DurationVar(&g.timeout, "timeout", 5*time.Second, "how long to wait for the cluster")
	root.AddCommand(
		newRoutesCommand(g),
		newTopicsCommand(g),
		newTopicCommand(g),
		newBrokersCommand(g),
		newBrokerCommand(g),
		newMetaCommand(g),
		newSendCommand(g),
		newReadCommand(g),
		newTruncatedCommand(g),
		newBenchCommand(g),
		newGroupsCommand(g),
		newGroupCommand(g),
		newConsumeCommand(g),
	)
	return root
}

// run executes ferryctl and returns its exit code.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRootCommand(stdout)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	code := exitCode(err)
	if code == exitUnreachable {
		fmt.Fprintf(stderr, "ferryctl: cannot reach the cluster: %v\n", err)
	} else {
		fmt.Fprintf(stderr, "ferryctl: %v\n", err)
	}
	return code
}

func exitCode(err error) int {
	var ue usageError
	switch {
	case errors.As(err, &ue),
		// cobra reports these two as plain errors, with no hook to type them.
		strings.Contains(err.Error(), "unknown command"), strings.Contains(err.Error(), "required flag"):
		return exitUsage
	case errors.Is(err, client.ErrNoNode), errors.Is(err, transport.ErrConnLost), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, protocol.ErrTimeout):
		return exitUnreachable
	default:
		return exitError
	}
}
