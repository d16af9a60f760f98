package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/tlsconf"
)

type certsOptions struct {
	nodes   []string // NAME=HOST[,HOST...]
	clients []string // NAME
	days    int
	force   bool
}

const maxCertDays = 3650

// certJSON is one certificate certs wrote.
type certJSON struct {
	Name     string    `json:"name"`
	Kind     string    `json:"kind"` // ca, node or client
	Cert     string    `json:"cert"`
	Key      string    `json:"key"`
	Hosts    []string  `json:"hosts,omitempty"`
	NotAfter time.Time `json:"not_after"`
}

func newCertsCommand(g *globalOptions) *cobra.Command {
	o := &certsOptions{}
	cmd := &cobra.Command{
		Use:   "certs DIR --node NAME=HOST[,HOST...] [--node ...] [--client NAME] [--days N]",
		Short: "Make a throwaway CA and a TLS certificate per node and client",
		Long: `Make a throwaway certificate authority (DIR/ca.pem and its key DIR/ca-key.pem)
and, signed by it, a certificate and key per node (DIR/NAME.pem, DIR/NAME-key.pem)
valid for the hosts given (IP addresses or DNS names: every address the node's
peers and clients dial), and per client. A node's certificate serves both as its
server certificate and as its client certificate; a client's is for client
authentication only and names no host (its common name is NAME), so no server
can present it. Give the servers
-tls-cert DIR/NAME.pem -tls-key DIR/NAME-key.pem -tls-ca DIR/ca.pem, and ferryctl
--tls-ca DIR/ca.pem (with --tls-cert and --tls-key of a client's certificate
when the servers have -tls-ca). Keep ca-key.pem off the nodes.

It refuses a DIR that already holds a CA unless --force (which replaces the CA:
every certificate it signed must then be made again). It uses Go's crypto; no
openssl. It dials nothing.`,
		Args:        usageArgs(cobra.ExactArgs(1)),
		Annotations: map[string]string{offline: "true"},
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(g, args[0])
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&o.nodes, "node", nil, "a node's certificate: NAME=HOST[,HOST...] (repeatable)")
	f.StringArrayVar(&o.clients, "client", nil, "a client's certificate, for servers that require one: NAME (repeatable)")
	f.IntVar(&o.days, "days", 365, "validity of the node and client certificates, in days")
	f.BoolVar(&o.force, "force", false, "replace a CA already in DIR")
	c := g.checker(f)
	c.name("node", "NAME=HOST[,HOST...]", func(s string) error { _, _, err := parseNodeSpec(s); return err })
	c.name("client", "a name: letters, digits, '.', '_', '-'", checkCertName)
	c.intRange("days", 1, maxCertDays)
	c.bool("force")
	return cmd
}

// certNameChars are the characters of a certificate's name (its files are
// NAME.pem and NAME-key.pem).
func checkCertName(s string) error {
	if s == "" || len(s) > 64 {
		return fmt.Errorf("certificate name %s: want 1 to 64 characters", shown(s))
	}
	for i, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
		if !ok {
			return fmt.Errorf("certificate name %s: character %q at %d: want letters, digits, '.', '_', '-'", shown(s), r, i)
		}
	}
	if s == "ca" || s == "ca-key" || strings.HasPrefix(s, ".") {
		return fmt.Errorf("certificate name %s: taken by the CA's files or hidden", shown(s))
	}
	return nil
}

// parseNodeSpec reads NAME=HOST[,HOST...]: hosts are IP addresses or DNS
// names.
func parseNodeSpec(s string) (string, []string, error) {
	name, list, ok := strings.Cut(s, "=")
	if !ok {
		return "", nil, fmt.Errorf("want NAME=HOST[,HOST...]")
	}
	if err := checkCertName(name); err != nil {
		return "", nil, err
	}
	var hosts []string
	for _, h := range strings.Split(list, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return "", nil, fmt.Errorf("node %s: an empty host: want NAME=HOST[,HOST...]", name)
		}
		if net.ParseIP(h) == nil && !validDNSName(h) {
			return "", nil, fmt.Errorf("node %s: host %s is neither an IP address nor a DNS name", name, shown(h))
		}
		hosts = append(hosts, h)
	}
	return name, hosts, nil
}

// validDNSName accepts host names of letters, digits and '-' labels
// (a '*' first label for a wildcard), at most 253 bytes.
func validDNSName(h string) bool {
	if len(h) > 253 {
		return false
	}
	for i, label := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if label == "*" && i == 0 {
			continue
		}
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

func (o *certsOptions) run(g *globalOptions, dir string) error {
	if len(o.nodes) == 0 && len(o.clients) == 0 {
		return usageError{errors.New("certs: give at least one --node NAME=HOST[,HOST...] or --client NAME")}
	}
	type spec struct {
		name, kind string
		hosts      []string
	}
	var specs []spec
	seen := map[string]bool{}
	for _, n := range o.nodes {
		name, hosts, _ := parseNodeSpec(n) // checked when parsed
		specs = append(specs, spec{name, "node", hosts})
	}
	for _, c := range o.clients {
		// A client's certificate names the client (its CN) and no host:
		// it is for client authentication only.
		specs = append(specs, spec{c, "client", nil})
	}
	for _, s := range specs {
		if seen[s.name] {
			return usageError{fmt.Errorf("certs: %s is named twice", s.name)}
		}
		seen[s.name] = true
	}
	for _, f := range []string{tlsconf.CAFile, tlsconf.CAKeyFile} {
		path := filepath.Join(dir, f)
		if _, err := os.Lstat(path); err == nil && !o.force {
			return usageError{fmt.Errorf("certs: %s exists: %s already holds a CA (--force replaces it, and every certificate it signed must be made again)", path, dir)}
		}
	}
	ca, err := tlsconf.GenerateCA(dir)
	if err != nil {
		return err
	}
	out := []certJSON{{Name: "ca", Kind: "ca", Cert: ca.CertFile, Key: filepath.Join(dir, tlsconf.CAKeyFile), NotAfter: ca.Cert.NotAfter}}
	now := time.Now()
	notBefore := now.Add(-time.Hour) // a peer whose clock is a little behind accepts it
	notAfter := now.Add(time.Duration(o.days) * 24 * time.Hour)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	for _, s := range specs {
		var f tlsconf.Files
		if s.kind == "client" {
			f, err = tlsconf.GenerateClientCert(ca, s.name, dir, notBefore, notAfter)
		} else {
			f, err = tlsconf.GenerateCert(ca, s.name, s.hosts, dir, notBefore, notAfter)
		}
		if err != nil {
			return err
		}
		out = append(out, certJSON{Name: s.name, Kind: s.kind, Cert: f.Cert, Key: f.Key, Hosts: s.hosts, NotAfter: notAfter.UTC()})
	}
	var rows [][]string
	for _, c := range out {
		rows = append(rows, []string{c.Kind, c.Name, c.Cert, c.Key, strings.Join(c.Hosts, ","), c.NotAfter.UTC().Format(time.DateOnly)})
	}
	return g.printer().print(out, []string{"KIND", "NAME", "CERT", "KEY", "HOSTS", "VALID UNTIL"}, rows)
}
