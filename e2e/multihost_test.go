package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
)

// TestMultiHost runs the cluster of deploy/hosts across Linux network
// namespaces, one per host, each with its own address on a bridge (and
// 3 ms of netem delay on its link where the kernel has netem), from the
// systemd units' command lines expanded with the hosts' settings files, as
// a host would run them: only the addresses (10.0.0.N becomes this run's
// 10.77.S.N), the binaries' and data's paths, and the timing knobs the
// settings offer (FERRY_METASERVER_ARGS, FERRY_BROKER_ARGS) differ. The
// test process reaches every host through its own address on the bridge.
//
// g1 is a group of three (g1-master on host-a, g1-slave on host-b,
// g1-slave2 on host-e), g2 a master and a slave. Under a HIGH load with the
// producer SDK it kills g1's master (host-a) with SIGKILL and waits for the
// metaservers to promote one of its slaves (the other stays in the sync
// set); restarts the old master, which rejoins as a slave and enters the
// set again (g1-slave2 starts once g1 has its master and first slave, as
// docs/deploy.md says to grow a group); cuts host-c
// (metaserver m3 and g2's master) off the network and waits for g2's slave
// on host-d to be promoted; heals, and waits for m3 to catch up and the
// old g2 master to rejoin as the slave. Then every message the SDK
// acknowledged must be stored (a HIGH message acknowledged OK is never
// lost to a failover), with the load's other promises (once-only storage,
// key order), and each group's slave must hold its master's whole log.
//
// It needs root and iproute2, and skips where either is missing.
func TestMultiHost(t *testing.T) {
	skipShort(t)
	if os.Geteuid() != 0 {
		t.Skip("TestMultiHost needs root: it makes network namespaces, veth pairs and a bridge (CI runs it as root)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("TestMultiHost needs iproute2's ip: " + err.Error())
	}
	began := time.Now()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	bin := filepath.Join(home, "bin")
	build := exec.Command("go", "build", "-o", bin+string(filepath.Separator), "./cmd/ferry-metaserver", "./cmd/ferry-broker")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	built := time.Now()

	n := newNetns(t)
	units := deployedUnits(t, filepath.Join(root, "deploy"))
	hosts := map[string]bool{}
	for _, u := range units {
		hosts[u.host] = true
	}
	for _, h := range slices.Sorted(maps.Keys(hosts)) {
		n.addHost(h)
	}
	t.Logf("network: bridge %s, the test at %s, hosts %v; netem delay: %s", n.bridge, n.addr(0), n.hostAddrs(), n.delay)

	// The settings as deployed, at this run's addresses, with the local
	// cluster's timing (a 4 s session, a 500 ms failover margin) so two
	// failovers fit in the test's time.
	timing := map[string]string{
		"FERRY_METASERVER_ARGS": "-session 4s -failover-margin 500ms -lag-time 5s",
		"FERRY_BROKER_ARGS":     "-heartbeat 1s -session 4s",
	}
	procs := map[string]*hostProc{} // by broker or metaserver id
	// A group's brokers past its first two (g1-slave2) start once the group
	// has its master and slave: a newcomer takes its preferred place only
	// while it is free, so a second slave registering before the master
	// would take the master's.
	type pending struct {
		host, name string
		argv       []string
	}
	var later []pending
	perGroup := map[string]int{}
	var metaAddrs []string
	// Each file a unit loads as a credential (the metaservers' raft
	// secret), the same on every host, as systemd hands it to the unit: a
	// copy in the unit's own CREDENTIALS_DIRECTORY.
	secrets := map[string]string{}
	for _, u := range units {
		env := map[string]string{}
		for k, v := range u.env {
			env[k] = n.subst(v)
		}
		for k, v := range timing {
			if _, ok := env[k]; !ok {
				t.Fatalf("%s: the settings no longer have %s, which the test sets", u.where, k)
			}
			env[k] = v
		}
		env["STATE_DIRECTORY"] = filepath.Join(home, u.host)
		if len(u.credentials) > 0 {
			dir := filepath.Join(home, u.host, "credentials", cmp.Or(u.instance, "metaserver"))
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			for name, path := range u.credentials {
				if secrets[path] == "" {
					secrets[path] = auth.NewToken()
				}
				if err := os.WriteFile(filepath.Join(dir, name), []byte(secrets[path]+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			env["CREDENTIALS_DIRECTORY"] = dir
		}
		argv, err := expandUnit(u.execStart, u.instance, env)
		if err != nil {
			t.Fatalf("%s: %v", u.where, err)
		}
		argv[0] = filepath.Join(bin, filepath.Base(argv[0]))
		name := u.instance
		if name == "" {
			name = env["FERRY_META_ID"]
			metaAddrs = strings.Split(env["FERRY_META_ADDRS"], ",")
		}
		if g := env["FERRY_GROUP"]; u.instance != "" {
			if perGroup[g]++; perGroup[g] > 2 {
				later = append(later, pending{u.host, name, argv})
				continue
			}
		}
		procs[name] = n.start(t, home, u.host, name, argv)
	}
	for _, name := range []string{"m1", "m2", "m3", "g1-master", "g1-slave", "g2-master", "g2-slave"} {
		if procs[name] == nil {
			t.Fatalf("deploy/hosts runs no %s (it runs %v)", name, procs)
		}
	}
	mc, err := client.New(client.Config{Addrs: metaAddrs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mc.Close() })
	c := &localCluster{t: t, root: root, home: home, meta: strings.Join(metaAddrs, ","), mc: mc}

	group := func(name string) (api.GroupInfo, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		gs, err := mc.Groups(ctx)
		if err != nil {
			return api.GroupInfo{}, false
		}
		for _, g := range gs {
			if g.Name == name {
				return g, true
			}
		}
		return api.GroupInfo{}, false
	}
	// waitGroup waits until the registry shows the group writable at epoch
	// with master and slave (broker ids), and with the slave copying when
	// there is one.
	waitGroup := func(name, master, slave string, epoch uint32, why string) time.Time {
		t.Helper()
		testwait.ForEvery(t, 45*time.Second, 20*time.Millisecond, fmt.Sprintf("%s: %s writable at epoch %d with master %q and slave %q", why, name, epoch, master, slave), func() bool {
			g, ok := group(name)
			return ok && g.State == "RW" && g.Epoch == epoch && g.Master.ID == master && g.Slave.ID == slave &&
				(slave == "" || g.Last.SlaveConnected && g.SlaveHeartbeatAgeMillis >= 0)
		})
		return time.Now()
	}
	// waitSet waits until the registry shows the group writable at epoch,
	// led by one of masters, with every other broker of members in its
	// sync set but those in out, and returns its master.
	waitSet := func(name string, masters, members, out []string, epoch uint32, why string) (string, time.Time) {
		t.Helper()
		var master string
		testwait.ForEvery(t, 45*time.Second, 20*time.Millisecond, fmt.Sprintf("%s: %s writable at epoch %d, led by one of %v, with the others of %v but %v in its sync set", why, name, epoch, masters, members, out), func() bool {
			g, ok := group(name)
			if !ok || g.State != "RW" || g.Epoch != epoch || !slices.Contains(masters, g.Master.ID) {
				return false
			}
			var want []string
			for _, m := range members {
				if m != g.Master.ID && !slices.Contains(out, m) {
					want = append(want, m)
				}
			}
			master = g.Master.ID
			return slices.Equal(slices.Sorted(slices.Values(g.InSync)), slices.Sorted(slices.Values(want)))
		})
		return master, time.Now()
	}
	g1Members := []string{"g1-master", "g1-slave", "g1-slave2"}
	checkExited := func() {
		for name, p := range procs {
			if p.exited() && !p.killed {
				t.Fatalf("%s exited on %s; its log:\n%s", name, p.host, p.tail(20))
			}
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range slices.Sorted(maps.Keys(procs)) {
				t.Logf("last lines of %s's log (%s):\n%s", name, procs[name].host, procs[name].tail(12))
			}
		}
	})

	waitGroup("g1", "g1-master", "g1-slave", 1, "at the start")
	waitGroup("g2", "g2-master", "g2-slave", 1, "at the start")
	for _, p := range later {
		procs[p.name] = n.start(t, home, p.host, p.name, p.argv)
	}
	if procs["g1-slave2"] == nil {
		t.Fatalf("deploy/hosts runs no g1-slave2 (it runs %v)", procs)
	}
	waitSet("g1", []string{"g1-master"}, g1Members, nil, 1, "g1-slave2 started")
	checkExited()
	ready := time.Now()
	t.Logf("cluster ready across the namespaces %v after the build", ready.Sub(built).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := mc.CreateTopic(ctx, api.CreateTopicRequest{Name: "multihost", Queues: 8}); err != nil {
		t.Fatal(err)
	}
	l := startLoad(t, c, loadConfig{
		topic: "multihost", workers: 4, keysPerWorker: 8, unkeyedEvery: 4, rate: 50,
		maxMessages: 40_000, maxDuration: 80 * time.Second, reliability: protocol.High,
	})
	l.waitAcked(300, 30*time.Second, "before the faults")

	// 1. kill -9 g1's master on host-a: one of its slaves (host-b, host-e)
	// is promoted, and the other stays in the sync set.
	g1Old := procs["g1-master"]
	killed := time.Now()
	g1Old.kill9(t)
	promotedID, promoted1 := waitSet("g1", []string{"g1-slave", "g1-slave2"}, g1Members, []string{"g1-master"}, 2, "after kill -9 of g1-master on host-a")
	g1New := procs[promotedID]
	t.Logf("KILL: %s (%s) is g1's master at epoch 2, %v after kill -9 of g1-master (host-a), at %d acknowledgements",
		promotedID, g1New.host, promoted1.Sub(killed).Round(time.Millisecond), l.acked.Load())
	// The old master comes back with its own command line, rejoins as a
	// slave and enters the sync set once caught up.
	restarted := time.Now()
	procs["g1-master"] = n.start(t, home, g1Old.host, "g1-master", g1Old.argv)
	g1Old = procs["g1-master"]
	_, rejoined1 := waitSet("g1", []string{promotedID}, g1Members, nil, 2, "after the restart of g1-master")
	t.Logf("g1-master rejoined g1 as a slave, in the sync set, %v after its restart", rejoined1.Sub(restarted).Round(time.Millisecond))
	checkExited()

	// 2. host-c (metaserver m3 and g2's master) is cut off: g2's slave on
	// host-d is promoted by the metaservers left (m1, m2).
	l.waitAcked(l.acked.Load()+200, 30*time.Second, "before the partition")
	g2Old, g2New := procs["g2-master"], procs["g2-slave"]
	cut := time.Now()
	n.link(t, g2Old.host, false)
	promoted2 := waitGroup("g2", "g2-slave", "", 2, "while host-c is cut off")
	t.Logf("PARTITION: g2-slave (host-d) is g2's master at epoch 2, %v after host-c was cut off, at %d acknowledgements",
		promoted2.Sub(cut).Round(time.Millisecond), l.acked.Load())
	n.link(t, g2Old.host, true)
	healed := time.Now()
	rejoined2 := waitGroup("g2", "g2-slave", "g2-master", 2, "after host-c was reconnected")
	t.Logf("HEAL: g2-master (host-c) rejoined g2 as the slave %v after host-c was reconnected", rejoined2.Sub(healed).Round(time.Millisecond))
	// m3 follows the leader again and has applied what the others
	// committed while it was cut off. Each node is asked for itself.
	nodes := map[string]*client.Client{}
	for _, id := range []string{"m1", "m2", "m3"} {
		nc, err := client.New(client.Config{Addrs: []string{procs[id].flag("-rpc-addr")}})
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		nodes[id] = nc
	}
	status := func(id string) (api.RaftStatus, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		st, err := nodes[id].RaftStatus(ctx)
		return st, err == nil
	}
	var want uint64
	testwait.ForEvery(t, 30*time.Second, 50*time.Millisecond, "m1 or m2 to lead after the heal", func() bool {
		for _, id := range []string{"m1", "m2"} {
			if st, ok := status(id); ok && st.State == "Leader" {
				want = st.CommitIndex
				return true
			}
		}
		return false
	})
	var m3st api.RaftStatus
	testwait.ForEvery(t, 30*time.Second, 50*time.Millisecond, fmt.Sprintf("m3 (host-c) to follow a leader and apply index %d", want), func() bool {
		var ok bool
		m3st, ok = status("m3")
		return ok && m3st.LeaderID != "" && m3st.AppliedIndex >= want
	})
	t.Logf("m3 (host-c) follows %s at term %d and applied index %d (the leader had committed %d at the heal)", m3st.LeaderID, m3st.Term, m3st.AppliedIndex, want)
	checkExited()

	// 3. Both groups take writes from their new masters, then the load
	// stops and everything acknowledged is read back.
	for _, x := range []struct {
		group string
		p     *hostProc
		since time.Time
	}{{"g1", g1New, rejoined1}, {"g2", g2New, rejoined2}} {
		addr := x.p.flag("-addr")
		testwait.ForEvery(t, 30*time.Second, 20*time.Millisecond, fmt.Sprintf("HIGH messages acknowledged by %s's new master %s", x.group, addr), func() bool {
			return l.acksFrom(x.group, addr, x.since).n >= 20
		})
	}
	l.finish()
	l.check(c, t.Name())
	if l.acked.Load() == 0 {
		t.Fatal("no message was acknowledged")
	}
	// Each slave holds its master's whole log: the rejoined ones and g1's
	// slave that was not promoted.
	g1Other := procs["g1-slave"]
	if g1New == g1Other {
		g1Other = procs["g1-slave2"]
	}
	for _, x := range []struct{ master, slave *hostProc }{{g1New, g1Old}, {g1New, g1Other}, {g2New, g2Old}} {
		var end float64
		testwait.ForEvery(t, 30*time.Second, 50*time.Millisecond, fmt.Sprintf("%s and %s to report the same log end", x.master.name, x.slave.name), func() bool {
			mm, ok1 := readMetrics("http://" + x.master.flag("-metrics-addr") + "/metrics")
			sm, ok2 := readMetrics("http://" + x.slave.flag("-metrics-addr") + "/metrics")
			end = mm["ferrymq_broker_log_end_offset"]
			return ok1 && ok2 && end > 0 && sm["ferrymq_broker_log_end_offset"] == end
		})
		t.Logf("%s (master) and %s (slave) both end their logs at %v", x.master.name, x.slave.name, end)
	}
	t.Logf("MULTIHOST: %d acknowledged, %d failed (not acknowledged), every acknowledged message read back; build %v, run %v",
		l.acked.Load(), l.failed.Load(), built.Sub(began).Round(time.Millisecond), time.Since(built).Round(time.Millisecond))
}

// --- the hosts: network namespaces on a bridge -------------------------------------

// netns is this run's network: a bridge in the root namespace with an
// address for the test process, and a namespace per host with a veth into
// the bridge. Names carry the test's PID, so a leftover of a killed run
// does not collide with the next.
type netns struct {
	t      *testing.T
	pid    int
	subnet int // the third octet: 10.77.subnet.0/24
	bridge string
	hosts  []string          // in order: host i+1 has address .i+1
	nsOf   map[string]string // host -> namespace
	vethOf map[string]string // host -> its veth's end on the bridge
	delay  string            // "3ms", or why there is none
}

func newNetns(t *testing.T) *netns {
	t.Helper()
	n := &netns{t: t, pid: os.Getpid(), nsOf: map[string]string{}, vethOf: map[string]string{}}
	n.bridge = fmt.Sprintf("fmqbr%d", n.pid)
	// Probe: can this machine make a namespace at all?
	probe := fmt.Sprintf("ferrymq-%d-probe", n.pid)
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		t.Skipf("TestMultiHost needs network namespaces: ip netns add: %v: %s", err, bytes.TrimSpace(out))
	}
	_ = exec.Command("ip", "netns", "del", probe).Run()
	// A /24 no interface or route of this machine uses.
	for i := range 200 {
		s := 20 + (n.pid+i)%200
		out, err := exec.Command("ip", "-4", "route", "show", "to", "match", fmt.Sprintf("10.77.%d.1", s)).Output()
		if err == nil && !strings.Contains(string(out), fmt.Sprintf("10.77.%d.", s)) {
			n.subnet = s
			break
		}
	}
	if n.subnet == 0 {
		t.Fatal("no free 10.77.x.0/24 subnet")
	}
	// Removed last (cleanups run in reverse), after every process is gone.
	t.Cleanup(n.teardown)
	n.ip("link", "add", n.bridge, "type", "bridge")
	n.ip("link", "set", n.bridge, "up")
	n.ip("addr", "add", n.addr(0)+"/24", "dev", n.bridge)
	return n
}

// addr is host i's address (1-based); 0 is the test's, on the bridge.
func (n *netns) addr(i int) string {
	if i == 0 {
		return fmt.Sprintf("10.77.%d.254", n.subnet)
	}
	return fmt.Sprintf("10.77.%d.%d", n.subnet, i)
}

func (n *netns) hostAddrs() []string {
	var out []string
	for i, h := range n.hosts {
		out = append(out, h+"="+n.addr(i+1))
	}
	return out
}

// deployedNet is the network of deploy/hosts' settings.
var deployedNet = regexp.MustCompile(`\b10\.0\.0\.(\d+)\b`)

// subst moves a settings value from deploy/hosts' addresses (10.0.0.N) to
// this run's (10.77.S.N).
func (n *netns) subst(v string) string {
	return deployedNet.ReplaceAllString(v, fmt.Sprintf("10.77.%d.$1", n.subnet))
}

func (n *netns) ip(args ...string) {
	n.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		n.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
}

// addHost makes host's namespace, with its veth on the bridge at the
// address deploy/hosts gives it (host-a .1, host-b .2, ...), and delay.
func (n *netns) addHost(host string) {
	n.t.Helper()
	i := len(n.hosts) + 1
	if want := fmt.Sprintf("host-%c", 'a'+i-1); host != want {
		n.t.Fatalf("deploy/hosts: host %d is %s; the test maps host-a, host-b, ... to .1, .2, ...", i, host)
	}
	ns := fmt.Sprintf("ferrymq-%d-%s", n.pid, host)
	veth := fmt.Sprintf("fmq%dh%d", n.pid, i)
	n.hosts = append(n.hosts, host)
	n.nsOf[host], n.vethOf[host] = ns, veth
	n.ip("netns", "add", ns)
	n.ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
	n.ip("link", "set", veth, "master", n.bridge, "up")
	n.ip("-n", ns, "link", "set", "lo", "up")
	n.ip("-n", ns, "addr", "add", n.addr(i)+"/24", "dev", "eth0")
	n.ip("-n", ns, "link", "set", "eth0", "up")
	if i == 1 || n.delay == "3ms" {
		out, err := exec.Command("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "3ms").CombinedOutput()
		switch {
		case err == nil:
			n.delay = "3ms"
		case i == 1:
			n.delay = fmt.Sprintf("none: tc qdisc add ... netem delay 3ms: %v: %s (a kernel without CONFIG_NET_SCH_NETEM)", err, bytes.TrimSpace(out))
		default:
			n.t.Fatalf("tc netem on %s: %v: %s", host, err, out)
		}
	}
	// The host answers the test's address before any server starts.
	testwait.ForEvery(n.t, 10*time.Second, 20*time.Millisecond, host+"'s link up", func() bool {
		out, err := exec.Command("ip", "-n", ns, "-br", "link", "show", "eth0").Output()
		return err == nil && strings.Contains(string(out), "UP")
	})
}

// link cuts a host off the bridge (up=false) or puts it back.
func (n *netns) link(t *testing.T, host string, up bool) {
	t.Helper()
	state := "down"
	if up {
		state = "up"
	}
	n.ip("link", "set", n.vethOf[host], state)
}

func (n *netns) teardown() {
	for _, h := range n.hosts {
		// Deleting the bridge's end removes the pair at once, even while
		// a socket left in the namespace (say, retransmitting to a peer
		// that is gone) keeps the namespace itself alive for a while.
		if out, err := exec.Command("ip", "link", "del", n.vethOf[h]).CombinedOutput(); err != nil {
			n.t.Logf("ip link del %s: %v: %s", n.vethOf[h], err, out)
		}
		if out, err := exec.Command("ip", "netns", "del", n.nsOf[h]).CombinedOutput(); err != nil {
			n.t.Logf("ip netns del %s: %v: %s", n.nsOf[h], err, out)
		}
	}
	if out, err := exec.Command("ip", "link", "del", n.bridge).CombinedOutput(); err != nil {
		n.t.Logf("ip link del %s: %v: %s", n.bridge, err, out)
	}
}

// hostProc is a server running in a host's namespace.
type hostProc struct {
	name, host string
	argv       []string
	cmd        *exec.Cmd
	log        string
	done       chan struct{}
	killed     bool
}

// start runs argv in host's namespace (`ip netns exec` execs the program in
// its own process, so the PID is the server's), logging to home/logs, and
// kills it when the test ends.
func (n *netns) start(t *testing.T, home, host, name string, argv []string) *hostProc {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(home, "logs"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := &hostProc{name: name, host: host, argv: argv, log: filepath.Join(home, "logs", name+".log"), done: make(chan struct{})}
	logf, err := os.OpenFile(p.log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(logf, "==== %s on %s: %s\n", name, host, strings.Join(argv, " "))
	p.cmd = exec.Command("ip", append([]string{"netns", "exec", n.nsOf[host]}, argv...)...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s on %s: %v", name, host, err)
	}
	go func() {
		_ = p.cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	t.Cleanup(func() { p.stop(t) })
	// The PID is the server once ip has switched namespaces and exec'd it.
	want := filepath.Base(argv[0])
	testwait.ForEvery(t, 10*time.Second, 5*time.Millisecond, fmt.Sprintf("%s (pid %d) to exec %s", name, p.cmd.Process.Pid, want), func() bool {
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", p.cmd.Process.Pid))
		return p.exited() || err == nil && filepath.Base(exe) == want
	})
	return p
}

func (p *hostProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill9 kills the server with SIGKILL and waits until it is gone.
func (p *hostProc) kill9(t *testing.T) {
	t.Helper()
	p.killed = true
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %s: %v", p.name, err)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s (pid %d) still runs 10 s after SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

// stop ends the server at the test's end: SIGTERM, then SIGKILL after 10 s.
func (p *hostProc) stop(t *testing.T) {
	if p.exited() {
		return
	}
	p.killed = true
	_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(10 * time.Second):
	}
	t.Logf("%s (pid %d) did not stop 10 s after SIGTERM; killing it", p.name, p.cmd.Process.Pid)
	_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Errorf("%s (pid %d) still runs 10 s after SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

// flag is the value of one of the server's flags on its command line.
func (p *hostProc) flag(name string) string {
	for i, a := range p.argv {
		if a == name && i+1 < len(p.argv) {
			return p.argv[i+1]
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

func (p *hostProc) tail(lines int) string {
	b, _ := os.ReadFile(p.log)
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(ls[max(0, len(ls)-lines):], "\n")
}

// --- the deployed settings: deploy/systemd expanded with deploy/hosts ---------------

// deployedUnit is a systemd unit as one host of deploy/hosts runs it.
type deployedUnit struct {
	where, host, instance string
	execStart             string
	env                   map[string]string // from its EnvironmentFiles
	credentials           map[string]string // LoadCredential: name -> file under /etc/ferrymq
}

// deployedUnits reads deploy/hosts: a host runs ferry-metaserver.service
// when its folder has metaserver.env, and ferry-broker@NAME.service for
// each broker-NAME.env; each unit's EnvironmentFile=/etc/ferrymq/F is the
// host's F or, for what every host shares, deploy/hosts/F.
func deployedUnits(t *testing.T, deploy string) []deployedUnit {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(deploy, "hosts"))
	if err != nil {
		t.Fatal(err)
	}
	var out []deployedUnit
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		host := e.Name()
		files, err := os.ReadDir(filepath.Join(deploy, "hosts", host))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			var unit, instance string
			switch name := f.Name(); {
			case name == "metaserver.env":
				unit = "ferry-metaserver.service"
			case strings.HasPrefix(name, "broker-") && strings.HasSuffix(name, ".env"):
				unit, instance = "ferry-broker@.service", strings.TrimSuffix(strings.TrimPrefix(name, "broker-"), ".env")
			default:
				continue
			}
			u := deployedUnit{where: fmt.Sprintf("deploy/systemd/%s on %s", strings.Replace(unit, "@", "@"+instance, 1), host), host: host, instance: instance, env: map[string]string{}}
			b, err := os.ReadFile(filepath.Join(deploy, "systemd", unit))
			if err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(bytes.NewReader(b))
			for sc.Scan() {
				k, v, _ := strings.Cut(strings.TrimSpace(sc.Text()), "=")
				switch k {
				case "ExecStart":
					u.execStart = v
				case "LoadCredential":
					name, path, _ := strings.Cut(v, ":")
					if u.credentials == nil {
						u.credentials = map[string]string{}
					}
					u.credentials[name] = path
				case "EnvironmentFile":
					rel, ok := strings.CutPrefix(strings.ReplaceAll(strings.TrimPrefix(v, "-"), "%i", instance), "/etc/ferrymq/")
					if !ok {
						t.Fatalf("%s: EnvironmentFile %s is not under /etc/ferrymq", u.where, v)
					}
					env, err := os.ReadFile(filepath.Join(deploy, "hosts", host, rel))
					if os.IsNotExist(err) {
						env, err = os.ReadFile(filepath.Join(deploy, "hosts", rel))
					}
					if err != nil {
						t.Fatalf("%s: %v", u.where, err)
					}
					for _, line := range strings.Split(string(env), "\n") {
						if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
							k, v, _ := strings.Cut(line, "=")
							u.env[k] = v
						}
					}
				}
			}
			if u.execStart == "" {
				t.Fatalf("%s: no ExecStart", u.where)
			}
			out = append(out, u)
		}
	}
	if len(out) == 0 {
		t.Fatal("deploy/hosts runs nothing")
	}
	return out
}

var (
	unitBracedVar = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)
	unitWordVar   = regexp.MustCompile(`^\$([A-Za-z_][A-Za-z0-9_]*)$`)
)

// expandUnit splits an ExecStart line as systemd does for the forms the
// units use: %i is the instance, ${VAR} the value within its word, a word
// $VAR the value split at whitespace.
func expandUnit(line, instance string, env map[string]string) ([]string, error) {
	var out []string
	for _, w := range strings.Fields(line) {
		w = strings.ReplaceAll(w, "%i", instance)
		if m := unitWordVar.FindStringSubmatch(w); m != nil {
			v, ok := env[m[1]]
			if !ok {
				return nil, fmt.Errorf("$%s is set by no settings file", m[1])
			}
			out = append(out, strings.Fields(v)...)
			continue
		}
		var missing []string
		w = unitBracedVar.ReplaceAllStringFunc(w, func(r string) string {
			name := unitBracedVar.FindStringSubmatch(r)[1]
			v, ok := env[name]
			if !ok {
				missing = append(missing, name)
			}
			return v
		})
		if len(missing) > 0 || strings.ContainsAny(w, "$%") {
			return nil, fmt.Errorf("%q: unset %v or an expansion the test does not know", w, missing)
		}
		out = append(out, w)
	}
	return out, nil
}
