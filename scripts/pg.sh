#!/usr/bin/env bash
# Throwaway PostgreSQL for kiroku's tests and benchmarks.
#
#   scripts/pg.sh start [PORT]   install PostgreSQL from Debian packages if missing, start a
#                                server on 127.0.0.1:PORT (default: the first free port from
#                                55432 up) with its data in a new temporary directory; prints
#                                "DIR DSN" on stdout
#   scripts/pg.sh stop DIR       stop that server by its PID and delete DIR
#
# The server trusts loopback connections: it is for tests, never for data that matters.
set -euo pipefail

log() { echo "pg.sh: $*" >&2; }

pg_bindir() {
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [ -x "$d/pg_ctl" ] && { echo "$d"; return 0; }
  done
  return 1
}

ensure_installed() {
  pg_bindir >/dev/null && return 0
  log "PostgreSQL not found; installing it from Debian packages"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  # Debian's package would otherwise create and start a default cluster on
  # port 5432, which nothing here uses.
  $sudo mkdir -p /etc/postgresql-common/createcluster.d
  echo "create_main_cluster = false" | $sudo tee /etc/postgresql-common/createcluster.d/kiroku.conf >/dev/null
  $sudo apt-get update -qq >&2
  $sudo apt-get install -y -qq postgresql >&2
  pg_bindir >/dev/null || { log "PostgreSQL installation failed"; exit 1; }
}

# as_owner runs a command as the server's OS user: postgres when we are root
# (initdb refuses root), ourselves otherwise.
as_owner() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
  local port="${1:-}"
  if [ -z "$port" ]; then
    port=55432
    while port_in_use "$port"; do port=$((port + 1)); [ "$port" -lt 55532 ] || { log "no free port"; exit 1; }; done
  fi
  ensure_installed
  local bin; bin=$(pg_bindir)
  local dir; dir=$(mktemp -d "${TMPDIR:-/tmp}/kiroku-pg.XXXXXX")
  chmod 755 "$dir"
  [ "$(id -u)" -eq 0 ] && chown postgres: "$dir"
  # Whatever fails from here on leaves no server running and no directory.
  trap 'stop "$dir" >&2' EXIT
  as_owner "$bin/initdb" -D "$dir/data" -U kiroku --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; exit 1; }
  # Enough connections and predicate locks for the concurrent conformance tests;
  # fsync stays on: durability is measured, not assumed.
  as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start -o \
    "-p $port -c listen_addresses=127.0.0.1 -k $dir -c max_connections=300 \
     -c max_pred_locks_per_transaction=256 -c shared_buffers=128MB -c deadlock_timeout=100ms" >&2 \
    || { cat "$dir/server.log" >&2; exit 1; }
  as_owner "$bin/createdb" -h 127.0.0.1 -p "$port" -U kiroku kiroku >&2 || exit 1
  trap - EXIT
  echo "$dir postgres://kiroku@127.0.0.1:$port/kiroku?sslmode=disable"
}

stop() {
  local dir="$1"
  [ -f "$dir/data/postmaster.pid" ] || { log "no server running in $dir"; rm -rf "$dir"; return 0; }
  local pid; pid=$(head -1 "$dir/data/postmaster.pid")
  kill -INT "$pid" 2>/dev/null || true   # fast shutdown
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then log "server $pid did not stop; killing it"; kill -KILL "$pid"; fi
  rm -rf "$dir"
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) shift; stop "$1" ;;
  *) echo "usage: $0 start [PORT] | stop DIR" >&2; exit 2 ;;
esac
