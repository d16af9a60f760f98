#!/usr/bin/env bash
# delay-bench.sh: issue 28's figures for delayed messages, measured on the
# real processes a user runs: how late a broker releases them at a steady
# fire rate and after a burst, what pending messages cost in resident
# memory, and how soon firing resumes after a restart.
#
#   scripts/delay-bench.sh                    every figure
#   scripts/delay-bench.sh lateness burst     only these (lateness burst memory resume)
#
# It builds ferry-metaserver, ferry-broker and ferryctl into a temporary
# directory, starts one metaserver on 127.0.0.1 and, for every run, a fresh
# master (its own broker group, an empty data directory, -metrics-addr on
# BASE+9), sends with `ferryctl bench` and reads the master's /metrics.
# Every process it starts is stopped by its PID (a trap on exit); every load
# is bounded by a message count and by `timeout`, every wait by a deadline.
# Each figure is the median of RUNS runs, each on a fresh master.
#
# Figures:
#   lateness  --rate LAT_RATE --delay LAT_DELAY for LAT_SECONDS (1 KiB): once the first are due,
#             about LAT_RATE fires/s. After every message fired (fired_total reaching the count,
#             at most SETTLE_TIMEOUT s), p50, p99 and p99.9 of the master's
#             ferrymq_broker_delayed_lateness_seconds (due -> released)
#   burst     BURST_COUNT messages (1 KiB, async shape) all due at one instant (--deliver-at)
#             BURST_LEAD s after the sends start: /metrics polled every 100 ms from the end of
#             the sends; the time from the due instant until fired_total reaches the count, and
#             lateness p99 (a run whose sends end after the due instant is not counted)
#   memory    the master's VmRSS (/proc/PID/status) idle (topic made, one message sent) and
#             after MEM_COUNTS pending MEM_SIZE-byte messages due over the next ~89 days
#             (--delay 1h --delay-spread 2136h: none falls due during the run), read
#             MEM_SETTLE s after the sends; of it RssAnon (heap) and RssFile (mapped files), the
#             Go heap in use (go_memstats_heap_inuse_bytes), and its peak VmHWM. Each count is its own master.
#   resume    RESUME_COUNT pending (RESUME_SIZE bytes) due over the near future (--delay
#             RESUME_DELAY --delay-spread RESUME_SPREAD); once the first have fired the master is
#             stopped (SIGTERM, or kill -9) and started again on its directory: ms from the
#             start of its process to the first fire after it (its fired_total above 0, polled
#             every 20 ms)
#
# Quantiles are read from the histogram's cumulative buckets (upper bounds
# 50 µs, doubling to 13.1 s) as Prometheus's histogram_quantile does: the
# bucket holding the rank, linearly interpolated between its bounds (a
# bucket spans a factor of 2, so a quantile is exact only to that bucket);
# one in the +Inf bucket is printed as ">13.1072".
#
# Environment:
#   RUNS=3                    runs per figure (the median is printed)
#   LAT_RATE=20000 LAT_SECONDS=20 LAT_DELAY=5s
#   BURST_COUNT=500000 BURST_LEAD=20
#   MEM_COUNTS="1000000 5000000"  MEM_SIZE=100  MEM_SETTLE=10
#   MEM_ONCE=20000000         pending counts measured once (not RUNS times: a run takes minutes)
#   RESUME_COUNT=1000000 RESUME_SIZE=1024 RESUME_DELAY=20s RESUME_SPREAD=10m
#   SETTLE_TIMEOUT=120        the longest wait for every message to fire, in s
#   RUN_TIMEOUT=900           hard cap in seconds of each ferryctl bench run
#   FERRY_BENCH_BASE_PORT=7600  first of the 30 ports used (metaserver +1,+2; master +3,+4; metrics +9)
#   KEEP=1                    keep the temporary directory (logs, data)
#   BROKER_ARGS="..."         more flags for every master
#
# Output: progress lines start with '#'; then one line per figure:
#   FIGURE NAME UNIT MEDIAN runs=R1,R2,R3 | aim AIM MET/MISSED | COMMAND
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${RUNS:-3}"
LAT_RATE="${LAT_RATE:-20000}"
LAT_SECONDS="${LAT_SECONDS:-20}"
LAT_DELAY="${LAT_DELAY:-5s}"
BURST_COUNT="${BURST_COUNT:-500000}"
BURST_LEAD="${BURST_LEAD:-20}"
MEM_COUNTS="${MEM_COUNTS:-1000000 5000000}"
MEM_ONCE="${MEM_ONCE:-20000000}"
MEM_SIZE="${MEM_SIZE:-100}"
MEM_SETTLE="${MEM_SETTLE:-10}"
RESUME_COUNT="${RESUME_COUNT:-1000000}"
RESUME_SIZE="${RESUME_SIZE:-1024}"
RESUME_DELAY="${RESUME_DELAY:-20s}"
RESUME_SPREAD="${RESUME_SPREAD:-10m}"
SETTLE_TIMEOUT="${SETTLE_TIMEOUT:-120}"
RUN_TIMEOUT="${RUN_TIMEOUT:-900}"
BASE="${FERRY_BENCH_BASE_PORT:-7600}"
KEEP="${KEEP:-0}"
read -r -a BROKER_EXTRA <<<"${BROKER_ARGS:-}"

META="127.0.0.1:$((BASE + 1))"
RAFT="127.0.0.1:$((BASE + 2))"
MASTER_ADDR="127.0.0.1:$((BASE + 3))"
MASTER_HA="127.0.0.1:$((BASE + 4))"
METRICS_URL="http://127.0.0.1:$((BASE + 9))/metrics"

ALL=(lateness burst memory resume)
NAME=delay-bench.sh
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
# shellcheck source=scripts/bench-lib.sh
. "$ROOT/scripts/bench-lib.sh"

WANT=()
for a in "$@"; do
	case "$a" in
	lateness | burst | memory | resume) WANT+=("$a") ;;
	-h | --help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "delay-bench.sh: unknown figure $a (${ALL[*]})" >&2; exit 2 ;;
	esac
done
[ ${#WANT[@]} -eq 0 ] && WANT=("${ALL[@]}")
want() { local s; for s in "${WANT[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

work_init ferry-delay-bench
sig() { case "$1" in 130 | 143) echo "interrupted (rc=$1)" >&2; exit "$1" ;; esac; }
require_free_ports $((BASE + 1)) $((BASE + 9)) "set FERRY_BENCH_BASE_PORT to a free block of 30 ports"
ctl() { "$BIN/ferryctl" --meta "$META" --timeout 5s "$@"; }

# ------------------------------------------------------------------ master
# start_master GROUP [ARGS...]: the master of GROUP on its directory (fresh
# unless it exists), with -metrics-addr; MASTER_PID, T_LAUNCH (ns).
start_master() {
	local g="$1"
	shift
	T_LAUNCH="$(date +%s%N)"
	launch "$g-master" "$BIN/ferry-broker" -id "$g-master" -group "$g" -role master -dir "$WORK/data/$g-master" \
		-addr "$MASTER_ADDR" -ha-addr "$MASTER_HA" -meta "$META" -flush async -heartbeat 1s -session 4s \
		-metrics-addr "127.0.0.1:$((BASE + 9))" "${BROKER_EXTRA[@]}" "$@"
	MASTER_PID="$LAST_PID"
}
# fresh GROUP TOPIC [ARGS...]: a fresh master of GROUP taking writes, with
# TOPIC (8 queues) made and warmed up with one ordinary message.
fresh() {
	local g="$1" t="$2"
	shift 2
	rm -rf "$WORK/data/$g-master"
	start_master "$g" "$@"
	wait_until 30 "group $g taking writes" group_ready "$g" 0
	ctl topic create "$t" --queues 8 --groups "$g" >/dev/null || die "topic create $t failed"
	ctl send "$t" --body warm-up >/dev/null || die "the warm-up send to $t failed"
}
stop_master() {
	stop_pid "$MASTER_PID" "${1:-TERM}"
}

# metrics: the master's /metrics into M (empty when it does not answer).
# metrics [SECS]: the master's /metrics into M (empty when it does not
# answer within SECS, 2 by default); METRICS_MS, how long it took.
metrics() {
	local t0
	t0="$(date +%s%N)"
	M="$(curl -s -m "${1:-2}" "$METRICS_URL" 2>/dev/null)"
	METRICS_MS=$((($(date +%s%N) - t0) / 1000000))
}
# mval NAME: the value of series NAME (exact, labels included) in M.
mval() { awk -v n="$1" '$1 == n { print $2; exit }' <<<"$M"; }
# fired: the master's fired_total now (M is set only in the caller's
# subshell: call metrics before reading quantiles).
fired() { metrics; mval ferrymq_broker_delayed_fired_total; }
# quantile Q: the lateness quantile Q (seconds) from the histogram in M.
quantile() {
	awk -v q="$1" '
		/^ferrymq_broker_delayed_lateness_seconds_bucket/ {
			match($0, /le="[^"]*"/); le = substr($0, RSTART + 4, RLENGTH - 5)
			n++; ub[n] = le; c[n] = $2
		}
		END {
			if (n == 0 || c[n] == 0) { print "NA"; exit }
			rank = q * c[n]; lo = 0; prev = 0
			for (i = 1; i <= n; i++) {
				if (c[i] >= rank) {
					if (ub[i] == "+Inf") { printf ">%s\n", ub[i - 1]; exit }
					printf "%.4f\n", lo + (ub[i] - lo) * (c[i] > prev ? (rank - prev) / (c[i] - prev) : 1)
					exit
				}
				lo = ub[i]; prev = c[i]
			}
		}' <<<"$M"
}
# qbucket Q: the bounds in ms of the histogram bucket holding quantile Q in M.
qbucket() {
	awk -v q="$1" '
		/^ferrymq_broker_delayed_lateness_seconds_bucket/ {
			match($0, /le="[^"]*"/); n++; ub[n] = substr($0, RSTART + 4, RLENGTH - 5); c[n] = $2
		}
		END {
			if (n == 0 || c[n] == 0) { print "NA"; exit }
			lo = 0
			for (i = 1; i <= n; i++) {
				if (c[i] >= q * c[n]) { printf "(%g, %s]", lo * 1000, ub[i] == "+Inf" ? "+Inf" : ub[i] * 1000; exit }
				lo = ub[i]
			}
		}' <<<"$M"
}
ms() { awk -v s="$1" 'BEGIN{ if (s == "NA") print s; else if (s ~ /^>/) printf ">%g", substr(s, 2) * 1000; else printf "%.1f", s * 1000 }'; }

# wait_fired N SECS: polls fired_total every 100 ms until it reaches N or
# SECS pass; FIRED_AT (ns) is when it was seen reaching N (empty if not).
wait_fired() {
	local n="$1" end f
	end=$(($(date +%s) + $2))
	FIRED_AT=""
	while [ "$(date +%s)" -lt "$end" ]; do
		f="$(fired)"
		if [ -n "$f" ] && awk -v f="$f" -v n="$n" 'BEGIN{ exit !(f + 0 >= n + 0) }'; then
			FIRED_AT="$(date +%s%N)"
			return 0
		fi
		sleep 0.1
	done
	log "  fired_total ${f:-?} of $n after $2 s"
	return 1
}

# sendbench TOPIC ARGS...: ferryctl bench --json (bounded by RUN_TIMEOUT);
# B_SENT, B_RATE, B_ERRS; returns its exit code.
sendbench() {
	local t="$1" out rc
	shift
	echo "ferryctl bench --topic $t $*" >>"$WORK/logs/bench.out"
	out="$(timeout --foreground -k 5 "$RUN_TIMEOUT" "$BIN/ferryctl" --meta "$META" --timeout 10s --json bench \
		--topic "$t" --progress=false "$@" 2>>"$WORK/logs/bench.err")"
	rc=$?
	echo "$out" >>"$WORK/logs/bench.out"
	sig "$rc"
	B_SENT="$(jnum sent "$out")" B_ERRS="$(jnum errors "$out")"
	B_RATE="$(awk -v x="$(jnum msgs_per_sec "$out")" 'BEGIN{ printf "%.0f", x }')"
	[ "$rc" = 0 ] || log "  ferryctl bench failed (rc $rc): $(grep -m1 -A3 '^ferryctl:' "$WORK/logs/bench.err" | tr '\n' ' ')"
	return "$rc"
}

# ------------------------------------------------------------------ figures
declare -A VALS=() CMDS=()
add() { VALS[$1]+="${2:-NA} "; }
# shellcheck disable=SC2086 # the runs are words
med() { median ${VALS[$1]:-}; }
runs() { local v="${VALS[$1]:-}"; v="${v% }"; echo "${v// /,}"; }
RUN_NO=0
next() { RUN_NO=$((RUN_NO + 1)); G="g$RUN_NO" T="t$RUN_NO"; }

lateness_run() {
	local n=$((LAT_RATE * LAT_SECONDS)) args
	next
	args=(--mode async --producers 4 --window 1000 --size 1024 --rate "$LAT_RATE" --duration "${LAT_SECONDS}s" --count "$n" --delay "$LAT_DELAY")
	CMDS[lateness]="ferryctl bench ${args[*]}"
	fresh "$G" "$T"
	local c0 c1
	c0="$(proc_ticks "$MASTER_PID")"
	if sendbench "$T" "${args[@]}" && [ "${B_ERRS:-1}" = 0 ] && wait_fired "$B_SENT" "$SETTLE_TIMEOUT"; then
		c1="$(proc_ticks "$MASTER_PID")"
		metrics
		add lat.p50 "$(ms "$(quantile 0.5)")"
		add lat.p99 "$(ms "$(quantile 0.99)")"
		add lat.p999 "$(ms "$(quantile 0.999)")"
		add lat.rate "$B_RATE"
		add lat.bcpu "$(per_msg "$c0" "$c1" 0 "$B_SENT")"
		log "  sent $B_SENT at $B_RATE msgs/s; lateness p50 $(ms "$(quantile 0.5)") ms, p99 $(ms "$(quantile 0.99)") ms (bucket $(qbucket 0.99) ms), p99.9 $(ms "$(quantile 0.999)") ms (bucket $(qbucket 0.999) ms), all in $(qbucket 1) ms; master CPU over the run $(per_msg "$c0" "$c1" 0 "$B_SENT") µs per message (stored and fired)"
	else
		log "  run not counted"
	fi
	stop_master
}

burst_run() {
	local args due t0 t_due first="" f
	next
	fresh "$G" "$T"
	t0="$(date +%s)"
	due="$(date -u -d "@$((t0 + BURST_LEAD))" +%FT%TZ)"
	t_due=$(((t0 + BURST_LEAD) * 1000000000))
	args=(--mode async --producers 4 --window 1000 --size 1024 --count "$BURST_COUNT" --deliver-at "$due")
	CMDS[burst]="ferryctl bench --mode async --producers 4 --window 1000 --size 1024 --count $BURST_COUNT --deliver-at NOW+${BURST_LEAD}s"
	if ! sendbench "$T" "${args[@]}" || [ "${B_ERRS:-1}" != 0 ]; then
		log "  run not counted"
		stop_master
		return
	fi
	if [ "$(date +%s%N)" -ge "$t_due" ]; then
		log "  the sends ended after the due instant $due: run not counted (raise BURST_LEAD)"
		stop_master
		return
	fi
	# Polled every 100 ms from before the due instant: the first fire, then all.
	local end=$((t0 + BURST_LEAD + SETTLE_TIMEOUT)) done_at=""
	while [ "$(date +%s)" -lt "$end" ]; do
		f="$(fired)"
		[ -z "$first" ] && [ "${f:-0}" != 0 ] && first="$(date +%s%N)"
		if [ -n "$f" ] && [ "$f" -ge "$B_SENT" ] 2>/dev/null; then
			done_at="$(date +%s%N)"
			break
		fi
		sleep 0.1
	done
	if [ -z "$done_at" ]; then
		log "  fired ${f:-?} of $B_SENT within $SETTLE_TIMEOUT s of the due instant: run not counted"
	else
		local d fst
		metrics
		d="$(awk -v a="$t_due" -v b="$done_at" 'BEGIN{ printf "%.2f", (b - a) / 1e9 }')"
		fst="$(awk -v a="$t_due" -v b="$first" 'BEGIN{ printf "%.0f", (b - a) / 1e6 }')"
		add burst.drain "$d"
		add burst.first "$fst"
		add burst.p99 "$(ms "$(quantile 0.99)")"
		add burst.rate "$B_RATE"
		log "  sent $B_SENT at $B_RATE msgs/s; first fire seen ${fst} ms after the due instant, all $B_SENT fired after $d s; lateness p99 $(ms "$(quantile 0.99)") ms (bucket $(qbucket 0.99) ms), all in $(qbucket 1) ms"
	fi
	stop_master
}

rss_kib() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status" 2>/dev/null; }
memory_run() {
	local n="$1" idle idle_anon rss hwm anon file args
	next
	args=(--mode async --producers 4 --window 1000 --size "$MEM_SIZE" --count "$n" --delay 1h --delay-spread 2136h)
	CMDS[mem]="ferryctl bench --mode async --producers 4 --window 1000 --size $MEM_SIZE --count N --delay 1h --delay-spread 2136h (master -delay-quota 2N)"
	# The topic's quota of pending messages (-delay-quota, 10M by default) is
	# raised well above n: at n+1, 742 of 20M sends were refused DELAY_QUOTA.
	fresh "$G" "$T" -delay-quota "$((2 * n))"
	sleep "$MEM_SETTLE"
	idle="$(rss_kib "$MASTER_PID" VmRSS)" idle_anon="$(rss_kib "$MASTER_PID" RssAnon)"
	if sendbench "$T" "${args[@]}" && [ "${B_ERRS:-1}" = 0 ]; then
		sleep "$MEM_SETTLE"
		rss="$(rss_kib "$MASTER_PID" VmRSS)" hwm="$(rss_kib "$MASTER_PID" VmHWM)"
		anon="$(rss_kib "$MASTER_PID" RssAnon)" file="$(rss_kib "$MASTER_PID" RssFile)"
		metrics 120
		local pend heap
		add "mem.$n.scrape" "$METRICS_MS"
		heap="$(awk '$1 == "go_memstats_heap_inuse_bytes" { printf "%.1f", $2 / 1048576 }' <<<"$M")"
		add "mem.$n.heap" "$heap"
		pend="$(awk '/^ferrymq_broker_delayed_pending\{/ { s += $2 } END { print s + 0 }' <<<"$M")"
		add "mem.idle" "$(awk -v k="$idle" 'BEGIN{ printf "%.1f", k / 1024 }')"
		add "mem.$n" "$(awk -v k="$rss" -v i="$idle" 'BEGIN{ printf "%.1f", (k - i) / 1024 }')"
		add "mem.$n.rss" "$(awk -v k="$rss" 'BEGIN{ printf "%.1f", k / 1024 }')"
		add "mem.$n.hwm" "$(awk -v k="$hwm" -v i="$idle" 'BEGIN{ printf "%.1f", (k - i) / 1024 }')"
		add "mem.$n.rate" "$B_RATE"
		add "mem.$n.anon" "$(awk -v k="$anon" -v i="$idle_anon" 'BEGIN{ printf "%.1f", (k - i) / 1024 }')"
		add "mem.$n.file" "$(awk -v k="$file" 'BEGIN{ printf "%.1f", k / 1024 }')"
		log "  $B_SENT sent at $B_RATE msgs/s, $pend pending; VmRSS idle $((idle / 1024)) MiB, with them $((rss / 1024)) MiB (+$(((rss - idle) / 1024)); RssAnon +$(((anon - idle_anon) / 1024)), RssFile $((file / 1024)); Go heap in use $heap MiB; /metrics answered in $METRICS_MS ms), peak VmHWM $((hwm / 1024)) MiB; data $(du -sh "$WORK/data/$G-master" | cut -f1)"
	else
		log "  run not counted"
	fi
	stop_master
	rm -rf "$WORK/data/$G-master"
}

resume_run() {
	local how="$1" args f0 t1="" f
	next
	args=(--mode async --producers 4 --window 1000 --size "$RESUME_SIZE" --count "$RESUME_COUNT" --delay "$RESUME_DELAY" --delay-spread "$RESUME_SPREAD")
	CMDS[resume]="ferryctl bench ${args[*]}"
	fresh "$G" "$T"
	if ! sendbench "$T" "${args[@]}" || [ "${B_ERRS:-1}" != 0 ]; then
		log "  run not counted"
		stop_master
		return
	fi
	# Firing under way before the stop.
	if ! wait_fired 1 60; then
		log "  nothing fired within 60 s of the sends: run not counted"
		stop_master
		return
	fi
	f0="$(fired)"
	if [ "$how" = kill ]; then stop_master KILL; else stop_master TERM; fi
	start_master "$G"
	local end=$(($(date +%s) + 60))
	while [ "$(date +%s)" -lt "$end" ]; do
		f="$(fired)"
		if [ -n "$f" ] && [ "$f" != 0 ]; then
			t1="$(date +%s%N)"
			break
		fi
		sleep 0.02
	done
	if [ -z "$t1" ]; then
		log "  no fire within 60 s of the restart: run not counted (log: $WORK/logs/$G-master.log)"
	else
		local d
		d="$(awk -v a="$T_LAUNCH" -v b="$t1" 'BEGIN{ printf "%.0f", (b - a) / 1e6 }')"
		add "resume.$how" "$d"
		metrics
		log "  $f0 had fired before the stop ($how); first fire after the restart seen $d ms after the process started (pending by due: $(awk '/^ferrymq_broker_delayed_pending\{/ { printf "%s=%s ", $1, $2 }' <<<"$M" | sed 's/ferrymq_broker_delayed_pending//g'))"
	fi
	stop_master
	rm -rf "$WORK/data/$G-master"
}

# ------------------------------------------------------------------ report
line() { printf 'FIGURE %-22s %-5s %10s  runs=%-24s | aim %-10s %-6s | %s\n' "$@"; }
verdict() { awk -v v="$1" -v op="$2" -v b="$3" 'BEGIN{ if (v == "NA" || v ~ /^>/) { print (v ~ /^>/ && op == "<=") ? "MISSED" : "-"; exit }
	ok = (op == ">=") ? v + 0 >= b + 0 : v + 0 <= b + 0; print ok ? "MET" : "MISSED" }'; }
report() {
	local v n
	echo "# $(date -u +%FT%TZ) commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "?") nproc=$(nproc) RUNS=$RUNS load before: $LOAD0 after: $(uptime | sed 's/.*load average: //')"
	if want lateness; then
		v=$(med lat.p50); line lateness.p50 ms "$v" "$(runs lat.p50)" "-" "-" "${CMDS[lateness]:-}"
		v=$(med lat.p99); line lateness.p99 ms "$v" "$(runs lat.p99)" "<=50" "$(verdict "$v" "<=" 50)" "at $(med lat.rate) msgs/s sent"
		v=$(med lat.p999); line lateness.p99.9 ms "$v" "$(runs lat.p999)" "<=200" "$(verdict "$v" "<=" 200)" "master CPU over the run $(med lat.bcpu) µs per message (stored and fired)"
	fi
	if want burst; then
		v=$(med burst.drain); line burst.drain s "$v" "$(runs burst.drain)" "<=10" "$(verdict "$v" "<=" 10)" "${CMDS[burst]:-}"
		v=$(med burst.first); line burst.first ms "$v" "$(runs burst.first)" "-" "-" "first fire seen (polled every 100 ms) after the due instant"
		v=$(med burst.p99); line burst.lateness.p99 ms "$v" "$(runs burst.p99)" "-" "-" "sent at $(med burst.rate) msgs/s"
	fi
	if want memory; then
		line mem.idle MiB "$(med mem.idle)" "$(runs mem.idle)" "-" "-" "VmRSS of an idle master (one per run below)"
		for n in $MEM_COUNTS $MEM_ONCE; do
			v=$(med "mem.$n")
			line "mem.$n.above_idle" MiB "$v" "$(runs "mem.$n")" "<=64" "$(verdict "$v" "<=" 64)" "VmRSS $(med "mem.$n.rss") MiB; of it RssAnon +$(med "mem.$n.anon") MiB above idle, RssFile $(med "mem.$n.file") MiB (mapped log); Go heap in use $(med "mem.$n.heap") MiB; /metrics answered in $(med "mem.$n.scrape") ms; peak above idle $(med "mem.$n.hwm") MiB; sent at $(med "mem.$n.rate") msgs/s"
		done
		echo "NOTE memory: ${CMDS[mem]:-}"
	fi
	if want resume; then
		v=$(med resume.term); line resume.sigterm ms "$v" "$(runs resume.term)" "<=1000" "$(verdict "$v" "<=" 1000)" "${CMDS[resume]:-}"
		v=$(med resume.kill); line resume.kill9 ms "$v" "$(runs resume.kill)" "<=1000" "$(verdict "$v" "<=" 1000)" "from the process start to fired_total > 0 (polled every 20 ms)"
	fi
	return 0
}

# ------------------------------------------------------------------ main
LOAD0="$(uptime | sed 's/.*load average: //')"
log "work directory $WORK, ports $BASE..$((BASE + 29)), figures: ${WANT[*]}; load average $LOAD0"
build_bins
start_meta
for r in $(seq "$RUNS"); do
	if want lateness; then
		log "lateness run $r/$RUNS: --rate $LAT_RATE --delay $LAT_DELAY for $LAT_SECONDS s"
		lateness_run
	fi
	if want burst; then
		log "burst run $r/$RUNS: $BURST_COUNT due at one instant ${BURST_LEAD} s after the sends start"
		burst_run
	fi
	if want memory; then
		for n in $MEM_COUNTS; do
			log "memory run $r/$RUNS: $n pending $MEM_SIZE-byte messages due over ~89 days"
			memory_run "$n"
		done
	fi
	if want resume; then
		for how in term kill; do
			log "resume run $r/$RUNS: $RESUME_COUNT pending, master stopped ($how) while firing, started again"
			resume_run "$how"
		done
	fi
done
if want memory; then
	for n in $MEM_ONCE; do
		log "memory run (once): $n pending $MEM_SIZE-byte messages due over ~89 days"
		memory_run "$n"
	done
fi
report
