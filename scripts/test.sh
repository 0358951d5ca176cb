#!/usr/bin/env bash
# kiroku's whole test suite, as CI runs it (.ci/run calls this).
#
# It starts the services the tests need — a throwaway PostgreSQL on a free
# loopback port (scripts/pg.sh), a one-node Cassandra and a three-node one
# whose nodes the tests of node failures stop and start (scripts/
# cassandra.sh; some 15 s and 40 s to start, so they start first, in the
# background, while the checks run) — and sets KIROKU_REQUIRE_SERVICES=1,
# so a test whose service is missing fails instead of skipping. Then:
# gofmt, go vet, staticcheck, every test under the race detector, and
# every fuzz target for a few seconds (scripts/fuzz.sh, FUZZTIME). The
# services are stopped by PID on exit, whatever happened.
set -euo pipefail
cd "$(dirname "$0")/.."

# Tracked and new (untracked, not ignored) files alike.
unformatted=$(gofmt -l $(git ls-files --cached --others --exclude-standard '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:" >&2; echo "$unformatted" >&2; exit 1
fi

# Each Cassandra keeps its own state file here, so that this run neither
# meets nor stops a cluster someone else started with scripts/cassandra.sh;
# the tests stop and start the three-node cluster's nodes through its state
# file, KIROKU_CASSANDRA_CLUSTER_STATE.
export KIROKU_CASSANDRA_STATE KIROKU_CASSANDRA_CLUSTER_STATE
KIROKU_CASSANDRA_STATE=$(mktemp "${TMPDIR:-/tmp}/kiroku-test-cassandra.XXXXXX")
KIROKU_CASSANDRA_CLUSTER_STATE=$(mktemp "${TMPDIR:-/tmp}/kiroku-test-cassandra3.XXXXXX")
cassout=$(mktemp "${TMPDIR:-/tmp}/kiroku-test-cassandra-out.XXXXXX")
cass3out=$(mktemp "${TMPDIR:-/tmp}/kiroku-test-cassandra3-out.XXXXXX")
casspid="" cass3pid="" pgdir=""
stop_services() {
  # A start still under way is interrupted; its own trap stops what it started.
  local pid
  for pid in $casspid $cass3pid; do
    if kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid" 2>/dev/null || true; fi
    wait "$pid" 2>/dev/null || true
  done
  scripts/cassandra.sh stop || true   # the clusters named in our state files, if any
  KIROKU_CASSANDRA_STATE=$KIROKU_CASSANDRA_CLUSTER_STATE scripts/cassandra.sh stop || true
  rm -f "$KIROKU_CASSANDRA_STATE" "$KIROKU_CASSANDRA_STATE.lock" "$cassout" \
    "$KIROKU_CASSANDRA_CLUSTER_STATE" "$KIROKU_CASSANDRA_CLUSTER_STATE.lock" "$cass3out"
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
# Replication 3 for TestClusterNodeFailures; small heaps, for a small workload.
KIROKU_CASSANDRA_STATE=$KIROKU_CASSANDRA_CLUSTER_STATE scripts/cassandra.sh start --nodes 3 --heap 512m >"$cass3out" &
cass3pid=$!

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
wait "$cass3pid" || { cass3pid=""; echo "test.sh: could not start the three-node Cassandra" >&2; exit 1; }
cass3pid=""
cass=$(cat "$cass3out")
export KIROKU_CASSANDRA_CLUSTER_CONTACTS=${cass#* }
echo "test.sh: three-node Cassandra at $KIROKU_CASSANDRA_CLUSTER_CONTACTS"
export KIROKU_REQUIRE_SERVICES=1

go test -race -count=1 -timeout 25m "$@" ./...
FUZZTIME=${FUZZTIME:-3s} scripts/fuzz.sh
