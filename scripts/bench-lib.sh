# bench-lib.sh: bench.sh's CPU accounting, its BUDGET lines and its
# coldstart shape, and what delay-bench.sh shares with it (group_ready,
# jnum, median), sourced by either after lib.sh; it uses the script's globals
# (BIN, WORK, META, ctl, start_group, stop_group, BROKER_PIDS, ...).

# group_ready GROUP SLAVES: GROUP is writable (and with SLAVES > 0, that
# many slaves are in its sync set: HIGH is taken).
group_ready() {
	local out
	out="$(ctl brokers --json 2>/dev/null)" || return 1
	# the array's item (lines "  {" to "  }") whose name is GROUP
	out="$(awk -v g="\"name\": \"$1\"," '/^  \{/ { b = "" } { b = b $0 "\n" } /^  \}/ && index(b, g) { printf "%s", b; exit }' <<<"$out")"
	grep -q '"state": "RW"' <<<"$out" || return 1
	[ "$2" = 0 ] || [ "$(grep -c '"in_sync": true' <<<"$out")" -ge "$2" ]
}

# jnum KEY JSON: a number field of ferryctl's JSON output.
jnum() { sed -n "s/^ *\"$1\": *\([-0-9.eE+]*\),*$/\1/p" <<<"$2" | head -1; }
median() {
	printf '%s\n' "$@" | grep -E '^[0-9.eE+-]+$' | sort -g |
		awk '{a[NR]=$1} END{ if (NR==0) print "NA"; else if (NR%2) print a[(NR+1)/2]; else printf "%.6g\n", (a[NR/2]+a[NR/2+1])/2 }'
}

# proc_ticks PID: the CPU time (user and system, clock ticks) of PID so far,
# from /proc (empty where there is none).
proc_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null; }
# procs_ticks PID...: the sum of proc_ticks of every PID.
procs_ticks() {
	local p t=0
	for p in "$@"; do t=$((t + $(proc_ticks "$p" || echo 0))); done
	echo "$t"
}
# children_cpu: CHILDREN_CPU, the seconds of CPU (user and system) of every
# child of this shell waited for so far (the shell's `times`, run without
# a subshell: a subshell's children times start at 0).
children_cpu() {
	times >"$WORK/times"
	CHILDREN_CPU="$(awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] } print t }' "$WORK/times")"
}
# per_msg TICKS0 TICKS1 SECONDS N: (TICKS1-TICKS0 clock ticks + SECONDS) / N in µs.
per_msg() {
	awk -v a="$1" -v b="$2" -v s="$3" -v hz="$(getconf CLK_TCK 2>/dev/null || echo 100)" -v n="$4" \
		'BEGIN{ if (a != "" && b != "" && n > 0) printf "%.2f", ((b - a) / hz + s) * 1e6 / n; else print "NA" }'
}

# budget SHAPE: the CPU budget in µs per message of SHAPE, summed over every
# ferrymq process, at which it reaches 5x NATS on BUDGET_CORES cores:
# BUDGET_CORES * 1e6 / (5 * NATS async publish msgs/s) for writing a
# message (BUDGET_US, else 6.0 without NATS in the run), plus, for the
# consume shapes, BUDGET_CORES * 1e6 / (5 * NATS `js consume` msgs/s with
# as many clients) for reading it (6.0 without NATS).
budget() {
	local w="${BUDGET_US:-}" r="" n
	n="${NATS[nats.js.default.pub_async]:-}"
	[ -z "$w" ] && w="$(awk -v c="$BUDGET_CORES" -v n="$n" 'BEGIN{ if (n + 0 > 0) printf "%.2f", c * 1e6 / (5 * n); else print "6.00" }')"
	case "$1" in
	consume) n="${NATS[consume.1]:-}" ;;
	consume4) n="${NATS[consume.4]:-}" ;;
	*) echo "$w"; return ;;
	esac
	r="$(awk -v c="$BUDGET_CORES" -v n="$n" 'BEGIN{ if (n + 0 > 0) printf "%.2f", c * 1e6 / (5 * n); else print "6.00" }')"
	awk -v a="$w" -v b="$r" 'BEGIN{ printf "%.2f", a + b }'
}

# budget_report: a BUDGET line for every shape run: the median CPU per
# message summed over every ferrymq process, against budget (bench-lib.sh).
budget_report() {
	local k used b n
	n="${NATS[nats.js.default.pub_async]:-}"
	for k in async async1 sync flushsync high normalslave delayed q1000 q8 consume consume4 fixedrate roll; do
		[ -n "${VALS[$k.tot]:-}" ] || continue
		used=$(med "$k.tot") b=$(budget "$k")
		printf 'BUDGET %-12s %8s %8s %s\n' "$k" "$used" "$b" \
			"$(awk -v u="$used" -v b="$b" 'BEGIN{ if (u == "NA") print "-"; else print (u + 0 <= b + 0) ? "MET" : "EXCEEDED" }')"
	done
	echo "NOTE BUDGET shape used_us budget_us: used is the median over the runs of the CPU (user and system) of every ferrymq process (the whole ferryctl bench process, the brokers, the metaserver) over the run, per message sent; budget is $(if [ -n "${BUDGET_US:-}" ]; then echo "BUDGET_US=$BUDGET_US"; elif [ -n "$n" ]; then echo "$BUDGET_CORES cores x 1e6 / (5 x NATS async publish $n msgs/s)"; else echo "the default 6.00 (no NATS in this run)"; fi) for writing a message$(if has consume || has consume4; then echo ", and for consume and consume4 that plus $BUDGET_CORES x 1e6 / (5 x NATS js consume msgs/s with 1 and 4 clients: ${NATS[consume.1]:-not run, 6.00} / ${NATS[consume.4]:-not run, 6.00}) for reading it"; fi)"
	[ "$RUNS" -ge 3 ] || echo "NOTE BUDGET: RUNS=$RUNS: judge the budget on the median of at least 3 runs"
	if has high && [ -n "${VALS[high.scpu]:-}" ]; then
		echo "NOTE high: the slave's CPU per message (fetch and append) $(med high.scpu) µs; every process $(med high.tot) µs against $(med async.tot) µs for async without a slave (when run): what a replica adds to the machine"
	fi
	[ -n "${COLD_NOTE:-}" ] && echo "$COLD_NOTE"
	return 0
}

# coldstart_run: a master with COLD_BYTES of log (written by ferryctl bench
# in the async shape), stopped (SIGTERM), the page cache dropped, started
# again on the same directory; adds coldstart.listen (ms from the start
# until its data port accepts a TCP connection: it binds it after opening
# and recovering the log) and coldstart.send (ms until a `ferryctl send`
# to the topic is acknowledged: the log open, the group registered
# writable, the route known).
coldstart_run() {
	RUN_NO=$((RUN_NO + 1))
	local g="g$RUN_NO" topic="t$RUN_NO" n rc t0 t1 t2
	n=$((COLD_BYTES / SIZE))
	start_group "$g" async 0
	ctl topic create "$topic" --queues 8 --groups "$g" >/dev/null || die "topic create $topic failed"
	ctl send "$topic" --body warm-up >/dev/null || die "the warm-up send to $topic failed"
	timeout --foreground -k 5 "$RUN_TIMEOUT" "$BIN/ferryctl" --meta "$META" --timeout 10s "${CTL_TLS[@]}" --json bench \
		--topic "$topic" --size "$SIZE" --progress=false "${ASYNC[@]:0:6}" --count "$n" >>"$WORK/logs/bench.out" 2>>"$WORK/logs/bench.err"
	rc=$?
	sig "$rc"
	stop_pid "${BROKER_PIDS[0]}"
	BROKER_PIDS=()
	if [ "$rc" != 0 ]; then
		log "coldstart: writing $n messages failed (rc $rc), run not counted"
		stop_group
		return
	fi
	log "  $(du -sh "$WORK/data/$g-master" | cut -f1) written; dropping the page cache"
	sync
	if ! (echo 3 >/proc/sys/vm/drop_caches) 2>/dev/null; then
		COLD_NOTE="NOTE coldstart: /proc/sys/vm/drop_caches is not writable here (not root?): the cache was warm"
	fi
	t0="$(date +%s%N)"
	launch "$g-master" "$BIN/ferry-broker" -id "$g-master" -group "$g" -role master -dir "$WORK/data/$g-master" \
		-addr "$MASTER_ADDR" -ha-addr "$MASTER_HA" -meta "$META" -flush async -heartbeat 1s -session 4s "${BROKER_EXTRA[@]}" "${BROKER_TLS[@]}"
	BROKER_PIDS=("$LAST_PID")
	for _ in $(seq 6000); do port_open "${MASTER_ADDR##*:}" && break; sleep 0.01; done
	t1="$(date +%s%N)"
	for _ in $(seq 600); do ctl --timeout 1s send "$topic" --body cold >/dev/null 2>&1 && break; sleep 0.05; done
	t2="$(date +%s%N)"
	stop_group
	add coldstart.listen "$(awk -v a="$t0" -v b="$t1" 'BEGIN{ printf "%.0f", (b - a) / 1e6 }')"
	add coldstart.send "$(awk -v a="$t0" -v b="$t2" 'BEGIN{ printf "%.0f", (b - a) / 1e6 }')"
}
