#!/usr/bin/env bash
# bench-failover.sh: issue 12's failover figures, measured on real processes.
#
# Starts the local cluster (scripts/cluster.sh: 3 metaservers, groups g1 and
# g2, each a master and a slave) on a throwaway FERRY_HOME and runs
# scripts/failoverprobe (a Go program on the producer SDK and the
# metaserver client) against it:
#
#   1. kill-to-writable: producers send without pause to topic fo-g1 (its
#      queues on g1 only). ROUNDS times: kill -9 g1's master (read from the
#      registry; PID from FERRY_HOME/pids), measure from the kill until the
#      registry shows g1 writable with the other broker as master at a higher
#      epoch, and until a send is acknowledged by that broker; restart the
#      killed broker with its own command line (/proc/PID/cmdline, read
#      before the kill) and wait until it is g1's slave and connected.
#   2. SIGSTOP of g1's master until its slave is promoted, then SIGCONT:
#      producers send keyed and unkeyed messages at a fixed pace to fo-mix
#      (queues on g1 and g2); the longest and p99 wait for an
#      acknowledgement among the sends in flight during the fault.
#   3. When a group writable again gets messages: after 2 (g1 writable at its
#      promotion; the old master rejoins as slave), and on a second cluster
#      with FERRY_FAILOVER=off (SIGSTOP until g1 is read-only, HOLD more,
#      SIGCONT, g1 writable again under the same master).
#
# Every process is started by cluster.sh (or, for the restarted brokers, by
# the probe, which writes their PID files) and stopped by cluster.sh stop,
# by PID, on exit. Runs in about 4 minutes with the defaults.
#
#   ROUNDS=10 FERRY_BASE_PORT=9300 bash scripts/bench-failover.sh
#
# Environment:
#   ROUNDS           promotions in 1 (default 10)
#   FERRY_BASE_PORT  the clusters' first port (default: 9300, or the next
#                    free block of 60 ports up to 9900 when 9300's is taken)
#   FERRY_FLUSH      brokers' flush mode (default async)
#   SENDERS          producer goroutines: 1 uses this many, 2 and 3 this many
#                    keyed and this many unkeyed (default 4)
#   PACE             least time between one sender's sends (default 20ms in 1,
#                    STOP_PACE=100ms in 2 and 3)
#   OBSERVE          how long 2 and 3 keep sending after g1 is writable (10s)
#   HOLD             3, failover off: how long g1's master stays stopped after
#                    g1 is read-only (1s)
#   KEEP=1           keep the work directory (data, logs, and every send of 2
#                    and 3 in stop-on.csv, stop-off.csv) after the run; it is
#                    also kept when the run fails
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS="${ROUNDS:-10}"
SENDERS="${SENDERS:-4}"
PACE="${PACE:-20ms}"
STOP_PACE="${STOP_PACE:-100ms}"
OBSERVE="${OBSERVE:-10s}"
HOLD="${HOLD:-1s}"
KEEP="${KEEP:-0}"
export FERRY_FLUSH="${FERRY_FLUSH:-async}"
CLUSTER="$ROOT/scripts/cluster.sh"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ferry-bench-failover.XXXXXX")"
HOMES=()
PROBE=""
ok=0

# port_free P: nothing listens on 127.0.0.1:P.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
block_free() {
  local p
  for p in $(seq "$1" $(($1 + 59))); do
    port_free "$p" || return 1
  done
}
if [ -n "${FERRY_BASE_PORT:-}" ]; then
  BASE="$FERRY_BASE_PORT"
  block_free "$BASE" || { echo "bench-failover.sh: a port in $BASE..$((BASE + 59)) is in use" >&2; exit 1; }
else
  BASE=""
  for b in 9300 9400 9500 9600 9700 9800 9900; do
    if block_free "$b"; then BASE="$b" && break; fi
  done
  [ -n "$BASE" ] || { echo "bench-failover.sh: no free block of 60 ports from 9300 to 9959; set FERRY_BASE_PORT" >&2; exit 1; }
fi
export FERRY_BASE_PORT="$BASE"
META="127.0.0.1:$((BASE + 1)),127.0.0.1:$((BASE + 2)),127.0.0.1:$((BASE + 3))"

# cleanup: continue any broker left stopped, stop every process of every
# cluster started here (cluster.sh stop: by the PIDs in FERRY_HOME/pids),
# then remove the work directory unless kept.
cleanup() {
  local h f
  for h in "${HOMES[@]}"; do
    for f in "$h"/pids/*.pid; do
      if [ -f "$f" ]; then kill -CONT "$(cat "$f")" 2>/dev/null || true; fi
    done
    FERRY_HOME="$h" "$CLUSTER" stop >>"$WORK/cluster.log" 2>&1 || true
  done
  if [ "$ok" = 1 ] && [ "$KEEP" != 1 ]; then
    rm -rf "$WORK"
  else
    echo "bench-failover.sh: work directory kept: $WORK (cluster logs under */logs, cluster.sh output in cluster.log)" >&2
  fi
}
trap cleanup EXIT
trap 'if [ -n "$PROBE" ]; then kill -TERM "$PROBE" 2>/dev/null || true; wait "$PROBE" || true; fi; exit 130' INT TERM

# cluster_start NAME [ENV...]: a fresh cluster under $WORK/NAME.
cluster_start() {
  local name="$1"
  shift
  HOME_NOW="$WORK/$name"
  HOMES+=("$HOME_NOW")
  if ! env FERRY_HOME="$HOME_NOW" "$@" "$CLUSTER" start >>"$WORK/cluster.log" 2>&1; then
    echo "bench-failover.sh: cluster.sh start failed:" >&2
    tail -n 30 "$WORK/cluster.log" >&2
    exit 1
  fi
}
cluster_stop() { FERRY_HOME="$HOME_NOW" "$CLUSTER" stop >>"$WORK/cluster.log" 2>&1; }
ctl() { "$HOME_NOW/bin/ferryctl" --meta "$META" --timeout 5s "$@"; }

# run NAME SECONDS ARGS...: the probe, bounded in time, its output shown and
# kept in $WORK/NAME.out. It runs in the background so that a signal to this
# script stops it at once (the trap below), by its PID.
run() {
  local name="$1" secs="$2" rc=0 tailpid
  shift 2
  echo "\$ failoverprobe $*" | sed "s|$WORK|\$WORK|g" >"$WORK/$name.out"
  timeout --kill-after=10 "$secs" "$WORK/bin/failoverprobe" -meta "$META" -home "$HOME_NOW" "$@" >>"$WORK/$name.out" 2>&1 &
  PROBE=$!
  tail -n +1 -f --pid="$PROBE" "$WORK/$name.out" &
  tailpid=$!
  wait "$PROBE" || rc=$?
  PROBE=""
  wait "$tailpid" || true
  if [ "$rc" != 0 ]; then
    echo "bench-failover.sh: failoverprobe $1 $2 exited with status $rc" >&2
    exit 1
  fi
}

started=$SECONDS
echo "== building scripts/failoverprobe into $WORK/bin (work directory $WORK, ports $BASE..$((BASE + 59)))"
(cd "$ROOT" && go build -o "$WORK/bin/failoverprobe" ./scripts/failoverprobe)

echo "== cluster 1: FERRY_FAILOVER=on (cluster.sh start: session 4s, failover margin 500ms, flush $FERRY_FLUSH)"
cluster_start on FERRY_FAILOVER=on
ctl topic create fo-g1 --queues 4 --groups g1 >/dev/null
ctl topic create fo-mix --queues 8 --groups g1,g2 >/dev/null
# placement TOPIC: how many of its queues each group holds, e.g. "g1 x4, g2 x4".
placement() {
  ctl routes "$1" --json | grep -o '"group": *"[^"]*"' | sed 's/.*: *"//; s/"$//' | sort | uniq -c |
    awk '{printf "%s%s x%s", s, $2, $1; s=", "}'
}
echo "topics: fo-g1 on $(placement fo-g1); fo-mix on $(placement fo-mix)"

echo
echo "== 1. kill -9 of g1's master, $ROUNDS promotions"
run kill $((ROUNDS * 40 + 60)) -mode kill -topic fo-g1 -group g1 -rounds "$ROUNDS" -senders "$SENDERS" -pace "$PACE"

echo
echo "== 2. SIGSTOP of g1's master until its slave is promoted, then SIGCONT"
run stop-on 150 -mode stop -failover on -topic fo-mix -group g1 -senders "$SENDERS" -pace "$STOP_PACE" -observe "$OBSERVE" \
  -trace "$WORK/stop-on.csv"
echo
ctl brokers | sed 's/^/  /'
cluster_stop

echo
echo "== cluster 2: FERRY_FAILOVER=off"
cluster_start off FERRY_FAILOVER=off
ctl topic create fo-mix --queues 8 --groups g1,g2 >/dev/null
echo
echo "== 3. SIGSTOP of g1's master until g1 is read-only, $HOLD more, then SIGCONT (no failover)"
run stop-off 150 -mode stop -failover off -topic fo-mix -group g1 -senders "$SENDERS" -pace "$STOP_PACE" -observe "$OBSERVE" -hold "$HOLD" \
  -trace "$WORK/stop-off.csv"
cluster_stop

echo
echo "==== note ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git -C "$ROOT" rev-parse --short HEAD), $(nproc) cores, run took $((SECONDS - started)) s)"
echo "Local cluster (scripts/cluster.sh: 3 metaservers, g1/g2 master+slave, broker session 4s, heartbeat 1s,"
echo "failover margin 500ms, flush $FERRY_FLUSH); producers: producer SDK defaults (RequestTimeout 5s, RoutePoll 300ms),"
echo "synchronous NORMAL sends; registry polled every 20ms. Command: ROUNDS=$ROUNDS bash scripts/bench-failover.sh"
echo
echo "Kill-to-writable ($(head -1 "$WORK/kill.out" | sed 's/^\$ //')):"
grep -E "^(round|=>|   [a-z])" "$WORK/kill.out" | sed 's/^=> /  /; s/^round/  round/'
echo "SIGSTOP of g1's master, failover on ($(head -1 "$WORK/stop-on.out" | sed 's/^\$ //')):"
grep -E "^(SIGSTOP|=>|   [a-z])" "$WORK/stop-on.out" | sed 's/^=> /  /; s/^SIGSTOP/  SIGSTOP/'
echo "SIGSTOP of g1's master past the session, failover off ($(head -1 "$WORK/stop-off.out" | sed 's/^\$ //')):"
grep -E "^(SIGSTOP|=>|   [a-z])" "$WORK/stop-off.out" | sed 's/^=> /  /; s/^SIGSTOP/  SIGSTOP/'
ok=1
