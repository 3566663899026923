#!/usr/bin/env python3
"""The heaviest kernels of a profiled range, from ncu's raw CSV of one metric per launch:

  ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --page raw --print-units base \\
      --print-kernel-base function APP... > launches.csv
  top_kernels.py launches.csv [N]

Prints a table of the N kernels (default 3) with the most GPU time summed over their launches, then one line
"top: NAME NAME ..." with their names as ncu's --kernel-name matches them. Exits 1 when no launch was found.
"""
import csv
import sys
from collections import defaultdict

METRIC = "gpu__time_duration.sum"


def main():
    path, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    with open(path, newline="") as f:
        # ncu prints its own lines (==PROF== ...) around the CSV; the CSV starts at the header row.
        lines = [line for line in f if line.startswith('"')]
    total, launches = defaultdict(float), defaultdict(int)
    for row in csv.DictReader(lines):
        value = row.get(METRIC, "").replace(",", "")
        try:
            ns = float(value)
        except ValueError:  # the units row
            continue
        total[row["Kernel Name"]] += ns
        launches[row["Kernel Name"]] += 1
    if not total:
        print(f"top_kernels: no launch with {METRIC} in {path}", file=sys.stderr)
        return 1
    step = sum(total.values())
    ranked = sorted(total, key=total.get, reverse=True)
    print(f"{sum(launches.values())} launches of {len(total)} kernels, {step / 1e6:.3f} ms of GPU time")
    print(f"{'kernel':60} {'launches':>8} {'ms':>9} {'share':>6}")
    for name in ranked[:max(n, 10)]:
        print(f"{name[:60]:60} {launches[name]:8d} {total[name] / 1e6:9.3f} {100 * total[name] / step:5.1f}%")
    print("top: " + " ".join(ranked[:n]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
