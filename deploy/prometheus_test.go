package deploy

import (
	"cmp"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// prometheusConfig is what the checks read of prometheus/prometheus.yml.
type prometheusConfig struct {
	RuleFiles     []string `yaml:"rule_files"`
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		Scheme        string `yaml:"scheme"`
		MetricsPath   string `yaml:"metrics_path"`
		Authorization *struct {
			Type            string `yaml:"type"`
			CredentialsFile string `yaml:"credentials_file"`
		} `yaml:"authorization"`
		BearerTokenFile string `yaml:"bearer_token_file"`
		TLSConfig       *struct {
			CAFile string `yaml:"ca_file"`
		} `yaml:"tls_config"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

// TestPrometheusScrape holds prometheus/prometheus.yml to the servers it
// scrapes, those of deploy/hosts: one job per program whose targets are
// exactly their -metrics-addr, on /metrics, over HTTPS with the cluster's
// CA and a bearer token (a describe principal's: with authorization on,
// /metrics needs one). promtool, when installed, checks the file too.
func TestPrometheusScrape(t *testing.T) {
	s := programs(t)
	raw := readFile(t, "prometheus/prometheus.yml")
	var cfg prometheusConfig
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	units, problems := hostUnits(systemdFiles(t))
	report(t, problems)
	want := map[string][]string{} // program -> metrics addresses
	for _, u := range units {
		prog := serverProgram(u.argv[0])
		p, pr := s.checkCommand(commandLine{where: u.host, prog: prog, args: u.argv[1:]})
		report(t, pr)
		want[prog] = append(want[prog], p[metricsFlag])
	}
	jobs := map[string]string{"ferrymq-metaserver": "ferry-metaserver", "ferrymq-broker": "ferry-broker"}
	seen := map[string]bool{}
	for _, sc := range cfg.ScrapeConfigs {
		prog, ok := jobs[sc.JobName]
		if !ok {
			t.Errorf("job %s scrapes no ferrymq server (want jobs %v)", sc.JobName, slices.Sorted(maps.Keys(jobs)))
			continue
		}
		seen[sc.JobName] = true
		var targets []string
		for _, c := range sc.StaticConfigs {
			targets = append(targets, c.Targets...)
		}
		if !slices.Equal(slices.Sorted(slices.Values(targets)), slices.Sorted(slices.Values(want[prog]))) {
			t.Errorf("job %s scrapes %v; deploy/hosts runs %s with -%s %v", sc.JobName, targets, prog, metricsFlag, want[prog])
		}
		if sc.MetricsPath != "" && sc.MetricsPath != "/metrics" {
			t.Errorf("job %s scrapes %s; the servers serve /metrics", sc.JobName, sc.MetricsPath)
		}
		if sc.Scheme != "https" || sc.TLSConfig == nil || sc.TLSConfig.CAFile == "" {
			t.Errorf("job %s: want scheme https and tls_config ca_file (the metrics port serves TLS with -tls-cert)", sc.JobName)
		}
		if sc.BearerTokenFile == "" && (sc.Authorization == nil || sc.Authorization.CredentialsFile == "" ||
			!strings.EqualFold(cmp.Or(sc.Authorization.Type, "Bearer"), "Bearer")) {
			t.Errorf("job %s: want a bearer token file (authorization credentials_file): /metrics needs describe", sc.JobName)
		}
	}
	for job := range jobs {
		if !seen[job] {
			t.Errorf("prometheus.yml has no job %s", job)
		}
	}
	for _, f := range cfg.RuleFiles {
		if _, err := os.Stat(filepath.Join("prometheus", f)); err != nil {
			t.Errorf("rule file %s: %v", f, err)
		}
	}

	// promtool wants the files the config names: check a copy whose
	// /etc/prometheus/ files are in a temporary directory.
	if _, err := exec.LookPath("promtool"); err != nil {
		t.Log("promtool is not installed: the file's syntax is not checked")
		return
	}
	dir := t.TempDir()
	for _, f := range []string{"ferrymq.token", "ferrymq-ca.pem"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range cfg.RuleFiles {
		if err := os.WriteFile(filepath.Join(dir, f), readFile(t, filepath.Join("prometheus", f)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	copyPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(copyPath, []byte(strings.ReplaceAll(string(raw), "/etc/prometheus/", dir+"/")), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("promtool", "check", "config", copyPath).CombinedOutput(); err != nil {
		t.Errorf("promtool check config: %v\n%s", err, out)
	}
}

// TestProbeChecksCatchMistakes: the Kubernetes check wants probes on the
// paths open without credentials, and over HTTPS exactly when the server
// serves TLS (-tls-cert).
func TestProbeChecksCatchMistakes(t *testing.T) {
	s := programs(t)
	k8s := k8sFiles(t)
	meta := string(k8s["k8s/metaserver.yaml"])
	with := func(text string) map[string][]byte {
		m := maps.Clone(k8s)
		m["k8s/metaserver.yaml"] = []byte(text)
		return m
	}
	replace := func(t *testing.T, s, old, new string) string {
		t.Helper()
		if !strings.Contains(s, old) {
			t.Fatalf("k8s/metaserver.yaml no longer holds %q: update this mutation", old)
		}
		return strings.ReplaceAll(s, old, new)
	}
	has := func(problems []string, want string) bool {
		return slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, want) })
	}
	tlsArgs := "- -metrics-addr=0.0.0.0:7301\n            - -tls-cert=/tls/tls.crt\n            - -tls-key=/tls/tls.key\n            - -tls-ca=/tls/ca.crt"

	_, p := s.checkK8s(with(replace(t, meta, "httpGet: {path: /readyz, port: metrics}", "httpGet: {path: /metrics, port: metrics}")))
	if !has(p, `path "/metrics" is not one the servers serve`) {
		t.Errorf("a readiness probe on /metrics (which needs credentials with authorization on) passes:\n%s", strings.Join(p, "\n"))
	}
	tlsOn := replace(t, meta, "- -metrics-addr=0.0.0.0:7301", tlsArgs)
	_, p = s.checkK8s(with(tlsOn))
	if !has(p, "scheme HTTP, but -metrics-addr serves HTTPS") {
		t.Errorf("HTTP probes of a server with -tls-cert pass:\n%s", strings.Join(p, "\n"))
	}
	_, p = s.checkK8s(with(replace(t, tlsOn, "port: metrics}", "port: metrics, scheme: HTTPS}")))
	if has(p, "scheme") {
		t.Errorf("HTTPS probes of a server with -tls-cert are refused:\n%s", strings.Join(p, "\n"))
	}
	_, p = s.checkK8s(with(replace(t, meta, "port: metrics}", "port: metrics, scheme: HTTPS}")))
	if !has(p, "scheme HTTPS, but -metrics-addr serves HTTP") {
		t.Errorf("HTTPS probes of a server without TLS pass:\n%s", strings.Join(p, "\n"))
	}
}
