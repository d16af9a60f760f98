#!/usr/bin/env bash
# cluster.sh: a whole ferrymq cluster on this machine, as real processes on
# 127.0.0.1: 3 metaservers and 2 broker groups (a master and a slave each;
# FERRY_GROUPS sets how many groups, FERRY_SLAVES how many slaves each).
#
#   scripts/cluster.sh start    build the binaries, start every process, wait until ready
#   scripts/cluster.sh stop     stop every process this script started, by its PID, all at once
#   scripts/cluster.sh status   show the processes, the Raft cluster and the broker groups
#   scripts/cluster.sh demo     start from empty data, create a topic, send with `ferryctl bench` and
#                               consume with a consumer group, show the routes and brokers, read and
#                               consume messages back, kill g1's master
#                               and watch its slave take over and the old master rejoin, stop
#                               (with FERRY_SLAVES > 1 it also shows the sync sets, and the most
#                               caught-up slave takes over)
#
# Environment:
#   FERRY_HOME       data, logs, PIDs and binaries (default: .cluster in the repository)
#   FERRY_BASE_PORT  first port of the 60 the cluster uses (default 7100; more past 4 groups, see below)
#   FERRY_GROUPS     broker groups g1..gN, each a master and a slave (default 2)
#   FERRY_SLAVES     slaves per group, 1 to 8 (default 1): gN-slave, then gN-slave2, gN-slave3, ...;
#                    every group's master waits for its sync set (the slaves caught up) before it
#                    answers a HIGH message, and below the group's MinInSync copies (default 2, the
#                    master's counted) it refuses HIGH NOT_ENOUGH_REPLICAS
#   FERRY_HEARTBEAT, FERRY_SESSION, FERRY_FAILOVER_MARGIN, FERRY_LAG_TIME
#                    the brokers' -heartbeat (default 1s), the session of the brokers and the
#                    metaservers (-session, default 4s), the metaservers' -failover-margin (default
#                    500ms) and -lag-time (default 5s; the metaservers give it to every master, which
#                    drops a slave not caught up this long from its sync set): Go durations
#   FERRY_HIGH_WAIT  the brokers' -high-wait (default 3s): how long a master holds a HIGH message for its
#                    sync set before it answers SLAVE_SYNC_TIMEOUT (the SDK retries it)
#   FERRY_FLUSH      brokers' flush mode, async or sync (default async)
#   FERRY_TXN_TIMEOUT  the brokers' -txn-timeout (default 1m, at most 15m): a master aborts a
#                    transaction open longer (a Go duration)
#   FERRY_FAILOVER   on (default): the metaservers promote a lost master's slave; off: the group
#                    stays read-only until its master is back
#   FERRY_AUTO_CREATE  1: a route lookup of an unknown topic creates it (8 queues); default 0: an
#                    unknown topic is refused UNKNOWN_TOPIC, so a typo does not make a topic
#   FERRY_ADMIT_GROUPS auto (default): a broker group that registers takes queues at once; manual:
#                    it waits for `ferryctl broker add-group` (the metaservers' -admit-groups), and
#                    `start` admits g1 and g2 once they registered
#   FERRY_TLS        1: TLS on every link (clients, brokers to metaservers, slaves to masters, raft),
#                    client certificates required. `ferryctl certs` makes a throwaway CA and a
#                    certificate per process (for 127.0.0.1 and localhost) and one for ferryctl
#                    ("ctl") under $FERRY_HOME/tls, kept across `start`s (demo makes new ones); the
#                    servers get -tls-cert/-tls-key/-tls-ca and this script's ferryctl --tls-ca,
#                    --tls-cert, --tls-key. Give status and stop the same FERRY_TLS. Default 0: plaintext
#   FERRY_AUTH       1: authorization on. Makes an admin and a cluster token under $FERRY_HOME/auth
#                    (kept across `start`s; demo makes new ones): every server gets
#                    -auth-cluster-token-file, the metaservers -auth-admin-token-file, and this
#                    script's ferryctl --token-file auth/admin.token. Give status and stop the same
#                    FERRY_AUTH. Default 0: off
#                    With FERRY_TLS=1 or FERRY_AUTH=1 the metaservers, and only they, also get
#                    -raft-secret-file $FERRY_HOME/raft/raft.secret (made like the tokens, kept across
#                    `start`s, new for each demo): the secret that alone opens their Raft port
#
# Ports, from BASE: metaserver RPC +1..+3, raft +11..+13, metrics +21..+23; broker j (g1 master 1,
# g1 slave 2, g2 master 3, g2 slave 4, ..., gN slave 2N): data +30+j, HA +40+j, metrics +50+j for
# j <= 9 (the default 2 groups: data +31..+34, HA +41..+44, metrics +51..+54); from the tenth
# broker on (FERRY_GROUPS > 4), data +60+3(j-10), HA the port after, metrics the one after that.
# With FERRY_SLAVES=S > 1 the extra slaves come after all of those, group by group: slave k
# (2 <= k <= S) of group g is broker j = 2N + (g-1)(S-1) + (k-1), with the same formula, so the
# masters and first slaves keep their ports whatever S is (FERRY_GROUPS=1 FERRY_SLAVES=2: g1-slave2
# is j = 3, data +33, HA +43, metrics +53). The cluster spans 60 ports, plus 3 for each broker past
# the ninth: 60 + 3 * max(0, N(S+1) - 9).
set -euo pipefail
# What the script and its processes create is at most 0640 (files) and 0750
# (directories): logs, PIDs, binaries; the servers keep their data 0600/0700.
umask 027

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FERRY_HOME="${FERRY_HOME:-$ROOT/.cluster}"
BASE="${FERRY_BASE_PORT:-7100}"
FLUSH="${FERRY_FLUSH:-async}"
FAILOVER="${FERRY_FAILOVER:-on}"
AUTO_CREATE="${FERRY_AUTO_CREATE:-0}"
ADMIT="${FERRY_ADMIT_GROUPS:-auto}"
TLS="${FERRY_TLS:-0}"
AUTH="${FERRY_AUTH:-0}"
GROUPS_N="${FERRY_GROUPS:-2}"
SLAVES_N="${FERRY_SLAVES:-1}"
HEARTBEAT="${FERRY_HEARTBEAT:-1s}"
SESSION="${FERRY_SESSION:-4s}"
MARGIN="${FERRY_FAILOVER_MARGIN:-500ms}"
LAG_TIME="${FERRY_LAG_TIME:-5s}"
HIGH_WAIT="${FERRY_HIGH_WAIT:-3s}"
TXN_TIMEOUT="${FERRY_TXN_TIMEOUT:-1m}"
BIN="$FERRY_HOME/bin"
PIDS="$FERRY_HOME/pids"
LOGS="$FERRY_HOME/logs"
META="127.0.0.1:$((BASE + 1)),127.0.0.1:$((BASE + 2)),127.0.0.1:$((BASE + 3))"
if ! [[ "$GROUPS_N" =~ ^[1-9][0-9]?$ ]]; then
  echo "cluster.sh: FERRY_GROUPS=$GROUPS_N: want 1 to 99" >&2
  exit 2
fi
if ! [[ "$SLAVES_N" =~ ^[1-8]$ ]]; then
  echo "cluster.sh: FERRY_SLAVES=$SLAVES_N: want 1 to 8" >&2
  exit 2
fi
# BROKERS are the brokers' names in port order (see Ports above): each group's master and first
# slave, then the extra slaves of each group. A name is also the broker's id and its process name.
BROKERS=()
for ((i = 1; i <= GROUPS_N; i++)); do
  BROKERS+=("g$i-master" "g$i-slave")
done
for ((i = 1; i <= GROUPS_N; i++)); do
  for ((k = 2; k <= SLAVES_N; k++)); do
    BROKERS+=("g$i-slave$k")
  done
done
# BROKER_J maps a broker's name to its j, its place in BROKERS counted from 1.
declare -A BROKER_J=()
for i in "${!BROKERS[@]}"; do
  BROKER_J[${BROKERS[$i]}]=$((i + 1))
done

# group_brokers G: the names of group G's brokers, one a line, its master first.
group_brokers() {
  local k
  echo "$1-master"
  echo "$1-slave"
  for ((k = 2; k <= SLAVES_N; k++)); do
    echo "$1-slave$k"
  done
}

# broker_port KIND J: the data, ha or metrics port of broker J (1-based, in BROKERS' order).
broker_port() {
  local off=0
  case "$1" in
  ha) off=1 ;;
  metrics) off=2 ;;
  esac
  if [ "$2" -le 9 ]; then
    echo $((BASE + 30 + 10 * off + $2))
  else
    echo $((BASE + 60 + 3 * ($2 - 10) + off))
  fi
}
TLS_DIR="$FERRY_HOME/tls"
CTL_TLS=()
case "$TLS" in
1) CTL_TLS=(--tls-ca "$TLS_DIR/ca.pem" --tls-cert "$TLS_DIR/ctl.pem" --tls-key "$TLS_DIR/ctl-key.pem") ;;
0) ;;
*)
  echo "cluster.sh: FERRY_TLS=$TLS: want 0 or 1" >&2
  exit 2
  ;;
esac

AUTH_DIR="$FERRY_HOME/auth"
CTL_AUTH=()
case "$AUTH" in
1) CTL_AUTH=(--token-file "$AUTH_DIR/admin.token") ;;
0) ;;
*)
  echo "cluster.sh: FERRY_AUTH=$AUTH: want 0 or 1" >&2
  exit 2
  ;;
esac

ctl() { "$BIN/ferryctl" --meta "$META" "${CTL_TLS[@]}" "${CTL_AUTH[@]}" "$@"; }

# broker_metrics NAME: broker NAME's Prometheus metrics, as a scrape reads them (HTTPS with ctl's
# certificate under FERRY_TLS=1, the admin token under FERRY_AUTH=1); fails if it does not answer.
broker_metrics() {
  local scheme=http opts=(-sf --max-time 2)
  if [ "$TLS" = 1 ]; then
    scheme=https
    opts+=(--cacert "$TLS_DIR/ca.pem" --cert "$TLS_DIR/ctl.pem" --key "$TLS_DIR/ctl-key.pem")
  fi
  if [ "$AUTH" = 1 ]; then
    opts+=(-H "Authorization: Bearer $(cat "$AUTH_DIR/admin.token")")
  fi
  curl "${opts[@]}" "$scheme://127.0.0.1:$(broker_port metrics "${BROKER_J[$1]}")/metrics"
}

# metric TEXT NAME: the value of series NAME (labels included, as exported) in the metrics TEXT.
metric() { awk -v n="$2" '$1 == n { print $2; exit }' <<<"$1"; }

# master_of G: the broker of group G whose metrics say it is the master (none if none answers so).
master_of() {
  local b m
  for b in $(group_brokers "$1"); do
    if m="$(broker_metrics "$b" 2>/dev/null)" && [ "$(metric "$m" ferrymq_broker_is_master)" = 1 ]; then
      echo "$b"
      return 0
    fi
  done
  return 1
}

# takes_high G: group G's master takes HIGH messages (ferrymq_broker_takes_high 1: its sync set
# holds the copies they need) and every other broker of G is in its sync set.
takes_high() {
  local master m b
  master="$(master_of "$1")" || return 1
  m="$(broker_metrics "$master" 2>/dev/null)" || return 1
  [ "$(metric "$m" ferrymq_broker_takes_high)" = 1 ] || return 1
  for b in $(group_brokers "$1"); do
    [ "$b" = "$master" ] && continue
    [ "$(metric "$m" "ferrymq_broker_replica_in_sync{replica=\"$b\"}")" = 1 ] || return 1
  done
}

# auth_flags KIND: the authorization flags of a metaserver or a broker (none without FERRY_AUTH=1).
auth_flags() {
  [ "$AUTH" = 1 ] || return 0
  printf '%s\n' -auth-cluster-token-file "$AUTH_DIR/cluster.token"
  if [ "$1" = metaserver ]; then
    printf '%s\n' -auth-admin-token-file "$AUTH_DIR/admin.token"
  fi
}

# make_tokens: with FERRY_AUTH=1, the admin and cluster tokens (32 random bytes, base64url) under
# $AUTH_DIR, unless it has them.
make_tokens() {
  [ "$AUTH" = 1 ] || return 0
  if [ -f "$AUTH_DIR/admin.token" ] && [ -f "$AUTH_DIR/cluster.token" ]; then
    echo "auth: using the tokens in $AUTH_DIR"
    return 0
  fi
  echo "auth: making the admin and cluster tokens in $AUTH_DIR"
  mkdir -p "$AUTH_DIR"
  chmod 700 "$AUTH_DIR"
  local name
  for name in admin cluster; do
    (umask 077 && head -c 32 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n' >"$AUTH_DIR/$name.token")
  done
}

# The metaservers' own secret: with TLS or authorization on, it alone opens their Raft port. No
# broker and no ferryctl is given it.
RAFT_DIR="$FERRY_HOME/raft"
secure() { [ "$TLS" = 1 ] || [ "$AUTH" = 1 ]; }

# raft_flags: a metaserver's -raft-secret-file (none without FERRY_TLS=1 or FERRY_AUTH=1).
raft_flags() {
  secure || return 0
  printf '%s\n' -raft-secret-file "$RAFT_DIR/raft.secret"
}

# make_raft_secret: with FERRY_TLS=1 or FERRY_AUTH=1, the metaservers' raft secret (32 random
# bytes, base64url) under $RAFT_DIR, unless it has one.
make_raft_secret() {
  secure || return 0
  if [ -f "$RAFT_DIR/raft.secret" ]; then
    return 0
  fi
  echo "raft: making the metaservers' raft secret in $RAFT_DIR"
  mkdir -p "$RAFT_DIR"
  chmod 700 "$RAFT_DIR"
  (umask 077 && head -c 32 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n' >"$RAFT_DIR/raft.secret")
}

# tls_flags NAME: the TLS flags of the server NAME (none without FERRY_TLS=1).
tls_flags() {
  [ "$TLS" = 1 ] || return 0
  printf '%s\n' -tls-cert "$TLS_DIR/$1.pem" -tls-key "$TLS_DIR/$1-key.pem" -tls-ca "$TLS_DIR/ca.pem"
}

# make_certs: with FERRY_TLS=1, a CA and the certificates under $TLS_DIR, unless it has a CA.
make_certs() {
  [ "$TLS" = 1 ] || return 0
  if [ -f "$TLS_DIR/ca.pem" ]; then
    echo "TLS: using the certificates in $TLS_DIR"
    return 0
  fi
  local nodes=() name
  for name in meta-m1 meta-m2 meta-m3 "${BROKERS[@]}"; do
    nodes+=(--node "$name=127.0.0.1,localhost")
  done
  echo "TLS: making a CA and certificates in $TLS_DIR"
  "$BIN/ferryctl" certs "$TLS_DIR" "${nodes[@]}" --client ctl
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

build() {
  if ! command -v curl >/dev/null; then
    echo "cluster.sh: curl not found: it reads the brokers' metrics to tell when the cluster is ready" >&2
    exit 1
  fi
  mkdir -p "$BIN"
  echo "building binaries into $BIN"
  (cd "$ROOT" && go build -o "$BIN/" ./cmd/ferry-metaserver ./cmd/ferry-broker ./cmd/ferryctl)
}

# launch NAME CMD...: start a process in the background, logs and PID under FERRY_HOME. A log
# from an earlier run (made before the umask) is made 0640 again.
launch() {
  local name="$1"
  shift
  chmod 750 "$LOGS"
  if [ -f "$LOGS/$name.log" ]; then chmod 640 "$LOGS/$name.log"; fi
  "$@" >"$LOGS/$name.log" 2>&1 &
  echo $! >"$PIDS/$name.pid"
  disown $! # its end (say a kill -9) is not this shell's to report
}

refuse_if_running() {
  mkdir -p "$PIDS" "$LOGS"
  for f in "$PIDS"/*.pid; do
    if alive "$f"; then
      echo "cluster.sh: a cluster is already running under $FERRY_HOME ($(basename "$f" .pid) is up); run '$0 stop' first" >&2
      exit 1
    fi
  done
  rm -f "$PIDS"/*.pid
}

start() {
  refuse_if_running
  build
  make_certs
  make_tokens
  make_raft_secret
  local peers="" i auto=() tlsf=() authf=() raftf=()
  case "$AUTO_CREATE" in
  1) auto=(-auto-create) ;;
  0) ;;
  *)
    echo "cluster.sh: FERRY_AUTO_CREATE=$AUTO_CREATE: want 0 or 1" >&2
    exit 2
    ;;
  esac
  case "$ADMIT" in
  auto | manual) ;;
  *)
    echo "cluster.sh: FERRY_ADMIT_GROUPS=$ADMIT: want auto or manual" >&2
    exit 2
    ;;
  esac
  for i in 1 2 3; do
    peers="${peers:+$peers,}m$i=127.0.0.1:$((BASE + 10 + i))/127.0.0.1:$((BASE + i))"
  done
  for i in 1 2 3; do
    mapfile -t tlsf < <(tls_flags "meta-m$i")
    mapfile -t authf < <(auth_flags metaserver)
    mapfile -t raftf < <(raft_flags)
    launch "meta-m$i" "$BIN/ferry-metaserver" -id "m$i" -dir "$FERRY_HOME/data/meta-m$i" \
      -rpc-addr "127.0.0.1:$((BASE + i))" -raft-addr "127.0.0.1:$((BASE + 10 + i))" -peers "$peers" \
      -metrics-addr "127.0.0.1:$((BASE + 20 + i))" "${auto[@]}" -session "$SESSION" -lag-time "$LAG_TIME" -failover "$FAILOVER" -failover-margin "$MARGIN" -admit-groups "$ADMIT" \
      "${tlsf[@]}" "${authf[@]}" "${raftf[@]}"
  done
  local j name group role
  for name in "${BROKERS[@]}"; do
    j=${BROKER_J[$name]}
    group="${name%%-*}"
    role=slave
    if [ "$name" = "$group-master" ]; then role=master; fi
    if [ "$j" = $((2 * GROUPS_N + 1)) ]; then
      # The first extra slave: any order works (a slave-preferring newcomer joins as one more
      # slave), but starting the extra slaves once every group has its master and first slave
      # keeps the registrations, and the logs, in the order the names say.
      wait_registered
    fi
    mapfile -t tlsf < <(tls_flags "$name")
    mapfile -t authf < <(auth_flags broker)
    launch "$name" "$BIN/ferry-broker" -id "$name" -group "$group" -role "$role" \
      -dir "$FERRY_HOME/data/$name" -addr "127.0.0.1:$(broker_port data "$j")" -ha-addr "127.0.0.1:$(broker_port ha "$j")" \
      -metrics-addr "127.0.0.1:$(broker_port metrics "$j")" -meta "$META" -flush "$FLUSH" -heartbeat "$HEARTBEAT" -session "$SESSION" -high-wait "$HIGH_WAIT" -txn-timeout "$TXN_TIMEOUT" "${tlsf[@]}" "${authf[@]}"
  done
  wait_ready
  if [ "$ADMIT" = manual ]; then
    local n
    for n in $(seq 1 "$GROUPS_N"); do
      ctl broker add-group "g$n" >/dev/null
    done
    echo "admitted broker groups g1 to g$GROUPS_N (FERRY_ADMIT_GROUPS=manual)"
  fi
  console_url
}

# console_url prints where the web console is (every metaserver serves it).
console_url() {
  local scheme=http login="no login: authorization is off"
  if [ "$TLS" = 1 ]; then scheme=https; fi
  if [ "$AUTH" = 1 ]; then login="log in with the token in $AUTH_DIR/admin.token"; fi
  echo "web console: $scheme://127.0.0.1:$((BASE + 21))/console/ ($login; every metaserver serves it, on ports $((BASE + 21))-$((BASE + 23)))"
}

# registered: each group's master and slave ids in the registry, a line "GROUP MASTER SLAVE" each
# ("-" for none), from `ferryctl brokers --json` (indented two spaces a level).
registered() {
  ctl --timeout 2s brokers --json 2>/dev/null | awk '
    /^    "name": "/ { if (g != "") print g, m, sl; g = $2; gsub(/[",]/, "", g); m = "-"; sl = "-"; want = "" }
    /^    "master": \{/ { want = "m" }
    /^    "slave": \{/ { want = "s" }
    /^      "id": "/ { id = $2; gsub(/[",]/, "", id); if (want == "m") m = id; if (want == "s") sl = id; want = "" }
    END { if (g != "") print g, m, sl }'
}

# wait_registered waits until every group has a master and a slave in the registry.
wait_registered() {
  local deadline=$((SECONDS + 60)) out n
  while [ $SECONDS -lt $deadline ]; do
    check_alive
    out="$(registered)"
    n="$(awk '$2 != "-" && $3 != "-"' <<<"$out" | wc -l)"
    if [ "$n" = "$GROUPS_N" ]; then
      return 0
    fi
    sleep 0.2
  done
  echo "cluster.sh: the groups' masters and first slaves did not register within 60 s; logs are in $LOGS" >&2
  stop
  exit 1
}

# check_alive stops the cluster and exits if a process it started has exited.
check_alive() {
  local f
  for f in "$PIDS"/*.pid; do
    if ! alive "$f"; then
      echo "cluster.sh: $(basename "$f" .pid) exited; its log:" >&2
      tail -n 20 "$LOGS/$(basename "$f" .pid).log" >&2
      stop
      exit 1
    fi
  done
}

# wait_ready waits until every group is writable, each master reports a slave connected, and
# each master takes HIGH messages with every slave of its group in its sync set.
wait_ready() {
  local deadline=$((SECONDS + 60)) out n ready
  while [ $SECONDS -lt $deadline ]; do
    check_alive
    if out="$(ctl --timeout 2s brokers --json 2>/dev/null)" &&
      [ "$(grep -c '"state": "RW"' <<<"$out")" = "$GROUPS_N" ] &&
      [ "$(grep -c '"slave_heartbeat_age_ms": -1' <<<"$out")" = 0 ] &&
      [ "$(grep -c '"slave_connected": true' <<<"$out")" = "$GROUPS_N" ]; then
      ready=1
      for ((n = 1; n <= GROUPS_N; n++)); do
        if ! takes_high "g$n"; then
          ready=0
          break
        fi
      done
    else
      ready=0
    fi
    if [ "$ready" = 1 ]; then
      echo "cluster ready: metaservers $META${CTL_TLS[*]:+ (TLS: ferryctl ${CTL_TLS[*]})}"
      return 0
    fi
    sleep 0.5
  done
  echo "cluster.sh: the cluster did not become ready within 60 s; logs are in $LOGS" >&2
  sync_sets >&2 || true
  stop
  exit 1
}

# stop stops every process this script started, all at once: SIGTERM to each recorded PID, then
# a wait for all of them (a clean stop takes each about as long as the slowest), SIGKILL to any
# still running after STOP_WAIT seconds.
STOP_WAIT=10
stop() {
  local f pid name pids=() names=() i running deadline
  for f in "$PIDS"/*.pid; do
    [ -f "$f" ] || continue
    pid="$(cat "$f")"
    name="$(basename "$f" .pid)"
    if kill -0 "$pid" 2>/dev/null; then
      pids+=("$pid")
      names+=("$name")
    else
      rm -f "$f"
    fi
  done
  if [ ${#pids[@]} = 0 ]; then
    return 0
  fi
  # One kill for all: the metaservers stop together, so none is left
  # running to find its peers gone.
  kill -TERM "${pids[@]}" 2>/dev/null || true
  deadline=$((SECONDS + STOP_WAIT))
  while :; do
    running=0
    for pid in "${pids[@]}"; do
      if kill -0 "$pid" 2>/dev/null; then
        running=1
        break
      fi
    done
    if [ "$running" = 0 ] || [ "$SECONDS" -ge "$deadline" ]; then
      break
    fi
    sleep 0.05
  done
  for i in "${!pids[@]}"; do
    pid="${pids[$i]}"
    name="${names[$i]}"
    if kill -0 "$pid" 2>/dev/null; then
      echo "$name (pid $pid) did not stop in $STOP_WAIT s; killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    echo "stopped $name (pid $pid)"
    rm -f "$PIDS/$name.pid"
  done
}

status() {
  local f any=0
  for f in "$PIDS"/*.pid; do
    [ -f "$f" ] || continue
    any=1
    if alive "$f"; then
      echo "$(basename "$f" .pid): running (pid $(cat "$f"))"
    else
      echo "$(basename "$f" .pid): not running"
    fi
  done
  if [ $any = 0 ]; then
    echo "no cluster under $FERRY_HOME"
    return 0
  fi
  echo
  ctl meta status || true
  echo
  ctl brokers || true
  echo
  sync_sets
}

# sync_sets prints, from each group's master's metrics, whether it takes HIGH messages and each
# slave's place in its sync set and lag.
sync_sets() {
  local n g master m b lagb lags in
  for ((n = 1; n <= GROUPS_N; n++)); do
    g="g$n"
    if ! master="$(master_of "$g")" || ! m="$(broker_metrics "$master" 2>/dev/null)"; then
      echo "$g: no master answers its metrics"
      continue
    fi
    if [ "$(metric "$m" ferrymq_broker_takes_high)" = 1 ]; then
      echo "$g: master $master takes HIGH"
    else
      echo "$g: master $master refuses HIGH (NOT_ENOUGH_REPLICAS: its sync set is below the group's MinInSync)"
    fi
    for b in $(group_brokers "$g"); do
      [ "$b" = "$master" ] && continue
      lagb="$(metric "$m" "ferrymq_broker_replica_lag_bytes{replica=\"$b\"}" | awk '{ printf "%d", $1 }')"
      lags="$(metric "$m" "ferrymq_broker_replica_lag_seconds{replica=\"$b\"}" | awk '{ printf "%.3f", $1 }')"
      in="$(metric "$m" "ferrymq_broker_replica_in_sync{replica=\"$b\"}")"
      if [ -z "$in" ]; then
        echo "  $b: not a replica of $master"
      elif [ "$in" = 1 ]; then
        echo "  $b: in the sync set, ${lagb} bytes and ${lags} s behind"
      else
        echo "  $b: out of the sync set, ${lagb} bytes and ${lags} s behind"
      fi
    done
  done
}

demo() {
  # The demo starts from empty data, so it runs the same every time.
  refuse_if_running
  rm -rf "$FERRY_HOME/data"
  if [ "$TLS" = 1 ]; then
    rm -rf "$TLS_DIR"
  fi
  if [ "$AUTH" = 1 ]; then
    rm -rf "$AUTH_DIR"
  fi
  rm -rf "$RAFT_DIR"
  start
  trap stop EXIT
  echo
  echo "== ferryctl topic create demo --queues 8"
  ctl topic create demo --queues 8
  echo
  if [ "$AUTH" = 1 ]; then
    echo "== ferryctl acl add demo-app --perm produce:demo --perm 'consume:demo:*' (the token is printed once)"
    ctl acl add demo-app --perm produce:demo --perm 'consume:demo:*'
    echo
    echo "== ferryctl acl list"
    ctl acl list
    echo
  fi
  echo "== ferryctl bench --topic demo --count 50000 --size 1024 --consumers 4 (NORMAL, async; a consumer group of 4 takes them)"
  ctl bench --topic demo --count 50000 --size 1024 --producers 4 --consumers 4 --group demo-bench --progress=false
  echo
  echo "== ferryctl bench --topic demo --count 10000 --reliability high"
  ctl bench --topic demo --count 10000 --size 1024 --producers 4 --reliability high --progress=false
  echo
  echo "== ferryctl send demo --body 'hello, ferrymq' --key greeting"
  ctl send demo --body 'hello, ferrymq' --key greeting
  echo
  echo "== ferryctl send demo --body 'hello, later' --after 2s (a delayed message: stored now, pending; its handle names it)"
  ctl send demo --body 'hello, later' --key later --after 2s | tee "$FERRY_HOME/delayed.out"
  local handle
  handle="$(awk 'NR == 2 { print $4 }' "$FERRY_HOME/delayed.out")"
  echo
  echo "== ferryctl delayed ls (pending per minute of due time, per topic)"
  ctl delayed ls
  echo
  echo "== waiting for its time; then ferryctl delayed get $handle (where it was released)"
  wait_for "the release of delayed message $handle" delayed_released "$handle"
  ctl delayed get "$handle"
  echo
  local queue offset
  queue="$(awk 'NR == 2 { print $3 }' "$FERRY_HOME/delayed.out")"
  offset="$(ctl --json delayed get "$handle" | sed -n 's/.*"queue_offset": *\([0-9]*\).*/\1/p')"
  echo "== ferryctl read demo --queue $queue --from $offset --limit 1 (the released message)"
  ctl read demo --queue "$queue" --from "$offset" --limit 1
  echo
  echo "== ferryctl routes demo"
  ctl routes demo
  echo
  echo "== ferryctl brokers"
  ctl brokers
  echo
  if [ "$SLAVES_N" -gt 1 ]; then
    echo "== the sync sets, from each master's metrics (ferrymq_broker_takes_high, ferrymq_broker_replica_*)"
    sync_sets
    echo
  fi
  echo "== ferryctl meta status"
  ctl meta status
  echo
  if [ "$TLS" = 0 ] && [ "$AUTH" = 0 ]; then
    echo "== the web console's overview (curl $(console_url | awk '{ print $3 }'); open it in a browser while the cluster runs)"
    curl -sf --max-time 5 "http://127.0.0.1:$((BASE + 21))/console/" | tr -d '\n' |
      sed -e 's/<tr>/\n/g' -e 's/<[^>]*>/ /g' | awk 'NR > 1 && NF { $1 = $1; print }' | head -12
    echo
  fi
  echo "== ferryctl read demo --queue 0 --from 0 --limit 5"
  ctl read demo --queue 0 --from 0 --limit 5
  echo
  echo "== ferryctl consume demo --group demo-readers --count 5 (joins the group, prints, commits, leaves)"
  ctl consume demo --group demo-readers --count 5 --timeout 10s
  echo
  echo "== ferryctl group describe demo-readers (committed offsets and lag per queue)"
  ctl group describe demo-readers
  echo
  if [ "$FAILOVER" = on ]; then
    failover_demo
  fi
}

# delayed_released HANDLE: the delayed message HANDLE names was released.
delayed_released() { ctl --json delayed get "$1" 2>/dev/null | grep -q '"state": *"released"'; }

# g1_column N: field N of g1's row in `ferryctl brokers` (2 epoch, 3 state, 5 master id, 7 slave id).
g1_column() { ctl --timeout 2s brokers 2>/dev/null | awk -v n="$1" '$1 == "g1" { print $n; exit }'; }

# wait_for DESCRIPTION COMMAND...: run COMMAND every 100 ms until it succeeds, for up to 30 s.
wait_for() {
  local what="$1" deadline=$((SECONDS + 30))
  shift
  until "$@"; do
    if [ $SECONDS -ge $deadline ]; then
      echo "cluster.sh: $what did not happen within 30 s; logs are in $LOGS" >&2
      exit 1
    fi
    sleep 0.1
  done
}

# g1_led_by_slave: g1 takes writes with one of its slaves as master (with one slave, g1-slave).
g1_led_by_slave() {
  local m
  m="$(g1_column 5)"
  [ "$m" != g1-master ] && [ "${m#g1-slave}" != "$m" ] && [ "$(g1_column 3)" = RW ]
}

# g1_master_rejoined NEW: g1-master follows NEW again and is in its sync set.
g1_master_rejoined() {
  local m
  m="$(broker_metrics "$1" 2>/dev/null)" && [ "$(metric "$m" 'ferrymq_broker_replica_in_sync{replica="g1-master"}')" = 1 ]
}

# failover_demo kills g1's master with SIGKILL, waits for the metaservers to
# promote its slave (the most caught-up one, with several), sends through the
# new master, then restarts the old master with its own command line: it
# rejoins as a slave.
failover_demo() {
  local pid start ms args=() promoted slaves
  pid="$(cat "$PIDS/g1-master.pid")"
  mapfile -d '' args <"/proc/$pid/cmdline"
  if [ "$SLAVES_N" = 1 ]; then
    echo "== kill -9 g1-master (pid $pid): after the 4 s session and the 500 ms margin, the metaservers promote g1-slave"
  else
    slaves="$(group_brokers g1 | tail -n +2 | paste -sd, - | sed 's/,/, /g')"
    echo "== kill -9 g1-master (pid $pid): after the 4 s session and the 500 ms margin, the metaservers promote the most caught-up of $slaves"
  fi
  start=$(date +%s%N)
  kill -KILL "$pid"
  wait_for "the promotion of a slave of g1" g1_led_by_slave
  ms=$((($(date +%s%N) - start) / 1000000))
  promoted="$(g1_column 5)"
  echo "g1 takes writes again, led by $promoted at epoch $(g1_column 2), $((ms / 1000)).$(printf %03d $((ms % 1000))) s after the kill"
  echo
  echo "== ferryctl send demo --body 'after the failover' --key greeting (the same key, the same queue, its new master)"
  ctl send demo --body 'after the failover' --key greeting
  echo
  echo "== restart g1-master with its own command line: it rejoins g1 as the slave and copies from $promoted"
  launch g1-master "${args[@]}"
  wait_for "g1-master to rejoin as the slave" g1_master_rejoined "$promoted"
  ctl brokers
  echo
  if [ "$SLAVES_N" -gt 1 ]; then
    echo "== the sync sets after the failover"
    sync_sets
    echo
  fi
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
demo) demo ;;
*)
  echo "usage: $0 start|stop|status|demo" >&2
  exit 2
  ;;
esac
