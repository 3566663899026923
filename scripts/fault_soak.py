#!/usr/bin/python3
"""Fault soak: many short `ddplab train` jobs, each with one fault injected at a random moment, and what they leave.

usage: scripts/fault_soak.py MPIRUN DDPLAB [--jobs N] [--seed S] [--limit-s T]

Runs N jobs (default 100) of a small MLP at 2 and 4 ranks, each with one fault, in turn:
  kill        a rank kills itself with SIGKILL at a random step (--fault kill)
  sigterm     SIGTERM to mpirun a random moment after the first snapshot
  disk-full   the output's file system (a tmpfs of its own) filled a random moment after the first snapshot
  unwritable  the output's file system remounted read-only a random moment after the first snapshot
  hang        a rank sleeps forever at a random step (--fault hang); the watchdog (--timeout-s 3) ends the job
Every job must end within T seconds (default 60); every file it leaves must be a complete run file or a `.partial`
snapshot that `ddplab report` reads; nothing else (a temporary, a half-written file) may be left. Prints the counts
and exits 1 if any job broke a rule. disk-full and unwritable need tmpfs mounts (root); without them they are
skipped with the reason. Bad input: one line "fault_soak.py: error: ...", exit code 2.
"""
import argparse
import collections
import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SMALL = ["--input-dim", "16", "--hidden", "32", "--classes", "4", "--batch", "4", "--warmup-steps", "0", "--quiet",
         "--flush-every", "5"]
KINDS = ["kill", "sigterm", "disk-full", "unwritable", "hang"]
# The codes each fault may end with: mpirun's when it ends the job itself (a killed rank: 137, or 1 after it
# terminated the others; a SIGTERM it forwards: 143), the ranks' otherwise (docs/RELIABILITY.md).
EXPECTED_CODES = {"kill": {1, 137}, "sigterm": {143, 1}, "disk-full": {5}, "unwritable": {5}, "hang": {3, 1}}


class Tmpfs:
    """A tmpfs of `size` mounted on a fresh folder, unmounted (and the folder removed) on exit."""

    def __init__(self, size):
        self.size = size
        self.path = tempfile.mkdtemp(prefix="ddplab_tmpfs_")

    def __enter__(self):
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", self.path],
                           capture_output=True, text=True)
        if p.returncode != 0:
            os.rmdir(self.path)
            raise OSError(f"cannot mount a tmpfs ({(p.stderr or p.stdout).strip() or 'mount failed'})")
        return self.path

    def __exit__(self, *exc):
        subprocess.run(["umount", self.path], capture_output=True)
        os.rmdir(self.path)

    def remount_read_only(self):
        """Remounts it read-only; retried while the kernel refuses because a file is open for writing (a snapshot
        being written): the fault then lands just after that write."""
        deadline = time.monotonic() + 30
        while subprocess.run(["mount", "-o", "remount,ro", self.path], capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                raise OSError(f"cannot remount {self.path} read-only")
            time.sleep(0.001)


def mount_problem():
    """Why tmpfs mounts cannot be made here, or "" if they can."""
    try:
        with Tmpfs("64k"):
            return ""
    except OSError as e:
        return str(e)


def fill(folder):
    """Writes a filler file in `folder` until its file system has no space left."""
    with open(os.path.join(folder, "filler"), "wb", buffering=0) as f:
        chunk = b"\0" * 65536
        while True:
            try:
                f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return
                chunk = chunk[: len(chunk) // 2]


def wait_for(path, deadline):
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.path.exists(path)


def run_job(mpirun, ddplab, np_ranks, kind, rng, folder, limit_s, tmpfs=None):
    """Runs one job with its fault; returns (exit code or None if it had to be killed, seconds, output)."""
    out = os.path.join(folder, "run.h5")
    args = ["--steps", "400", "--data-cost-ms", "1", "--out", out]
    rank, step = rng.randrange(np_ranks), rng.randrange(2, 40)
    if kind in ("kill", "hang"):
        args += ["--fault", kind, "--fault-rank", str(rank), "--fault-step", str(step), "--timeout-s", "3"]
    cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(np_ranks), ddplab, "train"] + SMALL + args
    start = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        if kind in ("sigterm", "disk-full", "unwritable") and wait_for(out + ".partial", start + limit_s):
            time.sleep(rng.uniform(0, 0.5))
            if kind == "sigterm":
                p.send_signal(signal.SIGTERM)
            elif kind == "disk-full":
                fill(folder)
            else:
                tmpfs.remount_read_only()
        output, _ = p.communicate(timeout=max(1, limit_s - (time.monotonic() - start)))
        code = p.returncode
    except subprocess.TimeoutExpired:
        output, code = "", None
    finally:
        if p.poll() is None:  # the job outlived its limit, or injecting the fault failed: it goes with it
            os.killpg(p.pid, signal.SIGKILL)
            output += p.communicate()[0]
    return code, time.monotonic() - start, output


def check_files(ddplab, folder):
    """(readable, broken) file names left in `folder`: run files and snapshots `ddplab report` reads, and the rest."""
    readable, broken = [], []
    for name in sorted(os.listdir(folder)):
        if name == "filler":
            continue
        path = os.path.join(folder, name)
        ok = (name.endswith(".h5") or name.endswith(".h5.partial")) and subprocess.run(
            [ddplab, "report", path], capture_output=True, timeout=60).returncode == 0
        (readable if ok else broken).append(name)
    return readable, broken


def refuse(what):
    print(f"fault_soak.py: error: {what}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="fault_soak.py", description=__doc__.split("\n")[0])
    parser.error = refuse  # one line, not argparse's usage block
    parser.add_argument("mpirun")
    parser.add_argument("ddplab")
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--limit-s", type=float, default=60)
    args = parser.parse_args(argv)
    for what, ok in [("--jobs must be at least 1", args.jobs >= 1), ("--limit-s must be positive", args.limit_s > 0),
                     (f"{args.ddplab} is not an executable", os.access(args.ddplab, os.X_OK)),
                     (f"{args.mpirun} not found", shutil.which(args.mpirun) is not None)]:
        if not ok:
            refuse(what)
    return args


def main(argv):
    args = parse_args(argv)
    rng = random.Random(args.seed)
    kinds = KINDS
    if problem := mount_problem():
        print(f"skipping disk-full and unwritable: {problem}")
        kinds = [k for k in KINDS if k not in ("disk-full", "unwritable")]
    counts = collections.Counter()
    codes = collections.defaultdict(collections.Counter)
    bad = []
    for j in range(args.jobs):
        kind, np_ranks = kinds[j % len(kinds)], (2, 4)[(j // len(kinds)) % 2]
        counts[kind] += 1
        if kind in ("disk-full", "unwritable"):
            tmpfs = Tmpfs("2m")
            with tmpfs as folder:
                code, seconds, output = run_job(args.mpirun, args.ddplab, np_ranks, kind, rng, folder, args.limit_s,
                                                tmpfs)
                readable, broken = check_files(args.ddplab, folder)
        else:
            with tempfile.TemporaryDirectory() as folder:
                code, seconds, output = run_job(args.mpirun, args.ddplab, np_ranks, kind, rng, folder, args.limit_s)
                readable, broken = check_files(args.ddplab, folder)
        codes[kind][code] += 1
        counts["ended in time"] += code is not None
        counts["expected exit code"] += code in EXPECTED_CODES[kind]
        counts["files left"] += len(readable) + len(broken)
        counts["files readable"] += len(readable)
        if code is None or broken or code not in EXPECTED_CODES[kind]:
            why = "timed out" if code is None else f"broken files {broken}" if broken else f"exit code {code}"
            bad.append(f"job {j} ({kind}, {np_ranks} ranks): {why}; output ends: {output.strip()[-300:]!r}")
        print(f"job {j:3d} {kind:10s} np {np_ranks}  exit {code}  {seconds:5.1f} s  files {readable + broken}",
              flush=True)
    print(f"\njobs {args.jobs} (seed {args.seed}, limit {args.limit_s:g} s each)")
    for kind in kinds:
        exits = ", ".join(f"{c}: {n}" for c, n in sorted(codes[kind].items(), key=lambda kv: str(kv[0])))
        print(f"  {kind:10s} {counts[kind]:4d}  exit codes {exits}")
    print(f"ended in time       {counts['ended in time']}/{args.jobs}")
    print(f"expected exit code  {counts['expected exit code']}/{args.jobs}")
    print(f"files readable      {counts['files readable']}/{counts['files left']} (the rest half-written or corrupt)")
    for line in bad:
        print("FAIL " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
