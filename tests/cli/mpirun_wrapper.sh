#!/usr/bin/env bash
# scripts/mpirun.sh keeps Open MPI's binding whatever the program's arguments hold: an -n among them (allreduce_perf's
# iteration count) once made it add --bind-to none to a 2-rank job. With at most as many ranks as cores each rank is
# bound to one core (Open MPI 4's default for 2 ranks); with more, the job still runs (--oversubscribe).
#   mpirun_wrapper.sh REPO_ROOT
set -euo pipefail
wrapper="$1/scripts/mpirun.sh"
if [ "$(nproc)" -lt 2 ]; then echo "SKIPPED: needs 2 cores to see a 2-rank job bound"; exit 77; fi
passed=0 fail=0
for program_args in "" "-n 10" "-np 10"; do
  # shellcheck disable=SC2086  # the program's arguments, split on purpose
  lists=$("$wrapper" -np 2 -x DDPLAB_UNUSED=1 sh -c 'sed -n "s/^Cpus_allowed_list:\t//p" /proc/self/status' sh $program_args)
  for list in $lists; do
    if [[ ! "$list" =~ ^[0-9]+$ ]]; then
      echo "FAIL: program arguments '$program_args': a rank may run on cpus $list (want one core per rank)"
      fail=1
    fi
  done
  [ "$(wc -w <<< "$lists")" -eq 2 ] || { echo "FAIL: '$program_args': want 2 ranks, got: $lists"; fail=1; }
  [ "$fail" -eq 0 ] && passed=$((passed + 1))
done
over=$(($(nproc) + 1))
if "$wrapper" -np "$over" true; then passed=$((passed + 1)); else echo "FAIL: -np $over (more ranks than cores) did not run"; fail=1; fi
echo "mpirun_wrapper: $passed of 4 checks passed"
exit "$fail"
