#!/usr/bin/python3
"""Soak: a long run of a small MLP keeps its memory flat and its run file proportional to its steps.

usage: check_soak.py MPIRUN DDPLAB [STEPS]

Samples the resident memory (VmRSS) of every rank from /proc while a run of STEPS steps (default 20000) goes on,
with snapshots every 2000 steps. What may grow: the step records every rank keeps for the final gather (one
StepRecord and a BucketTimes per bucket per step, about 0.2 kB a step), nothing else. The file: two runs of
S and 3S steps, whose size difference must be what 2S steps of records take.
"""
import os
import subprocess
import sys
import tempfile
import time

import h5py

failures = []
# A step of ~0.3 ms, most of it a sleep (--data-cost-ms per sample), so the run lasts seconds without loading the
# machine and the memory samples fall in training, not start-up.
SMALL = ["--input-dim", "16", "--hidden", "32", "--classes", "4", "--batch", "4", "--quiet", "--flush-every", "2000",
         "--data-cost-ms", "0.05"]


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rank_pids(marker):
    out = subprocess.run(["pgrep", "-f", "--", marker], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out if os.path.exists(f"/proc/{p}")]


def run(mpirun, ddplab, steps, path, sample=False):
    cmd = [mpirun, "--bind-to", "none", "-np", "2", ddplab, "train", "--steps", str(steps), "--out", path] + SMALL
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    samples = []  # (seconds, total RSS of the ranks in kB), from the first snapshot on: start-up is over
    start = time.monotonic()
    while p.poll() is None and time.monotonic() - start < 300:
        if sample and os.path.exists(path + ".partial"):
            pids = [q for q in rank_pids("--out " + path) if q != p.pid]
            kb = [rss_kb(q) for q in pids]
            if pids and None not in kb:
                samples.append((time.monotonic() - start, sum(kb)))
        time.sleep(0.05)
    out, _ = p.communicate(timeout=60)
    return p.returncode, out, samples


def main():
    mpirun, ddplab = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20000
    with tempfile.TemporaryDirectory() as work:
        long_run = os.path.join(work, "soak.h5")
        code, out, samples = run(mpirun, ddplab, steps, long_run, sample=True)
        check(code == 0, f"{steps}-step run completes (code {code}) {out[-300:] if code else ''}")
        check(len(samples) >= 10, f"sampled the ranks' memory {len(samples)} times")
        if len(samples) >= 10:
            # From the first snapshot (step 2000) to just before the end. Only the records may grow: 144 bytes of
            # StepRecord + 24 per bucket per step per rank; allowed: 0.3 kB, plus 4 MB of allocator slack and rank
            # 0's snapshot buffers.
            a, b = samples[0], samples[-2]
            allowed = 2 * (4096 + 0.3 * steps)
            check(b[1] - a[1] <= allowed, f"RSS flat but for the records: {a[1]} kB -> {b[1]} kB for both ranks "
                  f"(allowed growth {allowed:.0f} kB over at most {steps} steps)")
        with h5py.File(long_run, "r") as f:
            check(int(f.attrs["num_steps"]) == steps and f.attrs["stop_reason"] == "", "run file complete")
        check(not os.path.exists(long_run + ".partial"), "the snapshot is gone once the run file is written")

        short, longer = os.path.join(work, "s.h5"), os.path.join(work, "l.h5")
        s = steps // 4
        run(mpirun, ddplab, s, short)
        run(mpirun, ddplab, 3 * s, longer)
        with h5py.File(short, "r") as f:
            buckets = f["buckets/count"].shape[0]
        per_step = 2 * (18 + 3 * buckets) * 8  # 2 ranks x (18 step fields + 3 bucket times per bucket) x 8 bytes
        grew = os.path.getsize(longer) - os.path.getsize(short)
        expected = 2 * s * per_step
        check(abs(grew - expected) <= 0.1 * expected + 16384,
              f"file grows with the steps: {grew} bytes for {2 * s} more steps, expected ~{expected}")
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
