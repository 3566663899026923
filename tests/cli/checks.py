"""The CLI tests' one assertion: print each check as it is made ("ok   ..." or "FAIL ..."), keep going, and let the
script exit non-zero at the end if any failed (`failures`), so one run shows everything that is wrong. A check that
the host cannot make (busy with other work, a kernel without a counter) is `skip`ped with the reason: then the test
ends as skipped (exit 77, each such test's SKIP_RETURN_CODE), never as passed."""
import atexit
import os
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

failures = []
skips = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def skip(what):
    print("skip " + what, flush=True)
    skips.append(what)


def exit_code():
    """1 when a check failed, else 77 when one was skipped, else 0."""
    return 1 if failures else 77 if skips else 0


_session_dirs = tempfile.mkdtemp(prefix="ddplab_mpi_sessions.")
atexit.register(shutil.rmtree, _session_dirs, True)


def own_mpi_session(env=None):
    """`env` (else this process's environment) with a TMPDIR of its own, for an mpirun that may start or end beside
    another: Open MPI 4.1 creates and removes the shared $TMPDIR/ompi.<host>.<uid> without a lock, so one job's
    clean-up can remove it while another job makes its session directory inside ("orte_session_dir failed", exit 1,
    before any rank starts)."""
    env = dict(os.environ if env is None else env)
    env["TMPDIR"] = tempfile.mkdtemp(dir=_session_dirs)
    return env


def start_all(commands, jobs=4):
    """Starts subprocess.run(argv, capture_output=True, text=True, **keywords) for each (argv, keywords) of
    `commands`, `jobs` at a time, and returns a function that waits for them: it returns the completed processes in
    order, each with its wall time in `seconds`. For cases that do not depend on each other: a refusal is mostly
    waiting on process start-up (mpirun's ~0.6 s for ~0.25 s of CPU), so on two cores four at a time take about a third
    of the time that one at a time do."""
    def run(command):
        argv, keywords = command
        keywords = dict(keywords, env=own_mpi_session(keywords.get("env")))
        began = time.monotonic()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, **keywords)
        except subprocess.TimeoutExpired as e:  # one check fails, naming it, rather than the whole test
            text = lambda out: out.decode(errors="replace") if isinstance(out, bytes) else out or ""
            proc = subprocess.CompletedProcess(argv, None, text(e.stdout),
                                               text(e.stderr) + f"\n(killed: still running after {e.timeout} s)")
            check(False, f"{' '.join(map(str, argv))[:300]}: still running after {e.timeout} s")  # whatever else is asked
        proc.seconds = time.monotonic() - began
        return proc

    pool = ThreadPoolExecutor(jobs)
    started = [pool.submit(run, command) for command in commands]
    pool.shutdown(wait=False)
    return lambda: [future.result() for future in started]


def run_all(commands, jobs=4):
    """start_all's processes, once they are done."""
    return start_all(commands, jobs)()


def cpu_waited_ms(run_file):
    """What a busy host took from a run: over its steady steps (the stored summary's), the median of each step's
    longest wait of a rank for a CPU. The excuse of a timing check that such waits can fail."""
    import json  # here: most tests never read a run file
    import h5py
    import numpy as np
    with h5py.File(run_file, "r") as f:
        first = json.loads(f.attrs["summary"])["first_steady_step"]
        return float(np.median(f["steps"]["cpu_wait_ms"][:, first:].max(axis=0)))


def stalled_s(text):
    """How long the watchdog saw no progress before it ended the job, as it says: its own clock, which a busy host's
    slow process start-up does not move."""
    m = re.search(r"watchdog: no progress for ([0-9.]+) s", text)
    return float(m.group(1)) if m else None


def fires_in_time(text, timeout_s):
    """The watchdog fired after the timeout and before it plus a quarter (its checks' spacing), with 3 s for a thread
    that waited for a CPU."""
    stalled = stalled_s(text)
    return stalled is not None and timeout_s <= stalled <= timeout_s * 1.25 + 3
