#!/usr/bin/python3
"""Bus bandwidth against message size, one line per implementation, from allreduce_perf's JSON (-J) or CSV (--csv).

usage: /usr/bin/python3 scripts/allreduce_chart.py RESULTS.json|RESULTS.csv [MORE ...] [-o OUT.png]
                                                   [--mode out-of-place|in-place]

The line is busbw at the median call and the shaded band around it spans the fastest call (top) to the p99 call
(bottom): one statistic, each call timed by its slowest rank. (The table's busbw column is from each rank's mean
call, combined over the ranks by -a: a rank's mean can beat every call's slowest rank, and so lie outside the band.)
Where a GPU implementation's calls were queued and timed together (allreduce_perf -z 0, its default) no call has a
time of its own: that line is the mean call, without a band, and its legend says so.
Several files: one line per implementation and file (labelled by rank count when the files differ in it, else by
file name). Default output: <first input's stem>_busbw.png beside
it; the format follows the extension (png, svg, pdf). Prints the path it writes. Needs Debian's python3-matplotlib.
Bad input: one line "allreduce_chart.py: error: ..." on stderr, exit code 2, nothing written.
"""
import argparse
import csv
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

MODES = {"out-of-place": ("out_of_place", "oop"), "in-place": ("in_place", "ip")}
FORMATS = ("png", "svg", "pdf")


class BadInput(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, as every other refusal
        raise BadInput(message)


class Series:
    """One implementation in one file: sizes (bytes) with busbw (GB/s) at the median, fastest and p99 call."""

    def __init__(self, impl, nranks, link, path):
        self.impl, self.nranks, self.link, self.path = impl, nranks, link, path
        self.points = []  # (size, busbw at the median call, at the fastest call, at the p99 call)
        self.queued = False  # -z 0's rows: the mean call only

    def add(self, size, time_us, p50_us, min_us, p99_us):
        factor = 2 * (self.nranks - 1) / self.nranks
        if p50_us in (None, ""):
            self.queued = True
            p50_us = min_us = p99_us = time_us
        self.points.append((size, *(size / float(us) / 1e3 * factor for us in (p50_us, min_us, p99_us))))


def read_results(path, mode):
    """The file's series, in the order their implementations first appear."""
    if not os.path.isfile(path):
        raise BadInput(f"cannot read {path}: no such file")
    key, prefix = MODES[mode]
    series = {}
    try:
        with open(path, newline="") as f:
            if path.endswith(".json"):
                doc = json.load(f)
                nranks, link = int(doc["nranks"]), doc["link"]["name"]
                rows = [(r["impl"], r["size_bytes"], r[key]["time_us"], r[key]["p50_us"], r[key]["min_us"],
                         r[key]["p99_us"]) for r in doc["results"]]
            elif path.endswith(".csv"):
                table = list(csv.DictReader(f))
                nranks = int(table[0]["nranks"]) if table else 0
                link = table[0]["link"] if table else ""
                rows = [(r["impl"], r["size_bytes"], r[f"{prefix}_time_us"], r[f"{prefix}_p50_us"],
                         r[f"{prefix}_min_us"], r[f"{prefix}_p99_us"]) for r in table]
            else:
                raise BadInput(f"cannot read {path}: expected allreduce_perf's .json or .csv")
            for impl, size, time_us, p50_us, min_us, p99_us in rows:
                s = series.setdefault(impl, Series(impl, nranks, link, path))
                s.add(int(size), time_us, p50_us, min_us, p99_us)
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as e:
        raise BadInput(f"cannot read {path}: not allreduce_perf output ({type(e).__name__}: {e})") from None
    if not series:
        raise BadInput(f"cannot read {path}: no results")
    if nranks < 2:
        raise BadInput(f"{path}: {nranks} rank(s) move no data (busbw 0); run allreduce_perf with -np 2 or more")
    return list(series.values())


def size_label(size, _pos=None):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):g} {unit}"
    return f"{size:g} B"


def size_ticks(sizes):
    """Powers of two across the sizes, at most 12 of them, on a regular stride of exponents."""
    lo, hi = math.floor(math.log2(min(sizes))), math.ceil(math.log2(max(sizes)))
    stride = max(1, math.ceil((hi - lo + 1) / 12))
    return [2.0 ** e for e in range(lo, hi + 1, stride)]


def labels(all_series):
    files = {s.path for s in all_series}
    ranks = {s.nranks for s in all_series}
    if len(files) == 1:
        return [s.impl for s in all_series]
    if len(ranks) == len(files):
        return [f"{s.impl}, {s.nranks} ranks" for s in all_series]
    return [f"{s.impl} ({os.path.splitext(os.path.basename(s.path))[0]})" for s in all_series]


def chart(all_series, mode, out):
    fig, ax = plt.subplots(figsize=(8, 4.8))
    # An implementation keeps its colour across files; files differ in line style.
    colors = {impl: f"C{i % 10}" for i, impl in enumerate(dict.fromkeys(s.impl for s in all_series))}
    styles = {path: ("-", "--", ":", "-.")[i % 4] for i, path in enumerate(dict.fromkeys(s.path for s in all_series))}
    for s, label in zip(all_series, labels(all_series)):
        pts = sorted(s.points)
        sizes = [p[0] for p in pts]
        ax.plot(sizes, [p[1] for p in pts], marker="o", markersize=3, linewidth=1.5, color=colors[s.impl],
                linestyle=styles[s.path], label=f"{label} (mean of queued calls)" if s.queued else label)
        ax.fill_between(sizes, [p[3] for p in pts], [p[2] for p in pts], color=colors[s.impl], alpha=0.12,
                        linewidth=0)
    sizes = [p[0] for s in all_series for p in s.points]
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(size_ticks(sizes)))
    ax.xaxis.set_major_formatter(FuncFormatter(size_label))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.tick_params(axis="x", labelrotation=45)
    ax.set_xlim(min(sizes) / 1.25, max(sizes) * 1.25)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("message size (bytes of float data)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.grid(True, which="major", color="0.9")
    nranks = sorted({s.nranks for s in all_series})
    links = sorted({s.link for s in all_series})
    ax.set_title(f"all-reduce busbw, {mode}, {'/'.join(map(str, nranks))} ranks, link {'/'.join(links)}\n"
                 "line: the median call; band: the fastest to the p99 call (each call timed by its slowest rank)",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    tmp = f"{out}.tmp.{os.getpid()}"
    try:
        fig.savefig(tmp, format=os.path.splitext(out)[1][1:], dpi=130, bbox_inches="tight")
        os.replace(tmp, out)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)


def main(argv):
    parser = Parser(prog="allreduce_chart.py", description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="+", help="allreduce_perf's -J JSON or --csv CSV files")
    parser.add_argument("-o", "--out", help="chart file (.png, .svg or .pdf); default <first input>_busbw.png")
    parser.add_argument("--mode", choices=list(MODES), default="out-of-place", help="which table half to draw")
    args = parser.parse_args(argv[1:])
    all_series = [s for path in args.results for s in read_results(path, args.mode)]  # all read before writing
    out = args.out or os.path.splitext(args.results[0])[0] + "_busbw.png"
    if os.path.splitext(out)[1][1:] not in FORMATS:
        raise BadInput(f"-o {out}: the extension must be one of {', '.join(FORMATS)}")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise BadInput(f"-o {out}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise BadInput(f"-o {out}: folder {folder} is not writable")
    chart(all_series, args.mode, out)
    print(out)


if __name__ == "__main__":
    try:
        main(sys.argv)
    except BadInput as e:
        print(f"allreduce_chart.py: error: {e}", file=sys.stderr)
        sys.exit(2)
