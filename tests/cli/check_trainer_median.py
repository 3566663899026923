#!/usr/bin/python3
"""bench/device/trainer_median.py on a run file whose summary gives the median (analysis/summary.cpp computes it;
test_report's TheMedianStepIsOverEachStepsSlowestRank checks that) and a mean unlike it, a resumed run's step numbers;
then a missing harness file, a missing run file and one of an older ddplab, without the median.

usage: check_trainer_median.py TRAINER_MEDIAN_PY
"""
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

from checks import check, failures  # tests/cli/checks.py: the assertion every CLI test shares

# [rank, step] in ms, steps 4..9 of a resumed run (first_step 4), the steady state from its second record: each step's
# slowest rank 16, 12, 15, 30, 14 ms, whose median is 15 (the summary's); the mean (its slowest rank's, rank 0's) 17.
STEPS = [[90.0, 16.0, 11.0, 15.0, 30.0, 13.0],
         [80.0, 15.0, 12.0, 14.0, 29.0, 14.0]]


def run(script, *args):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=30)


def main():
    script = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        run_file, harness = os.path.join(tmp, "train.h5"), os.path.join(tmp, "step.csv")
        with h5py.File(run_file, "w") as f:
            f.attrs["first_step"] = 4
            f.attrs["summary"] = json.dumps({"first_steady_step": 1, "slowest_step_ms": 17.0, "median_step_ms": 15.0})
            f["steps/step_ms"] = np.array(STEPS)
        with open(harness, "w") as f:
            f.write("model,precision,step_ms,forward_ms\ngpt2-small,bf16,12.000000,4.0\n")
        both = run(script, run_file, harness)
        expected = ("trainer median 15.000 ms over steps 5..9 (its mean 17.000) against the harness's median "
                    "12.000 ms: 1.250x median over median (1.417x its mean over the median)")
        check(both.returncode == 0 and both.stdout.strip() == expected,
              f"the summary's median step (computed in analysis/summary.cpp, tested in test_report) and mean beside "
              f"the harness's median, their ratios, the steady steps named (got {both.returncode}: "
              f"{both.stdout.strip()!r})")
        alone = run(script, run_file, os.path.join(tmp, "missing.csv"))
        check(alone.returncode == 0 and alone.stdout.startswith("trainer median 15.000 ms over steps 5..9") and
              "no harness median" in alone.stdout,
              f"without the harness's file (its step failed or was left out): the trainer's median alone, exit 0 "
              f"(got {alone.returncode}: {alone.stdout!r})")
        empty = os.path.join(tmp, "empty.csv")
        with open(empty, "w") as f:
            f.write("model,precision,step_ms,forward_ms\n")
        unreadable = run(script, run_file, empty)
        check(unreadable.returncode == 1 and "the harness's file unreadable" in unreadable.stdout,
              f"a harness file without a row: said, exit 1 (got {unreadable.returncode}: {unreadable.stdout!r})")
        older = os.path.join(tmp, "older.h5")
        with h5py.File(older, "w") as f:
            f.attrs["summary"] = json.dumps({"first_steady_step": 1, "slowest_step_ms": 17.0})
            f["steps/step_ms"] = np.array(STEPS)
        proc = run(script, older, harness)
        check(proc.returncode == 1 and "no median_step_ms" in proc.stderr,
              f"a run file without the median: said, exit 1 (got {proc.returncode}: {proc.stderr!r})")
        missing = run(script, os.path.join(tmp, "missing.h5"), harness)
        check(missing.returncode == 1 and missing.stdout == "" and missing.stderr.startswith("trainer_median: "),
              f"without the run file: one line on stderr, exit 1 (got {missing.returncode}: {missing.stderr!r})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
