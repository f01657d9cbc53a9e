#!/usr/bin/env bash
# Starts and stops a throw-away single-node Ceph RADOS Gateway (an S3 server) on 127.0.0.1 for
# ckptfs's tests and benchmarks: one mon, one osd, one radosgw, no mgr, no cephx, no systemd.
# Everything it creates lives under DIR (config, stores, logs, pid files, sockets); nothing is
# written to /etc/ceph, /var/lib/ceph or /var/log/ceph.
#
# Usage:
#   eval "$(bash scripts/rgw.sh start DIR)"   # prints `export AWS_...` lines, also kept in DIR/env
#   bash scripts/rgw.sh status DIR            # exit 0 when all three daemons and S3 answer
#   bash scripts/rgw.sh stop DIR              # kills the daemons, removes what start made
#                                             # (idempotent)
#
# Environment:
#   RGW_PORT=N              S3 port (default: a free one in 20000-32767)
#   RGW_STORE=memstore      object store: memstore (RAM, default) or bluestore (sparse file in DIR)
#   RGW_STORE_BYTES=N       capacity of the store (default 4 GiB memstore, 64 GiB bluestore);
#                           once it is full, PUTs hang (radosgw waits for space) instead of failing
#   RGW_TIMEOUT=30          seconds each daemon may take to come up
#   RGW_STOP_GRACE=1        seconds between SIGTERM and SIGKILL on stop
#
# Only progress and errors go to stderr; stdout carries only the export lines, so the command
# substitution above sees EOF as soon as start returns (daemons never hold the caller's stdout).
set -euo pipefail

readonly kAccessKey=CKPTFSTESTACCESSKEY0
readonly kSecretKey=ckptfs-test-secret-key-do-not-use-elsewhere
readonly kRegion=us-east-1
readonly kUser=ckptfs
# Package that provides each tool this script runs. ceph-common (ceph, radosgw-admin,
# ceph-authtool) comes in as a dependency of radosgw and ceph-osd; the `ceph` metapackage is
# not needed and would add ceph-mgr and its Python stack.
readonly kPackages=(ceph-mon ceph-osd radosgw ceph-common python3-boto3 curl)

log() { echo "rgw.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

install_deps() {
  local missing=() p
  for p in "${kPackages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Sets the paths every command uses. DIR is made absolute because the daemons outlive our cwd.
set_paths() {
  [[ -n ${1:-} ]] || usage
  mkdir -p "$1"
  dir=$(cd "$1" && pwd)
  # ceph.conf values such as "mon cluster log file" are space-separated lists.
  [[ $dir != *[[:space:]]* ]] || die "DIR must not contain whitespace: '$dir'"
  conf=$dir/ceph.conf
  run=$dir/run
  logs=$dir/log
}

# Local TCP ports in use (any state, any address), from /proc: no python or iproute2 needed.
used_ports() {
  local hex
  awk 'FNR > 1 { split($2, a, ":"); print a[2] }' /proc/net/tcp /proc/net/tcp6 2>/dev/null |
    while read -r hex; do echo $((16#$hex)); done
}

# A random free port below Linux's ephemeral range (32768+), so that an outgoing connection
# cannot take it between now and the daemon's bind(). Ports in EXCLUDE... are skipped too.
free_port() {
  local used port i
  used=" $(used_ports | tr '\n' ' ') $* "
  for ((i = 0; i < 200; i++)); do
    port=$((20000 + RANDOM % 12768))
    [[ $used == *" $port "* ]] || { echo "$port"; return 0; }
  done
  die "no free port found in 20000-32767"
}

port_is_free() { [[ " $(used_ports | tr '\n' ' ') " != *" $1 "* ]]; }

# Every ceph CLI call is bounded: without --connect-timeout a missing mon blocks it for 300 s.
ceph_cli() { timeout 20 ceph -c "$conf" --connect-timeout 10 "$@"; }

# pid of daemon NAME if it is alive and really ours (its command line names our ceph.conf),
# so a recycled pid is never signalled.
daemon_pid() {
  local f=$run/$1.pid pid
  [[ -f $f ]] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ ]] && [[ -r /proc/$pid/cmdline ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "-c $conf " || return 1
  echo "$pid"
}

# Runs a daemon in the foreground (-f) as our background child rather than letting it
# daemonize: radosgw forks only after it has reached the cluster, so a plain `radosgw` blocks
# the caller for up to client_mount_timeout when something is wrong. setsid gives it a session
# of its own, so signals aimed at the caller's process group (Ctrl-C, a test runner killing its
# job) do not take down one daemon behind the others' back; stop (or a failed start) does that.
launch() {
  local name=$1; shift
  setsid "$@" -f -c "$conf" </dev/null >>"$logs/$name.out" 2>&1 &
  echo $! >"$run/$name.pid"
}

# Polls CMD until it succeeds, for at most RGW_TIMEOUT seconds, failing early if daemon NAME
# died. WHAT names the wait in the error message.
wait_until() {
  local name=$1 what=$2; shift 2
  local deadline=$((SECONDS + ${RGW_TIMEOUT:-30}))
  until "$@" >/dev/null 2>&1; do
    daemon_pid "$name" >/dev/null || fail "$name exited while waiting for $what" "$name"
    ((SECONDS < deadline)) || fail "$name: no $what within ${RGW_TIMEOUT:-30} s" "$name"
    sleep 0.1
  done
}

# The interesting part of daemon NAME's logs: the last lines of its stdout/stderr (where it
# reports failing to start), and the last error lines (ceph logs errors at level -1) of its log.
# A crash appends a dump of recent events that repeats the log; it is skipped.
show_logs() {
  local name=$1 out=$logs/$1.out cephlog=$logs/$1.log
  if [[ -s $out ]]; then
    log "---- last lines of $out"
    sed '/--- begin dump of recent events ---/q' "$out" | tail -n 12 >&2
  fi
  if [[ -s $cephlog ]]; then
    log "---- last errors in $cephlog"
    sed '/--- begin dump of recent events ---/q' "$cephlog" | grep -E ' -1 |FAILED' | tail -n 10 >&2
  fi
}

# Start failed: say why, show the daemon's log, take down what we started. Logs and ceph.conf
# stay for a post-mortem; `stop` removes them.
fail() {
  trap - EXIT INT TERM HUP
  log "error: $1"
  [[ -n ${2:-} ]] && show_logs "$2"
  stop_daemons
  rm -rf "${dir:?}/mon" "$dir/osd" "$dir/rgw" "$dir/env"
  log "start failed; logs kept in $logs (\`$0 stop $dir\` removes them)"
  exit 1
}

osd_is_up() { ceph_cli osd stat -f json | grep -q '"num_up_osds":1,'; }
s3_answers() { curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$1/"; }

write_conf() {
  local fsid=$1 mon_port=$2 rgw_port=$3 store=$4 store_bytes=$5
  cat >"$conf" <<EOF
# Written by scripts/rgw.sh for a throw-away test cluster.
[global]
fsid = $fsid
# One mon, msgr v2 only, on loopback: nothing listens beyond 127.0.0.1, and skipping msgr v1
# spares a second mon port. The osd binds 127.0.0.1 ports in ms_bind_port_min..max (6800+).
mon host = v2:127.0.0.1:$mon_port
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
# No cephx: no keyrings to create, and every tool works with only this file.
auth cluster required = none
auth service required = none
auth client required = none
# Keep every default path (/etc/ceph, /var/lib/ceph, /var/log/ceph, /var/run/ceph) inside DIR.
# The keyring is never created (no cephx); naming it only stops clients probing /etc/ceph.
keyring = $dir/keyring
run dir = $run
admin socket = $run/\$name.asok
log file = $logs/\$name.log
mon cluster log file = default=$logs/cluster.\$channel.log cluster=$logs/cluster.log
crash dir = $dir/crash
mon data = $dir/mon/\$id
osd data = $dir/osd/\$id
rgw data = $dir/rgw
# Clients (radosgw, radosgw-admin) give up after this long instead of the default 300 s.
client mount timeout = 30
# A single osd: pools of size 1, and no health warnings about it.
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
# There is no mgr to run the pg autoscaler; 8 pgs per pool is plenty for one osd.
osd pool default pg autoscale mode = off
osd pool default pg num = 8
osd pool default pgp num = 8
# The mon batches map changes for 1 s by default; radosgw start-up creates pools and waits for
# each map change, so 10 ms makes start-up and first bucket creation several times faster.
paxos propose interval = 0.01
# The mon stops itself when its disk has less than 5% free (and warns below 30%); a test box's
# disk may well be that full, and this mon's store is a few MB.
mon data avail crit = 1
mon data avail warn = 2
# Only a cephx concern; keeps "ceph health" quiet about it.
mon warn on insecure global id reclaim allowed = false

[osd]
osd objectstore = $store
# memstore keeps objects in RAM (about twice the stored bytes); the size is the capacity it
# reports, so the osd turns full there instead of exhausting the machine's memory. A full osd
# makes writes wait for space, so radosgw requests hang rather than fail.
memstore device bytes = $store_bytes
# bluestore: the osd creates DIR/osd/0/block as a sparse file of this size at mkfs.
bluestore block size = $store_bytes
bluestore block create = true
# bluestore sizes its cache to this; the default 4 GiB is too much beside a test run.
osd memory target = 2147483648

[client.rgw.a]
# radosgw overrides the client default to require a "secure" mon session, which needs cephx;
# without this it retries authentication forever and never opens its port.
ms mon client mode = crc
# Path-style S3 on loopback; tcp_nodelay because small responses otherwise wait for the
# client's delayed ACK (Nagle), ~40 ms per small GET.
rgw frontends = beast endpoint=127.0.0.1:$rgw_port tcp_nodelay=1
# Give up initializing after as long as we wait for it, not the default 300 s.
rgw init timeout = ${RGW_TIMEOUT:-30}
# rgw dns name stays unset: every request is path-style (http://127.0.0.1:PORT/bucket/key).
# Deleted and overwritten objects' data is freed by the garbage collector, by default after
# 2 h; with memstore that is RAM, so collect after 30 s.
rgw gc obj min wait = 30
rgw gc processor period = 30
rgw gc processor max time = 30
# Per-request usage and ops logs cost rados writes and nobody reads them here. Both are off by
# default in 16; pinned so that a different default cannot slow benchmarks unnoticed.
rgw enable usage log = false
rgw enable ops log = false
rgw luarocks location = $dir/rgw/luarocks
EOF
}

cmd_start() {
  [[ -n ${1:-} ]] || usage
  local store=${RGW_STORE:-memstore} store_bytes rgw_port mon_port
  case $store in
    memstore) store_bytes=${RGW_STORE_BYTES:-$((4 << 30))} ;;
    bluestore) store_bytes=${RGW_STORE_BYTES:-$((64 << 30))} ;;
    *) die "RGW_STORE must be memstore or bluestore, not '$store'" ;;
  esac
  [[ $store_bytes =~ ^[0-9]+$ ]] || die "RGW_STORE_BYTES must be a number of bytes"
  [[ ${RGW_PORT:-1} =~ ^[0-9]+$ ]] || die "RGW_PORT must be a port number"
  [[ ${RGW_TIMEOUT:-30} =~ ^[0-9]+$ ]] || die "RGW_TIMEOUT must be whole seconds"
  set_paths "$1"
  local name
  for name in client.rgw.a osd.0 mon.a; do
    daemon_pid "$name" >/dev/null && die "a cluster is already running in $dir (stop it first)"
  done
  install_deps
  if [[ -n ${RGW_PORT:-} ]]; then
    rgw_port=$RGW_PORT
    port_is_free "$rgw_port" || die "RGW_PORT $rgw_port is already in use on 127.0.0.1"
  else
    rgw_port=$(free_port)
  fi
  mon_port=$(free_port "$rgw_port")

  # A fresh cluster every time: whatever a previous run left behind goes.
  rm -rf "${dir:?}/mon" "$dir/osd" "$dir/rgw" "$run" "$logs" "$dir/crash" "$dir/env" "$conf"
  mkdir -p "$dir/mon/a" "$dir/osd/0" "$dir/rgw" "$run" "$logs" "$dir/crash"
  local t0=$EPOCHREALTIME fsid osd_uuid
  fsid=$(</proc/sys/kernel/random/uuid)
  osd_uuid=$(</proc/sys/kernel/random/uuid)
  write_conf "$fsid" "$mon_port" "$rgw_port" "$store" "$store_bytes"
  # From here on, any failure, Ctrl-C or kill takes down what was started.
  trap 'fail "unexpected error (exit status $?)"' EXIT
  trap 'fail "interrupted"' INT TERM HUP

  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" "$run/monmap" >/dev/null
  ceph-mon -c "$conf" -i a --mkfs --monmap "$run/monmap" >"$logs/mon.a.out" 2>&1 ||
    fail "ceph-mon --mkfs failed" mon.a
  launch mon.a ceph-mon -i a
  # `osd new` with a given uuid is idempotent, so it doubles as the wait for the mon.
  wait_until mon.a "answer from the mon on port $mon_port" ceph_cli osd new "$osd_uuid"

  ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" >"$logs/osd.0.out" 2>&1 ||
    fail "ceph-osd --mkfs ($store) failed" osd.0
  launch osd.0 ceph-osd -i 0
  wait_until osd.0 "osd up in the osdmap" osd_is_up

  # radosgw-admin creates the default realm/zone and their pools on first use; doing it before
  # radosgw starts avoids both racing to create them.
  timeout "${RGW_TIMEOUT:-30}" radosgw-admin -c "$conf" user create --uid="$kUser" \
      --display-name="ckptfs tests" --access-key="$kAccessKey" --secret-key="$kSecretKey" \
      >"$logs/radosgw-admin.out" 2>&1 || fail "radosgw-admin user create failed" radosgw-admin
  launch client.rgw.a radosgw -n client.rgw.a
  wait_until client.rgw.a "S3 answer on 127.0.0.1:$rgw_port" s3_answers "$rgw_port"

  cat >"$dir/env" <<EOF
export AWS_ENDPOINT_URL=http://127.0.0.1:$rgw_port
export AWS_ACCESS_KEY_ID=$kAccessKey
export AWS_SECRET_ACCESS_KEY=$kSecretKey
export AWS_REGION=$kRegion
export AWS_DEFAULT_REGION=$kRegion
EOF
  trap - EXIT INT TERM HUP
  local took
  took=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  log "up in $took s: S3 on http://127.0.0.1:$rgw_port ($store, $((store_bytes >> 20)) MiB)," \
      "logs in $logs; stop with: bash $0 stop $dir"
  cat "$dir/env"
}

# True while PID runs. A zombie counts as gone: it has released its ports and memory, and the
# daemons are not our children, so reaping them is up to init, which may take seconds.
alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  [[ ${stat##*) } != Z* ]]
}

# SIGTERM, a short grace, then SIGKILL; waits (bounded) until the process is gone.
stop_daemon() {
  local name=$1 pid i
  pid=$(daemon_pid "$name") || { rm -f "$run/$name.pid"; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < ${RGW_STOP_GRACE:-1} * 10; i++)); do
    alive "$pid" || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    alive "$pid" || break
    sleep 0.1
  done
  alive "$pid" && log "warning: $name (pid $pid) survived SIGKILL"
  rm -f "$run/$name.pid"
}

# radosgw first: once the osd and mon are gone it would retry them for minutes before exiting.
stop_daemons() {
  stop_daemon client.rgw.a
  stop_daemon osd.0
  stop_daemon mon.a
}

cmd_stop() {
  [[ -n ${1:-} ]] || usage
  [[ -d $1 ]] || return 0
  set_paths "$1"
  stop_daemons
  # Only what start creates; DIR itself goes only if that leaves it empty.
  rm -rf "${dir:?}/mon" "$dir/osd" "$dir/rgw" "$run" "$logs" "$dir/crash" "$dir/env" "$conf"
  rmdir "$dir" 2>/dev/null || true
}

cmd_status() {
  [[ -n ${1:-} ]] || usage
  [[ -f $1/ceph.conf ]] || { log "no cluster in $1"; return 1; }
  set_paths "$1"
  local ok=0 name pid port
  for name in mon.a osd.0 client.rgw.a; do
    if pid=$(daemon_pid "$name"); then
      log "$name: running (pid $pid)"
    else
      log "$name: not running"; ok=1
    fi
  done
  port=$(sed -n 's/^rgw frontends = .*endpoint=127\.0\.0\.1:\([0-9]*\).*/\1/p' "$conf")
  if s3_answers "$port"; then
    log "S3: http://127.0.0.1:$port answers"
    cat "$dir/env"
  else
    log "S3: http://127.0.0.1:$port does not answer"; ok=1
  fi
  return $ok
}

case ${1:-} in
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  status) shift; cmd_status "$@" ;;
  *) usage ;;
esac
