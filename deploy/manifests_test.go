package deploy

// The deployment files are checked against the real programs: every
// ferry-metaserver and ferry-broker command line in them (compose, the
// Kubernetes StatefulSets with their per-pod settings, the systemd units
// expanded with deploy/hosts) is run through the built binary with -h
// appended, which parses every flag and value and exits 0 only if all are
// good; every port a probe, a Service, a container or the Dockerfile names
// is one the flags listen on; every probe path is one the servers serve
// without credentials, over HTTPS when the server has -tls-cert.
// TestChecksCatchMistakes feeds the checks broken copies of the files, so a
// check that passes anything fails there.

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"gopkg.in/yaml.v3"
)

// probePaths are the HTTP paths the servers serve on -metrics-addr without
// credentials (with authorization on, /metrics needs describe), so the only
// ones a probe may use; HTTPS when the server has -tls-cert.
var probePaths = map[string]bool{"/healthz": true, "/readyz": true}

// listenFlags are each server's flags that name an address it listens on;
// metricsFlag serves the probe paths.
var listenFlags = map[string][]string{
	"ferry-metaserver": {"rpc-addr", "raft-addr", "metrics-addr", "pprof"},
	"ferry-broker":     {"addr", "ha-addr", "metrics-addr", "pprof"},
}

const metricsFlag = "metrics-addr"

// servers holds the built server binaries and their flag sets.
type servers struct {
	dir   string
	flags map[string]map[string]bool // program -> flag name -> is a bool flag
}

var (
	buildOnce sync.Once
	built     *servers
	buildErr  error
)

// programs builds ferry-metaserver and ferry-broker once per test binary.
func programs(t *testing.T) *servers {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ferrymq-deploy-check-")
		if err != nil {
			buildErr = err
			return
		}
		s := &servers{dir: dir, flags: map[string]map[string]bool{}}
		cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "../cmd/ferry-metaserver", "../cmd/ferry-broker")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		for prog := range listenFlags {
			out, err := exec.Command(filepath.Join(dir, prog), "-h").CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("%s -h: %v\n%s", prog, err, out)
				return
			}
			s.flags[prog] = parseUsage(string(out))
			if len(s.flags[prog]) < 5 || !hasKey(s.flags[prog], "dir") {
				buildErr = fmt.Errorf("%s -h printed no flags I can read:\n%s", prog, out)
				return
			}
		}
		built = s
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built != nil {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// usageLine is a flag's first line in the flag package's usage: "  -name"
// (a bool flag) or "  -name type".
var usageLine = regexp.MustCompile(`^  -([A-Za-z0-9][A-Za-z0-9_.-]*)(?: ([A-Za-z0-9]+))?(?:\t|$)`)

// parseUsage returns a program's flags from its -h output: name -> bool flag.
func parseUsage(out string) map[string]bool {
	flags := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		if m := usageLine.FindStringSubmatch(line); m != nil {
			flags[m[1]] = m[2] == ""
		}
	}
	return flags
}

// commandLine is one server's command line found in a deployment file.
type commandLine struct {
	where string   // file and service, pod or unit
	prog  string   // ferry-metaserver or ferry-broker
	args  []string // after the program
	// config is the -config file's settings, when the file is part of the
	// deployment (a Kubernetes ConfigMap).
	config map[string]any
}

// parsed is a command line's flags: name -> value ("true" for a bare bool).
type parsed map[string]string

// port is the port of a listen flag's address (0 if none or not a number).
func (p parsed) port(flag string) int {
	v, ok := p[flag]
	if !ok {
		return 0
	}
	_, ps, err := net.SplitHostPort(v)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(ps)
	return n
}

// listenPorts are the ports the command line's listen flags name.
func (p parsed) listenPorts(prog string) map[int]string {
	out := map[int]string{}
	for _, f := range listenFlags[prog] {
		if n := p.port(f); n > 0 {
			out[n] = f
		}
	}
	return out
}

// checkCommand parses cl against its program's flags as the flag package
// does, reporting every name that is not a flag, and then runs the binary
// with the command line and -h: the program parses every value and exits 0
// only if all of them are good. It returns the flags found.
func (s *servers) checkCommand(cl commandLine) (parsed, []string) {
	var problems []string
	known, ok := s.flags[cl.prog]
	if !ok {
		return nil, []string{fmt.Sprintf("%s: unknown program %q", cl.where, cl.prog)}
	}
	p := parsed{}
	var argv []string // what the binary is run with
	for _, k := range slices.Sorted(maps.Keys(cl.config)) {
		if k == "config" || !hasKey(known, k) {
			problems = append(problems, fmt.Sprintf("%s: its -config file sets %q, which is not a flag of %s", cl.where, k, cl.prog))
			continue
		}
		v := fmt.Sprint(cl.config[k])
		p[k] = v
		argv = append(argv, "-"+k+"="+v)
	}
	for i := 0; i < len(cl.args); i++ {
		a := cl.args[i]
		if !strings.HasPrefix(a, "-") || a == "-" || a == "--" {
			problems = append(problems, fmt.Sprintf("%s: %s takes no arguments but flags; found %q", cl.where, cl.prog, a))
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		isBool, ok := known[name]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: -%s is not a flag of %s", cl.where, name, cl.prog))
			continue
		}
		if !hasValue && !isBool {
			if i+1 >= len(cl.args) {
				problems = append(problems, fmt.Sprintf("%s: -%s has no value", cl.where, name))
				continue
			}
			i++
			value = cl.args[i]
		} else if !hasValue {
			value = "true"
		}
		p[name] = value
		argv = append(argv, "-"+name+"="+value)
	}
	if len(problems) > 0 {
		return p, problems
	}
	cmd := exec.Command(filepath.Join(s.dir, cl.prog), append(argv, "-h")...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		msg := stderr.String()
		if i := strings.Index(msg, "\nUsage of"); i >= 0 {
			msg = msg[:i]
		}
		problems = append(problems, fmt.Sprintf("%s: %s refuses the command line %q: %v: %s", cl.where, cl.prog, argv, err, strings.TrimSpace(msg)))
	}
	return p, problems
}

func hasKey[K comparable, V any](m map[K]V, k K) bool { _, ok := m[k]; return ok }

// serverProgram returns the server a command's first word runs, or "".
func serverProgram(argv0 string) string {
	prog := filepath.Base(argv0)
	if _, ok := listenFlags[prog]; ok {
		return prog
	}
	return ""
}

// --- compose ----------------------------------------------------------------

type composeFile struct {
	Services map[string]struct {
		Image      string   `yaml:"image"`
		Entrypoint []string `yaml:"entrypoint"`
		Command    []string `yaml:"command"`
		Expose     []string `yaml:"expose"`
		Ports      []string `yaml:"ports"`
		Volumes    []string `yaml:"volumes"`
		Secrets    []string `yaml:"secrets"`
	} `yaml:"services"`
	Volumes map[string]any `yaml:"volumes"`
	Secrets map[string]any `yaml:"secrets"`
}

// raftSecretFlag is the metaservers' own secret, which alone opens their
// Raft port: every metaserver the files run has it, from a secret mounted
// into the metaservers alone (a compose secret, a Kubernetes Secret, a
// systemd credential).
const raftSecretFlag = "raft-secret-file"

// composeResult is what the compose file deploys, for the Dockerfile check.
type composeResult struct {
	servers     int
	listenPorts map[int]bool
	groups      map[string][]string // broker group -> its brokers' preferred roles
}

// checkGroups checks each broker group's brokers by their preferred roles
// (group -> one role per broker, the -role flag, master by default): one
// master and at least one slave, so a failover has a slave to promote.
// More slaves make a group of three or more.
func checkGroups(where string, groups map[string][]string) []string {
	var problems []string
	for _, g := range slices.Sorted(maps.Keys(groups)) {
		roles := slices.Sorted(slices.Values(groups[g]))
		masters := 0
		slaves := 0
		for _, r := range roles {
			switch r {
			case "master":
				masters++
			case "slave":
				slaves++
			}
		}
		if masters != 1 || slaves < 1 || masters+slaves != len(roles) {
			problems = append(problems, fmt.Sprintf("%s: group %s: its brokers prefer %v; want one master and the rest (at least one) slaves", where, g, roles))
		}
	}
	return problems
}

// brokerRole is a broker's preferred role by its parsed flags (-role,
// master by default).
func brokerRole(p parsed) string { return cmp.Or(p["role"], "master") }

func (s *servers) checkCompose(name string, data []byte) (composeResult, []string) {
	res := composeResult{listenPorts: map[int]bool{}, groups: map[string][]string{}}
	var f composeFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		return res, []string{fmt.Sprintf("%s: %v", name, err)}
	}
	var problems []string
	for _, svcName := range slices.Sorted(maps.Keys(f.Services)) {
		svc := f.Services[svcName]
		where := fmt.Sprintf("%s: service %s", name, svcName)
		argv := append(slices.Clone(svc.Entrypoint), svc.Command...)
		if len(argv) == 0 {
			problems = append(problems, where+": no command (the image has no entrypoint)")
			continue
		}
		for _, v := range svc.Volumes {
			vol, _, _ := strings.Cut(v, ":")
			if !strings.HasPrefix(vol, ".") && !strings.HasPrefix(vol, "/") && !hasKey(f.Volumes, vol) {
				problems = append(problems, fmt.Sprintf("%s: volume %q is not declared under volumes", where, vol))
			}
		}
		prog := serverProgram(argv[0])
		if prog == "" {
			if filepath.Base(argv[0]) != "ferryctl" {
				problems = append(problems, fmt.Sprintf("%s: runs %q, not a ferrymq program", where, argv[0]))
			}
			continue
		}
		res.servers++
		p, pr := s.checkCommand(commandLine{where: where, prog: prog, args: argv[1:]})
		problems = append(problems, pr...)
		secret, onSecret := strings.CutPrefix(p[raftSecretFlag], "/run/secrets/")
		switch {
		case prog == "ferry-metaserver" && p[raftSecretFlag] == "":
			problems = append(problems, where+": no -"+raftSecretFlag)
		case prog == "ferry-metaserver" && (!onSecret || !slices.Contains(svc.Secrets, secret) || !hasKey(f.Secrets, secret)):
			problems = append(problems, fmt.Sprintf("%s: -%s %s is no compose secret of the service (%v)", where, raftSecretFlag, p[raftSecretFlag], svc.Secrets))
		case prog != "ferry-metaserver" && len(svc.Secrets) > 0:
			problems = append(problems, fmt.Sprintf("%s: a %s mounts the secrets %v (only metaservers hold the raft secret)", where, prog, svc.Secrets))
		}
		listen := p.listenPorts(prog)
		for n := range listen {
			res.listenPorts[n] = true
		}
		if prog == "ferry-broker" {
			res.groups[p["group"]] = append(res.groups[p["group"]], brokerRole(p))
		}
		for _, e := range append(slices.Clone(svc.Expose), svc.Ports...) {
			// "7101", "7101/tcp" or "HOST:CONTAINER"
			e = strings.TrimSuffix(e, "/tcp")
			if i := strings.LastIndexByte(e, ':'); i >= 0 {
				e = e[i+1:]
			}
			n, err := strconv.Atoi(e)
			if err != nil || listen[n] == "" {
				problems = append(problems, fmt.Sprintf("%s: exposes port %q, on which %s does not listen (it listens on %v)", where, e, prog, listen))
			}
		}
		if p["dir"] != "" && !slices.ContainsFunc(svc.Volumes, func(v string) bool {
			_, mnt, _ := strings.Cut(v, ":")
			return strings.HasPrefix(p["dir"]+"/", strings.TrimSuffix(mnt, "/")+"/")
		}) {
			problems = append(problems, fmt.Sprintf("%s: -dir %s is on no volume (%v)", where, p["dir"], svc.Volumes))
		}
	}
	if res.servers == 0 {
		problems = append(problems, name+": no ferry-metaserver or ferry-broker service")
	}
	problems = append(problems, checkGroups(name, res.groups)...)
	return res, problems
}

// --- Kubernetes ---------------------------------------------------------------

// k8sObject is the part of a manifest the checks read.
type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"` // ConfigMap
	Spec struct {
		// Service
		ClusterIP string           `yaml:"clusterIP"`
		Selector  yaml.Node        `yaml:"selector"` // a map (Service) or a label selector (StatefulSet, PDB)
		Ports     []k8sServicePort `yaml:"ports"`
		// StatefulSet
		ServiceName string `yaml:"serviceName"`
		Replicas    *int   `yaml:"replicas"`
		Template    struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				Containers []k8sContainer `yaml:"containers"`
				Volumes    []struct {
					Name      string `yaml:"name"`
					ConfigMap *struct {
						Name string `yaml:"name"`
					} `yaml:"configMap"`
					Secret *struct {
						SecretName string `yaml:"secretName"`
					} `yaml:"secret"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
		VolumeClaimTemplates []struct {
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
		} `yaml:"volumeClaimTemplates"`
	} `yaml:"spec"`
}

// located is a manifest object and its file.
type located struct {
	file string
	obj  k8sObject
}

type k8sServicePort struct {
	Name       string    `yaml:"name"`
	Port       int       `yaml:"port"`
	TargetPort yaml.Node `yaml:"targetPort"`
}

type k8sContainer struct {
	Name    string   `yaml:"name"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			FieldRef *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	StartupProbe   *k8sProbe `yaml:"startupProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path   string    `yaml:"path"`
		Port   yaml.Node `yaml:"port"`
		Scheme string    `yaml:"scheme"`
	} `yaml:"httpGet"`
	TCPSocket *struct {
		Port yaml.Node `yaml:"port"`
	} `yaml:"tcpSocket"`
	Exec any `yaml:"exec"`
}

// selectorLabels reads a Service's selector map or a label selector's
// matchLabels.
func selectorLabels(n *yaml.Node) map[string]string {
	var m map[string]string
	if n.Kind == 0 {
		return nil
	}
	var ls struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	}
	if err := n.Decode(&ls); err == nil && ls.MatchLabels != nil {
		return ls.MatchLabels
	}
	if err := n.Decode(&m); err != nil {
		return nil
	}
	return m
}

func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// envRef is a $(VAR) reference in a container's command or args.
var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// k8sPodSample is what the downward API gives pod ordinal i, for the
// field paths the manifests use.
func k8sPodSample(stsName string, i int, fieldPath string) (string, bool) {
	switch fieldPath {
	case "metadata.name":
		return fmt.Sprintf("%s-%d", stsName, i), true
	case "metadata.namespace":
		return "ferrymq", true
	case "status.podIP":
		return fmt.Sprintf("10.244.%d.%d", i, 10+i), true
	}
	return "", false
}

// k8sResult is what the manifests deploy.
type k8sResult struct {
	pods        int
	listenPorts map[int]bool
	groups      map[string][]string // broker group -> its pods' preferred roles
}

func (s *servers) checkK8s(files map[string][]byte) (k8sResult, []string) {
	res := k8sResult{listenPorts: map[int]bool{}, groups: map[string][]string{}}
	var problems []string
	var objs []located
	for _, name := range slices.Sorted(maps.Keys(files)) {
		dec := yaml.NewDecoder(bytes.NewReader(files[name]))
		for {
			var o k8sObject
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", name, err))
				break
			}
			if o.Kind == "" {
				continue
			}
			if o.Metadata.Name == "" {
				problems = append(problems, fmt.Sprintf("%s: a %s without a name", name, o.Kind))
			}
			objs = append(objs, located{name, o})
		}
	}
	byKind := map[string]map[string]located{}
	for _, l := range objs {
		if byKind[l.obj.Kind] == nil {
			byKind[l.obj.Kind] = map[string]located{}
		}
		if _, dup := byKind[l.obj.Kind][l.obj.Metadata.Name]; dup {
			problems = append(problems, fmt.Sprintf("%s: two %ss named %s", l.file, l.obj.Kind, l.obj.Metadata.Name))
		}
		byKind[l.obj.Kind][l.obj.Metadata.Name] = l
	}
	for _, kind := range []string{"StatefulSet", "Service", "PodDisruptionBudget"} {
		if len(byKind[kind]) == 0 {
			problems = append(problems, fmt.Sprintf("the manifests have no %s", kind))
		}
	}

	// Per StatefulSet: the pods' listen ports by port name and number.
	type podPorts struct {
		labels  map[string]string
		byName  map[string]int
		byPort  map[int]bool
		covered bool // some PDB selects it
	}
	pods := map[string]*podPorts{}
	for _, name := range slices.Sorted(maps.Keys(byKind["StatefulSet"])) {
		l := byKind["StatefulSet"][name]
		sts := l.obj
		where := fmt.Sprintf("%s: StatefulSet %s", l.file, name)
		pp := &podPorts{labels: sts.Spec.Template.Metadata.Labels, byName: map[string]int{}, byPort: map[int]bool{}}
		pods[name] = pp
		if !selects(selectorLabels(&sts.Spec.Selector), pp.labels) {
			problems = append(problems, where+": its selector does not select its own pods")
		}
		if svc, ok := byKind["Service"][sts.Spec.ServiceName]; !ok || svc.obj.Spec.ClusterIP != "None" {
			problems = append(problems, fmt.Sprintf("%s: serviceName %q is not a headless Service of the manifests", where, sts.Spec.ServiceName))
		}
		replicas := 1
		if sts.Spec.Replicas != nil {
			replicas = *sts.Spec.Replicas
		}
		claims := map[string]bool{}
		for _, c := range sts.Spec.VolumeClaimTemplates {
			claims[c.Metadata.Name] = true
		}
		configMaps := map[string]string{} // volume name -> ConfigMap name
		secrets := map[string]bool{}      // Secret volumes
		for _, v := range sts.Spec.Template.Spec.Volumes {
			if v.ConfigMap != nil {
				configMaps[v.Name] = v.ConfigMap.Name
			}
			if v.Secret != nil {
				secrets[v.Name] = true
			}
		}
		for _, c := range sts.Spec.Template.Spec.Containers {
			cwhere := fmt.Sprintf("%s container %s", where, c.Name)
			argv := append(slices.Clone(c.Command), c.Args...)
			if len(argv) == 0 {
				problems = append(problems, cwhere+": no command (the image has no entrypoint)")
				continue
			}
			prog := serverProgram(argv[0])
			if prog == "" {
				problems = append(problems, fmt.Sprintf("%s: runs %q, not a ferrymq server", cwhere, argv[0]))
				continue
			}
			if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
				problems = append(problems, cwhere+": wants cpu and memory requests and a memory limit")
			}
			var metricsPort int
			var metricsScheme string // HTTP, or HTTPS with -tls-cert
			var peerIDs []string
			for i := range replicas {
				pwhere := fmt.Sprintf("%s pod %s-%d", cwhere, name, i)
				env := map[string]string{}
				for _, e := range c.Env {
					switch {
					case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
						v, ok := k8sPodSample(name, i, e.ValueFrom.FieldRef.FieldPath)
						if !ok {
							problems = append(problems, fmt.Sprintf("%s: env %s from field %s, which the check does not know", pwhere, e.Name, e.ValueFrom.FieldRef.FieldPath))
						}
						env[e.Name] = v
					default:
						env[e.Name] = envRef.ReplaceAllStringFunc(e.Value, func(r string) string { return env[envRef.FindStringSubmatch(r)[1]] })
					}
				}
				args := make([]string, len(argv)-1)
				for j, a := range argv[1:] {
					args[j] = envRef.ReplaceAllStringFunc(a, func(r string) string {
						v, ok := env[envRef.FindStringSubmatch(r)[1]]
						if !ok {
							problems = append(problems, fmt.Sprintf("%s: %s names no env variable of the container", pwhere, r))
						}
						return v
					})
				}
				// A -config file from a mounted ConfigMap: its settings
				// are part of the command line, read from the ConfigMap
				// rather than this machine.
				cl := commandLine{where: pwhere, prog: prog}
				for j := 0; j < len(args); j++ {
					path, ok := strings.CutPrefix(args[j], "-config=")
					if !ok && args[j] == "-config" && j+1 < len(args) {
						j++
						path, ok = args[j], true
					}
					if !ok {
						cl.args = append(cl.args, args[j])
						continue
					}
					cfg, err := configFromMounts(path, c, configMaps, byKind["ConfigMap"])
					if err != nil {
						problems = append(problems, fmt.Sprintf("%s: -config %s: %v", pwhere, path, err))
					}
					cl.config = cfg
				}
				p, pr := s.checkCommand(cl)
				problems = append(problems, pr...)
				res.pods++
				listen := p.listenPorts(prog)
				for n := range listen {
					res.listenPorts[n] = true
				}
				if i == 0 {
					for _, cp := range c.Ports {
						if listen[cp.ContainerPort] == "" {
							problems = append(problems, fmt.Sprintf("%s: containerPort %s (%d) is not a port %s listens on (%v)", pwhere, cp.Name, cp.ContainerPort, prog, listen))
						}
						pp.byName[cp.Name] = cp.ContainerPort
						pp.byPort[cp.ContainerPort] = true
					}
					metricsPort = p.port(metricsFlag)
					metricsScheme = "HTTP"
					if p["tls-cert"] != "" {
						metricsScheme = "HTTPS"
					}
				}
				onClaim := false
				for _, m := range c.VolumeMounts {
					onClaim = onClaim || claims[m.Name] && strings.HasPrefix(p["dir"]+"/", strings.TrimSuffix(m.MountPath, "/")+"/")
				}
				if !onClaim {
					problems = append(problems, fmt.Sprintf("%s: -dir %s is on no volumeClaimTemplate", pwhere, p["dir"]))
				}
				onSecret := false
				for _, m := range c.VolumeMounts {
					onSecret = onSecret || secrets[m.Name] && p[raftSecretFlag] != "" && strings.HasPrefix(p[raftSecretFlag], strings.TrimSuffix(m.MountPath, "/")+"/")
				}
				switch {
				case prog == "ferry-metaserver" && p[raftSecretFlag] == "":
					problems = append(problems, pwhere+": no -"+raftSecretFlag)
				case prog == "ferry-metaserver" && !onSecret:
					problems = append(problems, fmt.Sprintf("%s: -%s %s is on no Secret volume", pwhere, raftSecretFlag, p[raftSecretFlag]))
				case prog != "ferry-metaserver" && len(secrets) > 0:
					problems = append(problems, fmt.Sprintf("%s: a %s pod has Secret volumes (only metaservers hold the raft secret)", pwhere, prog))
				}
				switch prog {
				case "ferry-metaserver":
					// Every pod's -id is in -peers, and -peers names the
					// StatefulSet's pods exactly.
					ids := peerIDsOf(p["peers"])
					if i == 0 {
						peerIDs = ids
						if len(ids) != replicas {
							problems = append(problems, fmt.Sprintf("%s: -peers names %d nodes, the StatefulSet runs %d", pwhere, len(ids), replicas))
						}
					} else if !slices.Equal(ids, peerIDs) {
						problems = append(problems, fmt.Sprintf("%s: -peers differs from pod 0's", pwhere))
					}
					if !slices.Contains(ids, p["id"]) {
						problems = append(problems, fmt.Sprintf("%s: -id %s is not in -peers %v", pwhere, p["id"], ids))
					}
				case "ferry-broker":
					res.groups[p["group"]] = append(res.groups[p["group"]], brokerRole(p))
				}
			}
			probes := map[string]*k8sProbe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe, "startupProbe": c.StartupProbe}
			if c.ReadinessProbe == nil || c.LivenessProbe == nil {
				problems = append(problems, cwhere+": wants a readiness and a liveness probe")
			}
			for _, kind := range slices.Sorted(maps.Keys(probes)) {
				pr := probes[kind]
				if pr == nil {
					continue
				}
				if pr.HTTPGet == nil {
					problems = append(problems, fmt.Sprintf("%s: %s is not an httpGet (the image has no shell)", cwhere, kind))
					continue
				}
				if !probePaths[pr.HTTPGet.Path] {
					problems = append(problems, fmt.Sprintf("%s: %s path %q is not one the servers serve (%v)", cwhere, kind, pr.HTTPGet.Path, slices.Sorted(maps.Keys(probePaths))))
				}
				if scheme := cmp.Or(pr.HTTPGet.Scheme, "HTTP"); scheme != metricsScheme {
					problems = append(problems, fmt.Sprintf("%s: %s scheme %s, but -%s serves %s (HTTPS with -tls-cert)", cwhere, kind, scheme, metricsFlag, metricsScheme))
				}
				n, ok := resolvePort(&pr.HTTPGet.Port, pp.byName)
				if !ok || n != metricsPort {
					problems = append(problems, fmt.Sprintf("%s: %s port %s is not -%s's port %d", cwhere, kind, pr.HTTPGet.Port.Value, metricsFlag, metricsPort))
				}
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(byKind["Service"])) {
		l := byKind["Service"][name]
		where := fmt.Sprintf("%s: Service %s", l.file, name)
		sel := selectorLabels(&l.obj.Spec.Selector)
		var target *podPorts
		for _, pp := range pods {
			if selects(sel, pp.labels) {
				target = pp
			}
		}
		if target == nil {
			problems = append(problems, fmt.Sprintf("%s: selects no StatefulSet's pods (%v)", where, sel))
			continue
		}
		for _, sp := range l.obj.Spec.Ports {
			tp := &sp.TargetPort
			if tp.Kind == 0 {
				tp = &yaml.Node{Kind: yaml.ScalarNode, Value: strconv.Itoa(sp.Port)}
			}
			n, ok := resolvePort(tp, target.byName)
			if !ok || !target.byPort[n] {
				problems = append(problems, fmt.Sprintf("%s: port %s targets %s, not a port its pods listen on", where, sp.Name, tp.Value))
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(byKind["PodDisruptionBudget"])) {
		l := byKind["PodDisruptionBudget"][name]
		sel := selectorLabels(&l.obj.Spec.Selector)
		n := 0
		for _, pp := range pods {
			if selects(sel, pp.labels) {
				n++
				pp.covered = true
			}
		}
		if n != 1 {
			problems = append(problems, fmt.Sprintf("%s: PodDisruptionBudget %s selects %d StatefulSets' pods, want 1", l.file, name, n))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(pods)) {
		if !pods[name].covered {
			problems = append(problems, fmt.Sprintf("StatefulSet %s has no PodDisruptionBudget", name))
		}
	}
	problems = append(problems, checkGroups("k8s", res.groups)...)
	return res, problems
}

// resolvePort reads a probe's or Service's port: a number, or a container
// port's name.
func resolvePort(n *yaml.Node, byName map[string]int) (int, bool) {
	if v, err := strconv.Atoi(n.Value); err == nil {
		return v, true
	}
	v, ok := byName[n.Value]
	return v, ok
}

// configFromMounts reads a -config file that a container has from a
// mounted ConfigMap.
func configFromMounts(path string, c k8sContainer, volumes map[string]string, configMaps map[string]located) (map[string]any, error) {
	for _, m := range c.VolumeMounts {
		dir := strings.TrimSuffix(m.MountPath, "/") + "/"
		if !strings.HasPrefix(path, dir) {
			continue
		}
		cmName, ok := volumes[m.Name]
		if !ok {
			return nil, fmt.Errorf("the volume %s mounted at %s is not a ConfigMap", m.Name, m.MountPath)
		}
		cm, ok := configMaps[cmName]
		if !ok {
			return nil, fmt.Errorf("ConfigMap %s is not in the manifests", cmName)
		}
		key := strings.TrimPrefix(path, dir)
		text, ok := cm.obj.Data[key]
		if !ok {
			return nil, fmt.Errorf("ConfigMap %s has no key %s (it has %v)", cmName, key, slices.Sorted(maps.Keys(cm.obj.Data)))
		}
		var cfg map[string]any
		if err := json.Unmarshal([]byte(text), &cfg); err != nil {
			return nil, fmt.Errorf("ConfigMap %s key %s: %v", cmName, key, err)
		}
		return cfg, nil
	}
	return nil, errors.New("no mounted volume holds it")
}

// peerIDsOf reads the node ids of a -peers list (id=raft/rpc,...).
func peerIDsOf(peers string) []string {
	var ids []string
	for _, item := range strings.Split(peers, ",") {
		if id, _, ok := strings.Cut(strings.TrimSpace(item), "="); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

// --- systemd and deploy/hosts ---------------------------------------------------

// unitFile is a systemd unit's settings: section -> key -> values in order.
type unitFile map[string]map[string][]string

func parseUnit(data []byte) unitFile {
	u := unitFile{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
		default:
			k, v, ok := strings.Cut(line, "=")
			if ok && section != "" {
				u[section][strings.TrimSpace(k)] = append(u[section][strings.TrimSpace(k)], strings.TrimSpace(v))
			}
		}
	}
	return u
}

// parseEnvFile reads an EnvironmentFile: KEY=VALUE lines, # comments.
func parseEnvFile(data []byte) (map[string]string, error) {
	env := map[string]string{}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.ContainsAny(k, " \t\"'$") || strings.ContainsAny(v, "\"'$\\") {
			return nil, fmt.Errorf("line %d: %q: want KEY=VALUE without quotes or expansions", i+1, line)
		}
		env[k] = v
	}
	return env, nil
}

// unitVar is ${VAR} anywhere in a word, or $VAR as a whole word.
var (
	unitBraced = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)
	unitWord   = regexp.MustCompile(`^\$([A-Za-z_][A-Za-z0-9_]*)$`)
)

// expandExecStart splits an ExecStart line into words as systemd does for
// the forms the units use (no quotes): %i is the instance, ${VAR} is the
// variable's value within its word, a word $VAR is the value split at
// whitespace. A variable no environment file sets is a problem.
func expandExecStart(line, instance string, env map[string]string) ([]string, []string) {
	var out, problems []string
	line = strings.TrimLeft(line, "-@:+!")
	for _, w := range strings.Fields(line) {
		w = strings.ReplaceAll(w, "%i", instance)
		if m := unitWord.FindStringSubmatch(w); m != nil {
			v, ok := env[m[1]]
			if !ok {
				problems = append(problems, fmt.Sprintf("$%s is set by no environment file", m[1]))
			}
			out = append(out, strings.Fields(v)...)
			continue
		}
		w = unitBraced.ReplaceAllStringFunc(w, func(r string) string {
			name := unitBraced.FindStringSubmatch(r)[1]
			v, ok := env[name]
			if !ok {
				problems = append(problems, fmt.Sprintf("${%s} is set by no environment file", name))
			}
			return v
		})
		if strings.Contains(w, "$") || strings.Contains(w, "%") {
			problems = append(problems, fmt.Sprintf("%q: an expansion the check does not know", w))
		}
		out = append(out, w)
	}
	return out, problems
}

// hostUnit is a unit as one host of deploy/hosts runs it.
type hostUnit struct {
	host, unit, instance string
	argv                 []string
	env                  map[string]string
	loadCredentials      []string // NAME:PATH
}

// systemdSources are the unit files and the hosts folder, by path relative
// to deploy/ ("systemd/ferry-broker@.service", "hosts/host-a/host.env").
type systemdSources map[string][]byte

// stateDirectory is what systemd sets STATE_DIRECTORY to for
// StateDirectory=ferrymq.
const stateDirectory = "/var/lib/ferrymq"

// hostUnits expands the units for every host of deploy/hosts: a host runs
// ferry-metaserver.service when it has metaserver.env, and
// ferry-broker@NAME.service for each broker-NAME.env. Each unit's
// EnvironmentFile=/etc/ferrymq/F is hosts/HOST/F or, for files every host
// shares, hosts/F.
func hostUnits(src systemdSources) ([]hostUnit, []string) {
	var problems []string
	units := map[string]unitFile{}
	hosts := map[string]bool{}
	for p, data := range src {
		if dir, file := filepath.Split(p); dir == "systemd/" && strings.HasSuffix(file, ".service") {
			units[file] = parseUnit(data)
		}
		if parts := strings.Split(p, "/"); len(parts) == 3 && parts[0] == "hosts" {
			hosts[parts[1]] = true
		}
	}
	if len(hosts) == 0 {
		problems = append(problems, "deploy/hosts has no host folders")
	}
	var out []hostUnit
	for _, host := range slices.Sorted(maps.Keys(hosts)) {
		var runs [][2]string // unit, instance
		for p := range src {
			dir, file := filepath.Split(p)
			if dir != "hosts/"+host+"/" {
				continue
			}
			switch {
			case file == "metaserver.env":
				runs = append(runs, [2]string{"ferry-metaserver.service", ""})
			case strings.HasPrefix(file, "broker-") && strings.HasSuffix(file, ".env"):
				runs = append(runs, [2]string{"ferry-broker@.service", strings.TrimSuffix(strings.TrimPrefix(file, "broker-"), ".env")})
			}
		}
		sort.Slice(runs, func(i, j int) bool { return runs[i][0]+runs[i][1] < runs[j][0]+runs[j][1] })
		for _, r := range runs {
			where := fmt.Sprintf("systemd/%s on hosts/%s", strings.Replace(r[0], "@", "@"+r[1], 1), host)
			u, ok := units[r[0]]
			if !ok {
				problems = append(problems, where+": no such unit")
				continue
			}
			svc := u["Service"]
			env := map[string]string{"STATE_DIRECTORY": stateDirectory}
			// LoadCredential=NAME:PATH gives the unit its own copy of PATH
			// (root's alone) as $CREDENTIALS_DIRECTORY/NAME.
			for _, lc := range svc["LoadCredential"] {
				name, path, _ := strings.Cut(lc, ":")
				env["CREDENTIALS_DIRECTORY"] = "/run/credentials/" + strings.Replace(r[0], "@", "@"+r[1], 1)
				if name == "" || !strings.HasPrefix(path, "/etc/ferrymq/") {
					problems = append(problems, fmt.Sprintf("%s: LoadCredential=%s: want NAME:/etc/ferrymq/FILE", where, lc))
				}
			}
			for _, ef := range svc["EnvironmentFile"] {
				optional := strings.HasPrefix(ef, "-")
				ef = strings.ReplaceAll(strings.TrimPrefix(ef, "-"), "%i", r[1])
				rel, ok := strings.CutPrefix(ef, "/etc/ferrymq/")
				if !ok {
					problems = append(problems, fmt.Sprintf("%s: EnvironmentFile %s is not under /etc/ferrymq", where, ef))
					continue
				}
				data, ok := src["hosts/"+host+"/"+rel]
				if !ok {
					data, ok = src["hosts/"+rel]
				}
				if !ok {
					if !optional {
						problems = append(problems, fmt.Sprintf("%s: EnvironmentFile %s is neither hosts/%s/%s nor hosts/%s", where, ef, host, rel, rel))
					}
					continue
				}
				vars, err := parseEnvFile(data)
				if err != nil {
					problems = append(problems, fmt.Sprintf("%s: %s: %v", where, ef, err))
				}
				for k, v := range vars {
					env[k] = v
				}
			}
			if got := svc["StateDirectory"]; !slices.Equal(got, []string{"ferrymq"}) {
				problems = append(problems, fmt.Sprintf("%s: StateDirectory %v, want ferrymq", where, got))
			}
			if len(svc["ExecStart"]) != 1 {
				problems = append(problems, fmt.Sprintf("%s: %d ExecStart lines, want 1", where, len(svc["ExecStart"])))
				continue
			}
			argv, pr := expandExecStart(svc["ExecStart"][0], r[1], env)
			for _, p := range pr {
				problems = append(problems, where+": "+p)
			}
			for key, want := range map[string]string{"Restart": "on-failure", "NoNewPrivileges": "yes", "ProtectSystem": "strict", "User": "ferrymq"} {
				if got := svc[key]; len(got) != 1 || got[0] != want {
					problems = append(problems, fmt.Sprintf("%s: %s=%v, want %s", where, key, got, want))
				}
			}
			if len(svc["LimitNOFILE"]) != 1 {
				problems = append(problems, where+": wants a LimitNOFILE")
			}
			out = append(out, hostUnit{host: host, unit: r[0], instance: r[1], argv: argv, env: env, loadCredentials: svc["LoadCredential"]})
		}
	}
	return out, problems
}

func (s *servers) checkSystemd(src systemdSources) []string {
	units, problems := hostUnits(src)
	type node struct{ raft, rpc string }
	peers := map[string]node{}      // from the metaservers' -peers
	running := map[string]node{}    // from their own flags
	var metaAddrs []string          // the brokers' -meta
	groups := map[string][]string{} // group -> preferred roles
	brokerHosts := map[string][]string{}
	for _, u := range units {
		where := fmt.Sprintf("%s on hosts/%s", strings.Replace(u.unit, "@", "@"+u.instance, 1), u.host)
		if len(u.argv) == 0 {
			continue
		}
		prog := serverProgram(u.argv[0])
		if prog == "" {
			problems = append(problems, fmt.Sprintf("%s: runs %q", where, u.argv[0]))
			continue
		}
		p, pr := s.checkCommand(commandLine{where: where, prog: prog, args: u.argv[1:]})
		problems = append(problems, pr...)
		if !strings.HasPrefix(p["dir"], stateDirectory+"/") {
			problems = append(problems, fmt.Sprintf("%s: -dir %s is outside the state directory %s (ProtectSystem=strict makes the rest read-only)", where, p["dir"], stateDirectory))
		}
		switch prog {
		case "ferry-metaserver":
			if dir, name := filepath.Split(p[raftSecretFlag]); p[raftSecretFlag] == "" || dir != u.env["CREDENTIALS_DIRECTORY"]+"/" || !slices.ContainsFunc(u.loadCredentials, func(lc string) bool { return strings.HasPrefix(lc, name+":") }) {
				problems = append(problems, fmt.Sprintf("%s: -%s %q is no credential of the unit (LoadCredential %v)", where, raftSecretFlag, p[raftSecretFlag], u.loadCredentials))
			}
			for _, item := range strings.Split(p["peers"], ",") {
				id, addrs, _ := strings.Cut(item, "=")
				raft, rpc, _ := strings.Cut(addrs, "/")
				if old, ok := peers[id]; ok && old != (node{raft, rpc}) {
					problems = append(problems, fmt.Sprintf("%s: -peers differs between hosts for %s", where, id))
				}
				peers[id] = node{raft, rpc}
			}
			running[p["id"]] = node{p["raft-addr"], p["rpc-addr"]}
		case "ferry-broker":
			if metaAddrs == nil {
				metaAddrs = strings.Split(p["meta"], ",")
			} else if !slices.Equal(metaAddrs, strings.Split(p["meta"], ",")) {
				problems = append(problems, where+": -meta differs from another broker's")
			}
			groups[p["group"]] = append(groups[p["group"]], brokerRole(p))
			brokerHosts[p["group"]] = append(brokerHosts[p["group"]], u.host)
		}
	}
	// The peer list is the metaservers the hosts run, at the addresses they
	// listen on; the brokers' -meta is their RPC addresses.
	for id, n := range running {
		if peers[id] != n {
			problems = append(problems, fmt.Sprintf("metaserver %s listens on raft %s and rpc %s; -peers says %+v", id, n.raft, n.rpc, peers[id]))
		}
	}
	var rpcs []string
	for id, n := range peers {
		if _, ok := running[id]; !ok {
			problems = append(problems, fmt.Sprintf("-peers names %s, which no host runs", id))
		}
		rpcs = append(rpcs, n.rpc)
	}
	slices.Sort(rpcs)
	sortedMeta := slices.Sorted(slices.Values(metaAddrs))
	if !slices.Equal(rpcs, sortedMeta) {
		problems = append(problems, fmt.Sprintf("the brokers' -meta %v is not the metaservers' RPC addresses %v", metaAddrs, rpcs))
	}
	if len(running) < 3 {
		problems = append(problems, fmt.Sprintf("the hosts run %d metaservers, want at least 3", len(running)))
	}
	problems = append(problems, checkGroups("hosts", groups)...)
	// A host lost takes one broker of a group at most.
	for _, g := range slices.Sorted(maps.Keys(brokerHosts)) {
		seen := map[string]bool{}
		for _, h := range brokerHosts[g] {
			if seen[h] {
				problems = append(problems, fmt.Sprintf("group %s: two of its brokers on %s", g, h))
			}
			seen[h] = true
		}
	}
	return problems
}

// --- Dockerfile -------------------------------------------------------------------

var (
	dockerExpose = regexp.MustCompile(`(?m)^EXPOSE\s+(.+)$`)
	dockerXFlag  = regexp.MustCompile(`-X\s+([\w./-]+)\.(\w+)=`)
	dockerBuild  = regexp.MustCompile(`go build(?:[^\n\\]|\\\n)*`)
)

// checkDockerfile checks that the image exposes exactly the ports the
// compose file's servers listen on, that it builds the three programs,
// runs as a non-root user and has the data volume; it returns the -X
// variables the build sets (package path -> variable).
func checkDockerfile(data []byte, listenPorts map[int]bool) (map[string]string, []string) {
	var problems []string
	text := string(data)
	exposed := map[int]bool{}
	for _, m := range dockerExpose.FindAllStringSubmatch(text, -1) {
		for _, f := range strings.Fields(m[1]) {
			n, err := strconv.Atoi(strings.TrimSuffix(f, "/tcp"))
			if err != nil {
				problems = append(problems, fmt.Sprintf("Dockerfile: EXPOSE %q", f))
			}
			exposed[n] = true
		}
	}
	for n := range exposed {
		if !listenPorts[n] {
			problems = append(problems, fmt.Sprintf("Dockerfile: EXPOSE %d, a port no server listens on in compose.yaml", n))
		}
	}
	for n := range listenPorts {
		if !exposed[n] {
			problems = append(problems, fmt.Sprintf("Dockerfile: the servers listen on %d, which it does not EXPOSE", n))
		}
	}
	build := dockerBuild.FindString(text)
	for _, prog := range []string{"ferry-metaserver", "ferry-broker", "ferryctl"} {
		if !strings.Contains(build, "./cmd/"+prog) {
			problems = append(problems, fmt.Sprintf("Dockerfile: go build does not build ./cmd/%s", prog))
		}
	}
	if !strings.Contains(text, "CGO_ENABLED=0") {
		problems = append(problems, "Dockerfile: the binaries are not static (CGO_ENABLED=0)")
	}
	if m := regexp.MustCompile(`(?m)^USER\s+(\S+)`).FindAllStringSubmatch(text, -1); len(m) == 0 || strings.HasPrefix(m[len(m)-1][1], "0") || strings.HasPrefix(m[len(m)-1][1], "root") {
		problems = append(problems, "Dockerfile: the final stage does not run as a non-root user")
	}
	if !regexp.MustCompile(`(?m)^VOLUME\s+\[?"?/var/lib/ferrymq`).MatchString(text) {
		problems = append(problems, "Dockerfile: no VOLUME /var/lib/ferrymq")
	}
	vars := map[string]string{}
	for _, m := range dockerXFlag.FindAllStringSubmatch(build, -1) {
		vars[m[1]] = m[2]
	}
	return vars, problems
}

// stringVar reports whether the Go package in dir declares a package-level
// string variable name (what -ldflags -X can set).
func stringVar(dir, name string) (bool, error) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false, err
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
		if err != nil {
			return false, err
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, sp := range gd.Specs {
				vs := sp.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if n.Name != name {
						continue
					}
					if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "string" {
						return true, nil
					}
					if vs.Type == nil && i < len(vs.Values) {
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							return true, nil
						}
					}
				}
			}
		}
	}
	return false, nil
}

// --- the tests ----------------------------------------------------------------------

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func k8sFiles(t *testing.T) map[string][]byte {
	t.Helper()
	paths, err := filepath.Glob("k8s/*.yaml")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no k8s/*.yaml: %v", err)
	}
	files := map[string][]byte{}
	for _, p := range paths {
		if filepath.Base(p) != "kustomization.yaml" { // kustomize's, not a cluster object
			files[p] = readFile(t, p)
		}
	}
	return files
}

// systemdFiles reads systemd/ and hosts/ (paths relative to deploy/).
func systemdFiles(t *testing.T) systemdSources {
	t.Helper()
	src := systemdSources{}
	for _, root := range []string{"systemd", "hosts"} {
		err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			src[filepath.ToSlash(p)] = readFile(t, p)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return src
}

func report(t *testing.T, problems []string) {
	t.Helper()
	for _, p := range problems {
		t.Error(p)
	}
}

func TestCompose(t *testing.T) {
	s := programs(t)
	res, problems := s.checkCompose("compose.yaml", readFile(t, "compose.yaml"))
	report(t, problems)
	if res.servers != 8 {
		t.Errorf("compose.yaml runs %d servers, want 3 metaservers and 5 brokers", res.servers)
	}
	wantGroupsOfThreeAndTwo(t, "compose.yaml", res.groups)
}

// wantGroupsOfThreeAndTwo checks the layout every deployment file has: g1 a
// group of three, g2 a master and a slave.
func wantGroupsOfThreeAndTwo(t *testing.T, where string, groups map[string][]string) {
	t.Helper()
	if len(groups) != 2 || len(groups["g1"]) != 3 || len(groups["g2"]) != 2 {
		t.Errorf("%s: broker groups %v; want g1 a group of three and g2 of two", where, groups)
	}
}

func TestKubernetes(t *testing.T) {
	s := programs(t)
	res, problems := s.checkK8s(k8sFiles(t))
	report(t, problems)
	if res.pods != 8 {
		t.Errorf("the manifests run %d server pods, want 3 metaservers and the brokers of g1 (3) and g2 (2)", res.pods)
	}
	wantGroupsOfThreeAndTwo(t, "k8s", res.groups)
	// Every file is in the kustomization.
	var k struct {
		Resources []string `yaml:"resources"`
	}
	if err := yaml.Unmarshal(readFile(t, "k8s/kustomization.yaml"), &k); err != nil {
		t.Fatal(err)
	}
	for p := range k8sFiles(t) {
		if base := filepath.Base(p); !slices.Contains(k.Resources, base) {
			t.Errorf("k8s/kustomization.yaml does not list %s", base)
		}
	}
}

func TestSystemd(t *testing.T) {
	s := programs(t)
	src := systemdFiles(t)
	report(t, s.checkSystemd(src))
	units, _ := hostUnits(src)
	groups := map[string][]string{}
	for _, u := range units {
		if u.unit == "ferry-broker@.service" {
			groups[u.env["FERRY_GROUP"]] = append(groups[u.env["FERRY_GROUP"]], u.env["FERRY_ROLE"])
		}
	}
	wantGroupsOfThreeAndTwo(t, "deploy/hosts", groups)
}

func TestDockerfile(t *testing.T) {
	s := programs(t)
	compose, problems := s.checkCompose("compose.yaml", readFile(t, "compose.yaml"))
	report(t, problems)
	vars, problems := checkDockerfile(readFile(t, "docker/Dockerfile"), compose.listenPorts)
	report(t, problems)
	if len(vars) == 0 {
		t.Fatal("Dockerfile: go build sets no version with -ldflags -X")
	}
	for pkg, name := range vars {
		dir, ok := strings.CutPrefix(pkg, "github.com/ferrymq/ferrymq/")
		if !ok {
			t.Errorf("Dockerfile: -X %s.%s is outside the module", pkg, name)
			continue
		}
		t.Run("-X "+pkg+"."+name, func(t *testing.T) {
			found, err := stringVar(filepath.Join("..", dir), name)
			if err != nil {
				t.Fatal(err)
			}
			if !found {
				// The linker ignores -X of a variable that does not exist,
				// so the image would say nothing of its version.
				t.Skipf("%s declares no string variable %s yet: the -version flag of issue 16 adds it; until then the image's binaries have no version", dir, name)
			}
		})
	}
}

// TestChecksCatchMistakes breaks the deployment files one way at a time and
// wants each check to say so: a check that passes a broken file would let
// the real ones rot.
func TestChecksCatchMistakes(t *testing.T) {
	s := programs(t)
	compose := string(readFile(t, "compose.yaml"))
	k8s := k8sFiles(t)
	meta := string(k8s["k8s/metaserver.yaml"])
	broker := string(k8s["k8s/broker-g1.yaml"])
	sd := systemdFiles(t)
	unit := string(sd["systemd/ferry-broker@.service"])

	once := func(t *testing.T, s, old, new string) string {
		t.Helper()
		if !strings.Contains(s, old) {
			t.Fatalf("the file no longer holds %q: update this mutation", old)
		}
		return strings.Replace(s, old, new, 1)
	}
	withK8s := func(name, text string) map[string][]byte {
		m := map[string][]byte{}
		for k, v := range k8s {
			m[k] = v
		}
		m[name] = []byte(text)
		return m
	}
	withSD := func(name, text string) systemdSources {
		m := systemdSources{}
		for k, v := range sd {
			m[k] = v
		}
		m[name] = []byte(text)
		return m
	}
	cases := []struct {
		name  string
		check func(t *testing.T) []string
		want  string // in some problem
	}{
		{"compose: a misspelt flag", func(t *testing.T) []string {
			_, p := s.checkCompose("compose.yaml", []byte(once(t, compose, `"-metrics-addr"`, `"-metrics-adr"`)))
			return p
		}, "-metrics-adr is not a flag of ferry-metaserver"},
		{"compose: a bad value", func(t *testing.T) []string {
			_, p := s.checkCompose("compose.yaml", []byte(once(t, compose, `"-group", "g1"`, `"-group", "g1", "-heartbeat", "2"`)))
			return p
		}, "refuses the command line"},
		{"compose: an exposed port nothing listens on", func(t *testing.T) []string {
			_, p := s.checkCompose("compose.yaml", []byte(once(t, compose, `expose: ["7101", "7201", "7301"]`, `expose: ["7101", "7202", "7301"]`)))
			return p
		}, `exposes port "7202"`},
		{"compose: a metaserver without its raft secret", func(t *testing.T) []string {
			_, p := s.checkCompose("compose.yaml", []byte(once(t, compose, `"-metrics-addr", "0.0.0.0:7301", "-raft-secret-file", "/run/secrets/raft-secret"]`, `"-metrics-addr", "0.0.0.0:7301"]`)))
			return p
		}, "service m1: no -raft-secret-file"},
		{"compose: a raft secret the service does not mount", func(t *testing.T) []string {
			_, p := s.checkCompose("compose.yaml", []byte(once(t, compose, "    secrets: [raft-secret]\n", "")))
			return p
		}, "-raft-secret-file /run/secrets/raft-secret is no compose secret of the service"},
		{"compose: a broker given the raft secret", func(t *testing.T) []string {
			_, p := s.checkCompose("compose.yaml", []byte(once(t, compose, `volumes: ["g1-master-data:/var/lib/ferrymq"]`, `volumes: ["g1-master-data:/var/lib/ferrymq"]
    secrets: [raft-secret]`)))
			return p
		}, "a ferry-broker mounts the secrets [raft-secret]"},
		{"k8s: a metaserver's raft secret on no Secret volume", func(t *testing.T) []string {
			_, p := s.checkK8s(withK8s("k8s/metaserver.yaml", once(t, meta, "- {name: raft-secret, mountPath: /etc/ferrymq/raft, readOnly: true}", "- {name: raft-secret, mountPath: /etc/ferrymq/secret, readOnly: true}")))
			return p
		}, "-raft-secret-file /etc/ferrymq/raft/raft.secret is on no Secret volume"},
		{"systemd: a raft secret that is no credential of the unit", func(t *testing.T) []string {
			ms := string(sd["systemd/ferry-metaserver.service"])
			return s.checkSystemd(withSD("systemd/ferry-metaserver.service", once(t, ms, "LoadCredential=raft-secret:", "LoadCredential=raft:")))
		}, "is no credential of the unit"},
		{"k8s: a misspelt flag", func(t *testing.T) []string {
			_, p := s.checkK8s(withK8s("k8s/broker-g1.yaml", once(t, broker, "- -ha-addr=", "- -ha-adr=")))
			return p
		}, "-ha-adr is not a flag of ferry-broker"},
		{"k8s: a misspelt setting in the per-pod config", func(t *testing.T) []string {
			_, p := s.checkK8s(withK8s("k8s/broker-g1.yaml", once(t, broker, `'{"role": "slave"}'`, `'{"rol": "slave"}'`)))
			return p
		}, `sets "rol", which is not a flag`},
		{"k8s: a probe path the servers do not serve", func(t *testing.T) []string {
			_, p := s.checkK8s(withK8s("k8s/metaserver.yaml", once(t, meta, "path: /readyz", "path: /ready")))
			return p
		}, `path "/ready" is not one the servers serve`},
		{"k8s: a probe on another port", func(t *testing.T) []string {
			_, p := s.checkK8s(withK8s("k8s/broker-g1.yaml", once(t, broker, "{path: /healthz, port: metrics}", "{path: /healthz, port: data}")))
			return p
		}, "port data is not -metrics-addr's port 7601"},
		{"k8s: a Service port no pod listens on", func(t *testing.T) []string {
			_, p := s.checkK8s(withK8s("k8s/metaserver.yaml", once(t, meta, "{name: raft, port: 7201, targetPort: raft}", "{name: raft, port: 7201, targetPort: 7202}")))
			return p
		}, "port raft targets 7202"},
		{"k8s: a containerPort no flag listens on", func(t *testing.T) []string {
			_, p := s.checkK8s(withK8s("k8s/metaserver.yaml", once(t, meta, "{name: raft, containerPort: 7201}", "{name: raft, containerPort: 7202}")))
			return p
		}, "containerPort raft (7202)"},
		{"k8s: a pod missing from -peers", func(t *testing.T) []string {
			_, p := s.checkK8s(withK8s("k8s/metaserver.yaml", once(t, meta, "replicas: 3", "replicas: 4")))
			return p
		}, "-id ferry-metaserver-3 is not in -peers"},
		{"systemd: a variable no settings file sets", func(t *testing.T) []string {
			return s.checkSystemd(withSD("systemd/ferry-broker@.service", once(t, unit, "${FERRY_GROUP}", "${FERRY_GRUOP}")))
		}, "${FERRY_GRUOP} is set by no environment file"},
		{"systemd: a misspelt flag", func(t *testing.T) []string {
			return s.checkSystemd(withSD("systemd/ferry-broker@.service", once(t, unit, "-ha-addr ${FERRY_HOST}", "-ha-adr ${FERRY_HOST}")))
		}, "-ha-adr is not a flag of ferry-broker"},
		{"systemd: a bad value in a settings file", func(t *testing.T) []string {
			return s.checkSystemd(withSD("hosts/cluster.env", once(t, string(sd["hosts/cluster.env"]), "FERRY_BROKER_ARGS=", "FERRY_BROKER_ARGS=-heartbeat soon")))
		}, "refuses the command line"},
		{"hosts: a peer list that misses a host's address", func(t *testing.T) []string {
			return s.checkSystemd(withSD("hosts/host-b/host.env", once(t, string(sd["hosts/host-b/host.env"]), "FERRY_HOST=10.0.0.2", "FERRY_HOST=10.0.0.22")))
		}, "metaserver m2 listens on raft 10.0.0.22:7201"},
		{"compose: a group of three with two masters", func(t *testing.T) []string {
			_, p := s.checkCompose("compose.yaml", []byte(once(t, compose, `"-id", "g1-slave2", "-group", "g1", "-role", "slave"`, `"-id", "g1-slave2", "-group", "g1", "-role", "master"`)))
			return p
		}, "group g1: its brokers prefer [master master slave]"},
		{"k8s: a group of three with two masters", func(t *testing.T) []string {
			_, p := s.checkK8s(withK8s("k8s/broker-g1.yaml", once(t, broker, `ferry-broker-g1-2.json: '{"role": "slave"}'`, `ferry-broker-g1-2.json: '{"role": "master"}'`)))
			return p
		}, "group g1: its brokers prefer [master master slave]"},
		{"k8s: a group without a slave", func(t *testing.T) []string {
			g2 := string(k8s["k8s/broker-g2.yaml"])
			_, p := s.checkK8s(withK8s("k8s/broker-g2.yaml", once(t, g2, `ferry-broker-g2-1.json: '{"role": "slave"}'`, `ferry-broker-g2-1.json: '{"role": "master"}'`)))
			return p
		}, "group g2: its brokers prefer [master master]"},
		{"hosts: two brokers of a group on one host", func(t *testing.T) []string {
			m := withSD("hosts/host-b/broker-g1-slave2.env", string(sd["hosts/host-e/broker-g1-slave2.env"]))
			delete(m, "hosts/host-e/broker-g1-slave2.env")
			return s.checkSystemd(m)
		}, "group g1: two of its brokers on host-b"},
		{"Dockerfile: a port no server listens on", func(t *testing.T) []string {
			_, p := checkDockerfile([]byte(once(t, string(readFile(t, "docker/Dockerfile")), "EXPOSE 7401", "EXPOSE 7402")), map[int]bool{7101: true, 7201: true, 7301: true, 7401: true, 7501: true, 7601: true})
			return p
		}, "EXPOSE 7402"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			problems := c.check(t)
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, c.want) }) {
				t.Errorf("want a problem saying %q; got %d:\n%s", c.want, len(problems), strings.Join(problems, "\n"))
			}
		})
	}
}
