package outbox

import (
	"fmt"
	"strconv"
	"strings"
)

// Dialect is the SQL a database speaks: its placeholders, its clock and its
// column types. The outbox has no driver of its own: the application opens
// db with its driver and names the dialect.
type Dialect int

const (
	// SQLite: "?" placeholders, INTEGER PRIMARY KEY AUTOINCREMENT, BLOB.
	SQLite Dialect = iota
	// PostgreSQL: "$1" placeholders, BIGSERIAL, BYTEA.
	PostgreSQL
)

func (d Dialect) String() string {
	switch d {
	case SQLite:
		return "sqlite"
	case PostgreSQL:
		return "postgresql"
	}
	return "dialect(" + strconv.Itoa(int(d)) + ")"
}

func (d Dialect) valid() bool { return d == SQLite || d == PostgreSQL }

// now is the database's clock in unix milliseconds. Times the outbox
// compares (a lease's end, a row's next attempt) are all the database's, so
// application machines with skewed clocks agree on them. Both are stable
// within a statement (PostgreSQL's now() is its transaction's start: the
// relay's statements are transactions of their own), which lets the
// planners walk the table in id order and stop at a batch, rather than
// read it all.
func (d Dialect) now() string {
	if d == PostgreSQL {
		return "CAST(EXTRACT(EPOCH FROM now()) * 1000 AS BIGINT)"
	}
	return "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
}

// bind rewrites a query written with "?" placeholders into the dialect's.
func (d Dialect) bind(q string) string {
	if d != PostgreSQL {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// schema is the statements that create the outbox's tables.
func (d Dialect) schema(table string) []string {
	id, blob := "INTEGER PRIMARY KEY AUTOINCREMENT", "BLOB"
	if d == PostgreSQL {
		id, blob = "BIGSERIAL PRIMARY KEY", "BYTEA"
	}
	return []string{
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	id %s,
	msg_id TEXT NOT NULL UNIQUE,
	topic TEXT NOT NULL,
	msg_key TEXT NOT NULL,
	tag TEXT NOT NULL,
	properties TEXT NOT NULL,
	body %s NOT NULL,
	reliability INTEGER NOT NULL,
	created_at BIGINT NOT NULL,
	attempted_at BIGINT,
	attempts INTEGER NOT NULL DEFAULT 0,
	next_at BIGINT NOT NULL,
	failed_at BIGINT,
	last_error TEXT NOT NULL DEFAULT ''
)`, table, id, blob),
		// The relay's check that no earlier row of a key waits for a
		// retry: a probe of the key's rows due later than now, which are
		// few (rows wait only after a failure).
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s_wait ON %s (topic, msg_key, next_at)`, table, table),
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s_lease (
	name TEXT PRIMARY KEY,
	owner TEXT NOT NULL,
	expires_at BIGINT NOT NULL
)`, table),
	}
}

// inList is n placeholders for an IN list: "?,?,?".
func inList(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}
