#!/usr/bin/env bash
# Runs every Go native fuzz target of the module (func FuzzXxx, in every
# package), one after another, each for FUZZTIME (default 5s; a count such
# as 10000x works too), and stops at the first that fails, naming it; go
# test has written the failing input under the package's
# testdata/fuzz/FuzzXxx/ by then. The targets are found with go test
# -list, so a new one is run without changing this script.
#
# Go before 1.27 can fail a target with a bare "context deadline exceeded"
# when its -fuzztime runs out (go.dev/issue/75804, a race in the fuzz
# coordinator, not a failing input): such a run, with no input written, is
# tried once more.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-5s}

# go test -list prints a package's matching names, then "ok <package> ...".
listing=$(go test -list '^Fuzz' ./...)
targets=() names=()
while IFS= read -r line; do
  case $line in
    Fuzz*) names+=("$line") ;;
    ok*)
      pkg=$(awk '{print $2}' <<<"$line")
      for name in ${names[@]+"${names[@]}"}; do targets+=("$pkg $name"); done
      names=() ;;
  esac
done <<<"$listing"
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz.sh: found no fuzz targets" >&2; exit 1
fi

out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$SECONDS
for target in "${targets[@]}"; do
  pkg=${target% *} name=${target#* }
  for try in 1 2; do
    echo "fuzz.sh: $name ($pkg) for $fuzztime"
    if go test -run '^$' -fuzz "^$name\$" -fuzztime "$fuzztime" "$pkg" 2>&1 | tee "$out"; then
      break
    fi
    if [ "$try" = 1 ] && grep -q 'context deadline exceeded' "$out" && ! grep -q 'Failing input written' "$out"; then
      echo "fuzz.sh: $name: the fuzz coordinator's deadline race (go.dev/issue/75804), not a failing input; again"
      continue
    fi
    echo "fuzz.sh: FAILED: $name in $pkg" >&2
    exit 1
  done
done
echo "fuzz.sh: ${#targets[@]} targets passed in $((SECONDS - start))s"
