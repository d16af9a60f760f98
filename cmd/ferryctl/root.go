package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ferrymq/ferrymq/cmd/internal/cli"
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

// globalOptions are the flags every command takes, and what the commands
// read and write.
type globalOptions struct {
	meta    string
	json    bool
	timeout time.Duration
	tls     tlsOptions
	// tokenFile is --token-file; token the token presented (token.go).
	tokenFile, token string
	in               io.Reader
	out              io.Writer

	flagErrs flagErrors
	// preFailed is set when ferryctl's own pre-run failed, ran when a
	// command's RunE started. An error Execute returns with neither set
	// came from cobra's own checks (an unknown command, an argument it
	// refused, a required flag missing): a usage error (cobraError).
	preFailed, ran bool
}

// cobraError reports whether err, the error Execute returned, came from
// cobra's own checks rather than from ferryctl's pre-run or a command.
func (g *globalOptions) cobraError() bool { return !g.ran && !g.preFailed }

// markRuns wraps every command's RunE so that g knows a command ran.
func (g *globalOptions) markRuns(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		g.markRuns(c)
	}
	if run := cmd.RunE; run != nil {
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			g.ran = true
			return run(cmd, args)
		}
	}
}

// addrs is --meta as a list (checked when the flag was parsed).
func (g *globalOptions) addrs() []string {
	addrs, _ := parseMetaAddrs(g.meta)
	return addrs
}

// metaClient returns a metaserver client and a context bounded by --timeout.
func (g *globalOptions) metaClient(ctx context.Context) (*client.Client, context.Context, func(), error) {
	cl, err := client.New(client.Config{Addrs: g.addrs(), CallTimeout: g.timeout, Token: g.token, Transport: transport.ClientConfig{TLS: g.tls.config}})
	if err != nil {
		return nil, nil, nil, usageError{err}
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	return cl, ctx, func() { cancel(); _ = cl.Close() }, nil
}

// metaRun makes a command's RunE that opens a metaserver client bounded by
// --timeout for run and closes it after.
func (g *globalOptions) metaRun(run func(ctx context.Context, cl *client.Client, args []string) error) func(*cobra.Command, []string) error {
	return g.metaRunCmd(func(ctx context.Context, _ *cobra.Command, cl *client.Client, args []string) error {
		return run(ctx, cl, args)
	})
}

// metaRunCmd is metaRun for a run that needs its command (its stderr).
func (g *globalOptions) metaRunCmd(run func(ctx context.Context, cmd *cobra.Command, cl *client.Client, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		cl, ctx, done, err := g.metaClient(cmd.Context())
		if err != nil {
			return err
		}
		defer done()
		return run(ctx, cmd, cl, args)
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
			return usageError{fmt.Errorf("%s: %w", strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" "), err)}
		}
		return nil
	}
}

// defaultMeta is --meta when neither the flag nor FERRY_META gives it: the
// local cluster's metaservers (scripts/cluster.sh).
const defaultMeta = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"

// newRootCommand builds ferryctl's command tree; commands read stdin (send
// --body -) from in and print to out.
func newRootCommand(in io.Reader, out io.Writer) *cobra.Command {
	root, _ := newRoot(in, out)
	return root
}

// newRoot is newRootCommand, with the global options its commands share.
func newRoot(in io.Reader, out io.Writer) (*cobra.Command, *globalOptions) {
	g := &globalOptions{in: in, out: out}
	root := &cobra.Command{
		Use:     "ferryctl",
		Short:   "Inspect and drive a ferrymq cluster",
		Version: cli.Version,
		Long: `Inspect and drive a ferrymq cluster.

The global flags can also come from the environment: FERRY_META, FERRY_JSON,
FERRY_TIMEOUT, FERRY_TLS_CA, FERRY_TLS_CERT and FERRY_TLS_KEY (a flag on the
command line wins). The token presented to the servers is --token-file's, or
else FERRY_TOKEN's (the token itself).
Exit codes: 0 ok, 1 the cluster said no, 2 bad usage, 3 the cluster cannot be
reached.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// Before any command runs: the environment's global flags, then
		// the positional arguments (flags were checked as they were parsed).
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			err := g.preRun(cmd, args)
			g.preFailed = err != nil
			return err
		},
	}
	root.SetVersionTemplate(cli.VersionLine("ferryctl") + "\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		if first := g.flagErrs.first; first != nil && strings.Contains(err.Error(), first.Error()) {
			return usageError{first}
		}
		return usageError{err}
	})
	pf := root.PersistentFlags()
	pf.StringVar(&g.meta, "meta", defaultMeta, "metaserver RPC addresses, comma-separated (env FERRY_META)")
	pf.BoolVar(&g.json, "json", false, "print JSON instead of tables (env FERRY_JSON)")
	pf.DurationVar(&g.timeout, "timeout", 5*time.Second, "how long to wait for the cluster (env FERRY_TIMEOUT)")
	c := g.checker(pf)
	c.wrap("meta", metaWant, func(s string) error {
		if _, err := parseMetaAddrs(s); err != nil {
			if !strings.Contains(s, ",") {
				return errWant // one address: the message shows it
			}
			return checkErr{err}
		}
		return nil
	})
	c.bool("json")
	c.durationRange("timeout", time.Millisecond, maxTimeout)
	g.addTLSFlags(pf)
	g.addTokenFlags(pf)
	root.AddCommand(
		newRoutesCommand(g),
		newTopicsCommand(g),
		newTopicCommand(g),
		newBrokersCommand(g),
		newBrokerCommand(g),
		newMetaCommand(g),
		newSendCommand(g),
		newDelayedCommand(g),
		newTxnCommand(g),
		newMessageCommand(g),
		newReadCommand(g),
		newTruncatedCommand(g),
		newBenchCommand(g),
		newGroupsCommand(g),
		newGroupCommand(g),
		newConsumeCommand(g),
		newCertsCommand(g),
		newACLCommand(g),
	)
	refuseUnknownSubcommands(root)
	checkMetaVoterFlags(root, g)
	g.markRuns(root)
	return root, g
}

// preRun is what runs before any command: the environment's global flags,
// then the positional arguments (flags were checked as they were parsed).
func (g *globalOptions) preRun(cmd *cobra.Command, args []string) error {
	if err := applyEnv(cmd, g); err != nil {
		return err
	}
	if err := g.loadTLS(cmd); err != nil {
		return err
	}
	if err := g.loadToken(cmd); err != nil {
		return err
	}
	return checkArgs(cmd, args)
}

// checkMetaVoterFlags checks the addresses of meta add-voter (defined in
// meta.go) as --meta is checked: host:port.
func checkMetaVoterFlags(root *cobra.Command, g *globalOptions) {
	cmd, _, err := root.Find([]string{"meta", "add-voter"})
	if err != nil || cmd.Name() != "add-voter" {
		return
	}
	c := g.checker(cmd.Flags())
	for _, name := range []string{"raft-addr", "rpc-addr"} {
		if f := cmd.Flags().Lookup(name); f != nil {
			if _, ok := f.Value.(*checkedValue); !ok {
				c.wrap(name, "host:port (port 1 to 65535)", func(s string) error {
					if _, err := parseMetaAddrs(s); err != nil || strings.Contains(s, ",") {
						return errWant
					}
					return nil
				})
			}
		}
	}
}

// refuseUnknownSubcommands makes "ferryctl topic frobnicate" a usage error
// (cobra would print the help of "topic" and exit 0); "ferryctl topic"
// alone still prints the help.
func refuseUnknownSubcommands(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		refuseUnknownSubcommands(c)
	}
	if !cmd.HasSubCommands() || cmd.Runnable() || !cmd.HasParent() {
		return
	}
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		var names []string
		for _, c := range cmd.Commands() {
			if c.IsAvailableCommand() {
				names = append(names, c.Name())
			}
		}
		return usageError{fmt.Errorf("unknown command %s for %s: want %s", shown(args[0]), cmd.CommandPath(), strings.Join(names, ", "))}
	}
}

// run executes ferryctl and returns its exit code. It prints an error as
// one line "ferryctl: ..." on stderr; an error of several lines (several
// queues, or a bench's causes) continues on indented lines.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root, g := newRoot(stdin, stdout)
	root.SetArgs(singleDashVersion(root, args))
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	var ue usageError
	if !errors.As(err, &ue) && g.cobraError() {
		// cobra refused the command line (an unknown command, a required
		// flag missing): it has no typed errors for these.
		err = usageError{err}
	}
	err = explainTLSRefusal(err)
	code := exitCode(err)
	msg := err.Error()
	if code == exitUnreachable {
		msg = "cannot reach the cluster: " + msg
	}
	msg = strings.ReplaceAll(strings.TrimRight(msg, "\n"), "\n", "\n  ")
	fmt.Fprintf(stderr, "ferryctl: %s\n", msg)
	return code
}

// singleDashVersion returns args with -version, as the servers take it,
// made --version (pflag reads -version as the shorthands v, e, r...). A
// -version that is the value of the flag before it (send --body -version)
// stays as it is; so does everything after "--".
func singleDashVersion(root *cobra.Command, args []string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		if a == "--" {
			break
		}
		if a == "-version" && (i == 0 || !takesValue(root, out[i-1])) {
			out[i] = "--version"
		}
	}
	return out
}

// takesValue reports whether arg is a flag, of any of ferryctl's commands,
// that takes the next argument as its value.
func takesValue(root *cobra.Command, arg string) bool {
	if !strings.HasPrefix(arg, "-") || strings.Contains(arg, "=") || arg == "-" || arg == "--" {
		return false
	}
	long := strings.HasPrefix(arg, "--")
	name := strings.TrimLeft(arg, "-")
	found := false
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.Flags(), c.PersistentFlags()} {
			var f *pflag.Flag
			if long {
				f = fs.Lookup(name)
			} else if len(name) == 1 {
				f = fs.ShorthandLookup(name)
			}
			if f != nil && f.NoOptDefVal == "" {
				found = true
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return found
}

func exitCode(err error) int {
	var ue usageError
	switch {
	case errors.As(err, &ue): // cobra's own refusals are made usageErrors by run
		return exitUsage
	case errors.Is(err, client.ErrNotMetaserver):
		// --meta names a broker or something that is not ferrymq: the
		// address is wrong, and saying so is the whole error.
		return exitUsage
	case errors.Is(err, client.ErrNoNode), errors.Is(err, transport.ErrConnLost), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, protocol.ErrTimeout):
		return exitUnreachable
	default:
		return exitError
	}
}
