#!/usr/bin/env bash
# PgBouncer in transaction pooling on 127.0.0.1, in front of a PostgreSQL
# server, for the tests that run novaque through it. Its own ini, port, auth
# file, log and pid file live under a temporary folder owned by `postgres`
# (PgBouncer refuses to run as root); it is stopped by its pid. Every
# database name is passed through to the server (a `*` entry), so the suite's
# private databases work through it.
#
#   pgbouncer.sh start   start it (installs pgbouncer with apt-get if missing)
#   pgbouncer.sh stop    stop it and remove the folder
#   pgbouncer.sh url     the URL the tests use (any database name works)
#
# Settings (environment): NOVAQUE_PGBOUNCER_PORT (6442), the server behind it
# NOVAQUE_PGBOUNCER_SERVER ("127.0.0.1 5432"), NOVAQUE_PGBOUNCER_DIR
# (default: $TMPDIR/novaque-pgbouncer-<port>).
set -euo pipefail

PORT="${NOVAQUE_PGBOUNCER_PORT:-6442}"
read -r SERVER_HOST SERVER_PORT <<<"${NOVAQUE_PGBOUNCER_SERVER:-127.0.0.1 5432}"
DIR="${NOVAQUE_PGBOUNCER_DIR:-${TMPDIR:-/tmp}/novaque-pgbouncer-$PORT}"
HOST=127.0.0.1

die() { echo "pgbouncer: $*" >&2; exit 1; }

as_pg() {
  if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi
}

binary() {
  local found
  found=$(command -v pgbouncer || true)
  [ -n "$found" ] || [ ! -x /usr/sbin/pgbouncer ] || found=/usr/sbin/pgbouncer
  echo "$found"
}

install() {
  [ -n "$(binary)" ] && return 0
  [ "$(id -u)" = 0 ] || die "pgbouncer is not installed (apt-get install pgbouncer, as root)"
  echo "pgbouncer: installing pgbouncer with apt-get" >&2
  # The package's own service must not start: it would take the default port.
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d.novaque
  local had_policy=0
  [ -e /usr/sbin/policy-rc.d ] && had_policy=1
  [ $had_policy = 1 ] || install -m 755 /usr/sbin/policy-rc.d.novaque /usr/sbin/policy-rc.d
  (apt-get install -y -qq pgbouncer >/dev/null 2>&1 \
    || (apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null)) \
    || { [ $had_policy = 1 ] || rm -f /usr/sbin/policy-rc.d; die "apt-get could not install pgbouncer"; }
  [ $had_policy = 1 ] || rm -f /usr/sbin/policy-rc.d
  rm -f /usr/sbin/policy-rc.d.novaque
  [ -n "$(binary)" ] || die "pgbouncer is not on the PATH after installing it"
}

pid() {
  [ -f "$DIR/pgbouncer.pid" ] && cat "$DIR/pgbouncer.pid" || true
}

stop() {
  local p
  p=$(pid)
  if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
    kill -TERM "$p" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
  fi
  rm -rf "$DIR"
}

start() {
  local t0
  t0=$(date +%s.%N)
  install
  stop
  mkdir -p "$DIR"
  echo '"postgres" ""' >"$DIR/userlist.txt"
  cat >"$DIR/pgbouncer.ini" <<EOF
[databases]
* = host=$SERVER_HOST port=$SERVER_PORT

[pgbouncer]
listen_addr = $HOST
listen_port = $PORT
unix_socket_dir =
auth_type = trust
auth_file = $DIR/userlist.txt
admin_users = postgres
pool_mode = transaction
server_reset_query =
ignore_startup_parameters = extra_float_digits
max_client_conn = 2000
default_pool_size = 20
logfile = $DIR/pgbouncer.log
pidfile = $DIR/pgbouncer.pid
EOF
  chown -R postgres: "$DIR"
  as_pg "$(binary)" -d "$DIR/pgbouncer.ini" || die "it did not start: $(tail -n 5 "$DIR/pgbouncer.log" 2>/dev/null)"
  for _ in $(seq 1 100); do
    if pg_isready -q -h "$HOST" -p "$PORT" -d postgres -U postgres 2>/dev/null; then
      echo "pgbouncer: transaction pooling on $HOST:$PORT in front of $SERVER_HOST:$SERVER_PORT," \
        "up in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
      return 0
    fi
    sleep 0.1
  done
  die "it does not answer on $HOST:$PORT: $(tail -n 5 "$DIR/pgbouncer.log" 2>/dev/null)"
}

url() {
  echo "postgresql+psycopg://postgres@$HOST:$PORT/postgres"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  url) url ;;
  *) die "usage: $0 start|stop|url" ;;
esac
