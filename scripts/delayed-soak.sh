#!/usr/bin/env bash
# delayed-soak.sh: the long run of the delayed-message tests through real
# processes (e2e/delayed_test.go): 100,000 delayed messages due over 60 s
# (two in five in the busiest second, every fifth HIGH) sent to g1 of a
# local cluster, g1's master killed with SIGKILL in the busiest second and
# restarted (TestDelayedExactlyOnceKill9), then again with a failover: the
# slave stopped, the master killed, the slave promoted
# (TestDelayedExactlyOnceFailover). Each asserts that every acknowledged
# message is released exactly once and none early, and logs the figures.
#
#   scripts/delayed-soak.sh                          100,000 messages over 60 s
#   N=500000 WINDOW=120s scripts/delayed-soak.sh     more
#   RACE=1 scripts/delayed-soak.sh                   with the race detector (slower)
#
# The tests start their clusters with scripts/cluster.sh under a temporary
# FERRY_HOME on free ports they pick, and stop them by PID. The full test
# output goes to $OUT (default a temporary file); the figures are printed:
# the plan, the kill, the releases per incarnation, the lateness (from the
# copies' store times, and the brokers' histograms), the repeated releases a
# consumer saw across the failover, and the lookups.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
N="${N:-100000}"
WINDOW="${WINDOW:-60s}"
RACE="${RACE:-0}"
OUT="${OUT:-$(mktemp -t delayed-soak.XXXXXX)}"

case "$N" in '' | *[!0-9]*) echo "delayed-soak.sh: N must be a number of messages, got '$N'" >&2; exit 2 ;; esac
race=()
if [ "$RACE" = 1 ]; then race=(-race); fi

echo "== $N delayed messages due over $WINDOW, kill -9 and then failover (full output: $OUT)"
rc=0
(cd "$ROOT" && FERRY_DELAY_N="$N" FERRY_DELAY_WINDOW="$WINDOW" \
	go test "${race[@]}" -count=1 -v -timeout 60m -run '^TestDelayedExactlyOnce(Kill9|Failover)$' ./e2e/) >"$OUT" 2>&1 || rc=$?
grep -E '^(=== RUN|--- |    delayed_test.go:[0-9]+: (PLAN|SENT|KILLED|RESTARTED|PROMOTED|HANDED|FIRED|REPEATED|LATENESS|LOOKUPS))|^(ok|FAIL)' "$OUT" |
	sed -E 's/^    delayed_test.go:[0-9]+: /  /'
if [ "$rc" != 0 ]; then
	echo "== FAILED (exit $rc): the failures, from $OUT"
	grep -E '^\s+delayed_test.go:[0-9]+: ' "$OUT" | grep -vE ': (PLAN|SENT|KILLED|RESTARTED|PROMOTED|HANDED|FIRED|REPEATED|LATENESS|LOOKUPS|cluster up)' | head -40
fi
exit "$rc"
