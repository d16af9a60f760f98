package lint

// rule is a component's place in the architecture: its layer, its one job
// (for DESIGN.md's table) and the module packages it may import.
type rule struct {
	// layer orders the components: a package never imports one of a
	// higher layer, in its code or in its in-package tests (only external
	// test packages, package x_test, import upward: they sit above
	// everything). Lowest first: the wire and the disk, then what is built
	// on them, the servers, the harness that starts them for tests, the
	// SDKs (whose tests run real servers), their users, the programs, and
	// the tests and deployment checks on top.
	layer int
	job   string
	// imports lists what the package may import, besides its own
	// sub-packages; "*" allows anything.
	imports []string
}

// rules lists, per package (and its sub-packages, unless a longer entry names
// them), its layer and the module packages it may import.
var rules = map[string]rule{
	"protocol": {0, "frame format, request and status codes, message and batch encoding, route and heartbeat bodies", nil},
	"storage": {0, "segmented commit log, per-queue index, flush, recovery; knows bytes and offsets, not the network " +
		"(`storage/vfs`: its file-system seam, with fault injection)", nil},
	// Public: applications build the SDKs' TLS config with it.
	"tlsconf":              {0, "TLS configs from cert/key/CA files (public: `tlsconf.ClientConfig` for the SDKs); a throwaway CA and node certificates", nil},
	"internal/lint":        {0, "these rules, as tests", nil},
	"internal/testlog":     {0, "quiet loggers for tests, and a `Capture` whose lines tests read", nil},
	"internal/testwait":    {0, "waits in tests for an observable event (`For`, `ForEvery`, `Until`)", nil},
	"internal/testmetrics": {0, "reads Prometheus gatherers in tests", nil},
	// The SDKs' metric events: a leaf, so the SDKs import no metrics library.
	"sdkmetrics": {0, "the SDKs' metric events (`Hooks`: a counter added to, a duration observed)", nil},

	"routing": {1, "the route model (topics, queues, broker groups, states) and queue selection with latency-fault avoidance", []string{"protocol"}},
	// The permission model: pure, so every side that checks or presents
	// credentials may import it.
	"auth": {1, "the permission model: permissions, principals, immutable tables, `Authorize` (one rule per request code)", []string{"protocol"}},
	"internal/transport": {1, "framed TCP: multiplexed client, server (handler per request code, worker pool), TLS, limits before trust",
		[]string{"protocol"}},
	"sdkmetrics/prom":  {1, "the SDKs' metric events exported to Prometheus", []string{"sdkmetrics"}},
	"internal/testtls": {1, "TLS material for tests: a CA and certificates for 127.0.0.1", []string{"tlsconf"}},

	"metaserver/api": {2, "the control plane's request and reply bodies, shared by the metaserver and its client", []string{"protocol", "routing"}},
	// The client core below the metaserver client, which keeps its
	// connections in the core's pool; the consumer writes dead letters
	// through its sender, not the producer.
	"internal/clientcore": {2, "what every client shares: one route cache, a connection pool per address, the option and error core, a SEND call",
		[]string{"protocol", "routing", "internal/transport", "sdkmetrics"}},
	"metaserver/fsm": {2, "the pure, deterministic state machine: commands in, state out", []string{"protocol", "routing", "auth"}},

	"metaserver/client": {3, "the typed metaserver client that brokers, the SDKs and the CLI use",
		[]string{"protocol", "routing", "internal/transport", "internal/clientcore", "metaserver/api", "auth"}},
	"sdk": {3, "the options every SDK client takes (sealed: only ferrymq's packages make them)", []string{"internal/clientcore", "sdkmetrics"}},

	// storage/vfs: MkdirAllDurable, for its data directory.
	"metaserver": {4, "the Raft node, leader loops (failure detector, lag judge), RPC handlers",
		[]string{"metaserver/fsm", "metaserver/api", "metaserver/client", "protocol", "routing", "internal/transport", "auth", "storage/vfs"}},
	"broker": {4, "send path, HA master and slave, heartbeats, read path",
		[]string{"storage", "protocol", "routing", "internal/transport", "internal/clientcore", "metaserver/api", "metaserver/client", "auth"}},

	// The test harness starts whole clusters: it sits above the servers it
	// starts and below the SDKs, whose in-package tests run it.
	"internal/testcluster": {5, "in-process clusters for tests: metaservers with shrunk timings, broker groups, clients",
		[]string{"broker", "metaserver", "metaserver/api", "metaserver/client", "internal/transport",
			"internal/testlog", "internal/testwait", "protocol", "routing", "storage", "auth"}},

	"producer": {6, "the producer SDK", []string{"protocol", "routing", "internal/transport", "internal/clientcore", "sdk", "sdkmetrics",
		"metaserver/api", "metaserver/client", "auth"}},
	"consumer": {6, "the consumer SDK: group members share queues, long-poll PULLs, commit offsets, dead letters",
		[]string{"protocol", "routing", "internal/transport", "internal/clientcore", "sdk", "sdkmetrics", "metaserver/api", "metaserver/client", "auth"}},

	// Users of the SDKs: what they measure is what an application sees.
	"internal/loadgen": {7, "the load generator behind `ferryctl bench`: sends (and consumes) and measures throughput and latency",
		[]string{"producer", "consumer", "sdk", "protocol", "routing", "internal/transport", "metaserver/api", "metaserver/client"}},
	// An application's library over the producer: it looks its messages up
	// (LOOKUP) through the client core, as the consumer does.
	"outbox": {7, "QMQ's transactional outbox over database/sql: messages stored in the application's transaction, relayed once after the commit",
		[]string{"producer", "sdk", "protocol", "routing", "internal/transport", "internal/clientcore", "metaserver/client", "auth",
			"internal/testcluster", "internal/testwait"}},
	// What ferryctl and the web console share to read and act as an
	// operator, each with its own credential (a dial function); consumer:
	// the names of a dead letter's properties, for a journey.
	"internal/ops": {7, "what ferryctl and the console share: read a queue (slave fallback), offset at a time, lookups, each group's master, abort a transaction",
		[]string{"protocol", "routing", "internal/transport", "internal/clientcore", "metaserver/api", "metaserver/client", "consumer"}},
	// The web console is a client of the cluster, as ferryctl is: the
	// metaserver program serves it.
	"console": {7, "the web console: pages the metaservers serve, reading and acting through the clients with the session's own credential",
		[]string{"protocol", "routing", "auth", "internal/transport", "internal/clientcore", "internal/ops", "metaserver/api", "metaserver/client",
			"broker", "metaserver", "producer", "consumer", "sdk", "internal/testcluster", "internal/testlog", "internal/testwait"}},
	// Measurement programs under scripts/ are users of the public packages.
	"scripts": {7, "start/stop a local cluster, benchmarks, fault runs (and small Go programs they run)",
		[]string{"producer", "sdk", "protocol", "routing", "metaserver/api", "metaserver/client", "auth"}},

	"cmd": {8, "the programs: `ferry-metaserver` and `ferry-broker` (thin mains), `ferryctl` (the admin CLI); `cmd/internal`: their shared code",
		[]string{"*"}},

	"e2e": {9, "real-process tests: the programs run as a user runs them (scripts/cluster.sh)", []string{"*"}},
	// The checks of the deployment files (tests only): they hold the
	// manifests against the programs' real flags and metrics.
	"deploy": {9, "the Dockerfile, compose, systemd, Kubernetes, dashboard and alert files, and the tests that hold them to the programs' flags and metrics",
		[]string{"*"}},
}

// testOnly are packages that only test files may import: a program or a
// library that imported them would start test clusters.
var testOnly = []string{"internal/testcluster", "internal/testlog", "internal/testwait", "internal/testmetrics", "internal/testtls", "cmd/internal/clitest"}

// sdkForbidden lists the libraries the SDK packages (what an application
// links to produce or consume) may not import: they log through log/slog
// and report metrics through sdkmetrics' hooks, so an application picks its
// own logging and metrics libraries (sdkmetrics/prom is the Prometheus
// plugin, imported only by those who want it).
var sdkForbidden = map[string][]string{
	"producer":            {"github.com/prometheus/", "github.com/hashicorp/go-hclog"},
	"consumer":            {"github.com/prometheus/", "github.com/hashicorp/go-hclog"},
	"sdk":                 {"github.com/prometheus/", "github.com/hashicorp/go-hclog"},
	"sdkmetrics":          {"github.com/prometheus/", "github.com/hashicorp/go-hclog"},
	"internal/clientcore": {"github.com/prometheus/", "github.com/hashicorp/go-hclog"},
	// The application brings its database driver; the outbox's tests bring theirs.
	"outbox": {"github.com/prometheus/", "github.com/hashicorp/go-hclog", "github.com/glebarez/", "modernc.org/", "github.com/lib/pq", "github.com/jackc/"},
}
