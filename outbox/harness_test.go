package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/lib/pq"
	_ "github.com/ncruces/go-sqlite3/driver"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/sdk"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	code := m.Run()
	pg.stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// A backend is a database the suites run against: it opens a database
// (t's, closed by Cleanup) and says how a child process opens the same.
type backend struct {
	name    string
	dialect Dialect
	driver  string
	dsn     func(t testing.TB) string // "" : skip (the test is skipped with why)
}

var sqliteBackend = backend{name: "sqlite", dialect: SQLite, driver: "sqlite3", dsn: func(t testing.TB) string {
	return "file:" + filepath.Join(t.TempDir(), "app.db") + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"
}}

var pgBackend = backend{name: "postgresql", dialect: PostgreSQL, driver: "postgres", dsn: func(t testing.TB) string { return pg.dsn(t) }}

// backends are the databases every suite runs against.
var backends = []backend{sqliteBackend, pgBackend}

// open opens b's database for t.
func (b backend) open(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(b.driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

var tables atomic.Int64

// newTable is a table name no other test of the run uses (the PostgreSQL
// server is shared by the tests).
func newTable() string { return "ob" + strconv.FormatInt(tables.Add(1), 10) }

// cluster is a metaserver and two broker groups, and the topic the test
// at hand uses (four queues on both groups).
type cluster struct {
	*testcluster.Cluster
	topic string
	route routing.Route
}

func startCluster(t testing.TB) *cluster {
	t.Helper()
	c := &cluster{Cluster: testcluster.Start(t, testcluster.Opts{Groups: []string{"g1", "g2"}, MetaEdit: testcluster.SteadyMeta, BrokerEdit: testcluster.SteadyBroker})}
	c.useTopic(t, "orders")
	return c
}

// useTopic creates a topic and makes it the one the test uses.
func (c *cluster) useTopic(t testing.TB, name string) {
	t.Helper()
	c.topic, c.route = name, c.Meta.CreateTopic(t, name, "g1", "g2", "g1", "g2")
}

// newOutbox is an outbox on db's table with test timings, its relay not
// started, closed by Cleanup.
func (c *cluster) newOutbox(t testing.TB, db *sql.DB, d Dialect, table string, opts ...Opt) *Outbox {
	t.Helper()
	o, err := New(db, "relay-"+table, append([]Opt{WithDialect(d), Table(table), Client(sdk.MetaAddrs(c.MetaAddr())),
		LeaseTTL(time.Second), PollInterval(50 * time.Millisecond), LookupMargin(time.Minute), Backoff(50*time.Millisecond, time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	return o
}

// counts reads the topic whole and counts its messages by outbox id.
func (c *cluster) counts(t testing.TB) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, q := range c.route.Queues {
		tc := testcluster.Dial(t, c.Master(q.Group).Addr())
		for _, sm := range testcluster.PullAll(t, tc, c.topic, q.Queue) {
			id := ""
			for _, p := range sm.Message.Properties {
				if p.Key == IDProperty {
					id = p.Value
				}
			}
			out[id]++
		}
	}
	return out
}

// rowsLeft counts the table's rows.
func rowsLeft(t testing.TB, db *sql.DB, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitEmpty waits until the relay has deleted every row.
func waitEmpty(t testing.TB, db *sql.DB, table string, within time.Duration) {
	t.Helper()
	testwait.For(t, within, "the outbox table "+table+" to empty", func() bool { return rowsLeft(t, db, table) == 0 })
}

// exactlyOnce fails t unless every id of want is stored once and nothing
// else is.
func exactlyOnce(t testing.TB, got map[string]int, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%d distinct ids stored, want %d", len(got), len(want))
	}
	for _, id := range want {
		if got[id] != 1 {
			t.Errorf("message %s stored %d times, want once", id, got[id])
		}
	}
}

// commitMessages adds n messages in n transactions and commits them;
// every third is keyed (keys k0..k2), the others not.
func commitMessages(t testing.TB, o *Outbox, db *sql.DB, topic string, n int, prefix string) []string {
	t.Helper()
	var ids []string
	for i := range n {
		m := &Message{Topic: topic, Body: []byte(fmt.Sprintf("%s-%d", prefix, i)), Tag: "paid"}
		if i%3 == 0 {
			m.Key = "k" + strconv.Itoa(i%9/3)
		}
		ids = append(ids, addCommitted(t, o, db, m))
	}
	return ids
}

func addCommitted(t testing.TB, o *Outbox, db *sql.DB, m *Message) string {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := o.Add(ctx, tx, m)
	if err != nil {
		_ = tx.Rollback()
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return id
}

// pgServer is a throwaway PostgreSQL server shared by the run's tests,
// started on first use.
type pgServer struct {
	once    sync.Once
	why     string // why there is none
	dir     string
	addr    string
	cmd     *exec.Cmd
	exited  chan struct{}
	logPath string
}

var pg pgServer

// pgBin finds a PostgreSQL program.
func pgBin(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name)
	if len(matches) > 0 {
		return matches[len(matches)-1]
	}
	return ""
}

// dsn is the server's DSN, or skips t when the machine has no PostgreSQL.
func (s *pgServer) dsn(t testing.TB) string {
	s.once.Do(func() { s.why = s.start() })
	if s.why != "" {
		t.Skip("no PostgreSQL: " + s.why)
	}
	host, port, _ := strings.Cut(s.addr, ":")
	return fmt.Sprintf("host=%s port=%s user=postgres dbname=postgres sslmode=disable", host, port)
}

// start runs initdb and postgres in a fresh directory (as the user
// postgres when run as root, which PostgreSQL refuses to run as) and waits
// until it takes connections. It returns why it could not.
func (s *pgServer) start() string {
	initdb, postgres := pgBin("initdb"), pgBin("postgres")
	if initdb == "" || postgres == "" {
		return "initdb and postgres not found in PATH or /usr/lib/postgresql/*/bin"
	}
	dir, err := os.MkdirTemp("", "ferrymq-outbox-pg-")
	if err != nil {
		return err.Error()
	}
	s.dir = dir
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return "running as root and no user postgres to run the server as"
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chmod(dir, 0o755); err != nil {
			return err.Error()
		}
		if err := os.Chown(dir, uid, gid); err != nil {
			return err.Error()
		}
	}
	run := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(name, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		return cmd
	}
	data := filepath.Join(dir, "data")
	if out, err := run(initdb, "-D", data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8").CombinedOutput(); err != nil {
		return fmt.Sprintf("initdb: %v: %s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err.Error()
	}
	s.addr = ln.Addr().String()
	_ = ln.Close()
	_, port, _ := strings.Cut(s.addr, ":")
	s.logPath = filepath.Join(dir, "postgres.log")
	logf, err := os.Create(s.logPath)
	if err != nil {
		return err.Error()
	}
	defer logf.Close()
	s.cmd = run(postgres, "-D", data, "-k", dir, "-h", "127.0.0.1", "-p", port, "-F", "-c", "max_connections=50")
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		s.cmd = nil
		return "postgres: " + err.Error()
	}
	s.exited = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	db, err := sql.Open("postgres", fmt.Sprintf("host=127.0.0.1 port=%s user=postgres dbname=postgres sslmode=disable connect_timeout=2", port))
	if err != nil {
		return err.Error()
	}
	defer db.Close()
	if !testwait.Until(20*time.Second, func() bool { return db.Ping() == nil }) {
		logs, _ := os.ReadFile(s.logPath)
		return "postgres did not take connections within 20 s: " + string(logs)
	}
	return ""
}

// stop stops the server by its PID (a fast shutdown) and removes its files.
func (s *pgServer) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.exited:
		case <-time.After(20 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}
