#!/usr/bin/env bash
# mpirun with what this kind of machine needs: Open MPI refuses root without two variables, and needs
# --oversubscribe (and no core binding) when there are more ranks than cores.
#   scripts/mpirun.sh -np 4 build/ddplab train ...
set -euo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
np=1
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in -np|-n|--np) np="${args[i+1]}" ;; esac
done
extra=()
if [ "$np" -gt "$(nproc)" ]; then extra=(--oversubscribe --bind-to none); fi
exec mpirun "${extra[@]}" "$@"
