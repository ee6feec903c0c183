#!/usr/bin/env bash
# A PostgreSQL primary and a synchronous streaming standby on 127.0.0.1, for
# the failover tests. Nothing of the machine's own server is touched: both
# instances have their own ports and data directories under a temporary
# folder, owned by the `postgres` user, and are stopped by their pids.
#
#   pg_pair.sh start         a fresh pair (an old one in the folder is wiped)
#   pg_pair.sh ensure        start a fresh pair unless a healthy one runs
#   pg_pair.sh stop          stop both and remove the folder
#   pg_pair.sh kill-primary  SIGKILL the primary's postmaster and its children
#   pg_pair.sh promote       promote the standby (waits until it takes writes)
#   pg_pair.sh url           the multi-host URL the tests use
#
# Settings (environment): NOVAQUE_PG_PAIR_PORTS ("5442 5443": primary,
# standby), NOVAQUE_PG_PAIR_DIR (default: $TMPDIR/novaque-pg-pair-<port>).
set -euo pipefail

read -r PRIMARY_PORT STANDBY_PORT <<<"${NOVAQUE_PG_PAIR_PORTS:-5442 5443}"
DIR="${NOVAQUE_PG_PAIR_DIR:-${TMPDIR:-/tmp}/novaque-pg-pair-$PRIMARY_PORT}"
PRIMARY="$DIR/primary"
STANDBY="$DIR/standby"
HOST=127.0.0.1

die() { echo "pg_pair: $*" >&2; exit 1; }

bindir() {
  local found
  found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$found" ] || found=$(dirname "$(command -v initdb || true)")
  [ -x "$found/initdb" ] || die "no PostgreSQL server binaries (initdb) found; install postgresql"
  echo "$found"
}
BIN=$(bindir)

# Run a command as the postgres user (the server refuses to run as root).
as_pg() {
  if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi
}

psql_at() { # port, sql
  as_pg "$BIN/psql" -X -q -At -h "$HOST" -p "$1" -U postgres -d postgres -c "$2"
}

postmaster_pid() { # data directory
  [ -f "$1/postmaster.pid" ] && head -n 1 "$1/postmaster.pid" || true
}

alive() { # data directory
  local pid
  pid=$(postmaster_pid "$1")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

healthy() {
  alive "$PRIMARY" && alive "$STANDBY" \
    && [ "$(psql_at "$PRIMARY_PORT" "SELECT pg_is_in_recovery()" 2>/dev/null)" = f ] \
    && [ "$(psql_at "$PRIMARY_PORT" "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'" 2>/dev/null)" = 1 ]
}

stop_one() { # data directory
  local pid
  pid=$(postmaster_pid "$1")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    as_pg "$BIN/pg_ctl" -D "$1" -m immediate -w -t 20 stop >/dev/null 2>&1 || kill -KILL "$pid" 2>/dev/null || true
  fi
}

stop() {
  stop_one "$STANDBY"
  stop_one "$PRIMARY"
  rm -rf "$DIR"
}

start() {
  local began=$SECONDS t0
  t0=$(date +%s.%N)
  stop
  mkdir -p "$DIR"
  chown postgres: "$DIR" 2>/dev/null || true
  as_pg "$BIN/initdb" -D "$PRIMARY" -U postgres -A trust --no-sync -E UTF8 >"$DIR/initdb.log" 2>&1 \
    || die "initdb failed: $(tail -n 5 "$DIR/initdb.log")"
  cat >>"$PRIMARY/postgresql.conf" <<EOF
listen_addresses = '$HOST'
port = $PRIMARY_PORT
unix_socket_directories = '$DIR'
max_connections = 100
shared_buffers = 16MB
wal_level = replica
max_wal_senders = 4
max_replication_slots = 4
hot_standby = on
synchronous_standby_names = '*'
synchronous_commit = on
fsync = off
full_page_writes = off
logging_collector = off
EOF
  printf 'host all all %s/32 trust\nhost replication all %s/32 trust\n' "$HOST" "$HOST" >>"$PRIMARY/pg_hba.conf"
  as_pg "$BIN/pg_ctl" -D "$PRIMARY" -l "$DIR/primary.log" -w -t 60 start >/dev/null \
    || die "the primary did not start: $(tail -n 5 "$DIR/primary.log")"
  as_pg "$BIN/pg_basebackup" -h "$HOST" -p "$PRIMARY_PORT" -U postgres -D "$STANDBY" \
    -R -X stream -C -S standby1 >"$DIR/basebackup.log" 2>&1 \
    || die "pg_basebackup failed: $(tail -n 5 "$DIR/basebackup.log")"
  # The standby does not wait for a standby of its own once promoted: a
  # promoted server that kept synchronous_standby_names would wait forever.
  cat >>"$STANDBY/postgresql.conf" <<EOF
port = $STANDBY_PORT
synchronous_standby_names = ''
cluster_name = 'standby1'
EOF
  as_pg "$BIN/pg_ctl" -D "$STANDBY" -l "$DIR/standby.log" -w -t 60 start >/dev/null \
    || die "the standby did not start: $(tail -n 5 "$DIR/standby.log")"
  for _ in $(seq 1 300); do
    if healthy; then
      echo "pg_pair: primary on $HOST:$PRIMARY_PORT, synchronous standby on $HOST:$STANDBY_PORT," \
        "up in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
      return 0
    fi
    sleep 0.1
  done
  die "the standby did not become synchronous within $((SECONDS - began)) s: $(tail -n 5 "$DIR/standby.log")"
}

kill_primary() {
  local pid children
  pid=$(postmaster_pid "$PRIMARY")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || die "the primary is not running"
  children=$(ps -o pid= --ppid "$pid" || true)
  # shellcheck disable=SC2086
  kill -KILL "$pid" $children 2>/dev/null || true
}

promote() {
  alive "$STANDBY" || die "the standby is not running"
  as_pg "$BIN/pg_ctl" -D "$STANDBY" -w -t 60 promote >/dev/null || die "promotion failed"
}

url() {
  echo "postgresql+psycopg://postgres@/postgres?host=$HOST,$HOST&port=$PRIMARY_PORT,$STANDBY_PORT&target_session_attrs=read-write"
}

case "${1:-}" in
  start) start ;;
  ensure) healthy || start ;;
  stop) stop ;;
  kill-primary) kill_primary ;;
  promote) promote ;;
  url) url ;;
  *) die "usage: $0 start|ensure|stop|kill-primary|promote|url" ;;
esac
