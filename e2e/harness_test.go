package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/tlsconf"
)

// freeBase finds a base port whose span ports are all free on 127.0.0.1,
// below the kernel's ephemeral ports: a process restarted by a test must
// find its ports free, and an outgoing connection's local port, which the
// kernel picks from that range, could hold one meanwhile.
func freeBase(t *testing.T, span int) int {
	t.Helper()
	top := 32768 // Linux's default first ephemeral port
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if lo, err := strconv.Atoi(f[0]); err == nil && lo > 20000+span {
				top = lo
			}
		}
	}
	for try := range 50 {
		base := 20000 + ((os.Getpid()+try*7919)%((top-20000)/span-1))*span
		ok := true
		for p := base + 1; p < base+span && ok; p++ {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				ok = false
				break
			}
			ln.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatalf("no free range of %d ports", span)
	return 0
}

// localCluster is a cluster started by scripts/cluster.sh under its own
// FERRY_HOME (a t.TempDir) and port range.
type localCluster struct {
	t      *testing.T
	root   string
	home   string
	env    []string
	base   int
	groupN int // FERRY_GROUPS: g1..gN
	slaveN int // FERRY_SLAVES: slaves per group
	meta   string
	mc     *client.Client
	// With FERRY_TLS=1: the client config of cluster.sh's ferryctl
	// certificate (mc uses it) and ctl's flags for it.
	tls      *tls.Config
	tlsFlags []string
}

// brokerIndex is a cluster.sh broker's index j in a cluster of groups with
// slaves each: gN-master is 2N-1, gN-slave 2N, and gN-slaveK (K >= 2) comes
// after every master and first slave, group by group (its ports:
// brokerPortOf).
func brokerIndex(name string, groups, slaves int) (int, bool) {
	g, role, ok := strings.Cut(strings.TrimPrefix(name, "g"), "-")
	n, err := strconv.Atoi(g)
	if !ok || err != nil || n < 1 || n > groups || !strings.HasPrefix(name, "g") {
		return 0, false
	}
	switch role {
	case "master":
		return 2*n - 1, true
	case "slave":
		return 2 * n, true
	}
	k, err := strconv.Atoi(strings.TrimPrefix(role, "slave"))
	if !strings.HasPrefix(role, "slave") || err != nil || k < 2 || k > slaves || strconv.Itoa(k) != role[len("slave"):] {
		return 0, false
	}
	return 2*groups + (n-1)*(slaves-1) + (k - 1), true
}

// Broker port kinds, in cluster.sh's order.
const (
	portData = iota
	portHA
	portMetrics
)

// brokerPortOf is broker j's port of a kind, as cluster.sh lays them out:
// BASE+30+j, +40+j, +50+j up to the ninth broker, then three a broker from
// BASE+60.
func brokerPortOf(base, j, kind int) int {
	if j <= 9 {
		return base + 30 + 10*kind + j
	}
	return base + 60 + 3*(j-10) + kind
}

// clusterSpan is how many ports from the base a cluster of groups with
// slaves each uses.
func clusterSpan(groups, slaves int) int { return 60 + 3*max(0, groups*(slaves+1)-9) }

// startLocalCluster runs `cluster.sh start` with extra environment
// (e.g. FERRY_FLUSH=sync) and stops the cluster when the test ends.
func startLocalCluster(t *testing.T, extraEnv ...string) *localCluster {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	groupN, slaveN := 2, 1
	for _, e := range extraEnv {
		if v, ok := strings.CutPrefix(e, "FERRY_GROUPS="); ok {
			if groupN, err = strconv.Atoi(v); err != nil {
				t.Fatalf("%s: %v", e, err)
			}
		}
		if v, ok := strings.CutPrefix(e, "FERRY_SLAVES="); ok {
			if slaveN, err = strconv.Atoi(v); err != nil {
				t.Fatalf("%s: %v", e, err)
			}
		}
	}
	base := freeBase(t, clusterSpan(groupN, slaveN))
	c := &localCluster{t: t, root: root, home: t.TempDir(), base: base, groupN: groupN, slaveN: slaveN}
	c.env = append(os.Environ(), "FERRY_HOME="+c.home, fmt.Sprintf("FERRY_BASE_PORT=%d", base))
	c.env = append(c.env, extraEnv...)
	c.meta = fmt.Sprintf("127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", base+1, base+2, base+3)
	started := time.Now()
	// Registered first: a start that fails after launching processes
	// (say a broken script) must not leave them running.
	t.Cleanup(c.stopAll)
	out := c.script("start")
	if !strings.Contains(out, "cluster ready") {
		t.Fatalf("start:\n%s", out)
	}
	t.Logf("cluster up in %v (FERRY_HOME %s, base port %d)", time.Since(started).Round(100*time.Millisecond), c.home, base)
	if slices.Contains(extraEnv, "FERRY_TLS=1") {
		dir := filepath.Join(c.home, "tls")
		ca, cert, key := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ctl.pem"), filepath.Join(dir, "ctl-key.pem")
		c.tlsFlags = []string{"--tls-ca", ca, "--tls-cert", cert, "--tls-key", key}
		if c.tls, err = tlsconf.ClientConfig(ca, cert, key); err != nil {
			t.Fatal(err)
		}
	}
	mc, err := client.New(client.Config{Addrs: strings.Split(c.meta, ","), Transport: transport.ClientConfig{TLS: c.tls}})
	if err != nil {
		t.Fatal(err)
	}
	c.mc = mc
	t.Cleanup(func() { mc.Close() })
	return c
}

// stopAll stops the cluster: SIGTERM (and SIGCONT, for a stopped process)
// to every recorded PID at once, so they shut down together, then
// `cluster.sh stop`, which waits for each and kills what is left.
func (c *localCluster) stopAll() {
	if c.t.Failed() {
		names := []string{"g1-master", "g1-slave"}
		for k := 2; k <= c.slaveN; k++ {
			names = append(names, fmt.Sprintf("g1-slave%d", k))
		}
		for _, name := range names {
			if b, err := os.ReadFile(filepath.Join(c.home, "logs", name+".log")); err == nil {
				lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
				c.t.Logf("last lines of %s.log:\n%s", name, strings.Join(lines[max(0, len(lines)-15):], "\n"))
			}
		}
	}
	files, _ := filepath.Glob(filepath.Join(c.home, "pids", "*.pid"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGCONT)
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
	}
	c.script("stop")
}

func (c *localCluster) script(args ...string) string {
	c.t.Helper()
	cmd := exec.Command("bash", append([]string{filepath.Join(c.root, "scripts", "cluster.sh")}, args...)...)
	cmd.Env = c.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.t.Fatalf("cluster.sh %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func (c *localCluster) ctl(args ...string) string {
	c.t.Helper()
	cmd := exec.Command(filepath.Join(c.home, "bin", "ferryctl"), append(append([]string{"--meta", c.meta}, c.tlsFlags...), args...)...)
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		c.t.Fatalf("ferryctl %v: %v\n%s%s", args, err, out, stderr)
	}
	return string(out)
}

// ctlExit runs ferryctl and returns its exit code, stdout and stderr.
func (c *localCluster) ctlExit(args ...string) (int, string, string) {
	c.t.Helper()
	cmd := exec.Command(filepath.Join(c.home, "bin", "ferryctl"), append(append([]string{"--meta", c.meta}, c.tlsFlags...), args...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		c.t.Fatalf("ferryctl %v: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

func (c *localCluster) pid(name string) int {
	c.t.Helper()
	pid, err := c.pidOf(name)
	if err != nil {
		c.t.Fatal(err)
	}
	return pid
}

// pidOf is the PID cluster.sh (or restart) recorded for name.
func (c *localCluster) pidOf(name string) (int, error) {
	b, err := os.ReadFile(filepath.Join(c.home, "pids", name+".pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// signal sends sig to the process cluster.sh recorded for name.
//
// SIGSTOP returns only once every thread of the process has stopped: the
// kernel delivers the signal asynchronously, and a test that acts right
// after it must not race with the last moments of the process.
func (c *localCluster) signal(name string, sig syscall.Signal) {
	c.t.Helper()
	pid := c.pid(name)
	if err := syscall.Kill(pid, sig); err != nil {
		c.t.Fatalf("signal %v to %s: %v", sig, name, err)
	}
	if sig == syscall.SIGSTOP {
		testwait.For(c.t, 10*time.Second, name+" to stop", func() bool { return stopped(pid) })
	}
}

// stopped reports whether every thread of pid is stopped (state T).
func stopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || i+2 >= len(s) || (s[i+2] != 'T' && s[i+2] != 't') {
			return false
		}
	}
	return true
}

// cmdline is the command line of the running process recorded for name, as
// cluster.sh started it.
func (c *localCluster) cmdline(name string) []string {
	c.t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c.pid(name)))
	if err != nil {
		c.t.Fatalf("command line of %s: %v", name, err)
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if len(args) < 2 {
		c.t.Fatalf("command line of %s: %q", name, b)
	}
	return args
}

// kill9 kills the process recorded for name with SIGKILL and waits until it
// is gone (its ports are free then).
func (c *localCluster) kill9(name string) {
	c.t.Helper()
	pid := c.pid(name)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		c.t.Fatalf("kill -9 %s: %v", name, err)
	}
	testwait.ForEvery(c.t, 10*time.Second, 10*time.Millisecond, name+" to exit after SIGKILL", func() bool {
		return !alive(pid)
	})
}

// alive reports whether pid is a process that is not a zombie.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// restart starts a process again with the command line cluster.sh gave it
// (from cmdline), appending to its log and recording its PID where
// cluster.sh keeps it, so `cluster.sh stop` stops it.
func (c *localCluster) restart(name string, args []string) {
	c.t.Helper()
	if err := c.start(name, args); err != nil {
		c.t.Fatal(err)
	}
}

// start is restart without the test: it returns what went wrong (a
// goroutine other than the test's may call it).
func (c *localCluster) start(name string, args []string) error {
	logf, err := os.OpenFile(filepath.Join(c.home, "logs", name+".log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "\n==== restarted by the test at %s ====\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = c.env
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("restart %s: %w", name, err)
	}
	go func() { // reap it, whoever stops it
		_ = cmd.Wait()
		logf.Close()
	}()
	if err := os.WriteFile(filepath.Join(c.home, "pids", name+".pid"), []byte(fmt.Sprintf("%d\n", cmd.Process.Pid)), 0o644); err != nil {
		_ = cmd.Process.Kill() // nobody could stop it by its PID
		return fmt.Errorf("restart %s: %w", name, err)
	}
	return nil
}

// groups asks the metaserver for the broker groups.
func (c *localCluster) groups() ([]api.GroupInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return c.mc.Groups(ctx)
}

func (c *localCluster) group(name string) (api.GroupInfo, bool) {
	gs, err := c.groups()
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

// brokerPort returns a broker's port of a kind (portData, portHA,
// portMetrics).
func (c *localCluster) brokerPort(broker string, kind int) int {
	c.t.Helper()
	j, ok := brokerIndex(broker, c.groupN, c.slaveN)
	if !ok {
		c.t.Fatalf("no broker %s", broker)
	}
	return brokerPortOf(c.base, j, kind)
}

// addr is a broker's data address (where producers send), as the registry
// and producer results name it.
func (c *localCluster) addr(broker string) string {
	return fmt.Sprintf("127.0.0.1:%d", c.brokerPort(broker, portData))
}

// haAddr is a broker's HA address.
func (c *localCluster) haAddr(broker string) string {
	return fmt.Sprintf("127.0.0.1:%d", c.brokerPort(broker, portHA))
}

// dataDir is a broker's data directory (its commit log).
func (c *localCluster) dataDir(broker string) string {
	c.brokerPort(broker, portData)
	return filepath.Join(c.home, "data", broker)
}

// masterOf returns the process name of a group's current master by the
// registry: cluster.sh gives each broker its process name as its id. "" if
// the metaserver does not answer or the group has no master.
func (c *localCluster) masterOf(group string) string {
	c.t.Helper()
	g, ok := c.group(group)
	if !ok || g.Master.ID == "" {
		return ""
	}
	c.brokerPort(g.Master.ID, portData)
	return g.Master.ID
}

// waitMembers waits until the registry shows group with master and slave
// (broker ids, "" for none) at epoch, writable, and returns it.
func (c *localCluster) waitMembers(group, master, slave string, epoch uint32, timeout time.Duration, why string) api.GroupInfo {
	c.t.Helper()
	var g api.GroupInfo
	testwait.ForEvery(c.t, timeout, 20*time.Millisecond, fmt.Sprintf("%s: the registry to show %s writable at epoch %d with master %q and slave %q", why, group, epoch, master, slave), func() bool {
		var ok bool
		g, ok = c.group(group)
		return ok && g.Master.ID == master && g.Slave.ID == slave && g.Epoch == epoch && g.State == "RW"
	})
	return g
}

// brokersJSON runs `ferryctl brokers --json`.
func (c *localCluster) brokersJSON() map[string]api.GroupInfo {
	c.t.Helper()
	var gs []api.GroupInfo
	if err := json.Unmarshal([]byte(c.ctl("brokers", "--json")), &gs); err != nil {
		c.t.Fatalf("ferryctl brokers --json: %v", err)
	}
	out := map[string]api.GroupInfo{}
	for _, g := range gs {
		out[g.Name] = g
	}
	return out
}

// metrics reads a broker's Prometheus metrics as name -> value (labels are
// part of the name); false if the broker does not answer.
func (c *localCluster) metrics(broker string) (map[string]float64, bool) {
	return c.readMetrics(c.brokerPort(broker, portMetrics))
}

// metaMetrics reads the metrics of every metaserver that answers.
func (c *localCluster) metaMetrics() []map[string]float64 {
	var out []map[string]float64
	for i := 1; i <= 3; i++ {
		if m, ok := c.readMetrics(c.base + 20 + i); ok {
			out = append(out, m)
		}
	}
	return out
}

// metaCounter sums a counter over the metaservers that answer: a leader's
// failover counters are its own, so the sum counts every leader's
// decisions once.
func (c *localCluster) metaCounter(name string) float64 {
	var sum float64
	for _, m := range c.metaMetrics() {
		sum += m[name]
	}
	return sum
}

// metricsGet GETs path on a server's metrics port: over HTTPS with
// FERRY_TLS=1 (with ctl's certificate), and with FERRY_AUTH=1 with the
// bootstrap admin's token, as Prometheus would scrape it.
func (c *localCluster) metricsGet(port int, path string) (*http.Response, error) {
	scheme, tr := "http", &http.Transport{}
	if c.tls != nil {
		scheme, tr.TLSClientConfig = "https", c.tls
	}
	hc := http.Client{Timeout: 2 * time.Second, Transport: tr}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("%s://127.0.0.1:%d%s", scheme, port, path), nil)
	if err != nil {
		return nil, err
	}
	if tok, err := os.ReadFile(filepath.Join(c.home, "auth", "admin.token")); err == nil {
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	return hc.Do(req)
}

// readMetrics reads a server's Prometheus metrics as name -> value; false
// if the server does not answer.
func (c *localCluster) readMetrics(port int) (map[string]float64, bool) {
	return parseMetrics(c.metricsGet(port, "/metrics"))
}

// readMetrics reads Prometheus metrics as name -> value from a plain HTTP
// url; false if the server does not answer.
func readMetrics(url string) (map[string]float64, bool) {
	hc := http.Client{Timeout: 2 * time.Second}
	return parseMetrics(hc.Get(url))
}

func parseMetrics(resp *http.Response, err error) (map[string]float64, bool) {
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, false
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err() == nil
}

// waitMaster waits until a group's master process (the registry's) answers
// its metrics as writable with its slave connected, and the metaserver has
// the group writable: the state of a freshly started cluster.
func (c *localCluster) waitMaster(group string, timeout time.Duration, why string) {
	c.t.Helper()
	testwait.ForEvery(c.t, timeout, 50*time.Millisecond, fmt.Sprintf("%s: %s's master writable with its slave connected", why, group), func() bool {
		master := c.masterOf(group)
		if master == "" {
			return false
		}
		m, ok := c.metrics(master)
		if !ok || m["ferrymq_broker_writable"] != 1 || m["ferrymq_broker_slave_connected"] != 1 {
			return false
		}
		g, ok := c.group(group)
		return ok && g.State == "RW" && g.Last.SlaveConnected && g.SlaveHeartbeatAgeMillis >= 0
	})
}

// waitWritable waits until a group's master process (the registry's)
// answers its metrics as writable and the metaserver has the group
// writable, slave or not.
func (c *localCluster) waitWritable(group string, timeout time.Duration, why string) {
	c.t.Helper()
	testwait.ForEvery(c.t, timeout, 50*time.Millisecond, fmt.Sprintf("%s: %s's master writable", why, group), func() bool {
		master := c.masterOf(group)
		if master == "" {
			return false
		}
		m, ok := c.metrics(master)
		if !ok || m["ferrymq_broker_writable"] != 1 {
			return false
		}
		g, ok := c.group(group)
		return ok && g.State == "RW"
	})
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}

func grepLines(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
