#!/usr/bin/python3
"""The watchdog end to end (runtime/watchdog.h): a wait that never ends aborts the job within the timeout, naming
the wait, its peer, tag and step, after running the abort hooks (one of them unlinks the shared-memory names of a
setup a peer left half done); a long operation made of short waits does not; MPI_Init behind a peer that never starts
MPI, and MPI_Finalize beside a peer stopped before it, end within DDPLAB_MPI_WAIT_S.

usage: check_watchdog.py MPIRUN WATCHDOG_PROBE
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def main():
    mpirun, probe = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as work:
        marker = os.path.join(work, "hook-ran")
        start = time.monotonic()
        p = subprocess.run([mpirun, "--bind-to", "none", "-np", "2", probe, "hang", marker], capture_output=True,
                           text=True, timeout=120)
        seconds, out = time.monotonic() - start, p.stdout + p.stderr
        check(p.returncode == 3, f"hang: exit code 3 (got {p.returncode})")
        check(seconds < 15, f"hang: the job ends soon after the 1 s timeout ({seconds:.1f} s, startup included)")
        check("rank 0: watchdog: no progress for" in out and "at step 42" in out, "hang: names the rank and step")
        check("waiting for probe wait from rank 1 (tag 7) [main thread]" in out, "hang: names the wait, peer and tag")
        check(os.path.exists(marker), "hang: the abort hook ran before the abort")
        # A send by reference completes when the peer has read it: a peer that never does is a hang like any other.
        marker = os.path.join(work, "hook-ran-unread")
        p = subprocess.run([mpirun, "--bind-to", "none", "-np", "2", probe, "unread", marker], capture_output=True,
                           text=True, timeout=120)
        out = p.stdout + p.stderr
        check(p.returncode == 3 and os.path.exists(marker), f"unread: the watchdog ends the job (code {p.returncode})")
        check("rank 0: watchdog: no progress for" in out and "waiting for completion of a send to rank 1" in out,
              "unread: names the rank, the wait for the send's completion and the peer that does not read it")
    # A peer gone while the host's ranks share segments: the abort unlinks the names the survivor made.
    p = subprocess.run([mpirun, "--bind-to", "none", "-np", "2", probe, "half_shared"], capture_output=True, text=True,
                       timeout=120)
    pid = re.search(r"^pid (\d+)$", p.stdout, re.M)
    left = [n for n in os.listdir("/dev/shm") if pid and re.fullmatch(rf"ddplab-\d+-probe-{pid[1]}-\d+-\d+", n)]
    check(p.returncode == 3 and "waiting for sharing a segment" in p.stderr,
          f"half_shared: the watchdog ends the job (code {p.returncode})")
    check(pid is not None and not left, f"half_shared: no name of rank 0's is left in /dev/shm ({left})")
    p = subprocess.run([mpirun, "--bind-to", "none", "-np", "1", probe, "busy"], capture_output=True, text=True,
                       timeout=120)
    check(p.returncode == 0 and "watchdog" not in p.stderr,
          f"busy: 3 s of 10 ms waits under a 1 s timeout do not abort (code {p.returncode}) {p.stderr[-200:]}")
    # A rank that did not run (SIGSTOP) for longer than the timeout: its own absence restarts its clock, no abort.
    p = subprocess.Popen([mpirun, "--bind-to", "none", "-np", "1", probe, "stopped"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    pid = int(p.stdout.readline().split()[1])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and open(f"/proc/{pid}/stat").read().split(") ")[1][0] != "T":
        time.sleep(0.05)
    time.sleep(3)  # three timeouts
    os.kill(pid, signal.SIGCONT)
    _, err = p.communicate(timeout=60)
    check(p.returncode == 0 and "rank 0: watchdog: this rank did not run for" in err and "aborts the job" not in err,
          f"stopped: a rank stopped 3 s under a 1 s timeout says it did not run, and does not abort (code "
          f"{p.returncode}) {err[-300:]}")
    # MPI_Init and MPI_Finalize wait for every rank: a peer that never starts MPI (here `sleep`, launched as rank 1),
    # or one stopped before finalizing, would keep the probe there for good. DDPLAB_MPI_WAIT_S bounds both.
    env = dict(os.environ, DDPLAB_MPI_WAIT_S="2")
    for what, command in (("MPI_Init", ["-np", "1", probe, "busy", ":", "-np", "1", "sleep", "100"]),
                          ("MPI_Finalize", ["-np", "2", probe, "finalize"])):
        start = time.monotonic()
        p = subprocess.run([mpirun, "--bind-to", "none"] + command, capture_output=True, text=True, timeout=120,
                           env=env)
        seconds = time.monotonic() - start
        check(p.returncode == 3 and f"rank 0: watchdog: no progress for" in p.stderr and
              f"waiting for {what}: every rank of the job" in p.stderr and "rank 0 leaves (exit code 3)" in p.stderr,
              f"{what} behind a missing peer: rank 0 leaves with code 3, naming the wait (code {p.returncode}) "
              f"{p.stderr[-300:]}")
        check(seconds < 40, f"{what}: the job ends soon after DDPLAB_MPI_WAIT_S=2 ({seconds:.1f} s)")
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
