#!/usr/bin/env bash
# mpirun with what this kind of machine needs: Open MPI refuses root without two variables, and refuses more ranks
# than cores without --oversubscribe. Given always, it changes nothing else: a job of at most as many ranks as cores
# keeps Open MPI's default binding (2 ranks: one core each), and a larger one is left unbound, as Open MPI leaves an
# oversubscribed job. (It once added --bind-to none itself, judging the rank count from any -n on the line: the
# program's own -n, allreduce_perf's iteration count, then unbound every 2-rank benchmark.)
#
# Ctrl-C. Open MPI's mpirun answers SIGINT with SIGCONT, SIGTERM after odls_base_sigkill_timeout seconds (default 1)
# and SIGKILL as long again: too soon for ddplab ranks, which stop at the step boundary after SIGTERM and write their
# run file (a large one takes more than a second). Raising the timeout is no cure: mpirun waits it out whenever a
# rank exits non-zero, so every refused command line would linger that long (measured: 20 s at 10 s instead of
# 1.4 s). Instead mpirun runs in a session of its own, out of reach of the terminal's SIGINT, and this script turns
# Ctrl-C (or a SIGTERM sent to it) into SIGTERM to the ranks and waits for the job: every rank stops after the same
# step, rank 0 writes the file while the others wait for it, and all exit together.
#   scripts/mpirun.sh -np 4 build/launcher/ddplab train ...
set -uo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
setsid mpirun --oversubscribe "$@" &
job=$!
# The ranks on this node are mpirun's children; ranks elsewhere get mpirun's own SIGTERM handling.
# One stop may arrive twice: timeout(1) passes a signal to its child and then to its whole process group. Signals
# within 0.5 s of the first are one stop; a second one later ends the ranks at once, as a second Ctrl-C does. The
# time is read and kept before anything that waits (a command substitution), and the ranks are signalled in the
# background: bash runs a trap only once the command in the foreground ends, so the echo's handler, waiting behind a
# pkill slowed by a busy host, would read a time past the window. (bash < 5 has no EPOCHREALTIME: date's, in a
# subshell, there.)
last_stop_us=0
stop_ranks() {
  local now_us=${EPOCHREALTIME:-}
  now_us=${now_us/[.,]/}
  [ -n "$now_us" ] || now_us=$(date +%s%6N)
  ((now_us - last_stop_us < 500000)) && return
  last_stop_us=$now_us
  # The stop's own echo, sent to the whole process group, must not end pkill before it has signalled the ranks.
  (trap '' INT TERM; pkill -TERM -P "$job" || kill -TERM "$job" 2>/dev/null) &
}
trap stop_ranks INT TERM
# wait also returns when a trapped signal arrives (128 + its number), with the job still running or just ended: the
# job's own status is the one more wait after its end (bash keeps an ended job's status for it).
while kill -0 "$job" 2>/dev/null; do
  wait "$job"
done
wait "$job"
