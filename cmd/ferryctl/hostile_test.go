package main

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/protocol"
)

// What the tests below expect of a command line.
const (
	wantUsage   = exitUsage       // refused before any network call
	wantNetwork = exitUnreachable // accepted, then the cluster (nothing at 127.0.0.1:1) cannot be reached
)

// nowhere is an address where nothing listens.
const nowhere = "127.0.0.1:1"

// hostileValues is what every flag is tried with.
var hostileValues = []string{
	"-1", "0", "1", "4611686018427387904" /* 1<<62 */, "99999999999999999999", "", "主题-ü",
	"-1s", "0s", "1s", "2562047h", "NaN", "+Inf", "1e400", nowhere, "a=b", "true", "x,,y", "a b:1",
}

// Expectations of a flag's values: each returns the exit code a value
// gives.

func intIn(lo, hi int64) func(string) int {
	return func(v string) int {
		n, err := strconv.ParseInt(v, 0, 64)
		if err != nil || n < lo || n > hi {
			return wantUsage
		}
		return wantNetwork
	}
}

func durationIn(lo, hi time.Duration) func(string) int {
	return func(v string) int {
		d, err := time.ParseDuration(v)
		if err != nil || d < lo || d > hi {
			return wantUsage
		}
		return wantNetwork
	}
}

func floatIn(lo, hi float64) func(string) int {
	return func(v string) int {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) || f < lo || f > hi {
			return wantUsage
		}
		return wantNetwork
	}
}

func words(ws ...string) func(string) int {
	return func(v string) int {
		for _, w := range ws {
			if v == w {
				return wantNetwork
			}
		}
		return wantUsage
	}
}

func isBool(v string) bool { _, err := strconv.ParseBool(v); return err == nil }

func anyBool(v string) int {
	if isBool(v) {
		return wantNetwork
	}
	return wantUsage
}

func matches(re string) func(string) int {
	r := regexp.MustCompile(re)
	return func(v string) int {
		if r.MatchString(v) {
			return wantNetwork
		}
		return wantUsage
	}
}

var (
	topicName    = matches(`^[A-Za-z0-9._%-]{1,255}$`)
	consumerName = matches(`^[A-Za-z0-9._-]{1,255}$`)
	hostPort     = matches(`^[A-Za-z0-9._-]+:([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$`)
	// A broker group has no naming rule but this: printable, no spaces.
	brokerGroupName = matches(`^[^\s\x00-\x1f\x7f]{1,255}$`)
	nonEmpty        = func(v string) int {
		if v == "" {
			return wantUsage
		}
		return wantNetwork
	}
	anything = func(string) int { return wantNetwork }
	// A time: unix ms of 0 or more, or RFC 3339.
	timeArg = func(v string) int {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return map[bool]int{true: wantNetwork, false: wantUsage}[n >= 0]
		}
		if _, err := time.Parse(time.RFC3339Nano, v); err == nil {
			return wantNetwork
		}
		return wantUsage
	}
	// A filter is refused before any call unless it parses.
	filterExpr = func(v string) int {
		if _, err := protocol.ParseFilter(v); err != nil {
			return wantUsage
		}
		return wantNetwork
	}
)

// flagCase is one flag of one command: the command line it is tried on
// (after the global flags) and what each value gives.
type flagCase struct {
	base []string
	want func(v string) int
}

// flagCases lists every flag of every command ("command path/flag");
// TestHostileFlagValues fails when the command tree has one it does not.
var flagCases = map[string]flagCase{
	// Global flags, tried on topics.
	"/meta":    {[]string{"topics"}, hostPort},
	"/timeout": {[]string{"topics"}, durationIn(time.Millisecond, 24*time.Hour)},
	"/json":    {[]string{"topics"}, anyBool},
	// No hostile value names a PEM file (none is there), and a certificate
	// needs its key: each is refused before any network call.
	"/tls-ca":   {[]string{"topics"}, func(string) int { return wantUsage }},
	"/tls-cert": {[]string{"topics"}, func(string) int { return wantUsage }},
	"/tls-key":  {[]string{"topics"}, func(string) int { return wantUsage }},
	// No value names a readable file holding a token.
	"/token-file":     {[]string{"topics"}, func(string) int { return wantUsage }},
	"acl add/perm":    {[]string{"acl", "add", "p"}, permission},
	"acl grant/perm":  {[]string{"acl", "grant", "p"}, permission},
	"acl revoke/perm": {[]string{"acl", "revoke", "p"}, permission},

	"topic create/queues":    {[]string{"topic", "create", "t"}, intIn(1, 4096)},
	"topic create/groups":    {[]string{"topic", "create", "t"}, matches(`^[^,\s]+(,[^,\s]+)*$`)},
	"topic add-queues/count": {[]string{"topic", "add-queues", "t"}, intIn(1, 4096)},

	"read/queue":     {[]string{"read", "t"}, intIn(0, math.MaxUint32)},
	"read/from":      {[]string{"read", "t"}, intIn(0, math.MaxInt64)},
	"read/limit":     {[]string{"read", "t"}, intIn(1, 100000)},
	"read/max-bytes": {[]string{"read", "t"}, intIn(1, 16<<20)},

	"send/body": {[]string{"send", "t"}, nonEmpty},
	// A file that is not there is a usage error.
	"send/body-file":   {[]string{"send", "t"}, func(string) int { return wantUsage }},
	"send/key":         {[]string{"send", "t", "--body", "b"}, anything},
	"send/tag":         {[]string{"send", "t", "--body", "b"}, matches(`^[A-Za-z0-9._:/-]{1,64}$`)},
	"send/prop":        {[]string{"send", "t", "--body", "b"}, matches(`^[^=,]+=[^,]*$`)},
	"send/reliability": {[]string{"send", "t", "--body", "b"}, words("normal", "high", "NORMAL", "HIGH")},
	// No hostile value is an RFC 3339 time.
	"send/at":    {[]string{"send", "t", "--body", "b"}, rfc3339},
	"send/after": {[]string{"send", "t", "--body", "b"}, durationIn(0, math.MaxInt64)},

	"delayed ls/group":  {[]string{"delayed", "ls"}, brokerGroupName},
	"delayed ls/topic":  {[]string{"delayed", "ls"}, topicName},
	"delayed ls/bucket": {[]string{"delayed", "ls"}, durationIn(time.Second, 366*24*time.Hour)},
	"delayed ls/limit":  {[]string{"delayed", "ls"}, intIn(1, 1000)},
	"txn ls/group":      {[]string{"txn", "ls"}, brokerGroupName},
	"txn ls/producer":   {[]string{"txn", "ls"}, uintAny},
	"txn abort/group":   {[]string{"txn", "abort", "1.1.1"}, brokerGroupName},

	"bench/topic":            {[]string{"bench"}, topicName},
	"bench/queues":           {[]string{"bench"}, intIn(1, 4096)},
	"bench/producers":        {[]string{"bench"}, intIn(1, 1024)},
	"bench/size":             {[]string{"bench"}, intIn(0, 4<<20)},
	"bench/count":            {[]string{"bench"}, intIn(1, 1e12)},
	"bench/duration":         {[]string{"bench"}, durationIn(time.Millisecond, 7*24*time.Hour)},
	"bench/delivery-timeout": {[]string{"bench"}, durationIn(time.Millisecond, time.Hour)},
	"bench/reliability":      {[]string{"bench"}, words("normal", "high")},
	"bench/mode":             {[]string{"bench"}, words("sync", "async")},
	"bench/window":           {[]string{"bench"}, intIn(1, 1e6)},
	"bench/linger":           {[]string{"bench"}, durationIn(0, time.Second)},
	"bench/delay":            {[]string{"bench"}, durationIn(0, 90*24*time.Hour)},
	"bench/delay-spread":     {[]string{"bench", "--delay", "1m"}, durationIn(0, 90*24*time.Hour-time.Minute)},
	"bench/tag":              {[]string{"bench"}, matches(`^[A-Za-z0-9._:/-]{1,64}(,[A-Za-z0-9._:/-]{1,64})*$`)},
	"bench/filter":           {[]string{"bench", "--consumers", "1"}, filterExpr},
	"bench/deliver-at":       {[]string{"bench"}, rfc3339},
	"bench/batch-bytes":      {[]string{"bench"}, intIn(0, 16<<20-18-8)},
	"bench/max-inflight":     {[]string{"bench"}, intIn(0, 1024)},
	"bench/idempotence":      {[]string{"bench"}, anyBool},
	"bench/progress":         {[]string{"bench"}, anyBool},
	"bench/rate":             {[]string{"bench"}, rateIn},
	"bench/consumers":        {[]string{"bench"}, intIn(0, 1024)},
	"bench/group":            {[]string{"bench"}, consumerName},
	// --backlog needs --consumers.
	"bench/backlog": {[]string{"bench"}, func(v string) int {
		if b, err := strconv.ParseBool(v); err == nil && !b {
			return wantNetwork
		}
		return wantUsage
	}},
	"bench/consume-wait": {[]string{"bench"}, durationIn(time.Millisecond, time.Hour)},
	"bench/cpuprofile":   {[]string{"bench"}, nonEmpty},
	"bench/memprofile":   {[]string{"bench"}, nonEmpty},

	"consume/group":      {[]string{"consume", "t"}, consumerName},
	"consume/from":       {[]string{"consume", "t", "--group", "g"}, words("earliest", "latest")},
	"consume/count":      {[]string{"consume", "t", "--group", "g"}, intIn(0, 1e12)},
	"consume/member":     {[]string{"consume", "t", "--group", "g"}, consumerName},
	"consume/filter":     {[]string{"consume", "t", "--group", "g"}, filterExpr},
	"message find/id":    {[]string{"message", "find"}, nonEmpty},
	"message find/key":   {[]string{"message", "find"}, nonEmpty},
	"message find/since": {[]string{"message", "find", "--id", "x"}, timeArg},
	"message find/until": {[]string{"message", "find", "--id", "x"}, timeArg},
	"message find/limit": {[]string{"message", "find", "--id", "x"}, intIn(1, protocol.MaxLookupLimit)},
	"message find/cursor": {[]string{"message", "find", "--id", "x"}, func(v string) int {
		if _, err := clientcore.ParseLookupCursor(v); err != nil { // "": from the newest
			return wantUsage
		}
		return wantNetwork
	}},
	"read/filter": {[]string{"read", "t"}, filterExpr},

	"group reset-offsets/topic": {[]string{"group", "reset-offsets", "g", "--to-earliest"}, topicName},
	"group reset-offsets/queues": {[]string{"group", "reset-offsets", "g", "--topic", "t", "--to-earliest"},
		matches(`^(0|[1-9][0-9]{0,9})(,(0|[1-9][0-9]{0,9}))*$`)},
	// The --to-* flags: exactly one is needed.
	"group reset-offsets/to-offset":   {[]string{"group", "reset-offsets", "g", "--topic", "t"}, intIn(0, math.MaxInt64)},
	"group reset-offsets/to-time":     {[]string{"group", "reset-offsets", "g", "--topic", "t"}, timeArg},
	"group reset-offsets/to-earliest": {[]string{"group", "reset-offsets", "g", "--topic", "t"}, trueOnly},
	"group reset-offsets/to-latest":   {[]string{"group", "reset-offsets", "g", "--topic", "t"}, trueOnly},
	"group reset-offsets/dry-run":     {[]string{"group", "reset-offsets", "g", "--topic", "t", "--to-earliest"}, anyBool},
	"group reset-offsets/create":      {[]string{"group", "reset-offsets", "g", "--topic", "t", "--to-earliest"}, anyBool},

	// certs dials nothing: into a directory that cannot be made, what its
	// flags take fails writing (1).
	"certs/node":   {[]string{"certs", "/dev/null/tls"}, writeFails(matches(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}=[^,\s]+(,[^,\s]+)*$`))},
	"certs/client": {[]string{"certs", "/dev/null/tls"}, writeFails(matches(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$`))},
	"certs/days":   {[]string{"certs", "/dev/null/tls", "--node", "n=127.0.0.1"}, writeFails(intIn(1, 3650))},
	"certs/force":  {[]string{"certs", "/dev/null/tls", "--node", "n=127.0.0.1"}, writeFails(anyBool)},

	"broker retire-group/force":   {[]string{"broker", "retire-group", "g"}, anyBool},
	"broker retire-group/dry-run": {[]string{"broker", "retire-group", "g"}, anyBool},
	"broker set-group/min-insync": {[]string{"broker", "set-group", "g"}, intIn(0, 9)},
	"broker set-group/ack":        {[]string{"broker", "set-group", "g"}, matches(`^(all|quorum:(\+?0*[2-9]))$`)},
	"broker remove-slave/group":   {[]string{"broker", "remove-slave", "b"}, brokerGroupName},

	"meta status/member-timeout": {[]string{"meta", "status"}, durationIn(10*time.Millisecond, time.Minute)},
	"meta add-voter/raft-addr":   {[]string{"meta", "add-voter", "m9", "--rpc-addr", "127.0.0.1:2"}, hostPort},
	"meta add-voter/rpc-addr":    {[]string{"meta", "add-voter", "m9", "--raft-addr", "127.0.0.1:2"}, hostPort},
	"meta add-voter/force":       {[]string{"meta", "add-voter", "m9", "--raft-addr", "127.0.0.1:2", "--rpc-addr", "127.0.0.1:3"}, anyBool},
}

// writeFails is want for a command that dials nothing and fails writing
// what it was asked to: a value want accepts gives exit 1, not 3.
func writeFails(want func(string) int) func(string) int {
	return func(v string) int {
		if code := want(v); code != wantNetwork {
			return code
		}
		return exitError
	}
}

// trueOnly: a --to-* flag set to false leaves reset-offsets without a
// target.
func trueOnly(v string) int {
	if b, err := strconv.ParseBool(v); err == nil && b {
		return wantNetwork
	}
	return wantUsage
}

// argCases gives, for every runnable command, a command line with ARG where
// its first positional argument goes (nil: it takes none) and what an
// argument gives. TestHostileFlagValues fails when the tree has a command
// it does not list.
var argCases = map[string]flagCase{
	"routes":              {[]string{"routes", "ARG"}, topicName},
	"topics":              {nil, nil},
	"topic create":        {[]string{"topic", "create", "ARG"}, topicName},
	"topic add-queues":    {[]string{"topic", "add-queues", "ARG"}, topicName},
	"brokers":             {nil, nil},
	"broker readonly":     {[]string{"broker", "readonly", "ARG"}, brokerGroupName},
	"broker writable":     {[]string{"broker", "writable", "ARG"}, brokerGroupName},
	"broker resync":       {[]string{"broker", "resync", "ARG"}, brokerGroupName},
	"broker add-group":    {[]string{"broker", "add-group", "ARG"}, brokerGroupName},
	"broker retire-group": {[]string{"broker", "retire-group", "ARG"}, brokerGroupName},
	"broker set-group":    {[]string{"broker", "set-group", "ARG", "--ack", "all"}, brokerGroupName},
	"broker remove-slave": {[]string{"broker", "remove-slave", "ARG", "--group", "g"}, brokerGroupName},
	"meta status":         {nil, nil},
	"meta add-voter":      {[]string{"meta", "add-voter", "ARG", "--raft-addr", "127.0.0.1:2", "--rpc-addr", "127.0.0.1:3"}, nonEmpty},
	"meta remove-voter":   {[]string{"meta", "remove-voter", "ARG"}, nonEmpty},
	"send":                {[]string{"send", "ARG", "--body", "b"}, topicName},
	"delayed ls":          {nil, nil},
	"delayed get":         {[]string{"delayed", "get", "ARG"}, handle},
	"delayed cancel":      {[]string{"delayed", "cancel", "ARG"}, handle},
	"txn ls":              {nil, nil},
	"txn abort":           {[]string{"txn", "abort", "ARG", "--group", "g1"}, txnID},
	"read":                {[]string{"read", "ARG"}, topicName},
	"truncated":           {[]string{"truncated", "ARG"}, missingFile},
	"bench":               {nil, nil},
	"groups":              {nil, nil},
	"group describe":      {[]string{"group", "describe", "ARG"}, consumerName},
	"group reset-offsets": {[]string{"group", "reset-offsets", "ARG", "--topic", "t", "--to-earliest"}, consumerName},
	"group delete":        {[]string{"group", "delete", "ARG"}, consumerName},
	"group set-filter":    {[]string{"group", "set-filter", "ARG", "A || B"}, consumerName},
	"message get":         {[]string{"message", "get", "ARG"}, handle},
	"message find":        {[]string{"message", "find", "--id", "ARG"}, nonEmpty}, // no argument: the id is a flag
	"message journey":     {[]string{"message", "journey", "ARG"}, nonEmpty},
	"consume":             {[]string{"consume", "ARG", "--group", "g"}, topicName},
	"acl add":             {[]string{"acl", "add", "ARG", "--perm", "describe"}, principalName},
	"acl grant":           {[]string{"acl", "grant", "ARG", "--perm", "describe"}, principalName},
	"acl revoke":          {[]string{"acl", "revoke", "ARG", "--perm", "describe"}, principalName},
	"acl rm":              {[]string{"acl", "rm", "ARG"}, principalName},
	"acl rotate":          {[]string{"acl", "rotate", "ARG"}, principalName},
	"acl list":            {nil, nil},
	// certs writes into ARG (in the test's directory): a name the file
	// system refuses fails writing (1).
	"certs": {[]string{"certs", "ARG", "--node", "n=127.0.0.1"}, func(v string) int {
		switch {
		case v == "":
			return wantUsage
		case len(v) > 255, strings.ContainsRune(v, 0):
			return exitError
		}
		return exitOK
	}},
}

// permission: a --perm value auth reads is taken.
func permission(v string) int {
	if _, err := auth.ParsePermission(v); err != nil {
		return wantUsage
	}
	return wantNetwork
}

// principalName: a principal's name as auth allows it.
func principalName(v string) int {
	if auth.ValidateName(v) != nil {
		return wantUsage
	}
	return wantNetwork
}

// missingFile: truncated reads a file, not the cluster; the files tried
// are not there (the cluster said no is 1: so is a file that cannot be read).
func missingFile(v string) int {
	if v == "" {
		return wantUsage
	}
	return exitError
}

var hostileArgs = []string{"", "主题-ü", strings.Repeat("a", 300), "ok-name", "a b", "x\x00y",
	"g1@12", "g1@-1", "@5", "g1@", "g1@x", "a b@3", "g1@99999999999999999999"}

// rfc3339: a time in RFC 3339 after 1970.
func rfc3339(v string) int {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil && t.UnixMilli() > 0 {
		return wantNetwork
	}
	return wantUsage
}

// uintAny: any unsigned 64-bit number.
func uintAny(v string) int {
	if _, err := strconv.ParseUint(v, 0, 64); err != nil {
		return wantUsage
	}
	return wantNetwork
}

// txnID: PRODUCER.EPOCH.NUMBER.
func txnID(v string) int {
	if _, err := protocol.ParseTxnID(v); err != nil {
		return wantUsage
	}
	return wantNetwork
}

// handle: GROUP@OFFSET[/DUE], a broker group name, a log offset and a due time.
func handle(v string) int {
	h, err := protocol.ParseHandle(v)
	if err != nil || brokerGroupName(h.Group) != wantNetwork {
		return wantUsage
	}
	return wantNetwork
}

// leafCommands walks the command tree: every runnable command by its path
// after "ferryctl", and its flags (the global ones under "").
func leafCommands() map[string][]string {
	root := newRootCommand(strings.NewReader(""), &strings.Builder{})
	out := map[string][]string{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.HasSubCommands() {
			for _, sub := range c.Commands() {
				walk(sub)
			}
			if c != root {
				return
			}
		}
		path := strings.TrimPrefix(c.CommandPath(), "ferryctl")
		path = strings.TrimPrefix(path, " ")
		var flags []string
		fs := c.LocalNonPersistentFlags()
		if c == root {
			fs = c.PersistentFlags()
		}
		fs.VisitAll(func(f *pflag.Flag) {
			if f.Name != "help" {
				flags = append(flags, f.Name)
			}
		})
		out[path] = flags
	}
	walk(root)
	return out
}

type hostileCase struct {
	name string
	args []string
	want int
}

// TestHostileFlagValues runs every command with every flag set to each
// hostile value, and with hostile positional arguments, against an address
// where nothing listens: a value the README's rules refuse exits 2 before
// any network call, one they take exits 3 (the cluster cannot be reached);
// never a panic, and the error is one line "ferryctl: ...".
func TestHostileFlagValues(t *testing.T) {
	t.Chdir(t.TempDir()) // a profile or a file named by a value lands here
	global := []string{"--meta", nowhere, "--timeout", "1s"}
	tree := leafCommands()
	var cases []hostileCase
	var missing []string
	var paths []string
	for path := range tree {
		paths = append(paths, path)
	}
	sort.Strings(paths)
	for _, path := range paths {
		for _, flag := range tree[path] {
			key := path + "/" + flag
			fc, ok := flagCases[key]
			if !ok {
				missing = append(missing, "flag "+key)
				continue
			}
			for _, v := range hostileValues {
				var args []string
				for i := 0; i < len(global); i += 2 { // a global flag under test is not given twice
					if global[i] != "--"+flag {
						args = append(args, global[i], global[i+1])
					}
				}
				args = append(append(args, fc.base...), "--"+flag+"="+v)
				cases = append(cases, hostileCase{fmt.Sprintf("%s=%q", key, v), args, fc.want(v)})
			}
		}
		if path == "" {
			continue
		}
		ac, ok := argCases[path]
		if !ok {
			missing = append(missing, "command "+path)
			continue
		}
		if ac.base == nil {
			cases = append(cases, hostileCase{path + " with an extra argument", append(append([]string{}, global...), append(strings.Fields(path), "extra")...), wantUsage})
			cases = append(cases, hostileCase{path, append(append([]string{}, global...), strings.Fields(path)...), wantNetwork})
			continue
		}
		for _, v := range hostileArgs {
			args := append([]string{}, global...)
			for _, a := range ac.base {
				if a == "ARG" {
					a = v
				}
				args = append(args, a)
			}
			cases = append(cases, hostileCase{fmt.Sprintf("%s ARG=%q", path, v), args, ac.want(v)})
		}
	}
	for key := range flagCases {
		i := strings.LastIndex(key, "/")
		if flags, ok := tree[key[:i]]; !ok || !contains(flags, key[i+1:]) {
			t.Logf("flagCases has %s, which the command tree does not (a flag still to come, or one gone)", key)
		}
	}
	for path := range argCases {
		if _, ok := tree[path]; !ok {
			t.Logf("argCases has %q, which the command tree does not (a command still to come, or one gone)", path)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("flags and commands without a hostile case (add them to flagCases or argCases): %v", missing)
	}

	// The cases that reach for the cluster wait up to --timeout: run them
	// side by side.
	type result struct {
		code           int
		stdout, stderr string
		panicked       any
	}
	results := make([]result, len(cases))
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i, c := range cases {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			defer func() {
				if p := recover(); p != nil {
					results[i].panicked = p
				}
			}()
			code, out, errOut := ctl(c.args...)
			results[i] = result{code: code, stdout: out, stderr: errOut}
		}()
	}
	wg.Wait()
	for i, c := range cases {
		r := results[i]
		if r.panicked != nil {
			t.Errorf("%s: ferryctl %q panicked: %v", c.name, c.args, r.panicked)
			continue
		}
		if r.code != c.want {
			t.Errorf("%s: ferryctl %q: exit %d, want %d; stderr %q", c.name, c.args, r.code, c.want, r.stderr)
		}
		checkOneErrorLine(t, c.name, r.code, r.stderr)
	}
	t.Logf("%d cases", len(cases))
}

// checkOneErrorLine checks what a failed command prints on stderr: exactly
// one line starting "ferryctl: " (an error may go on over indented lines)
// and no Go stack trace.
func checkOneErrorLine(t *testing.T, name string, code int, stderr string) {
	t.Helper()
	if code == 0 {
		return
	}
	n := 0
	for _, line := range strings.Split(strings.TrimRight(stderr, "\n"), "\n") {
		if strings.HasPrefix(line, "ferryctl: ") {
			n++
		} else if !strings.HasPrefix(line, "  ") {
			t.Errorf("%s: stderr line %q is neither the error nor its continuation", name, line)
		}
	}
	if n != 1 {
		t.Errorf("%s: stderr has %d lines starting \"ferryctl: \", want 1: %q", name, n, stderr)
	}
	if strings.Count(stderr, "ferryctl:") != 1 {
		t.Errorf("%s: stderr repeats the prefix: %q", name, stderr)
	}
	if strings.Contains(stderr, "goroutine") || strings.Contains(stderr, "panic") {
		t.Errorf("%s: stderr has a stack trace: %q", name, stderr)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
