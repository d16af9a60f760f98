#!/usr/bin/env bash
# bench-idempotence.sh: what idempotent, ordered sends cost, on real processes.
#
# Starts one metaserver and one master broker on 127.0.0.1 (ports from
# FERRY_BENCH_PORT, default 7600), then runs `ferryctl bench` RUNS times each
# with idempotence on and off, in two shapes: async (4 producers, window 1000)
# and one at a time (--mode sync --producers 1). Prints one line per run and
# stops the processes it started, by PID.
#
#   RUNS=3 COUNT=200000 SYNC_COUNT=20000 FLUSH=async bash scripts/bench-idempotence.sh
#
# KEEP=1 keeps the work directory (binaries, data, logs) after the run.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
RUNS="${RUNS:-3}"
COUNT="${COUNT:-200000}"
SYNC_COUNT="${SYNC_COUNT:-20000}"
FLUSH="${FLUSH:-async}"
PORT="${FERRY_BENCH_PORT:-7600}"
KEEP="${KEEP:-0}"
META="127.0.0.1:$PORT"
RAFT="127.0.0.1:$((PORT + 1))"
NAME=bench-idempotence.sh
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

work_init ferry-idempotence
require_free_ports "$PORT" $((PORT + 3)) "set FERRY_BENCH_PORT to a free block of 4 ports"
ctl() { "$BIN/ferryctl" --meta "$META" --timeout 5s "$@"; }
writable() { ctl brokers --json 2>/dev/null | grep -q '"state": "RW"'; }

build_bins
start_meta
launch broker "$BIN/ferry-broker" -id g1-master -group g1 -role master -dir "$WORK/data/g1" -addr "127.0.0.1:$((PORT + 2))" \
  -ha-addr "127.0.0.1:$((PORT + 3))" -meta "$META" -flush "$FLUSH" -heartbeat 1s -session 4s
wait_until 30 "group g1 taking writes" writable
ctl topic create bench --queues 8 >/dev/null

for run in $(seq "$RUNS"); do
  for idem in true false; do
    echo "run $run idempotence=$idem async: $(ctl bench --topic bench --count "$COUNT" --idempotence="$idem" | tail -1)"
    echo "run $run idempotence=$idem sync-1: $(ctl bench --topic bench --count "$SYNC_COUNT" --mode sync --producers 1 --idempotence="$idem" | tail -1)"
  done
done
