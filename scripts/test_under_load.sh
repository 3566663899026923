#!/usr/bin/env bash
# The test suite on a busy machine: one busy thread pinned to each of the first LOAD CPUs (default 2) for the whole
# run, ROUNDS times (default 3), so that a test which only passes on a quiet host shows up before CI meets one.
# Prints each round's wall time and result, and exits non-zero when any round failed.
#   scripts/test_under_load.sh [BUILD_DIR]        ROUNDS=3 LOAD=2 CTEST_ARGS="-R cli_" scripts/test_under_load.sh
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${ROUNDS:-3}
load=${LOAD:-2}
[[ -f $build/CTestTestfile.cmake ]] || { echo "test_under_load.sh: no build in '$build' (run make build first)" >&2; exit 2; }

busy=()
stop_load() { ((${#busy[@]})) && kill "${busy[@]}" 2>/dev/null; wait 2>/dev/null; busy=(); }
trap stop_load EXIT
trap 'exit 130' INT TERM

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failed=0
for ((round = 1; round <= rounds; ++round)); do
  for ((cpu = 0; cpu < load; ++cpu)); do
    taskset -c "$cpu" bash -c 'while :; do :; done' &
    busy+=($!)
  done
  start=$(date +%s)
  (cd "$build" && ctest --output-on-failure -j 1 ${CTEST_ARGS:-}) > "$build/test_under_load.round$round.log" 2>&1
  rc=$?
  stop_load
  summary=$(grep -E "tests passed|tests failed" "$build/test_under_load.round$round.log" | tail -1)
  echo "round $round of $rounds, $load busy threads: $(( $(date +%s) - start )) s, ${summary:-no summary} (rc $rc;" \
       "log $build/test_under_load.round$round.log)"
  ((rc == 0)) || failed=1
done
exit $failed
