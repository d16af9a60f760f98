// Command failoverprobe measures failover on a local cluster of real
// processes started by scripts/cluster.sh; scripts/bench-failover.sh runs
// it. It is a measurement tool, imported by nothing.
//
//	failoverprobe -meta A,B,C -home FERRY_HOME -mode kill -topic T -rounds 10
//	failoverprobe -meta A,B,C -home FERRY_HOME -mode stop -topic T -failover on|off
//
// kill: producers (the producer SDK, synchronous sends, unkeyed) send to T,
// whose queues are all on -group, without pause. Each round reads the
// group's master from the registry, reads its command line from
// /proc/PID/cmdline, kills it with SIGKILL and measures, from the kill, (i)
// when the registry (polled every -poll) first shows the group writable
// with the other broker as master at a higher epoch, and (ii) when a send
// is first acknowledged by that broker. It then starts the killed broker
// again with its own command line (PID file and log under -home, as
// cluster.sh does), waits until it is the group's slave and connected, and
// goes on.
//
// stop: producers send keyed and unkeyed messages at a fixed pace to T,
// whose queues are on both groups, measuring each send's wait. The group's
// master is stopped with SIGSTOP; with -failover on it is continued
// (SIGCONT) as soon as the registry shows its slave promoted, and the probe
// waits for it to rejoin as the slave; with -failover off it stays stopped
// until the registry marks the group read-only, plus -hold, and is then
// continued, and the probe waits for the group to be writable again. It
// reports the longest and p99 wait for an acknowledgement among the sends
// in flight during the fault, the longest stretch with no acknowledgement,
// and when the group, writable again, first gets messages.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

type options struct {
	meta     []string
	home     string
	mode     string
	topic    string
	group    string
	rounds   int
	failover string
	senders  int
	pace     time.Duration
	poll     time.Duration
	warmup   time.Duration
	observe  time.Duration
	hold     time.Duration
	step     time.Duration
	trace    string
}

func main() {
	var o options
	var meta string
	flag.StringVar(&meta, "meta", "", "metaserver RPC addresses, comma-separated")
	flag.StringVar(&o.home, "home", "", "the cluster's FERRY_HOME (pids/ and logs/)")
	flag.StringVar(&o.mode, "mode", "", "kill or stop")
	flag.StringVar(&o.topic, "topic", "", "topic to send to (kill: its queues on -group only; stop: on both groups)")
	flag.StringVar(&o.group, "group", "g1", "the group whose master is killed or stopped")
	flag.IntVar(&o.rounds, "rounds", 10, "kill: promotions to measure")
	flag.StringVar(&o.failover, "failover", "on", "stop: whether the cluster fails over (on: SIGCONT once promoted; off: SIGCONT once read-only plus -hold)")
	flag.IntVar(&o.senders, "senders", 4, "producer goroutines (stop: this many keyed and this many unkeyed)")
	flag.DurationVar(&o.pace, "pace", 20*time.Millisecond, "each sender starts a send at most once per pace")
	flag.DurationVar(&o.poll, "poll", 20*time.Millisecond, "registry poll interval")
	flag.DurationVar(&o.warmup, "warmup", 3*time.Second, "stop: sending before the fault")
	flag.DurationVar(&o.observe, "observe", 10*time.Second, "stop: sending after the group is writable again")
	flag.DurationVar(&o.hold, "hold", time.Second, "stop, -failover off: how long the master stays stopped after the group is read-only")
	flag.DurationVar(&o.step, "step-timeout", 45*time.Second, "bound on each wait")
	flag.StringVar(&o.trace, "trace", "", "stop: write every send (times from the SIGSTOP, in ms) to this CSV file")
	flag.Parse()
	for _, a := range strings.Split(meta, ",") {
		if a != "" {
			o.meta = append(o.meta, a)
		}
	}
	if len(o.meta) == 0 || o.home == "" || o.topic == "" || (o.mode != "kill" && o.mode != "stop") ||
		(o.failover != "on" && o.failover != "off") {
		flag.Usage()
		os.Exit(2)
	}
	// A stopped broker must not stay stopped if the probe is interrupted.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sigs
		continueStopped()
		fmt.Fprintf(os.Stderr, "failoverprobe: %v\n", s)
		os.Exit(1)
	}()
	var err error
	switch o.mode {
	case "kill":
		err = runKill(o)
	case "stop":
		err = runStop(o)
	}
	continueStopped()
	if err != nil {
		fmt.Fprintf(os.Stderr, "failoverprobe: %v\n", err)
		os.Exit(1)
	}
}

// stoppedPID is a broker this probe stopped with SIGSTOP and has not
// continued yet (0: none).
var (
	stoppedMu  sync.Mutex
	stoppedPID int
)

func continueStopped() {
	stoppedMu.Lock()
	defer stoppedMu.Unlock()
	if stoppedPID != 0 {
		_ = syscall.Kill(stoppedPID, syscall.SIGCONT)
		stoppedPID = 0
	}
}

// ---- the registry ----

type registry struct {
	cl   *client.Client
	poll time.Duration
}

func (r *registry) group(name string) (api.GroupInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	gs, err := r.cl.Groups(ctx)
	if err != nil {
		return api.GroupInfo{}, err
	}
	for _, g := range gs {
		if g.Name == name {
			return g, nil
		}
	}
	return api.GroupInfo{}, fmt.Errorf("no group %q in the registry", name)
}

// waitFor polls the registry until ok holds for the group, and returns the
// group and when the answer that showed it came back.
func (r *registry) waitFor(name, what string, timeout time.Duration, ok func(api.GroupInfo) bool) (api.GroupInfo, time.Time, error) {
	deadline := time.Now().Add(timeout)
	var last api.GroupInfo
	var lastErr error
	for {
		g, err := r.group(name)
		at := time.Now()
		if err == nil && ok(g) {
			return g, at, nil
		}
		if err == nil {
			last = g
		}
		lastErr = err
		if at.After(deadline) {
			return last, at, fmt.Errorf("%s: not within %v (last seen: epoch %d, %s, master %q, slave %q, failover %q, error %v)",
				what, timeout, last.Epoch, last.State, last.Master.ID, last.Slave.ID, last.Failover, lastErr)
		}
		time.Sleep(r.poll)
	}
}

// healthy: writable, a master and a slave, the slave heartbeating and the
// master reporting it connected.
func healthy(g api.GroupInfo) bool {
	return g.Writable() && g.Master.ID != "" && g.Slave.ID != "" && g.Last.SlaveConnected &&
		g.SlaveHeartbeatAgeMillis >= 0 && g.SlaveHeartbeatAgeMillis < 2500 && g.MasterHeartbeatAgeMillis >= 0
}

// ---- processes ----

func pidOf(home, id string) (int, error) {
	b, err := os.ReadFile(filepath.Join(home, "pids", id+".pid"))
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("PID file of %s: %v", id, err)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		return 0, fmt.Errorf("%s (pid %d) is not running: %v", id, pid, err)
	}
	return pid, nil
}

func cmdline(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, err
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if len(args) == 0 || args[0] == "" {
		return nil, fmt.Errorf("pid %d: empty command line", pid)
	}
	return args, nil
}

// relaunch starts a broker again with its command line, its output
// appended to its log and its PID in its PID file, in its own process
// group, so cluster.sh stop finds and stops it.
func relaunch(home, id string, argv []string) (int, error) {
	logf, err := os.OpenFile(filepath.Join(home, "logs", id+".log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "\n==== failoverprobe: restarted at %s ====\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	pid := cmd.Process.Pid
	go func() { _ = cmd.Wait() }() // reap it if it exits while the probe runs
	if err := os.WriteFile(filepath.Join(home, "pids", id+".pid"), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		return pid, err
	}
	return pid, nil
}

// ---- the producers' sends ----

type sendEvent struct {
	start, end time.Time
	keyed      bool
	res        producer.Result
	err        error
}

type recorder struct {
	mu  sync.Mutex
	evs []sendEvent
}

func (r *recorder) add(e sendEvent) {
	r.mu.Lock()
	r.evs = append(r.evs, e)
	r.mu.Unlock()
}

func (r *recorder) snapshot() []sendEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.evs)
}

// firstAck returns the earliest acknowledgement after t that matches, or
// the zero time.
func (r *recorder) firstAck(after time.Time, match func(sendEvent) bool) time.Time {
	var first time.Time
	for _, e := range r.snapshot() {
		if e.err == nil && e.end.After(after) && match(e) && (first.IsZero() || e.end.Before(first)) {
			first = e.end
		}
	}
	return first
}

func (r *recorder) waitAck(after time.Time, timeout time.Duration, match func(sendEvent) bool) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		if t := r.firstAck(after, match); !t.IsZero() {
			return t, nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("no matching acknowledgement within %v", timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sender sends until ctx ends, one synchronous send at a time, starting one
// at most every pace.
func sender(ctx context.Context, wg *sync.WaitGroup, p *producer.Client, rec *recorder, topic string, key func(int) string, pace time.Duration) {
	defer wg.Done()
	for i := 0; ctx.Err() == nil; i++ {
		k := key(i)
		start := time.Now()
		res, err := p.Send(ctx, &producer.Message{Topic: topic, Key: k, Body: []byte(fmt.Sprintf("failoverprobe %d %s", i, start.Format(time.RFC3339Nano))),
			Reliability: protocol.Normal})
		if ctx.Err() != nil {
			return // ended by the probe, not by the cluster
		}
		rec.add(sendEvent{start: start, end: time.Now(), keyed: k != "", res: res, err: err})
		if d := time.Until(start.Add(pace)); d > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
	}
}

func newProducer(o options) (*producer.Client, error) {
	// The SDK's defaults (RequestTimeout 5 s, RoutePoll 300 ms, the default
	// avoider), as an application would have them.
	return producer.New(sdk.MetaAddrs(o.meta...))
}

// secs prints a duration as seconds with two decimals, or in milliseconds
// below a second.
func secs(d time.Duration) string {
	if d < time.Second && d > -time.Second {
		return d.Round(time.Millisecond).String()
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// ---- kill ----

func runKill(o options) error {
	cl, err := client.New(client.Config{Addrs: o.meta, CallTimeout: time.Second})
	if err != nil {
		return err
	}
	defer cl.Close()
	reg := &registry{cl: cl, poll: o.poll}
	p, err := newProducer(o)
	if err != nil {
		return err
	}
	defer p.Close()
	rec := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for range o.senders {
		wg.Add(1)
		go sender(ctx, &wg, p, rec, o.topic, func(int) string { return "" }, o.pace)
	}

	var toWritable, toAck []time.Duration
	for round := 1; round <= o.rounds; round++ {
		g, _, err := reg.waitFor(o.group, "group healthy before the kill", o.step, healthy)
		if err != nil {
			return fmt.Errorf("round %d: %v", round, err)
		}
		// The producers must be getting acknowledgements from this master.
		if _, err := rec.waitAck(time.Now(), o.step, func(e sendEvent) bool { return e.res.Broker == g.Master.Addr }); err != nil {
			return fmt.Errorf("round %d: producers before the kill: %v", round, err)
		}
		victim, heir, heirAddr := g.Master.ID, g.Slave.ID, g.Slave.Addr
		pid, err := pidOf(o.home, victim)
		if err != nil {
			return fmt.Errorf("round %d: %v", round, err)
		}
		argv, err := cmdline(pid)
		if err != nil {
			return fmt.Errorf("round %d: %v", round, err)
		}
		epoch := g.Epoch

		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return fmt.Errorf("round %d: kill %d: %v", round, pid, err)
		}
		killed := time.Now()

		pg, writableAt, err := reg.waitFor(o.group, "promotion", o.step, func(g api.GroupInfo) bool {
			return g.Writable() && g.Master.ID == heir && g.Epoch > epoch
		})
		if err != nil {
			return fmt.Errorf("round %d: %v", round, err)
		}
		ackAt, err := rec.waitAck(killed, o.step, func(e sendEvent) bool { return e.res.Broker == heirAddr })
		if err != nil {
			return fmt.Errorf("round %d: first send acknowledged by %s: %v", round, heir, err)
		}
		toWritable = append(toWritable, writableAt.Sub(killed))
		toAck = append(toAck, ackAt.Sub(killed))

		for !processGone(pid) {
			time.Sleep(10 * time.Millisecond)
		}
		restarted := time.Now()
		npid, err := relaunch(o.home, victim, argv)
		if err != nil {
			return fmt.Errorf("round %d: restarting %s: %v", round, victim, err)
		}
		_, rejoinedAt, err := reg.waitFor(o.group, victim+" rejoined as slave", o.step, func(g api.GroupInfo) bool {
			return healthy(g) && g.Master.ID == heir && g.Slave.ID == victim
		})
		if err != nil {
			return fmt.Errorf("round %d: %v", round, err)
		}
		fmt.Printf("round %2d: kill -9 %s (pid %d), epoch %d->%d: writable in registry %s, first ack by %s %s; restarted (pid %d), slave and connected after %s\n",
			round, victim, pid, epoch, pg.Epoch, secs(writableAt.Sub(killed)), heir, secs(ackAt.Sub(killed)), npid, secs(rejoinedAt.Sub(restarted)))
		if pg.Failover != "" {
			fmt.Printf("          failover word: %s\n", pg.Failover)
		}
	}
	st := p.Stats()
	var errs int
	for _, e := range rec.snapshot() {
		if e.err != nil {
			errs++
		}
	}
	fmt.Printf("=> kill-to-writable, registry (polled every %v), %d promotions: median %s, max %s (min %s)\n",
		o.poll, len(toWritable), secs(median(toWritable)), secs(slices.Max(toWritable)), secs(slices.Min(toWritable)))
	fmt.Printf("=> kill-to-first-ack by the new master (producer SDK, %d synchronous senders), %d promotions: median %s, max %s (min %s)\n",
		o.senders, len(toAck), secs(median(toAck)), secs(slices.Max(toAck)), secs(slices.Min(toAck)))
	fmt.Printf("   producer: %d sends, %d failed, %d retries, %d given up, %d duplicates answered\n",
		len(rec.snapshot()), errs, st.Retries, st.GivenUp, st.Duplicates)
	return nil
}

func processGone(pid int) bool {
	// Killed processes are children of init (cluster.sh's shell has exited)
	// or of this probe (reaped by relaunch's goroutine); either reaps them.
	err := syscall.Kill(pid, 0)
	if errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, rerr := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if rerr != nil {
		return true
	}
	// A zombie ("Z") no longer holds its ports or files.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) && s[i+2] == 'Z' {
		return true
	}
	return false
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	i := int(q*float64(len(s))+0.999999) - 1 // nearest rank
	i = max(0, min(i, len(s)-1))
	return s[i]
}

// ---- stop ----

func runStop(o options) error {
	cl, err := client.New(client.Config{Addrs: o.meta, CallTimeout: time.Second})
	if err != nil {
		return err
	}
	defer cl.Close()
	reg := &registry{cl: cl, poll: o.poll}
	g, _, err := reg.waitFor(o.group, "group healthy", o.step, healthy)
	if err != nil {
		return err
	}
	p, err := newProducer(o)
	if err != nil {
		return err
	}
	defer p.Close()
	rec := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for s := range o.senders {
		wg.Add(2)
		go sender(ctx, &wg, p, rec, o.topic, func(i int) string { return fmt.Sprintf("key-%d-%d", s, i%8) }, o.pace)
		go sender(ctx, &wg, p, rec, o.topic, func(int) string { return "" }, o.pace)
	}
	// Warm up from the first acknowledgements on the group and elsewhere,
	// so the fault meets a producer in its steady state.
	began := time.Now()
	firstIn, err := rec.waitAck(began, o.step, func(e sendEvent) bool { return e.res.Group == o.group })
	if err != nil {
		return fmt.Errorf("warm-up: no send acknowledged on %s: %v", o.group, err)
	}
	firstOut, err := rec.waitAck(began, o.step, func(e sendEvent) bool { return e.res.Group != o.group })
	if err != nil {
		return fmt.Errorf("warm-up: no send acknowledged outside %s: %v", o.group, err)
	}
	steady := firstIn
	if firstOut.After(steady) {
		steady = firstOut
	}
	time.Sleep(o.warmup)

	if g, _, err = reg.waitFor(o.group, "group healthy before the stop", o.step, healthy); err != nil {
		return err
	}
	victim, victimAddr, heir, epoch := g.Master.ID, g.Master.Addr, g.Slave.ID, g.Epoch
	pid, err := pidOf(o.home, victim)
	if err != nil {
		return err
	}
	stoppedMu.Lock()
	err = syscall.Kill(pid, syscall.SIGSTOP)
	stoppedPID = pid
	stoppedMu.Unlock()
	if err != nil {
		return fmt.Errorf("SIGSTOP %d: %v", pid, err)
	}
	stopped := time.Now()
	rel := func(t time.Time) string { return "+" + secs(t.Sub(stopped)) }

	var writableAt, contAt, roAt, rejoinedAt time.Time
	var pg api.GroupInfo
	if o.failover == "on" {
		pg, writableAt, err = reg.waitFor(o.group, "promotion", o.step, func(g api.GroupInfo) bool {
			return g.Writable() && g.Master.ID == heir && g.Epoch > epoch
		})
		if err != nil {
			return err
		}
		continueStopped()
		contAt = time.Now()
		_, rejoinedAt, err = reg.waitFor(o.group, victim+" rejoined as slave", o.step, func(g api.GroupInfo) bool {
			return healthy(g) && g.Master.ID == heir && g.Slave.ID == victim
		})
		if err != nil {
			return err
		}
	} else {
		_, roAt, err = reg.waitFor(o.group, "group read-only", o.step, func(g api.GroupInfo) bool { return !g.Writable() })
		if err != nil {
			return err
		}
		time.Sleep(o.hold)
		continueStopped()
		contAt = time.Now()
		pg, writableAt, err = reg.waitFor(o.group, "group writable again", o.step, func(g api.GroupInfo) bool {
			return g.Writable() && g.Master.ID == victim
		})
		if err != nil {
			return err
		}
	}
	endAt := writableAt.Add(o.observe)
	if !rejoinedAt.IsZero() && rejoinedAt.Add(2*time.Second).After(endAt) {
		endAt = rejoinedAt.Add(2 * time.Second)
	}
	time.Sleep(time.Until(endAt))
	cancel()
	wg.Wait()
	evs := rec.snapshot()
	if o.trace != "" {
		if err := writeTrace(o.trace, evs, stopped); err != nil {
			return err
		}
	}

	fmt.Printf("SIGSTOP %s (pid %d) at +0.00s (epoch %d); ", victim, pid, epoch)
	if o.failover == "on" {
		fmt.Printf("registry: %s promoted (epoch %d) %s; SIGCONT %s; %s slave again and connected %s\n",
			heir, pg.Epoch, rel(writableAt), rel(contAt), victim, rel(rejoinedAt))
	} else {
		fmt.Printf("registry: %s read-only %s; SIGCONT %s; writable again (epoch %d, master %s) %s\n",
			o.group, rel(roAt), rel(contAt), pg.Epoch, pg.Master.ID, rel(writableAt))
	}

	// The fault window: from the stop until the group is writable and its
	// old master continued. Every send in flight at some time in it counts.
	winEnd := writableAt
	if contAt.After(winEnd) {
		winEnd = contAt
	}
	var all, keyed, unkeyed []time.Duration
	var maxSend sendEvent
	var failed int
	for _, e := range evs {
		if e.start.After(winEnd) || e.end.Before(stopped) {
			continue
		}
		d := e.end.Sub(e.start)
		all = append(all, d)
		if e.keyed {
			keyed = append(keyed, d)
		} else {
			unkeyed = append(unkeyed, d)
		}
		if d > maxSend.end.Sub(maxSend.start) {
			maxSend = e
		}
		if e.err != nil {
			failed++
		}
	}
	var before, after []time.Duration
	for _, e := range evs {
		switch {
		case e.start.After(winEnd):
			after = append(after, e.end.Sub(e.start))
		case !e.start.Before(steady) && e.end.Before(stopped):
			before = append(before, e.end.Sub(e.start))
		}
	}
	if len(all) == 0 {
		return errors.New("no sends in the fault window")
	}
	where := "acknowledged on " + maxSend.res.Group
	if maxSend.err != nil {
		where = "failed: " + maxSend.err.Error()
	}
	fmt.Printf("=> longest wait for an acknowledgement, sends in flight during the fault (SIGSTOP..%s, %d sends, %d failed): max %s (%s, started %s, ended %s, %s), p99 %s, p50 %s; keyed max %s, unkeyed max %s\n",
		rel(winEnd), len(all), failed, secs(slices.Max(all)), map[bool]string{true: "keyed", false: "unkeyed"}[maxSend.keyed],
		rel(maxSend.start), rel(maxSend.end), where, secs(quantile(all, 0.99)), secs(quantile(all, 0.5)), secs(maxOr0(keyed)), secs(maxOr0(unkeyed)))
	if len(before) > 0 {
		fmt.Printf("   sends before it (%d, after the first acknowledgements, %s from the start): max %s, p99 %s\n",
			len(before), secs(steady.Sub(began)), secs(slices.Max(before)), secs(quantile(before, 0.99)))
	}
	if len(after) > 0 {
		fmt.Printf("   sends started after it (%d): max %s, p99 %s\n", len(after), secs(slices.Max(after)), secs(quantile(after, 0.99)))
	}
	fmt.Printf("   longest stretch with no acknowledgement at all during the fault: %s; with none from %s: %s; with none from the other groups: %s\n",
		secs(longestGap(evs, stopped, winEnd, func(sendEvent) bool { return true })),
		o.group, secs(longestGap(evs, stopped, winEnd, func(e sendEvent) bool { return e.res.Group == o.group })),
		secs(longestGap(evs, stopped, winEnd, func(e sendEvent) bool { return e.res.Group != o.group })))

	// When the group, writable again, gets messages.
	first := func(match func(sendEvent) bool) string {
		t := rec.firstAck(writableAt, match)
		if t.IsZero() {
			return "none before the run ended"
		}
		return "+" + secs(t.Sub(writableAt))
	}
	inGroup := func(e sendEvent) bool { return e.res.Group == o.group }
	fmt.Printf("=> %s writable again at %s: first acknowledgement on a %s queue %s after it (any message); first message sent after it that landed on %s %s (unkeyed: %s)\n",
		o.group, rel(writableAt), o.group, first(inGroup), o.group,
		first(func(e sendEvent) bool { return inGroup(e) && e.start.After(writableAt) }),
		first(func(e sendEvent) bool { return inGroup(e) && !e.keyed && e.start.After(writableAt) }))
	fmt.Printf("   unkeyed messages landing on %s (share): before the fault %s", o.group, share(evs, steady, stopped, o.group))
	for _, b := range [][2]time.Duration{{0, 2 * time.Second}, {2 * time.Second, 4 * time.Second}, {4 * time.Second, 6 * time.Second}, {6 * time.Second, o.observe}} {
		if b[1] > b[0] {
			fmt.Printf(", +%v..+%v %s", b[0].Seconds(), b[1].Seconds(), share(evs, writableAt.Add(b[0]), writableAt.Add(b[1]), o.group))
		}
	}
	fmt.Println(" (by send start, after writable)")
	var stale int
	for _, e := range evs {
		if e.err == nil && e.res.Broker == victimAddr && e.end.After(writableAt) && o.failover == "on" {
			stale++
		}
	}
	st := p.Stats()
	fmt.Printf("   producer: %d sends, %d retries, %d given up, %d duplicates answered", len(evs), st.Retries, st.GivenUp, st.Duplicates)
	if o.failover == "on" {
		fmt.Printf("; acknowledgements from the old master after the promotion: %d", stale)
	}
	fmt.Println()
	return nil
}

func maxOr0(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return slices.Max(ds)
}

// longestGap is the longest stretch in [from, to] with no matching
// acknowledgement.
func longestGap(evs []sendEvent, from, to time.Time, match func(sendEvent) bool) time.Duration {
	var ts []time.Time
	for _, e := range evs {
		if e.err == nil && match(e) && e.end.After(from) && e.end.Before(to) {
			ts = append(ts, e.end)
		}
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	prev, gap := from, time.Duration(0)
	for _, t := range append(ts, to) {
		gap = max(gap, t.Sub(prev))
		prev = t
	}
	return gap
}

// share is the fraction of unkeyed messages started in [from, to) that
// landed on group, as "n/m".
func share(evs []sendEvent, from, to time.Time, group string) string {
	var n, m int
	for _, e := range evs {
		if e.keyed || e.err != nil || e.start.Before(from) || !e.start.Before(to) {
			continue
		}
		m++
		if e.res.Group == group {
			n++
		}
	}
	return fmt.Sprintf("%d/%d", n, m)
}

// writeTrace writes one line per send: start and end in ms from the fault,
// keyed, group, queue, broker, and the error if it failed.
func writeTrace(path string, evs []sendEvent, zero time.Time) error {
	var b strings.Builder
	b.WriteString("start_ms,end_ms,wait_ms,keyed,group,queue,broker,duplicate,error\n")
	slices.SortFunc(evs, func(a, b sendEvent) int { return a.start.Compare(b.start) })
	for _, e := range evs {
		errs := ""
		if e.err != nil {
			errs = strconv.Quote(e.err.Error())
		}
		fmt.Fprintf(&b, "%d,%d,%d,%t,%s,%d,%s,%t,%s\n", e.start.Sub(zero).Milliseconds(), e.end.Sub(zero).Milliseconds(),
			e.end.Sub(e.start).Milliseconds(), e.keyed, e.res.Group, e.res.Queue, e.res.Broker, e.res.Duplicate, errs)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
