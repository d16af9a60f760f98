package main

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ferrymq/ferrymq/internal/loadgen"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/protocol"
)

// Every flag ferryctl takes is checked when it is parsed, before any
// network call: a checkedValue wraps the flag's pflag.Value and refuses a
// value that does not parse or is out of range with "--NAME VALUE: want
// WHAT" (a usage error, exit 2).

// Limits of the flags; the README's tables give the same ones.
const (
	maxTimeout    = 24 * time.Hour
	maxQueues     = 4096 // a topic creation or add-queues asks for at most this many (the metaserver's limit)
	maxReadLimit  = 100000
	maxCount      = 1_000_000_000_000 // bench --count and consume --count
	maxProducers  = 1024
	maxConsumers  = 1024
	maxWindow     = 1_000_000
	maxRate       = 1e9
	maxBenchTime  = loadgen.MaxDuration // bench --duration
	maxLinger     = time.Second
	maxConsumeIdl = time.Hour // bench --consume-wait
	maxInflight   = 1024
)

// checkedValue is a flag value that checks what it is set to.
type checkedValue struct {
	pflag.Value
	name  string
	want  string             // the allowed values, for the message
	check func(string) error // nil (ok), errWant, or a checkErr that says more; may be nil
	errs  *flagErrors
}

// errWant makes a check's error "--NAME VALUE: want WHAT".
var errWant = errors.New("want")

// flagErrors keeps the first refused flag value of a command line, so that
// the usage error names it as ferryctl does rather than as pflag wraps it.
type flagErrors struct{ first error }

func (v *checkedValue) Set(s string) error {
	err := v.Value.Set(s)
	if err == nil && v.check != nil {
		err = v.check(s)
	}
	if err == nil {
		return nil
	}
	if isCheckErr(err) {
		err = fmt.Errorf("--%s %s: %w", v.name, shown(s), err)
	} else { // a parse error, or errWant
		err = fmt.Errorf("--%s %s: want %s", v.name, shown(s), v.want)
	}
	if v.errs != nil && v.errs.first == nil {
		v.errs.first = err
	}
	return err
}

// checkErr marks an error of a check that explains itself (a name that is
// not allowed), as opposed to one of the Value's own parse errors.
type checkErr struct{ error }

func (e checkErr) Unwrap() error { return e.error }

func isCheckErr(err error) bool {
	var ce checkErr
	return errors.As(err, &ce)
}

// shown prints a flag value in a message: as it is, or quoted when it is
// empty or has spaces or unprintable characters; a long one is cut to its
// first protocol.ClipLen bytes and its length ("xxx...(5000 bytes)").
func shown(s string) string {
	if len(s) > protocol.ClipLen {
		clipped := protocol.Clip(s)
		head := clipped[:strings.LastIndex(clipped, "...(")]
		return shown(head) + clipped[len(head):]
	}
	if s == "" || strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

// checker wraps the flags of one flag set.
type checker struct {
	fs   *pflag.FlagSet
	errs *flagErrors
}

func (g *globalOptions) checker(fs *pflag.FlagSet) checker { return checker{fs: fs, errs: &g.flagErrs} }

// wrap replaces a defined flag's value with a checked one.
func (c checker) wrap(name, want string, check func(string) error) {
	f := c.fs.Lookup(name)
	if f == nil {
		panic("ferryctl: no flag " + name)
	}
	f.Value = &checkedValue{Value: f.Value, name: name, want: want, check: check, errs: c.errs}
	if want != "" && f.Value.Type() != "bool" && !strings.Contains(f.Usage, want) {
		f.Usage += " (" + want + ")"
	}
}

// intRange checks an integer flag (int, int64, uint32, uint) against
// [lo, hi].
func (c checker) intRange(name string, lo, hi int64) {
	c.wrap(name, fmt.Sprintf("%d to %d", lo, hi), func(s string) error {
		n, err := strconv.ParseInt(s, 0, 64)
		if err != nil || n < lo || n > hi {
			return errWant
		}
		return nil
	})
}

// durationRange checks a duration flag against [lo, hi].
func (c checker) durationRange(name string, lo, hi time.Duration) {
	want := fmt.Sprintf("a duration from %v to %v", lo, hi)
	if lo == 0 {
		want = fmt.Sprintf("a duration from 0s to %v", hi)
	}
	c.wrap(name, want, func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil || d < lo || d > hi {
			return errWant
		}
		return nil
	})
}

//lint:ignore U1000 floatRange checks a float flag against [lo, hi] (never NaN); unused while bench --rate (0, or 0.001 to 1e9) has its own check
func (c checker) floatRange(name string, lo, hi float64) {
	c.wrap(name, fmt.Sprintf("a number from %g to %g", lo, hi), func(s string) error {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) || f < lo || f > hi {
			return errWant
		}
		return nil
	})
}

// oneOf checks a string flag against a list of words.
func (c checker) oneOf(name string, words ...string) {
	c.wrap(name, strings.Join(words[:len(words)-1], ", ")+" or "+words[len(words)-1], func(s string) error {
		for _, w := range words {
			if s == w {
				return nil
			}
		}
		return errWant
	})
}

// bool checks a bool flag (its own parse error is reworded).
func (c checker) bool(name string) { c.wrap(name, "true or false", nil) }

// name checks a string flag with fn, which says what is wrong.
func (c checker) name(name, want string, fn func(string) error) {
	c.wrap(name, want, func(s string) error {
		if err := fn(s); err != nil {
			return checkErr{err}
		}
		return nil
	})
}

// Names.

const (
	topicWant = "a topic name: 1 to 255 letters, digits, '.', '_', '-' ('%' only in a group's dead-letter or retry topic, %DLQ%GROUP or %RETRY%GROUP)"
	groupWant = "a consumer group name: 1 to 255 letters, digits, '.', '_', '-'"
)

func checkTopic(s string) error { return protocol.ValidateTopic(s) }

func checkFilter(s string) error {
	_, err := protocol.ParseFilter(s)
	return err
}

// checkNewTopic checks the name of a topic to be created (no '%' but a
// dead-letter topic's, no name of dots alone).
func checkNewTopic(s string) error { return protocol.ValidateNewTopic(s) }

func checkConsumerGroup(s string) error { return fsm.ValidateConsumerName("consumer group", s) }

// checkBrokerGroup checks a broker group name as brokers take it (-group).
func checkBrokerGroup(s string) error { return protocol.ValidateServerName("broker group name", s) }

// checkBrokerID checks a broker's id as brokers take it (-id).
func checkBrokerID(s string) error { return protocol.ValidateServerName("broker id", s) }

// parseMetaAddrs reads --meta: a comma-separated list of host:port with a
// numeric port from 1 to 65535.
func parseMetaAddrs(s string) ([]string, error) {
	var out []string
	for _, a := range strings.Split(s, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return nil, fmt.Errorf("%s is not host:port", shown(a))
		}
		if host == "" {
			return nil, fmt.Errorf("%s has no host", shown(a))
		}
		if err := checkHost(host); err != nil {
			return nil, fmt.Errorf("%s: %w", shown(a), err)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%s: the port must be a number from 1 to 65535", shown(a))
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, errors.New("no host:port address in it")
	}
	return out, nil
}

// checkHost refuses a host no address can have, before it costs a DNS
// lookup (and --timeout): an IP address, or a name of letters, digits,
// '-', '_' and '.', at most 253 bytes.
func checkHost(host string) error {
	if net.ParseIP(host) != nil {
		return nil
	}
	if len(host) > 253 {
		return fmt.Errorf("the host name is %d bytes, more than a host name has (253)", len(host))
	}
	for i, r := range host {
		if r < utf8.RuneSelf && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			continue
		}
		return fmt.Errorf("the host %s has %q at byte %d, which no host name has (want an IP address, or letters, digits, '-', '_' and '.')", shown(host), r, i)
	}
	return nil
}

const metaWant = "a comma-separated list of host:port (port 1 to 65535)"

// globalFlags are the flags every command takes, and their environment
// variables: FERRY_ and the flag's name in capitals.
var globalFlags = []string{"meta", "json", "timeout", "tls-ca", "tls-cert", "tls-key"}

func envName(flag string) string {
	return "FERRY_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// applyEnv sets each global flag not given on the command line from its
// environment variable, if that is set.
func applyEnv(cmd *cobra.Command, g *globalOptions) error {
	for _, name := range globalFlags {
		f := cmd.Flags().Lookup(name)
		if f == nil || f.Changed {
			continue
		}
		v, ok := os.LookupEnv(envName(name))
		if !ok {
			continue
		}
		if err := cmd.Flags().Set(name, v); err != nil {
			want := ""
			if cv, ok := f.Value.(*checkedValue); ok {
				want = cv.want
			}
			g.flagErrs.first = nil
			return usageError{fmt.Errorf("%s=%s: want %s", envName(name), shown(v), want)}
		}
	}
	return nil
}

// checkArgs checks the positional arguments of every command, before any
// network call: none is empty, and a name is one the cluster can hold.
func checkArgs(cmd *cobra.Command, args []string) error {
	path := strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
	kind := argKinds[path]
	for i, a := range args {
		if a == "" {
			return usageError{fmt.Errorf("%s: %s is empty", path, argName(cmd, i))}
		}
		var err error
		switch kind {
		case "topic":
			err = checkTopic(a)
		case "new topic":
			err = checkNewTopic(a)
		case "consumer group":
			err = checkConsumerGroup(a)
		case "broker group":
			err = checkBrokerGroup(a)
		case "broker id":
			err = checkBrokerID(a)
		case "handle":
			err = checkHandle(a)
		case "transaction":
			_, err = protocol.ParseTxnID(a)
		}
		if err != nil {
			return usageError{fmt.Errorf("%s: %w", path, err)}
		}
	}
	return nil
}

// argName is the name of the i-th positional argument in cmd's Use line
// ("TOPIC"), or "argument i+1".
func argName(cmd *cobra.Command, i int) string {
	var names []string
	for _, w := range strings.Fields(cmd.Use)[1:] {
		if w = strings.Trim(w, "[]"); w != "" && w == strings.ToUpper(w) && !strings.HasPrefix(w, "-") && !strings.ContainsAny(w, "(|") {
			names = append(names, w)
		}
	}
	if i < len(names) {
		return names[i]
	}
	return fmt.Sprintf("argument %d", i+1)
}

// argKinds says what the positional arguments of a command name.
var argKinds = map[string]string{
	"routes":              "topic",
	"topic create":        "new topic",
	"topic add-queues":    "topic",
	"send":                "topic",
	"read":                "topic",
	"consume":             "topic",
	"broker readonly":     "broker group",
	"broker writable":     "broker group",
	"broker resync":       "broker id",
	"broker add-group":    "broker group",
	"broker retire-group": "broker group",
	"broker set-group":    "broker group",
	"broker remove-slave": "broker id",
	"group describe":      "consumer group",
	"group reset-offsets": "consumer group",
	"group delete":        "consumer group",
	"delayed get":         "handle",
	"message get":         "handle",
	"delayed cancel":      "handle",
	"txn abort":           "transaction",
}
