#!/usr/bin/env python3
"""Ctrl-C through scripts/mpirun.sh, the README's launcher: the terminal's SIGINT reaches the script alone (mpirun runs
in a session of its own), which turns it into SIGTERM to the ranks. One Ctrl-C: every rank stops after the same step
and the run file is complete; so too when the one stop arrives twice at once (timeout(1) around the script). A
second Ctrl-C before that step ends: the ranks die at once, as a second signal does, and the snapshot flushed before
stays whole.
    check_mpirun_stop.py REPO_ROOT DDPLAB"""
import os
import signal
import subprocess
import sys
import tempfile
import time

import h5py

from checks import check, exit_code


def wait_for(path, seconds=90):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.path.exists(path)


def start(wrapper, ddplab, out, step_s, flush_every):
    # Each step's input costs step_s (one sample a rank, --data-cost-ms per sample). What a terminal gives a foreground
    # job: SIGINT's default action (a shell's background job would ignore it).
    return subprocess.Popen([wrapper, "-np", "2", ddplab, "train", "--steps", "100000", "--batch", "1",
                             "--data-cost-ms", str(1000 * step_s), "--flush-every", str(flush_every), "--out", out],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def end(p, out):
    """The job's stderr once it ended; a job still running after 60 s is a failure, and its ranks are killed."""
    try:
        return p.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        subprocess.run(["pkill", "-KILL", "-f", "--", "--out " + out])
        p.kill()
        p.communicate()
        return "(still running 60 s after the signal)"


def main():
    wrapper, ddplab = os.path.join(sys.argv[1], "scripts", "mpirun.sh"), sys.argv[2]
    with tempfile.TemporaryDirectory() as work:
        # One Ctrl-C: a clean stop, the run file complete and named as stopped by the signal.
        out = os.path.join(work, "once.h5")
        p = start(wrapper, ddplab, out, step_s=0.05, flush_every=5)
        started = wait_for(out + ".partial")  # steps are under way
        p.send_signal(signal.SIGINT)
        err = end(p, out)
        reason, steps = "", 0
        if os.path.exists(out):
            with h5py.File(out, "r") as f:
                reason, steps = str(f.attrs["stop_reason"]), int(f.attrs["num_steps"])
        # The ranks' own code (128 + SIGTERM), as mpirun reports it: not the script's wait interrupted by its trap.
        check(started and p.returncode == 128 + signal.SIGTERM and reason.startswith("SIGTERM") and steps > 0 and
              not os.path.exists(out + ".partial"),
              f"one Ctrl-C: the ranks' exit code 143 (got {p.returncode}), run file complete after {steps} steps "
              f"({reason!r}) "
              f"{err.strip()[-300:]}")

        # One stop that arrives twice, 20 ms apart (timeout(1) passes a signal to its child, then to its process
        # group): still one stop, the run file complete.
        out = os.path.join(work, "echo.h5")
        p = start(wrapper, ddplab, out, step_s=0.05, flush_every=5)
        started = wait_for(out + ".partial")
        p.send_signal(signal.SIGINT)
        time.sleep(0.02)
        p.send_signal(signal.SIGINT)
        err = end(p, out)
        steps = 0
        if os.path.exists(out):
            with h5py.File(out, "r") as f:
                steps = int(f.attrs["num_steps"])
        check(started and p.returncode == 128 + signal.SIGTERM and steps > 0 and not os.path.exists(out + ".partial"),
              f"one stop signalled twice within 0.5 s: exit 143 (got {p.returncode}), the run file complete after "
              f"{steps} steps "
              f"{err.strip()[-300:]}")

        # Two: the second arrives 1.5 s after the first (past the 0.5 s in which the script takes signals for one
        # stop), inside a 4 s step, long before its end, where the first would have stopped the ranks. They die at once: no run file, and the snapshot of the first step stays readable.
        out = os.path.join(work, "twice.h5")
        p = start(wrapper, ddplab, out, step_s=4, flush_every=1)
        started = wait_for(out + ".partial")  # step 0 flushed; step 1 has begun
        p.send_signal(signal.SIGINT)
        time.sleep(1.5)
        p.send_signal(signal.SIGINT)
        err = end(p, out)
        flushed = -1
        if os.path.exists(out + ".partial"):
            with h5py.File(out + ".partial", "r") as f:
                flushed = int(f.attrs["num_steps"])
        check(started and p.returncode != 0 and not os.path.exists(out) and flushed >= 1,
              f"two Ctrl-Cs: the ranks die inside the step (code {p.returncode}, run file "
              f"{'written' if os.path.exists(out) else 'absent'}), the snapshot readable ({flushed} steps) "
              f"{err.strip()[-300:]}")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
