#!/usr/bin/env bash
# mpirun with what this kind of machine needs: Open MPI refuses root without two variables, and needs
# --oversubscribe (and no core binding) when there are more ranks than cores. On Ctrl-C, Open MPI's mpirun sends
# SIGCONT, then SIGTERM after odls_base_sigkill_timeout seconds (default 1), then SIGKILL after as many again.
# ddplab ranks stop at the step boundary after SIGTERM and write their run file, which needs more than one second
# for a large run: 10 s here (so Ctrl-C stops the run ~10 s later; SIGTERM sent to the ranks acts at once).
#   scripts/mpirun.sh -np 4 build/ddplab train ...
set -euo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_odls_base_sigkill_timeout="${OMPI_MCA_odls_base_sigkill_timeout:-10}"
np=1
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in -np|-n|--np) np="${args[i+1]}" ;; esac
done
extra=()
if [ "$np" -gt "$(nproc)" ]; then extra=(--oversubscribe --bind-to none); fi
exec mpirun "${extra[@]}" "$@"
