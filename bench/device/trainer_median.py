#!/usr/bin/env python3
"""The trainer's median step beside the harness's median, so that their ratio divides like by like:

  trainer_median.py RUN.h5 HARNESS.csv

RUN.h5 is a `ddplab train` run file: its summary's median_step_ms (the median over the steady steps of each step's
slowest rank, as `ddplab report` prints it: analysis/summary.h), slowest_step_ms (the mean it prints) and
first_steady_step, and steps/step_ms for the steps' numbers. HARNESS.csv is bench_transformer_cuda's --csv, whose
step_ms is the median of its timed steps. Prints one line, "trainer median ..."; exits 1 when either file cannot be
read, but for a missing harness file (its step failed, and has its own row, or DDPLAB_ONLY left it out): then the
trainer's median is printed alone, and the exit is 0.
"""
import csv
import json
import sys

import h5py


def trainer_steps(path):
    """The trainer's median and mean step, and the numbers of the steady steps they are over."""
    with h5py.File(path, "r") as f:
        summary = json.loads(f.attrs["summary"])
        first_step = int(f.attrs.get("first_step", 0))  # a resumed run's records start at its checkpoint's step
        steps = f["steps/step_ms"].shape[1]  # [rank, step]
    first = min(int(summary["first_steady_step"]), steps - 1)
    if first < 0:
        raise ValueError(f"{path} holds no completed step")
    if "median_step_ms" not in summary:
        raise ValueError(f"{path}: its summary has no median_step_ms (a run file of an older ddplab)")
    return (float(summary["median_step_ms"]), float(summary["slowest_step_ms"]), first_step + first,
            first_step + steps - 1)


def harness_median(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path} has no row")
    return float(rows[0]["step_ms"])


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        median, mean, first, last = trainer_steps(sys.argv[1])
    except (OSError, KeyError, ValueError) as e:
        print(f"trainer_median: {e}", file=sys.stderr)
        return 1
    line = f"trainer median {median:.3f} ms over steps {first}..{last} (its mean {mean:.3f})"
    try:
        harness = harness_median(sys.argv[2])
    except FileNotFoundError as e:
        print(f"{line}; no harness median: {e}")
        return 0
    except (OSError, KeyError, ValueError) as e:
        print(f"{line}; the harness's file unreadable: {e}")
        return 1
    if harness <= 0:
        print(f"{line}; the harness's median is {harness}, not a time")
        return 1
    print(f"{line} against the harness's median {harness:.3f} ms: {median / harness:.3f}x median over median "
          f"({mean / harness:.3f}x its mean over the median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
