#!/usr/bin/env bash
# kiroku's whole test suite, as CI runs it (.ci/run calls this).
#
# It starts the services the tests need — a throwaway PostgreSQL on a free
# loopback port (scripts/pg.sh) — and sets KIROKU_REQUIRE_SERVICES=1, so a
# test whose service is missing fails instead of skipping. Then: gofmt,
# go vet, staticcheck, every test under the race detector, and every fuzz
# target for a few seconds (scripts/fuzz.sh, FUZZTIME). The services are
# stopped by PID on exit, whatever happened.
set -euo pipefail
cd "$(dirname "$0")/.."

# Tracked and new (untracked, not ignored) files alike.
unformatted=$(gofmt -l $(git ls-files --cached --others --exclude-standard '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:" >&2; echo "$unformatted" >&2; exit 1
fi
go vet ./...
# Pinned here rather than in go.mod: a checker, not a dependency of kiroku.
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

pg=$(scripts/pg.sh start) || { echo "test.sh: could not start PostgreSQL" >&2; exit 1; }
pgdir=${pg%% *}
trap 'scripts/pg.sh stop "$pgdir"' EXIT
export KIROKU_PG_DSN=${pg#* }
export KIROKU_REQUIRE_SERVICES=1
echo "test.sh: PostgreSQL at $KIROKU_PG_DSN"

go test -race -count=1 -timeout 25m "$@" ./...
FUZZTIME=${FUZZTIME:-3s} scripts/fuzz.sh
