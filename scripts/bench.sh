#!/usr/bin/env bash
# bench.sh: issue 14's performance figures, measured on the real processes a
# user runs, beside NATS JetStream measured in the same invocation.
#
#   scripts/bench.sh                 every shape, then NATS (if ../shared/bench/run-peers.sh is there)
#   scripts/bench.sh async sync      only these shapes (and NATS)
#   PEERS=0 scripts/bench.sh async   without NATS (no ratios)
#
# It builds ferry-metaserver, ferry-broker and ferryctl into a temporary
# directory, starts one metaserver on 127.0.0.1, and for every run of every
# shape a fresh master broker (and a slave, for HIGH) with an empty data
# directory, as its own broker group, sends with `ferryctl bench` (1 KiB
# messages), and stops the brokers. Every process it starts is stopped by
# its PID (a trap on exit); every load is bounded by a message count and by
# `timeout`. The temporary directory is removed at the end (KEEP=1 keeps it).
#
# Shapes (each figure is the median of RUNS runs):
#   async      4 producers, window 1000 in flight each, flush=async  (--mode async --producers 4 --window 1000)
#   async1     1 producer, window 500, flush=async: NATS's async shape exactly (1 client, batch 500)
#   sync       one at a time (--mode sync --producers 1), flush=async: p50 and p99 latency
#   flushsync  the async shape with the broker at -flush sync (fdatasync before every answer)
#   high       the async shape with HIGH reliability and a slave, as a ratio to NORMAL alone
#              (the async shape's runs of this invocation; run with async)
#   normalslave the async shape, NORMAL, with a slave connected: high is printed against it
#   high2      the async shape with HIGH reliability and two slaves (both in the sync set: every
#              HIGH message waits for both), printed against high and normalslave2
#   normalslave2 the async shape, NORMAL, with two slaves connected
#   delayed    the async shape with --delay 1h (every message a delayed one, stored pending; none
#              falls due during the run), as a ratio to the async shape's runs of this invocation
#              (it runs the async shape too, its runs interleaved with those)
#   queues     the async shape into a topic of 1000 queues and into one of 8, as a ratio
#   consume    COUNT messages written (async shape), then one member drains them (--consumers 1
#              --backlog): the rate from its first delivered message to the last, beside
#              `run-peers.sh natsconsume` with CONSUME_CLIENTS=1 (NATS `js consume`, MSGS=COUNT)
#   consume4   the same with four members, beside natsconsume with CONSUME_CLIENTS=4
#   fixedrate  the async shape held at FIXED_RATE msgs/s for FIXED_SECONDS: p50 and p99
#   console    the fixedrate shape while a client requests web console pages (no browser) at
#              CONSOLE_RATE pages/s, its runs interleaved with fixedrate's: p99 with and without
#   roll       ROLL_COUNT messages (async shape) into a master with -segment-size ROLL_SEGMENT
#              (several segments rolled): rate and p99 against async
#   coldstart  COLD_BYTES written into a master, which is stopped; sync, the page cache dropped
#              (echo 3 > /proc/sys/vm/drop_caches, as root; a NOTE says when it could not be), and the
#              master started again on its directory: ms until its data port accepts a connection
#              (it binds it after opening the log) and until a `ferryctl send` is acknowledged
#   nats       ../shared/bench/run-peers.sh nats (JetStream, same machine, same invocation)
#
# Environment:
#   RUNS=3                   runs per figure (the median is printed)
#   COUNT=500000             messages per run of the async shapes
#   WINDOW=1000              messages in flight per producer in the async shape and the shapes built on it
#                            (flushsync, high, normalslave, queues, consume, consume4); figures name it (w1000)
#   SYNC_COUNT=20000         messages per run of the sync shape
#   FIXED_RATE=50000 FIXED_SECONDS=10   the fixedrate shape (bounded by both: at most RATE*SECONDS)
#   CONSOLE_RATE=20          console pages a second during the console shape (one session; the metaserver's
#                            -console-rate is set to it, so every page is answered)
#   FIXED_LINGER=2ms     the fixedrate shape's producer linger (the SDK's default; it adds up to
#                        that to a message's latency, and 0 makes every message a SEND of its own)
#   ROLL_COUNT=1000000 ROLL_SEGMENT=67108864   the roll shape: ~1 GiB into 64 MiB segments (16)
#   COLD_BYTES=2147483648    what the coldstart shape writes before the restart (2 GiB)
#   BUDGET_US=               the CPU budget per message written, in µs (default: from NATS, see below)
#   BUDGET_CORES=$(nproc)    the cores the budget spends
#   FERRY_BENCH_BASE_PORT=7600  first of the 30 ports used (metaserver +1,+2, its HTTP port +12; brokers +3..+6; NATS +20)
#   PEERS=1                  run NATS when run-peers.sh is there (0: skip it)
#   PEERS_SCRIPT=PATH        where run-peers.sh is (default: ../shared/bench/run-peers.sh from the repository)
#   PPROF=1                  start the brokers with -pprof on BASE+7 (master) and BASE+8 (slave)
#   METRICS=1                start the master with -metrics-addr on BASE+9 and log after each run its
#                            SEND requests (messages each, mean time to answer), HA fetch answers and acks
#   CPUPROFILE=DIR           write a CPU profile of each ferryctl bench run into DIR
#   RUN_TIMEOUT=120          hard cap in seconds of each ferryctl bench run
#   KEEP=1                   keep the temporary directory (logs, data)
#   BROKER_ARGS="..."        more flags for every broker (for instance "-pretouch -1")
#   TLS=1                    every link over TLS, client certificates required: `ferryctl certs` makes a
#                            CA and certificates in the work directory; the servers get -tls-cert,
#                            -tls-key, -tls-ca and ferryctl --tls-ca, --tls-cert, --tls-key
#
# Output: progress lines start with '#'; then one line per figure:
#   FIGURE NAME UNIT FERRYMQ runs=R1,R2,R3 | NATS-FIGURE NATS-VALUE | RATIO | aim AIM MET/MISSED
# and NOTE lines naming where the two sides' shapes differ. Then, for every shape run,
#   BUDGET SHAPE USED_US BUDGET_US MET/EXCEEDED
# USED_US: the median over the runs of the CPU (user + system) of every ferrymq process on the
# machine (the whole ferryctl bench process, the brokers, the metaserver) over the run, per
# message; BUDGET_US: the CPU per message at which the machine reaches 5x NATS,
# BUDGET_CORES * 1e6 / (5 * NATS async publish msgs/s of this run), 6.00 without NATS (BUDGET_US
# overrides it); consume and consume4 add the same for reading, from NATS `js consume` (1 and 4
# clients; 6.00 without). Judge it with RUNS >= 3 (a NOTE says when fewer).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${RUNS:-3}"
COUNT="${COUNT:-500000}"
WINDOW="${WINDOW:-1000}"
SYNC_COUNT="${SYNC_COUNT:-20000}"
FIXED_RATE="${FIXED_RATE:-50000}"
CONSOLE_RATE="${CONSOLE_RATE:-20}"
FIXED_SECONDS="${FIXED_SECONDS:-10}"
FIXED_LINGER="${FIXED_LINGER:-2ms}"
ROLL_COUNT="${ROLL_COUNT:-1000000}"
ROLL_SEGMENT="${ROLL_SEGMENT:-67108864}"
COLD_BYTES="${COLD_BYTES:-2147483648}"
BUDGET_CORES="${BUDGET_CORES:-$(nproc)}"
BASE="${FERRY_BENCH_BASE_PORT:-7600}"
PEERS="${PEERS:-1}"
PEERS_SCRIPT="${PEERS_SCRIPT:-$ROOT/../shared/bench/run-peers.sh}"
PPROF="${PPROF:-0}"
METRICS="${METRICS:-0}"
CPUPROFILE="${CPUPROFILE:-}"
RUN_TIMEOUT="${RUN_TIMEOUT:-120}"
KEEP="${KEEP:-0}"
TLS="${TLS:-0}"
read -r -a BROKER_EXTRA <<<"${BROKER_ARGS:-}"
SIZE=1024

META="127.0.0.1:$((BASE + 1))"
MASTER_ADDR="127.0.0.1:$((BASE + 3))"
MASTER_HA="127.0.0.1:$((BASE + 4))"
SLAVE_ADDR="127.0.0.1:$((BASE + 5))"
SLAVE_HA="127.0.0.1:$((BASE + 6))"
SLAVE2_ADDR="127.0.0.1:$((BASE + 10))"
SLAVE2_HA="127.0.0.1:$((BASE + 11))"
RAFT="127.0.0.1:$((BASE + 2))"
NATS_PORT="${NATS_PORT:-$((BASE + 20))}"

ALL_SHAPES=(async async1 sync flushsync high normalslave high2 normalslave2 delayed queues consume consume4 fixedrate console roll coldstart)
NAME=bench.sh
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
# shellcheck source=scripts/bench-lib.sh
. "$ROOT/scripts/bench-lib.sh"

# ------------------------------------------------------------------ arguments
SHAPES=()
WANT_NATS=0
for a in "$@"; do
	case "$a" in
	async | async1 | sync | flushsync | high | normalslave | high2 | normalslave2 | delayed | queues | consume | consume4 | fixedrate | console | roll | coldstart) SHAPES+=("$a") ;;
	nats) WANT_NATS=1 ;;
	-h | --help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "bench.sh: unknown shape $a (${ALL_SHAPES[*]} nats)" >&2; exit 2 ;;
	esac
done
[ ${#SHAPES[@]} -eq 0 ] && [ $WANT_NATS = 0 ] && SHAPES=("${ALL_SHAPES[@]}")
if [ "$PEERS" = 0 ]; then
	WANT_NATS=0
elif [ -f "$PEERS_SCRIPT" ]; then
	WANT_NATS=1
else
	log "no $PEERS_SCRIPT: NATS is not measured, figures are printed without ratios"
	WANT_NATS=0
fi
has() { local s; for s in "${SHAPES[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

# ------------------------------------------------------------------ processes
work_init ferry-bench
# A client that died of SIGINT or SIGTERM means the user interrupted us.
sig() { case "$1" in 130 | 143) echo "interrupted (rc=$1)" >&2; exit "$1" ;; esac; }

require_free_ports $((BASE + 1)) $((BASE + 12)) "set FERRY_BENCH_BASE_PORT to a free block of 30 ports"

META_TLS=() BROKER_TLS=() CTL_TLS=()
case "$TLS" in
0) ;;
1)
	META_TLS=(-tls-cert "$WORK/tls/meta.pem" -tls-key "$WORK/tls/meta-key.pem" -tls-ca "$WORK/tls/ca.pem")
	BROKER_TLS=(-tls-cert "$WORK/tls/broker.pem" -tls-key "$WORK/tls/broker-key.pem" -tls-ca "$WORK/tls/ca.pem")
	CTL_TLS=(--tls-ca "$WORK/tls/ca.pem" --tls-cert "$WORK/tls/ctl.pem" --tls-key "$WORK/tls/ctl-key.pem")
	;;
*) die "TLS=$TLS: want 0 or 1" ;;
esac
ctl() { "$BIN/ferryctl" --meta "$META" --timeout 5s "${CTL_TLS[@]}" "$@"; }

# start_group GROUP FLUSH SLAVES: a fresh master (and 0, 1 or 2 slaves) with
# empty data directories, as broker group GROUP; waits until it takes
# writes (and its slaves are in its sync set).
BROKER_PIDS=()
SHAPE_ARGS=() # more flags for the master of the shape being run (roll: -segment-size)
start_group() {
	local g="$1" flush="$2" slave="$3" pp=()
	[ "$PPROF" = 1 ] && pp=(-pprof "127.0.0.1:$((BASE + 7))")
	[ "$METRICS" = 1 ] && pp+=(-metrics-addr "127.0.0.1:$((BASE + 9))")
	launch "$g-master" "$BIN/ferry-broker" -id "$g-master" -group "$g" -role master -dir "$WORK/data/$g-master" \
		-addr "$MASTER_ADDR" -ha-addr "$MASTER_HA" -meta "$META" -flush "$flush" -heartbeat 1s -session 4s "${pp[@]}" "${BROKER_EXTRA[@]}" "${SHAPE_ARGS[@]}" "${BROKER_TLS[@]}"
	BROKER_PIDS=("$LAST_PID")
	if [ "$slave" -ge 1 ]; then
		pp=()
		[ "$PPROF" = 1 ] && pp=(-pprof "127.0.0.1:$((BASE + 8))")
		wait_until 30 "group $g's master registering" group_ready "$g" 0
		launch "$g-slave" "$BIN/ferry-broker" -id "$g-slave" -group "$g" -role slave -dir "$WORK/data/$g-slave" \
			-addr "$SLAVE_ADDR" -ha-addr "$SLAVE_HA" -meta "$META" -flush "$flush" -heartbeat 1s -session 4s "${pp[@]}" "${BROKER_EXTRA[@]}" "${BROKER_TLS[@]}"
		BROKER_PIDS+=("$LAST_PID")
	fi
	if [ "$slave" -ge 2 ]; then
		# The third broker joins once the group has its master and first slave.
		wait_until 30 "group $g's first slave joining its sync set" group_ready "$g" 1
		launch "$g-slave2" "$BIN/ferry-broker" -id "$g-slave2" -group "$g" -role slave -dir "$WORK/data/$g-slave2" \
			-addr "$SLAVE2_ADDR" -ha-addr "$SLAVE2_HA" -meta "$META" -flush "$flush" -heartbeat 1s -session 4s "${BROKER_EXTRA[@]}" "${BROKER_TLS[@]}"
		BROKER_PIDS+=("$LAST_PID")
	fi
	wait_until 30 "group $g taking writes" group_ready "$g" "$slave"
}
stop_group() {
	local p
	for p in "${BROKER_PIDS[@]}"; do stop_pid "$p"; done
	BROKER_PIDS=()
	rm -rf "$WORK"/data/g*-master "$WORK"/data/g*-slave "$WORK"/data/g*-slave2
}

# ------------------------------------------------------------------ figures
declare -A VALS=()
add() { VALS[$1]+="${2:-NA} "; }
# shellcheck disable=SC2086 # the runs are words
med() { median ${VALS[$1]:-}; }

# master_counts: (METRICS=1) logs the master's SEND requests (with the
# messages each carried and the mean time from reading one to answering
# it), HA fetch answers (messages and KiB each) and HA_ACKs, over the
# group's life (the run and its warm-up message), and the share of the log
# the slave had not acknowledged when the run ended (NORMAL does not wait
# for it: what is left is copied after the run, outside its CPU figures).
master_counts() {
	local m
	m="$(curl -s "http://127.0.0.1:$((BASE + 9))/metrics")" || { log "  no metrics from the master"; return; }
	awk '/^ferrymq_broker_messages_in_total / { n = $2 } /^ferrymq_broker_send_duration_seconds_count / { r = $2 }
		/^ferrymq_broker_send_duration_seconds_sum / { t = $2 } /^ferrymq_broker_ha_answers_total / { a = $2 }
		/^ferrymq_broker_ha_answer_bytes_total / { b = $2 } /^ferrymq_broker_ha_acks_total / { k = $2 }
		/^ferrymq_broker_log_end_offset / { e = $2 } /^ferrymq_broker_slave_lag_bytes / { l = $2 }
		END { printf "#   master: %d msgs in %d SENDs (%.1f msgs each, answered after %.2f ms on average), %d HA answers (%.1f msgs, %.0f KiB each), %d HA acks; at the end the slave lacked %.1f%% of the log\n",
			n, r, r ? n / r : 0, r ? t / r * 1000 : 0, a, a ? n / a : 0, a ? b / a / 1024 : 0, k, e ? 100 * l / e : 0 }' <<<"$m" >&2
}

RUN_NO=0
# bench_run SHAPE FLUSH SLAVE QUEUES ARGS...: one run on a fresh group; sets
# R_RATE, R_P50, R_P99, R_CPU (ferryctl bench's sends), R_BCPU (master),
# R_SCPU (slave), R_TOT (every ferrymq process), all CPU in µs per message,
# and with --consumers R_CRATE, R_CONSUMED (NA on failure).
bench_run() {
	local shape="$1" flush="$2" slave="$3" queues="$4" out rc errs prof=()
	shift 4
	RUN_NO=$((RUN_NO + 1))
	local g="g$RUN_NO" topic="t$RUN_NO"
	R_RATE=NA R_P50=NA R_P99=NA R_CPU=NA R_BCPU=NA R_SCPU=NA R_TOT=NA R_CRATE=NA R_CONSUMED=NA
	start_group "$g" "$flush" "$slave"
	ctl topic create "$topic" --queues "$queues" --groups "$g" >/dev/null || die "topic create $topic failed"
	# One message first, so that the master knows the new topic's route: its
	# first messages would be refused NO_ROUTE until its route cache looked
	# the topic up, and retried after the SDK's 50 ms backoff (in p99, max).
	ctl send "$topic" --body warm-up >/dev/null || die "the warm-up send to $topic failed"
	[ -n "$CPUPROFILE" ] && mkdir -p "$CPUPROFILE" && prof=(--cpuprofile "$CPUPROFILE/$shape-$RUN_NO.pprof")
	local m0 m1 s0=0 s1=0 a0 a1 c0
	children_cpu
	m0="$(proc_ticks "${BROKER_PIDS[0]}")" a0="$(procs_ticks "${BROKER_PIDS[@]}" "$META_PID")" c0="$CHILDREN_CPU"
	[ "$slave" -ge 1 ] && s0="$(proc_ticks "${BROKER_PIDS[1]}")"
	[ -n "$BG_LOAD" ] && "$BG_LOAD" start "$topic"
	out="$(timeout --foreground -k 5 "$RUN_TIMEOUT" "$BIN/ferryctl" --meta "$META" --timeout 10s "${CTL_TLS[@]}" --json bench \
		--topic "$topic" --size "$SIZE" --progress=false "$@" "${prof[@]}" 2>"$WORK/logs/bench.run.err")"
	rc=$?
	[ -n "$BG_LOAD" ] && "$BG_LOAD" stop
	children_cpu
	m1="$(proc_ticks "${BROKER_PIDS[0]}")" a1="$(procs_ticks "${BROKER_PIDS[@]}" "$META_PID")"
	[ "$slave" -ge 1 ] && s1="$(proc_ticks "${BROKER_PIDS[1]}")"
	[ "$METRICS" = 1 ] && master_counts
	cat "$WORK/logs/bench.run.err" >>"$WORK/logs/bench.err"
	echo "$shape run $RUN_NO (rc $rc): ferryctl bench --topic $topic $*" >>"$WORK/logs/bench.out"
	echo "$out" >>"$WORK/logs/bench.out"
	sig "$rc"
	[ "$shape" = roll ] && log "  segments in the master's data directory: $(find "$WORK/data/$g-master" -name '*.log' | wc -l)"
	stop_group
	if [ "$rc" != 0 ]; then
		# ferryctl's error is one line "ferryctl: ..." (bench's failed sends
		# by cause follow it, indented); the run is not counted.
		log "$shape: ferryctl bench failed (rc $rc), run not counted: $(grep -m1 -A3 '^ferryctl:' "$WORK/logs/bench.run.err" | tr '\n' ' ')"
		return
	fi
	errs="$(jnum errors "$out")"
	if [ "${errs:-0}" != 0 ]; then
		log "$shape: $errs sends failed; run not counted"
		return
	fi
	R_RATE="$(awk -v x="$(jnum msgs_per_sec "$out")" 'BEGIN{ printf "%.0f", x }')"
	R_P50="$(jnum p50_us "$out")"
	R_P99="$(jnum p99_us "$out")"
	local sent cons
	sent="$(jnum sent "$out")"
	cons="$(sed -n '/"consume": {/,$p' <<<"$out")"
	if [ -n "$cons" ]; then
		R_CONSUMED="$(jnum consumed "$cons")"
		R_CRATE="$(awk -v x="$(jnum msgs_per_sec "$cons")" 'BEGIN{ printf "%.0f", x }')"
		[ "$R_CONSUMED" = "$sent" ] || log "$shape: consumed $R_CONSUMED of $sent"
	fi
	# CPU per message: ferryctl bench's sends (its cpu_seconds); the master's
	# and the slave's and, summed over every ferrymq process (the whole
	# ferryctl process, the brokers and the metaserver), from /proc and
	# the shell's children times, over the whole ferryctl bench run.
	R_CPU="$(awk -v c="$(jnum cpu_seconds "$out")" -v n="$sent" 'BEGIN{ if (c != "" && n > 0) printf "%.2f", c * 1e6 / n; else print "NA" }')"
	R_BCPU="$(per_msg "$m0" "$m1" 0 "$sent")"
	[ "$slave" -ge 1 ] && R_SCPU="$(per_msg "$s0" "$s1" 0 "$sent")"
	R_TOT="$(per_msg "$a0" "$a1" "$(awk -v a="$c0" -v b="$CHILDREN_CPU" 'BEGIN{ print b - a }')" "$sent")"
}

ASYNC=(--mode async --producers 4 --window "$WINDOW" --count "$COUNT")
FIXED=(--mode async --producers 4 --window 1000 --rate "$FIXED_RATE" --duration "${FIXED_SECONDS}s"
	--count "$((FIXED_RATE * FIXED_SECONDS))" --linger "$FIXED_LINGER")

# console_load start TOPIC | stop: requests the metaserver's web console
# pages (the list pages and a page of TOPIC's messages) at about
# CONSOLE_RATE a second, as one session (a cookie jar): each second one
# curl process asks CONSOLE_RATE pages in turn, then waits out the second.
# Bounded by the run's timeout; stop kills the loop by its PID (a curl
# under way ends with its second's pages).
BG_LOAD=
CONSOLE_PID=
console_load() {
	local base="http://127.0.0.1:$((BASE + 12))/console" urls="$WORK/console.urls" i k=()
	[ "$TLS" = 1 ] && base="https://127.0.0.1:$((BASE + 12))/console" k=(-k)
	case "$1" in
	start)
		for ((i = 0; i < CONSOLE_RATE; i++)); do
			case $((i % 5)) in
			0) echo "url = \"$base/\"" ;;
			1) echo "url = \"$base/topics\"" ;;
			2) echo "url = \"$base/consumers\"" ;;
			3) echo "url = \"$base/groups\"" ;;
			4) echo "url = \"$base/messages?topic=$2&queue=0&offset=0\"" ;;
			esac
			echo "output = \"/dev/null\""
		done >"$urls"
		: >"$WORK/console.codes"
		(
			end=$((SECONDS + RUN_TIMEOUT))
			while [ $SECONDS -lt $end ]; do
				t0=$(date +%s%N)
				curl -s "${k[@]}" --max-time 2 -b "$WORK/console.jar" -c "$WORK/console.jar" -w '%{http_code}\n' -K "$urls" >>"$WORK/console.codes" 2>/dev/null
				left=$((1000000000 - ($(date +%s%N) - t0)))
				[ $left -gt 0 ] && sleep "$(awk -v n=$left 'BEGIN { printf "%.3f", n / 1e9 }')"
			done
		) &
		CONSOLE_PID=$!
		;;
	stop)
		stop_pid "$CONSOLE_PID"
		CONSOLE_PID=
		;;
	esac
}
# console_pages: how many console pages the last run's load got answered
# 200, and how many it asked.
console_pages() { echo "$(grep -c '^200$' "$WORK/console.codes") of $(wc -l <"$WORK/console.codes")"; }
# rec KEY: adds this run's figures under KEY (rate, p50, p99, CPU per message).
rec() {
	add "$1" "$R_RATE"
	add "$1.p50" "$R_P50"
	add "$1.p99" "$R_P99"
	add "$1.cpu" "$R_CPU"
	add "$1.bcpu" "$R_BCPU"
	add "$1.scpu" "$R_SCPU"
	add "$1.tot" "$R_TOT"
	add "$1.crate" "$R_CRATE"
}
cpu_log() { echo "CPU per message: ferryctl bench $R_CPU µs, master $R_BCPU µs, slave $R_SCPU µs, every ferrymq process $R_TOT µs"; }
run_shapes() {
	local r
	for r in $(seq "$RUNS"); do
		if has async || has high || has delayed; then
			log "async run $r/$RUNS: 4 producers, window $WINDOW, flush=async, $COUNT msgs"
			bench_run async async 0 8 "${ASYNC[@]}"
			rec async
			log "  $R_RATE msgs/s ($(cpu_log))"
		fi
		if has async1; then
			log "async1 run $r/$RUNS: 1 producer, window 500, flush=async, $COUNT msgs"
			bench_run async1 async 0 8 --mode async --producers 1 --window 500 --count "$COUNT"
			rec async1
			log "  $R_RATE msgs/s ($(cpu_log))"
		fi
		if has sync; then
			log "sync run $r/$RUNS: one at a time, 1 producer, flush=async, $SYNC_COUNT msgs"
			bench_run sync async 0 8 --mode sync --producers 1 --count "$SYNC_COUNT"
			rec sync
			log "  p50 $R_P50 µs, p99 $R_P99 µs, $R_RATE msgs/s ($(cpu_log))"
		fi
		if has flushsync; then
			log "flushsync run $r/$RUNS: async shape, broker -flush sync, $COUNT msgs"
			bench_run flushsync sync 0 8 "${ASYNC[@]}"
			rec flushsync
			log "  $R_RATE msgs/s ($(cpu_log))"
		fi
		if has high || has normalslave; then
			log "high run $r/$RUNS: async shape, HIGH, with a slave, $COUNT msgs"
			bench_run high async 1 8 "${ASYNC[@]}" --reliability high
			rec high
			log "  $R_RATE msgs/s ($(cpu_log))"
		fi
		if has normalslave; then
			log "normalslave run $r/$RUNS: async shape, NORMAL, with the slave connected, $COUNT msgs"
			bench_run normalslave async 1 8 "${ASYNC[@]}" --reliability normal
			rec normalslave
			log "  $R_RATE msgs/s ($(cpu_log))"
		fi
		if has high2 || has normalslave2; then
			log "high2 run $r/$RUNS: async shape, HIGH, with two slaves in the sync set, $COUNT msgs"
			bench_run high2 async 2 8 "${ASYNC[@]}" --reliability high
			rec high2
			log "  $R_RATE msgs/s ($(cpu_log))"
		fi
		if has normalslave2; then
			log "normalslave2 run $r/$RUNS: async shape, NORMAL, with two slaves connected, $COUNT msgs"
			bench_run normalslave2 async 2 8 "${ASYNC[@]}" --reliability normal
			rec normalslave2
			log "  $R_RATE msgs/s ($(cpu_log))"
		fi
		if has delayed; then
			log "delayed run $r/$RUNS: async shape, every message delayed 1h (--delay 1h), $COUNT msgs"
			bench_run delayed async 0 8 "${ASYNC[@]}" --delay 1h
			rec delayed
			log "  $R_RATE msgs/s ($(cpu_log))"
		fi
		if has queues; then
			log "queues run $r/$RUNS: async shape into 1000 queues, then into 8, $COUNT msgs each"
			bench_run q1000 async 0 1000 "${ASYNC[@]}"
			rec q1000
			local a="$R_RATE"
			bench_run q8 async 0 8 "${ASYNC[@]}"
			rec q8
			log "  1000 queues $a msgs/s, 8 queues $R_RATE msgs/s"
		fi
		local m
		for m in 1 4; do
			local k=consume
			[ $m = 4 ] && k=consume4
			has $k || continue
			log "$k run $r/$RUNS: $COUNT msgs written (async shape), then $m member(s) drain them (--backlog)"
			bench_run $k async 0 8 "${ASYNC[@]}" --consumers $m --backlog --consume-wait 5s
			rec $k
			log "  drained at $R_CRATE msgs/s (written at $R_RATE; $(cpu_log), writing and reading)"
		done
		if has fixedrate || has console; then
			log "fixedrate run $r/$RUNS: async shape held at $FIXED_RATE msgs/s for $FIXED_SECONDS s"
			bench_run fixedrate async 0 8 "${FIXED[@]}"
			rec fixedrate
			log "  p50 $R_P50 µs, p99 $R_P99 µs at $R_RATE msgs/s ($(cpu_log))"
		fi
		if has console; then
			log "console run $r/$RUNS: the fixedrate shape while $CONSOLE_RATE console pages a second are requested"
			BG_LOAD=console_load
			bench_run console async 0 8 "${FIXED[@]}"
			BG_LOAD=
			rec console
			log "  p50 $R_P50 µs, p99 $R_P99 µs at $R_RATE msgs/s; $(console_pages) console pages answered ($(cpu_log))"
		fi
		if has roll; then
			log "roll run $r/$RUNS: async shape, $ROLL_COUNT msgs into -segment-size $ROLL_SEGMENT"
			SHAPE_ARGS=(-segment-size "$ROLL_SEGMENT")
			bench_run roll async 0 8 --mode async --producers 4 --window 1000 --count "$ROLL_COUNT"
			SHAPE_ARGS=()
			rec roll
			log "  $R_RATE msgs/s, p99 $R_P99 µs ($(cpu_log))"
		fi
		if has coldstart; then
			log "coldstart run $r/$RUNS: $COLD_BYTES bytes written, master stopped, page cache dropped, started again"
			coldstart_run
			log "  port bound after $(echo "${VALS[coldstart.listen]:-}" | awk '{ print $NF }') ms, first send acknowledged after $(echo "${VALS[coldstart.send]:-}" | awk '{ print $NF }') ms"
		fi
	done
}

# ------------------------------------------------------------------ NATS
declare -A NATS=()
run_nats() {
	local out rc
	log "NATS: $PEERS_SCRIPT nats (RUNS=$RUNS; its own build, ports and servers; a few minutes)"
	out="$(RUNS="$RUNS" SIZE="$SIZE" NATS_PORT="$NATS_PORT" WORK="$WORK/peers" \
		timeout --foreground -k 10 3600 bash "$PEERS_SCRIPT" nats 2>>"$WORK/logs/peers.err")"
	rc=$?
	echo "$out" >"$WORK/logs/peers.out"
	sig "$rc"
	[ "$rc" = 0 ] || log "run-peers.sh nats exited with $rc (see $WORK/logs/peers.err; KEEP=1 keeps it)"
	# FIGURE <name> <median> <unit> runs=<v1,...> | <command>
	while read -r _ name value _; do NATS[$name]="$value"; done < <(grep '^FIGURE' <<<"$out")
	grep '^FIGURE' <<<"$out" | sed 's/^/# nats: /' >&2
	local m
	for m in 1 4; do
		{ [ $m = 1 ] && has consume; } || { [ $m = 4 ] && has consume4; } || continue
		log "NATS: $PEERS_SCRIPT natsconsume, $m client(s), a backlog of $COUNT"
		out="$(RUNS="$RUNS" SIZE="$SIZE" MSGS="$COUNT" CONSUME_CLIENTS=$m NATS_PORT="$NATS_PORT" WORK="$WORK/peers" \
			timeout --foreground -k 10 3600 bash "$PEERS_SCRIPT" natsconsume 2>>"$WORK/logs/peers.err")"
		rc=$?
		echo "$out" >>"$WORK/logs/peers.out"
		sig "$rc"
		[ "$rc" = 0 ] || log "run-peers.sh natsconsume exited with $rc (see $WORK/logs/peers.err; KEEP=1 keeps it)"
		NATS[consume.$m]="$(awk '$1 == "FIGURE" && $2 == "nats.js.default.consume" { print $3 }' <<<"$out")"
		grep '^FIGURE' <<<"$out" | sed "s/^/# nats ($m clients): /" >&2
	done
}

# ------------------------------------------------------------------ report
# line NAME UNIT VALUE RUNS NATSNAME NATSVALUE RATIO AIM VERDICT
line() { printf 'FIGURE %-22s %-7s %10s  runs=%-26s | %-30s %9s | %8s | aim %-12s %s\n' "$@"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (a+0 > 0 && b+0 > 0) printf "%.2fx", a/b; else print "-" }'; }
# verdict RATIO OP BOUND: MET or MISSED ('-' without a ratio).
verdict() { awk -v r="${1%x}" -v op="$2" -v b="$3" 'BEGIN{ if (r == "-" || r == "") { print "-"; exit }
	ok = (op == ">=") ? r + 0 >= b + 0 : r + 0 <= b + 0; print ok ? "MET" : "MISSED" }'; }
runs() { local v="${VALS[$1]:-}"; v="${v% }"; echo "${v// /,}"; }

report() {
	local v n rt
	echo "# $(date -u +%FT%TZ) commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "?") nproc=$(nproc) RUNS=$RUNS COUNT=$COUNT SYNC_COUNT=$SYNC_COUNT size=$SIZE B TLS=$TLS"
	if has async || has high || has delayed; then
		v=$(med async) n="${NATS[nats.js.default.pub_async]:-}"
		rt=$(ratio "$v" "$n")
		line async.4p.w$WINDOW msgs/s "$v" "$(runs async)" nats.js.default.pub_async "${n:--}" "$rt" ">=5x" "$(verdict "$rt" ">=" 5)"
	fi
	if has async1; then
		v=$(med async1) n="${NATS[nats.js.default.pub_async]:-}"
		rt=$(ratio "$v" "$n")
		line async.1p.w500 msgs/s "$v" "$(runs async1)" nats.js.default.pub_async "${n:--}" "$rt" "(shape)" "-"
	fi
	if has sync; then
		v=$(med sync.p50) n="${NATS[nats.js.default.pub_sync.p50]:-}"
		rt=$(ratio "$v" "$n")
		line sync.1p.p50 us "$v" "$(runs sync.p50)" nats.js.default.pub_sync.p50 "${n:--}" "$rt" "<=0.5x" "$(verdict "$rt" "<=" 0.5)"
		v=$(med sync.p99) n="${NATS[nats.js.default.pub_sync.p99]:-}"
		rt=$(ratio "$v" "$n")
		line sync.1p.p99 us "$v" "$(runs sync.p99)" nats.js.default.pub_sync.p99 "${n:--}" "$rt" "<=300us" \
			"$(awk -v x="$v" 'BEGIN{ if (x == "NA") print "-"; else print (x + 0 <= 300) ? "MET" : "MISSED" }')"
		v=$(med sync) n="${NATS[nats.js.default.pub_sync]:-}"
		rt=$(ratio "$v" "$n")
		line sync.1p.rate msgs/s "$v" "$(runs sync)" nats.js.default.pub_sync "${n:--}" "$rt" "-" "-"
	fi
	if has flushsync; then
		v=$(med flushsync) n="${NATS[nats.js.always.pub_async]:-}"
		rt=$(ratio "$v" "$n")
		line flushsync.4p.w$WINDOW msgs/s "$v" "$(runs flushsync)" nats.js.always.pub_async "${n:--}" "$rt" ">=50x" "$(verdict "$rt" ">=" 50)"
	fi
	if has high; then
		v=$(med high)
		rt=$(ratio "$v" "$(med async)")
		# Not an aim on one machine: the slave's CPU per message shares
		# the same cores (BUDGET high); judged against normalslave.
		line high.slave.4p.w$WINDOW msgs/s "$v" "$(runs high)" "ferrymq async.4p.w$WINDOW" "$(med async)" "$rt" "-" "-"
	fi
	if has normalslave; then
		v=$(med high)
		rt=$(ratio "$v" "$(med normalslave)")
		line high.vs.normalslave msgs/s "$v" "$(runs high)" "ferrymq normalslave (same slave)" "$(med normalslave)" "$rt" ">=0.9x" "$(verdict "$rt" ">=" 0.9)"
	fi
	if has high2; then
		v=$(med high2)
		line high2.slaves.4p.w$WINDOW msgs/s "$v" "$(runs high2)" "ferrymq high (one slave)" "$(med high)" "$(ratio "$v" "$(med high)")" "-" "-"
		line high2.p99 us "$(med high2.p99)" "$(runs high2.p99)" "ferrymq high p99 (one slave)" "$(med high.p99)" "$(ratio "$(med high2.p99)" "$(med high.p99)")" "-" "-"
	fi
	if has normalslave2; then
		v=$(med high2)
		line high2.vs.normalslave2 msgs/s "$v" "$(runs high2)" "ferrymq normalslave2 (same slaves)" "$(med normalslave2)" "$(ratio "$v" "$(med normalslave2)")" "-" "-"
	fi
	if has delayed; then
		v=$(med delayed)
		rt=$(ratio "$v" "$(med async)")
		line delayed.1h.4p.w$WINDOW msgs/s "$v" "$(runs delayed)" "ferrymq async.4p.w$WINDOW (same runs)" "$(med async)" "$rt" ">=0.9x" "$(verdict "$rt" ">=" 0.9)"
		echo "NOTE delayed: CPU per message (medians) ferryctl bench $(med delayed.cpu) µs, broker $(med delayed.bcpu) µs, every ferrymq process $(med delayed.tot) µs; async: $(med async.cpu), $(med async.bcpu), $(med async.tot) µs"
	fi
	if has queues; then
		v=$(med q1000)
		rt=$(ratio "$v" "$(med q8)")
		line queues.1000.4p.w$WINDOW msgs/s "$v" "$(runs q1000)" "ferrymq queues.8 (same runs)" "$(med q8)" "$rt" ">=0.9x" "$(verdict "$rt" ">=" 0.9)"
	fi
	local m k
	for m in 1 4; do
		k=consume
		[ $m = 4 ] && k=consume4
		has $k || continue
		v=$(med $k.crate) n="${NATS[consume.$m]:-}"
		rt=$(ratio "$v" "$n")
		line "consume.${m}m.backlog" msgs/s "$v" "$(runs $k.crate)" "nats.js.default.consume ${m}c" "${n:--}" "$rt" ">=5x" "$(verdict "$rt" ">=" 5)"
	done
	if has console; then
		rt=$(ratio "$(med console.p99)" "$(med fixedrate.p99)")
		line console.p99 us "$(med console.p99)" "$(runs console.p99)" "fixedrate p99, no console" "$(med fixedrate.p99)" "$rt" "<=1.05x" "$(verdict "$rt" "<=" 1.05)"
	fi
	if has fixedrate; then
		line fixedrate.p50 us "$(med fixedrate.p50)" "$(runs fixedrate.p50)" "at msgs/s (median)" "$(med fixedrate)" "-" "-" "-"
		line fixedrate.p99 us "$(med fixedrate.p99)" "$(runs fixedrate.p99)" "at msgs/s (median)" "$(med fixedrate)" "-" "keep" "-"
	fi
	if has roll; then
		v=$(med roll)
		rt=$(ratio "$v" "$(med async)")
		line roll.4p.w1000 msgs/s "$v" "$(runs roll)" "ferrymq async.4p.w$WINDOW" "$(med async)" "$rt" ">=0.9x" "$(verdict "$rt" ">=" 0.9)"
		line roll.p99 us "$(med roll.p99)" "$(runs roll.p99)" "ferrymq async.4p.w$WINDOW p99" "$(med async.p99)" "$(ratio "$(med roll.p99)" "$(med async.p99)")" "-" "-"
	fi
	if has coldstart; then
		line coldstart.listen ms "$(med coldstart.listen)" "$(runs coldstart.listen)" "-" "-" "-" "keep" "-"
		line coldstart.send ms "$(med coldstart.send)" "$(runs coldstart.send)" "-" "-" "-" "keep" "-"
	fi
	budget_report
	if has async; then
		echo "NOTE async.4p.w$WINDOW CPU per message (medians): ferryctl bench (the producers) $(med async.cpu) µs, broker $(med async.bcpu) µs; on $(nproc) cores their sum bounds the rate at about $(awk -v a="$(med async.cpu)" -v b="$(med async.bcpu)" -v c="$(nproc)" 'BEGIN{ if (a + b > 0) printf "%.0f", c * 1e6 / (a + b); else print "NA" }') msgs/s"
	fi
	echo "NOTE every ferrymq figure: 1 KiB bodies, a fresh broker and data directory per run (its topic new, warmed up with one message), one metaserver and the master on 127.0.0.1, idempotent producers (the SDK's default), ferryctl bench's latency is from SendAsync/Send to the result"
	if [ "${#NATS[@]}" -gt 0 ]; then
		echo "NOTE nats: run-peers.sh in this invocation: nats-server, R1 file-storage stream, 1 KiB, 1 client ('nats bench js pub'), RUNS=$RUNS; its store is fresh per run too"
		has async && echo "NOTE async.4p.w$WINDOW vs NATS: shapes differ: ferrymq 4 producers x $WINDOW in flight (the issue's figure), NATS 1 client x batch 500 (what run-peers runs); async.1p.w500 is ferrymq in NATS's shape"
		has sync && echo "NOTE sync: same shape (1 client, one publish at a time, wait for its ack); NATS's default store syncs every 2 min, ferrymq's flush=async every 500 ms"
		has flushsync && echo "NOTE flushsync vs NATS sync_interval: always: both fsync before acknowledging; shapes differ as for async (4 x 1000 vs 1 x 500 in flight)"
	fi
	return 0
}

# ------------------------------------------------------------------ main
log "work directory $WORK, ports $BASE..$((BASE + 29)), shapes: ${SHAPES[*]:-none}$([ $WANT_NATS = 1 ] && echo ' + nats')"
if [ ${#SHAPES[@]} -gt 0 ]; then
	build_bins
	if [ "$TLS" = 1 ]; then
		log "TLS on every link: certificates in $WORK/tls"
		"$BIN/ferryctl" certs "$WORK/tls" --node meta=127.0.0.1 --node broker=127.0.0.1 --client ctl >/dev/null || die "ferryctl certs failed"
	fi
	start_meta -metrics-addr "127.0.0.1:$((BASE + 12))" -console-rate "$CONSOLE_RATE" "${META_TLS[@]}"
	META_PID="$LAST_PID"
	run_shapes
fi
[ $WANT_NATS = 1 ] && run_nats
report
