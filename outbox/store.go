package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/protocol"
)

// queries are the outbox's statements in its dialect.
type queries struct {
	d                        Dialect
	table                    string
	insert, ready            string
	leaseRow, lease, release string
}

func newQueries(d Dialect, table string) queries {
	now := d.now()
	lease := table + "_lease"
	return queries{
		d:     d,
		table: table,
		insert: d.bind(fmt.Sprintf(`INSERT INTO %s (msg_id, topic, msg_key, tag, properties, body, reliability, created_at, next_at)
VALUES (?, ?, ?, ?, ?, ?, ?, %s, 0)`, table, now)),
		// A keyed row is ready only when no earlier row of its topic and
		// key waits for a retry: a key's messages are sent in id order.
		ready: d.bind(fmt.Sprintf(`SELECT id, msg_id, topic, msg_key, tag, properties, body, reliability, attempted_at, attempts
FROM %[1]s r WHERE r.failed_at IS NULL AND r.next_at <= %[2]s AND (r.msg_key = '' OR NOT EXISTS (
	SELECT 1 FROM %[1]s e WHERE e.topic = r.topic AND e.msg_key = r.msg_key AND e.next_at > %[2]s AND e.id < r.id AND e.failed_at IS NULL))
ORDER BY r.id LIMIT ?`, table, now)),
		leaseRow: d.bind(fmt.Sprintf(`INSERT INTO %s (name, owner, expires_at) VALUES (?, '', 0) ON CONFLICT (name) DO NOTHING`, lease)),
		lease: d.bind(fmt.Sprintf(`UPDATE %s SET owner = ?, expires_at = %s + ? WHERE name = ? AND (owner = ? OR expires_at < %s)`,
			lease, now, now)),
		release: d.bind(fmt.Sprintf(`UPDATE %s SET expires_at = 0 WHERE name = ? AND owner = ?`, lease)),
	}
}

// row is an outbox row as a pass reads it.
type row struct {
	id          int64
	msgID       string
	topic       string
	key         string
	tag         string
	props       map[string]string
	body        []byte
	reliability protocol.Reliability
	attemptedAt int64 // the first attempt (database ms), 0 none
	attempts    int   // before this pass
}

// readyRows reads up to n rows ready to be sent, in id order.
func (o *Outbox) readyRows(ctx context.Context, n int) ([]row, error) {
	rs, err := o.db.QueryContext(ctx, o.q.ready, n)
	if err != nil {
		return nil, fmt.Errorf("read ready rows: %w", err)
	}
	defer rs.Close()
	var out []row
	for rs.Next() {
		var r row
		var props string
		var rel int
		var attempted sql.NullInt64
		if err := rs.Scan(&r.id, &r.msgID, &r.topic, &r.key, &r.tag, &props, &r.body, &rel, &attempted, &r.attempts); err != nil {
			return nil, fmt.Errorf("read ready rows: %w", err)
		}
		if err := json.Unmarshal([]byte(props), &r.props); err != nil {
			return nil, fmt.Errorf("row %d: properties: %w", r.id, err)
		}
		r.reliability, r.attemptedAt = protocol.Reliability(rel), attempted.Int64
		out = append(out, r)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("read ready rows: %w", err)
	}
	return out, nil
}

// ids is the rows' ids as query arguments.
func ids(rows []row) []any {
	out := make([]any, len(rows))
	for i := range rows {
		out[i] = rows[i].id
	}
	return out
}

// markAttempted records, in one committed statement, that the rows are
// about to be sent: the first attempt's time (kept across attempts) and
// the count. A row marked so may be stored from then on, and whoever
// finds it later looks it up before sending it again.
func (o *Outbox) markAttempted(ctx context.Context, rows []row) error {
	q := o.q.d.bind(fmt.Sprintf(`UPDATE %s SET attempted_at = COALESCE(attempted_at, %s), attempts = attempts + 1 WHERE id IN (%s)`,
		o.q.table, o.q.d.now(), inList(len(rows))))
	if _, err := o.db.ExecContext(ctx, q, ids(rows)...); err != nil {
		return fmt.Errorf("mark %d rows attempted: %w", len(rows), err)
	}
	return nil
}

// deleteRows deletes rows whose messages are stored.
func (o *Outbox) deleteRows(ctx context.Context, rows []row) error {
	if len(rows) == 0 {
		return nil
	}
	q := o.q.d.bind(fmt.Sprintf(`DELETE FROM %s WHERE id IN (%s)`, o.q.table, inList(len(rows))))
	if _, err := o.db.ExecContext(ctx, q, ids(rows)...); err != nil {
		return fmt.Errorf("delete %d sent rows: %w", len(rows), err)
	}
	return nil
}

// putOff leaves a row for a pass after wait, noting why; failed marks it
// failed for good (the relay skips it until someone clears failed_at).
func (o *Outbox) putOff(ctx context.Context, r row, wait time.Duration, cause error, failed bool) error {
	failedAt := "NULL"
	if failed {
		failedAt = o.q.d.now()
	}
	msg := cause.Error()
	if len(msg) > 1000 {
		msg = msg[:1000]
	}
	q := o.q.d.bind(fmt.Sprintf(`UPDATE %s SET next_at = %s + ?, last_error = ?, failed_at = %s WHERE id = ?`,
		o.q.table, o.q.d.now(), failedAt))
	if _, err := o.db.ExecContext(ctx, q, wait.Milliseconds(), msg, r.id); err != nil {
		return fmt.Errorf("put row %d off: %w", r.id, err)
	}
	return nil
}
