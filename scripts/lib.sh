# lib.sh: what the measurement scripts that start their own processes share
# (bench.sh, bench-restart.sh, bench-idempotence.sh). Source it after
# setting ROOT (the repository), NAME (the script's name, for messages) and
# KEEP (1 keeps the work directory). It is safe under `set -e`.
#
#   work_init PREFIX         WORK (a new temporary directory with logs/ and data/), BIN, PIDS;
#                            on exit every process in PIDS is stopped and WORK removed (unless KEEP=1)
#   launch NAME CMD...       start a server in the background, its output in $WORK/logs/NAME.log,
#                            its PID in LAST_PID and PIDS
#   stop_pid PID [SIGNAL]    send SIGNAL (TERM), wait up to STOP_WAIT seconds (10), then KILL
#   require_free_ports FIRST LAST HINT   die unless nothing listens on 127.0.0.1:FIRST..LAST
#   wait_until SECS DESC CMD...          poll CMD every 0.1 s; die after SECS
#   build_bins               build ferry-metaserver, ferry-broker and ferryctl into BIN
#   start_meta [ARGS...]     the one-node metaserver m1 on META (raft on RAFT), with ARGS; waits for
#                            its election (through the script's ctl)
#
# Every process is stopped by its PID, never by name.

log() { echo "# $*" >&2; }
die() {
	echo "$NAME: $*" >&2
	exit 1
}

STOP_WAIT="${STOP_WAIT:-10}"
PIDS=()

work_init() {
	WORK="$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")"
	BIN="$WORK/bin"
	mkdir -p "$WORK/logs" "$WORK/data"
	trap lib_cleanup EXIT
	trap 'exit 130' INT TERM
}

stop_pid() {
	local p="$1" sig="${2:-TERM}" q keep=()
	if kill -0 "$p" 2>/dev/null; then
		kill "-$sig" "$p" 2>/dev/null || true
		for _ in $(seq $((STOP_WAIT * 10))); do
			kill -0 "$p" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$p" 2>/dev/null; then
			log "pid $p did not stop in $STOP_WAIT s; killing it"
			kill -KILL "$p" 2>/dev/null || true
		fi
	fi
	wait "$p" 2>/dev/null || true
	for q in "${PIDS[@]}"; do
		if [ "$q" != "$p" ]; then keep+=("$q"); fi
	done
	PIDS=("${keep[@]}")
}

lib_cleanup() {
	local p
	for p in "${PIDS[@]}"; do stop_pid "$p"; done
	if [ "$KEEP" = 1 ]; then
		echo "$NAME: work directory kept: $WORK" >&2
	else
		rm -rf "$WORK"
	fi
}

launch() {
	local name="$1"
	shift
	"$@" >"$WORK/logs/$name.log" 2>&1 &
	LAST_PID=$!
	PIDS+=("$LAST_PID")
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

require_free_ports() {
	local p
	for p in $(seq "$1" "$2"); do
		if port_open "$p"; then die "127.0.0.1:$p is in use; $3"; fi
	done
}

wait_until() {
	local secs="$1" desc="$2" _
	shift 2
	for _ in $(seq $((secs * 10))); do
		if "$@"; then return 0; fi
		sleep 0.1
	done
	die "$desc did not happen within $secs s (logs in $WORK/logs; KEEP=1 keeps them)"
}

build_bins() {
	log "building into $BIN"
	(cd "$ROOT" && go build -o "$BIN/" ./cmd/ferry-metaserver ./cmd/ferry-broker ./cmd/ferryctl) || die "build failed"
}

meta_leader() { ctl meta status --json 2>/dev/null | grep -q '"leader_id": "m1"'; }

start_meta() {
	launch meta "$BIN/ferry-metaserver" -id m1 -dir "$WORK/data/meta" -rpc-addr "$META" \
		-raft-addr "$RAFT" -peers "m1=$RAFT/$META" "$@"
	wait_until 30 "the metaserver's election" meta_leader
}
