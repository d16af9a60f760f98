#!/usr/bin/env bash
# bench-restart.sh: how long a broker holding a large commit log takes to
# open it again, on real processes: after a clean stop, after kill -9, and
# with its index directory removed (the log read whole, as before the index
# existed).
#
#   scripts/bench-restart.sh                  3,000,000 messages of 1 KiB (about 3.1 GB)
#   COUNT=10000000 scripts/bench-restart.sh   about 10 GB
#   DROP_CACHES=1 scripts/bench-restart.sh    drop the page cache before each start (root): cold figures
#
# It builds the binaries into a temporary directory, starts one metaserver
# and one master broker on 127.0.0.1 (ports from FERRY_BENCH_BASE_PORT,
# default 7650), fills the log with `ferryctl bench`, then stops and starts
# the broker and reads the time the commit log took to open from its log
# ("opened the commit log ... took=..."). Every process it starts is stopped
# by its PID (a trap on exit); the temporary directory is removed at the end
# (KEEP=1 keeps it).
#
# Output: one line per figure:
#   RESTART <how> took=<open time> records_read=<n> index_chunks=<n> end=<log bytes>
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COUNT="${COUNT:-3000000}"
BASE="${FERRY_BENCH_BASE_PORT:-7650}"
DROP_CACHES="${DROP_CACHES:-0}"
KEEP="${KEEP:-0}"
META="127.0.0.1:$((BASE + 1))"
ADDR="127.0.0.1:$((BASE + 3))"
HA="127.0.0.1:$((BASE + 4))"
RAFT="127.0.0.1:$((BASE + 2))"
NAME=bench-restart.sh
STOP_WAIT=30 # a broker closing a large log
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

case "$COUNT" in '' | *[!0-9]*) die "COUNT must be a number of messages, got '$COUNT'" ;; esac

work_init ferry-restart
require_free_ports $((BASE + 1)) $((BASE + 4)) "set FERRY_BENCH_BASE_PORT to a free block of 5 ports"
ctl() { "$BIN/ferryctl" --meta "$META" --timeout 5s "$@"; }
writable() { ctl brokers --json 2>/dev/null | grep -q '"state": "RW"'; }

build_bins
start_meta

BROKER=""
RUN=0
start_broker() {
	RUN=$((RUN + 1))
	launch "broker-$RUN" "$BIN/ferry-broker" -id g1-master -group g1 -role master -dir "$WORK/data/g1" -addr "$ADDR" -ha-addr "$HA" \
		-meta "$META" -heartbeat 1s -session 4s
	BROKER=$LAST_PID
	wait_until 600 "the broker opening its log" grep -q "opened the commit log" "$WORK/logs/broker-$RUN.log"
}
report() {
	local line
	line="$(grep -m1 "opened the commit log" "$WORK/logs/broker-$RUN.log")"
	printf 'RESTART %-28s took=%s records_read=%s index_chunks=%s end=%s\n' "$1" \
		"$(sed -n 's/.*took=\([^ ]*\).*/\1/p' <<<"$line")" "$(sed -n 's/.*records_read=\([^ ]*\).*/\1/p' <<<"$line")" \
		"$(sed -n 's/.*index_chunks=\([^ ]*\).*/\1/p' <<<"$line")" "$(sed -n 's/.* end=\([^ ]*\).*/\1/p' <<<"$line")"
}
drop_caches() {
	[ "$DROP_CACHES" = 1 ] || return 0
	sync
	echo 3 >/proc/sys/vm/drop_caches || die "DROP_CACHES=1 needs root"
}

start_broker
wait_until 30 "group g1 taking writes" writable
ctl topic create big --queues 8 --groups g1 >/dev/null || die "topic create failed"
log "filling the log with $COUNT messages of 1 KiB"
timeout --foreground -k 5 3600 "$BIN/ferryctl" --meta "$META" --timeout 10s bench --topic big --size 1024 \
	--count "$COUNT" --mode async --producers 4 --window 1000 --progress=false >"$WORK/logs/fill.out" 2>&1 ||
	die "filling failed: $(tail -3 "$WORK/logs/fill.out")"
temp="$(if [ "$DROP_CACHES" = 1 ]; then echo cold; else echo warm; fi)"

stop_pid "$BROKER" TERM
drop_caches
start_broker
report "after a clean stop ($temp)"

# kill -9 right after more writes: the index on disk is behind the log.
wait_until 30 "group g1 taking writes" writable
timeout --foreground -k 5 600 "$BIN/ferryctl" --meta "$META" --timeout 10s bench --topic big --size 1024 \
	--count 200000 --mode async --producers 4 --window 1000 --progress=false >"$WORK/logs/fill2.out" 2>&1 ||
	die "writing before the kill failed: $(tail -3 "$WORK/logs/fill2.out")"
stop_pid "$BROKER" KILL
drop_caches
start_broker
report "after kill -9 under writes ($temp)"

stop_pid "$BROKER" TERM
rm -rf "$WORK/data/g1/index"
drop_caches
start_broker
report "without its index ($temp)"
stop_pid "$BROKER" TERM
