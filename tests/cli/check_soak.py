#!/usr/bin/python3
"""Soak: a long run of a small MLP keeps its memory flat and its run file proportional to its steps.

usage: check_soak.py MPIRUN DDPLAB [STEPS]

Samples the resident memory (VmRSS) of every rank from /proc while a run of STEPS steps (default 20000) goes on,
with snapshots every 2000 steps. Ranks hand their step records to rank 0 at each snapshot, so rank 1's memory must
stay flat; rank 0 keeps everyone's records for the run file (one StepRecord and a BucketTimes per bucket per step
per rank, about 0.2 kB) and may grow by those, nothing else. The file: two runs of S and 3S steps, whose size
difference must be what 2S steps of records take.
"""
import os
import subprocess
import sys
import tempfile
import time

import h5py

from checks import check, failures, own_mpi_session  # tests/cli/checks.py: the assertion every CLI test shares
# A step of ~0.3 ms, most of it a sleep (--data-cost-ms per sample), so the run lasts seconds without loading the
# machine and the memory samples fall in training, not start-up.
SMALL = ["--input-dim", "16", "--hidden", "32", "--classes", "4", "--batch", "4", "--quiet", "--flush-every", "2000",
         "--data-cost-ms", "0.05"]


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rank_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for var in f.read().split(b"\0"):
                if var.startswith(b"OMPI_COMM_WORLD_RANK="):
                    return int(var.split(b"=")[1])
    except OSError:
        pass
    return None


def rank_pids(marker):
    """{rank: pid} of the ddplab processes whose command line holds `marker` (mpirun itself has no rank)."""
    out = subprocess.run(["pgrep", "-f", "--", marker], capture_output=True, text=True).stdout.split()
    ranks = {}
    for p in out:
        r = rank_of(int(p))
        if r is not None:
            ranks[r] = int(p)
    return ranks


def start(mpirun, ddplab, steps, path):
    cmd = [mpirun, "--bind-to", "none", "-np", "2", ddplab, "train", "--steps", str(steps), "--out", path] + SMALL
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=own_mpi_session())


def run(mpirun, ddplab, steps, path, sample=False):
    p = start(mpirun, ddplab, steps, path)
    samples = []  # (seconds, [RSS of rank 0, of rank 1] in kB), from the first snapshot on: start-up is over
    began = time.monotonic()
    while p.poll() is None and time.monotonic() - began < 300:
        if sample and os.path.exists(path + ".partial"):
            pids = rank_pids("--out " + path)
            kb = [rss_kb(pids[r]) if r in pids else None for r in (0, 1)]
            if None not in kb:
                samples.append((time.monotonic() - began, kb))
        time.sleep(0.05)
    out, _ = p.communicate(timeout=60)
    return p.returncode, out, samples


def main():
    mpirun, ddplab = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20000
    with tempfile.TemporaryDirectory() as work:
        # The two runs whose file sizes are compared go on beside the soak: their files do not depend on it, and the
        # soak's samples are of its own ranks' memory.
        s = steps // 4
        short, longer = os.path.join(work, "s.h5"), os.path.join(work, "l.h5")
        beside = [start(mpirun, ddplab, s, short), start(mpirun, ddplab, 3 * s, longer)]
        long_run = os.path.join(work, "soak.h5")
        code, out, samples = run(mpirun, ddplab, steps, long_run, sample=True)
        check(code == 0, f"{steps}-step run completes (code {code}) {out[-300:] if code else ''}")
        check(len(samples) >= 10, f"sampled the ranks' memory {len(samples)} times")
        if len(samples) >= 10:
            # From the first snapshot (step 2000) to just before the end.
            a, b = samples[0][1], samples[-2][1]
            check(b[1] - a[1] <= 2048, f"rank 1's RSS flat: {a[1]} kB -> {b[1]} kB (allowed growth 2048 kB)")
            allowed = 4096 + 2 * 0.3 * steps  # both ranks' records: a StepRecord and one bucket's times, < 300 B a step
            check(b[0] - a[0] <= allowed, f"rank 0's RSS grows by the records only: {a[0]} kB -> {b[0]} kB "
                  f"(allowed growth {allowed:.0f} kB over at most {steps} steps)")
        with h5py.File(long_run, "r") as f:
            check(int(f.attrs["num_steps"]) == steps and f.attrs["stop_reason"] == "", "run file complete")
        check(not os.path.exists(long_run + ".partial"), "the snapshot is gone once the run file is written")

        for p in beside:
            p.communicate(timeout=300)
        with h5py.File(short, "r") as f:  # the per-step datasets: [ranks, steps] and [ranks, steps, buckets]
            per_rank_step = sum(d.shape[2] if d.ndim == 3 else 1
                                for g in ("steps", "buckets") for d in f[g].values() if d.ndim >= 2)
        per_step = 2 * per_rank_step * 8  # 2 ranks x (step fields + bucket times per bucket) x 8 bytes
        grew = os.path.getsize(longer) - os.path.getsize(short)
        expected = 2 * s * per_step
        check(abs(grew - expected) <= 0.1 * expected + 16384,
              f"file grows with the steps: {grew} bytes for {2 * s} more steps, expected ~{expected}")
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
