#!/usr/bin/env bash
# A 3-node MariaDB Galera Cluster on loopback ports, for tests and measurements.
#
#   galera.sh start          start three nodes (a fresh cluster), wait until all are Synced
#   galera.sh stop           stop every node (and the lone server), remove the data
#   galera.sh kill N         SIGKILL node N (1-3)
#   galera.sh restart N      restart node N after a kill: --wsrep-recover, then
#                            --wsrep-start-position, so it rejoins by incremental transfer
#   galera.sh status         each node's state and the cluster size
#   galera.sh urls           the three SQLAlchemy URLs, space-separated
#   galera.sh lone start|stop  a lone server from the same binary (wsrep_provider=none),
#                            the baseline for throughput figures; prints its URL
#
# Nothing is read from /etc/mysql: each node has its own --defaults-file. The data
# lives under NOVAQUE_GALERA_DIR (default: a folder in ${TMPDIR:-/tmp}); the servers
# on the usual ports (3306) are never touched. Ports (NOVAQUE_GALERA_PORT, default
# 4306): node N serves SQL on PORT+N-1, group communication on 4567+10(N-1), its
# incremental transfer on 4568+10(N-1) and its full transfer on 4444+10(N-1)
# (NOVAQUE_GALERA_GCOMM_PORT and NOVAQUE_GALERA_SST_PORT move those).
set -euo pipefail

DIR="${NOVAQUE_GALERA_DIR:-${TMPDIR:-/tmp}/novaque-galera}"
SQL_PORT="${NOVAQUE_GALERA_PORT:-4306}"
GCOMM_PORT="${NOVAQUE_GALERA_GCOMM_PORT:-4567}"
SST_PORT="${NOVAQUE_GALERA_SST_PORT:-4444}"
LONE_PORT="${NOVAQUE_GALERA_LONE_PORT:-$((SQL_PORT + 3))}"
TIMEOUT="${NOVAQUE_GALERA_TIMEOUT:-120}"
PROVIDER=/usr/lib/galera/libgalera_smm.so
NODES=(1 2 3)

say() { echo "galera: $*" >&2; }
die() { say "$*"; exit 1; }

sql_port() { echo $((SQL_PORT + $1 - 1)); }
gcomm_port() { echo $((GCOMM_PORT + 10 * ($1 - 1))); }
url() { echo "mysql+pymysql://root@127.0.0.1:$1/test"; }

install_missing() {
  local missing=()
  [ -e "$PROVIDER" ] || missing+=(galera-4)
  command -v rsync >/dev/null 2>&1 || missing+=(rsync)
  command -v ss >/dev/null 2>&1 || missing+=(iproute2)
  command -v mariadbd >/dev/null 2>&1 || missing+=(mariadb-server)
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing ${missing[*]}"
  command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get to install them"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" \
    >/dev/null) || die "could not install ${missing[*]}"
}

#: What a node that exited while joining is started with again (see wait_synced).
restart_args=()

# The server runs as mysql when started by root (mariadbd refuses root).
run_as=()
if [ "$(id -u)" = 0 ]; then run_as=(--user=mysql); fi

write_config() { # node number (or "lone"), file
  local n=$1 file=$2 home port
  if [ "$n" = lone ]; then
    home="$DIR/lone"
    port=$LONE_PORT
  else
    home="$DIR/node$n"
    port=$(sql_port "$n")
  fi
  cat >"$file" <<EOF
[mysqld]
datadir=$home/data
socket=$home/mysqld.sock
pid-file=$home/mysqld.pid
log-error=$home/error.log
# A tmpdir of its own: a starting server deletes every '#sql*' file in its
# tmpdir, which would take temporary tables from other servers sharing /tmp.
tmpdir=$home/tmp
port=$port
bind-address=127.0.0.1
skip-name-resolve
max_connections=300
default_storage_engine=InnoDB
innodb_autoinc_lock_mode=2
innodb_buffer_pool_size=128M
binlog_format=ROW
EOF
  if [ "$n" = lone ]; then
    # The same binary and settings, without a cluster (wsrep_on=OFF with a
    # provider set would still join it).
    echo "wsrep_provider=none" >>"$file"
    return
  fi
  local g i addresses=()
  g=$(gcomm_port "$n")
  for i in "${NODES[@]}"; do addresses+=("127.0.0.1:$(gcomm_port "$i")"); done
  cat >>"$file" <<EOF
wsrep_on=ON
wsrep_provider=$PROVIDER
wsrep_cluster_name=novaque
wsrep_node_name=node$n
wsrep_cluster_address=gcomm://$(IFS=,; echo "${addresses[*]}")
wsrep_node_address=127.0.0.1:$g
wsrep_node_incoming_address=127.0.0.1:$port
wsrep_provider_options="gmcast.listen_addr=tcp://127.0.0.1:$g;ist.recv_addr=127.0.0.1:$((g + 1));evs.keepalive_period=PT0.5S;evs.suspect_timeout=PT2S;evs.inactive_timeout=PT4S;gcache.size=32M"
wsrep_sst_method=rsync
wsrep_sst_receive_address=127.0.0.1:$((SST_PORT + 10 * (n - 1)))
wsrep_slave_threads=2
EOF
}

home_of() { # node number or "lone"
  if [ "$1" = lone ]; then echo "$DIR/lone"; else echo "$DIR/node$1"; fi
}

prepare_home() { # node number or "lone": its folder and its my.cnf
  local home
  home=$(home_of "$1")
  mkdir -p "$home/tmp"
  write_config "$1" "$home/my.cnf"
  if [ ${#run_as[@]} -gt 0 ]; then chown mysql: "$home" "$home/tmp"; fi
}

init_node() { # node number or "lone": prepare_home, and a fresh data directory
  local home
  home=$(home_of "$1")
  prepare_home "$1"
  mariadb-install-db --defaults-file="$home/my.cnf" "${run_as[@]}" \
    --auth-root-authentication-method=normal --skip-test-db >"$home/install.log" 2>&1 \
    || { cat "$home/install.log" >&2; die "mariadb-install-db failed for $1"; }
}

launch() { # home, extra arguments...
  local home=$1; shift
  # setsid: the server outlives this script, and a signal to its job does not
  # reach it. The shell writes its own pid, then becomes the server (setsid
  # forks or not depending on the caller's job control).
  rm -f "$home/server.pid"
  setsid bash -c 'echo $$ >"$1/server.pid"; shift; exec mariadbd "$@"' _ "$home" \
    --defaults-file="$home/my.cnf" "${run_as[@]}" "$@" >>"$home/server.out" 2>&1 </dev/null &
  while [ ! -s "$home/server.pid" ]; do sleep 0.01; done
}

alive() { # home
  local pid
  pid=$(cat "$1/server.pid" 2>/dev/null) || return 1
  kill -0 "$pid" 2>/dev/null
}

query() { # port, sql
  mariadb -h 127.0.0.1 -P "$1" -u root -N -B -e "$2" 2>/dev/null
}

synced() { # node number
  local state
  state=$(query "$(sql_port "$1")" "SHOW STATUS LIKE 'wsrep_local_state_comment'") || return 1
  [ "$(echo "$state" | cut -f2)" = Synced ]
}

wait_synced() { # node numbers...
  local n deadline=$((SECONDS + TIMEOUT)) tries
  for n in "$@"; do
    tries=1
    until synced "$n"; do
      if ! alive "$DIR/node$n"; then
        # Two nodes joining at once can fail to agree on the new view (seen on a
        # loaded machine with the short failure detection): start it once more.
        if [ $tries -lt 3 ] && grep -q "failed to reach primary view" "$DIR/node$n/error.log"; then
          say "node $n could not join (failed to reach primary view): starting it again"
          tries=$((tries + 1))
          launch "$DIR/node$n" "${restart_args[@]}"
          continue
        fi
        tail -n 40 "$DIR/node$n/error.log" >&2 || true
        die "node $n exited before it was Synced (log: $DIR/node$n/error.log)"
      fi
      if [ $SECONDS -ge $deadline ]; then
        tail -n 40 "$DIR/node$n/error.log" >&2 || true
        die "node $n was not Synced within ${TIMEOUT}s (log: $DIR/node$n/error.log)"
      fi
      sleep 0.2
    done
  done
}

check_port_free() { # port
  if ss -Hltn "sport = :$1" | grep -q .; then
    die "port $1 is taken (another cluster running? galera.sh stop, or set NOVAQUE_GALERA_PORT)"
  fi
}

start() {
  install_missing
  for n in "${NODES[@]}"; do
    if alive "$DIR/node$n"; then die "node $n is running already ($DIR): galera.sh stop first"; fi
  done
  for n in "${NODES[@]}"; do
    local g
    g=$(gcomm_port "$n")
    for p in "$(sql_port "$n")" "$g" "$((g + 1))" "$((SST_PORT + 10 * (n - 1)))"; do
      check_port_free "$p"
    done
  done
  rm -rf "$DIR"
  mkdir -p "$DIR"
  chmod 755 "$DIR"
  local began=$SECONDS
  # One data directory, bootstrapped as a cluster of one and stopped cleanly,
  # copied to the other nodes: all three then start with the same state and
  # join without a state transfer (no donor to wait for).
  init_node 1
  prepare_home 2
  prepare_home 3
  launch "$DIR/node1" --wsrep-new-cluster
  wait_synced 1
  query "$(sql_port 1)" "CREATE DATABASE IF NOT EXISTS test" || die "could not create database test"
  stop_home "$DIR/node1"
  for n in 2 3; do cp -a "$DIR/node1/data" "$DIR/node$n/data"; done
  launch "$DIR/node1" --wsrep-new-cluster
  wait_synced 1
  launch "$DIR/node2"
  launch "$DIR/node3"
  wait_synced 2 3
  local size
  size=$(query "$(sql_port 1)" "SHOW STATUS LIKE 'wsrep_cluster_size'" | cut -f2)
  [ "$size" = 3 ] || die "cluster size is $size, not 3"
  say "3 nodes Synced in $((SECONDS - began)) s ($DIR)"
  urls
}

node_arg() { # node number
  case "${1:-}" in 1|2|3) ;; *) die "name a node: 1, 2 or 3 (got '${1:-}')" ;; esac
}

kill_node() {
  node_arg "${1:-}"
  local home="$DIR/node$1"
  alive "$home" || die "node $1 is not running"
  kill -KILL "$(cat "$home/server.pid")"
  while alive "$home"; do sleep 0.05; done
  say "node $1 killed"
}

restart_node() {
  node_arg "${1:-}"
  local home="$DIR/node$1" began=$SECONDS position
  alive "$home" && die "node $1 is running"
  # After a SIGKILL grastate.dat says seqno -1, and a plain start would copy
  # the whole data again: recover the position from InnoDB first.
  mariadbd --defaults-file="$home/my.cnf" "${run_as[@]}" --wsrep-recover \
    --log-error="$home/recover.log" >/dev/null 2>&1 \
    || { tail -n 20 "$home/recover.log" >&2; die "node $1: --wsrep-recover failed"; }
  position=$(sed -n 's/.*WSREP: Recovered position: *\([^ ]*\).*/\1/p' "$home/recover.log" | tail -n 1)
  [ -n "$position" ] || die "node $1: no position in $home/recover.log"
  restart_args=(--wsrep-start-position="$position")
  launch "$home" "${restart_args[@]}"
  wait_synced "$1"
  say "node $1 rejoined from $position in $((SECONDS - began)) s"
}

stop_home() { # home
  local home=$1 pid
  pid=$(cat "$home/server.pid" 2>/dev/null) || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  say "$home did not stop within 30 s: killed"
  kill -KILL "$pid" 2>/dev/null || true
}

stop() {
  local n
  for n in "${NODES[@]}"; do stop_home "$DIR/node$n" & done
  stop_home "$DIR/lone" &
  wait
  rm -rf "$DIR"
}

status() {
  local n
  for n in "${NODES[@]}"; do
    if alive "$DIR/node$n"; then
      echo "node $n: $(query "$(sql_port "$n")" "SHOW STATUS WHERE Variable_name IN \
('wsrep_local_state_comment', 'wsrep_cluster_size')" | tr '\t\n' '= ' || echo not answering)"
    else
      echo "node $n: down"
    fi
  done
}

urls() {
  local n out=()
  for n in "${NODES[@]}"; do out+=("$(url "$(sql_port "$n")")"); done
  echo "${out[*]}"
}

lone() {
  case "${1:-}" in
    start)
      install_missing
      alive "$DIR/lone" && die "the lone server is running already"
      check_port_free "$LONE_PORT"
      mkdir -p "$DIR"
      chmod 755 "$DIR"
      rm -rf "$DIR/lone"
      init_node lone
      launch "$DIR/lone"
      local deadline=$((SECONDS + TIMEOUT))
      until query "$LONE_PORT" "CREATE DATABASE IF NOT EXISTS test"; do
        alive "$DIR/lone" || die "the lone server exited (log: $DIR/lone/error.log)"
        [ $SECONDS -lt $deadline ] || die "the lone server did not answer within ${TIMEOUT}s"
        sleep 0.2
      done
      url "$LONE_PORT"
      ;;
    stop)
      stop_home "$DIR/lone"
      rm -rf "$DIR/lone"
      ;;
    *) die "lone start|stop" ;;
  esac
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  kill) kill_node "${2:-}" ;;
  restart) restart_node "${2:-}" ;;
  status) status ;;
  urls) urls ;;
  lone) lone "${2:-}" ;;
  *) die "usage: galera.sh start|stop|kill N|restart N|status|urls|lone start|stop" ;;
esac
