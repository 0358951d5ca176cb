#!/usr/bin/env bash
# kiroku's whole test suite, as CI runs it (.ci/run calls this).
#
# It starts the services the tests need — a throwaway PostgreSQL on a free
# loopback port (scripts/pg.sh) and a one-node Cassandra (scripts/
# cassandra.sh, about 15 s to start, so it starts first, in the background,
# while the checks run) — and sets KIROKU_REQUIRE_SERVICES=1, so a test
# whose service is missing fails instead of skipping. Then: gofmt, go vet,
# staticcheck, every test under the race detector, and every fuzz target
# for a few seconds (scripts/fuzz.sh, FUZZTIME). The services are stopped
# by PID on exit, whatever happened.
set -euo pipefail
cd "$(dirname "$0")/.."

# Tracked and new (untracked, not ignored) files alike.
unformatted=$(gofmt -l $(git ls-files --cached --others --exclude-standard '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:" >&2; echo "$unformatted" >&2; exit 1
fi

# Cassandra keeps its own state file here, so that this run neither meets
# nor stops a cluster someone else started with scripts/cassandra.sh.
export KIROKU_CASSANDRA_STATE
KIROKU_CASSANDRA_STATE=$(mktemp "${TMPDIR:-/tmp}/kiroku-test-cassandra.XXXXXX")
cassout=$(mktemp "${TMPDIR:-/tmp}/kiroku-test-cassandra-out.XXXXXX")
casspid="" pgdir=""
stop_services() {
  # A start still under way is interrupted; its own trap stops what it started.
  if [ -n "$casspid" ] && kill -0 "$casspid" 2>/dev/null; then kill -TERM "$casspid" 2>/dev/null || true; fi
  [ -z "$casspid" ] || wait "$casspid" 2>/dev/null || true
  scripts/cassandra.sh stop || true   # the cluster named in our state file, if any
  rm -f "$KIROKU_CASSANDRA_STATE" "$KIROKU_CASSANDRA_STATE.lock" "$cassout"
  [ -z "$pgdir" ] || scripts/pg.sh stop "$pgdir" || true
}
trap stop_services EXIT
# scripts/cassandra.sh runs Cassandra on Java 17 and resolves it once with
# Maven; install them from Debian's packages if missing, as pg.sh does
# PostgreSQL.
if ! compgen -G '/usr/lib/jvm/*17*/bin/java' >/dev/null || ! command -v mvn >/dev/null; then
  echo "test.sh: installing Java 17 and Maven for Cassandra" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq openjdk-17-jdk-headless maven >&2
fi
scripts/cassandra.sh start >"$cassout" &
casspid=$!

go vet ./...
# Pinned here rather than in go.mod: a checker, not a dependency of kiroku.
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

pg=$(scripts/pg.sh start) || { echo "test.sh: could not start PostgreSQL" >&2; exit 1; }
pgdir=${pg%% *}
export KIROKU_PG_DSN=${pg#* }
echo "test.sh: PostgreSQL at $KIROKU_PG_DSN"
wait "$casspid" || { casspid=""; echo "test.sh: could not start Cassandra" >&2; exit 1; }
casspid=""
cass=$(cat "$cassout")
export KIROKU_CASSANDRA_CONTACTS=${cass#* }
echo "test.sh: Cassandra at $KIROKU_CASSANDRA_CONTACTS"
export KIROKU_REQUIRE_SERVICES=1

go test -race -count=1 -timeout 25m "$@" ./...
FUZZTIME=${FUZZTIME:-3s} scripts/fuzz.sh
