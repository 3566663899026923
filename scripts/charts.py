#!/usr/bin/python3
"""Charts of ddplab run files, as PNG and SVG (headless: matplotlib's Agg backend).

usage: /usr/bin/python3 scripts/charts.py OUT_DIR FILE.h5 [FILE.h5 ...]

Per file:  <stem>_breakdown   where each rank's step goes (data / compute / hidden comm / exposed comm / optimizer,
                              plus the lab's extra all-reduce, host work and barrier wait when present)
           <stem>_step_times  step time of every step on every rank (warm-up shaded)
Several:   throughput         samples/s per file
           bucket_sweep       step time and exposed comm over bucket size, one line per overlap setting, when the
                              files differ only in bucket_mb/overlap
           scaling            samples/s over world size against ideal, when the files differ only in world size
                              (and per-rank batch, for strong scaling)
Steady-state figures (per-rank means, the slowest rank's step, samples/s, where the steady state starts) come from
the run file's stored `summary`, the one ddplab computed; only the step-time chart reads the per-step datasets.
Prints the path of every file it writes. Needs Debian's python3-h5py and python3-matplotlib (/usr/bin/python3).
Bad input: one line "charts.py: error: ..." on stderr, exit code 2.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import h5py  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

SCHEMA_VERSION = 3
# Config keys that do not make two runs different experiments.
INCIDENTAL = {"out", "force"}


class BadInput(Exception):
    pass


class Run:
    """One run file: its stored summary (ddplab's own steady-state figures, docs/RUN_FILE.md) and, for the step-time
    chart, every step's time on every rank."""

    def __init__(self, path):
        self.path = path
        self.stem = os.path.basename(path)[:-3] if path.endswith(".h5") else os.path.basename(path)
        if not os.path.isfile(path):
            raise BadInput(f"cannot read run file {path}: no such file")
        try:
            f = h5py.File(path, "r")
        except OSError:
            raise BadInput(f"cannot read run file {path}: not an HDF5 file") from None
        try:
            with f:
                self._load(f)
        except (KeyError, ValueError, TypeError) as e:
            raise BadInput(f"cannot read run file {path}: unexpected contents ({e})") from None

    def _load(self, f):
        path = self.path
        version = f.attrs.get("schema_version")
        if version is None:
            raise BadInput(f"cannot read run file {path}: no schema_version attribute (not a ddplab run file)")
        if int(version) != SCHEMA_VERSION:
            raise BadInput(f"cannot read run file {path}: schema version {int(version)}, this script reads "
                           f"version {SCHEMA_VERSION}")
        self.world = int(f.attrs["world_size"])
        self.steps = int(f.attrs["num_steps"])
        self.config = json.loads(f.attrs["config"])
        self.summary = json.loads(f.attrs["summary"])
        if len(self.summary["ranks"]) != self.world:
            raise BadInput(f"cannot read run file {path}: the summary has {len(self.summary['ranks'])} ranks, "
                           f"the run {self.world}")
        self.first_steady = int(self.summary["first_steady_step"])
        self.global_batch = int(self.summary["global_batch"])
        self.step_ms = float(self.summary["slowest_step_ms"])  # the slowest rank's mean step: it sets the pace
        self.samples_per_s = float(self.summary["samples_per_s"])
        self.step_times = f["steps/step_ms"][:].astype(float)
        if self.step_times.shape != (self.world, self.steps):
            raise BadInput(f"cannot read run file {path}: steps/step_ms has shape {list(self.step_times.shape)}, "
                           f"expected [{self.world}, {self.steps}]")

    def mean(self, name):
        """Steady-state mean per rank, as the summary stores it (0 for a field the file predates)."""
        return np.array([float(rank.get(name, 0.0)) for rank in self.summary["ranks"]])

    def experiment(self, *ignore):
        """The config without the keys that a sweep varies (and the incidental ones)."""
        return {k: v for k, v in self.config.items() if k not in INCIDENTAL and k not in ignore}


def save(fig, out_dir, name, written):
    for ext in ("png", "svg"):
        path = os.path.join(out_dir, f"{name}.{ext}")
        fig.savefig(path, dpi=120, bbox_inches="tight")
        written.append(path)
    plt.close(fig)


def breakdown_chart(run, out_dir, name, written):
    data, fwd, bwd = run.mean("data_ms"), run.mean("forward_ms"), run.mean("backward_ms")
    hidden = np.minimum(run.mean("hidden_comm_ms"), bwd)  # comm that ran during backward, drawn inside it
    parts = [("data", data, "#8c6bb1"),
             ("compute", fwd + bwd - hidden, "#4c72b0"),
             ("compute with comm hidden under it", hidden, "#55a868"),
             ("exposed comm", run.mean("exposed_comm_ms"), "#c44e52"),
             ("optimizer", run.mean("optimizer_ms"), "#dd8452"),
             ("extra all-reduce", run.mean("extra_comm_ms"), "#937860"),
             ("host work", run.mean("host_work_ms"), "#da8bc3"),
             ("barrier wait", run.mean("barrier_ms"), "#8c8c8c")]
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * run.world + 3), 4))
    ranks = np.arange(run.world)
    bottom = np.zeros(run.world)
    tallest = max(float(run.mean("step_ms").max()), 1e-9)
    for i, (label, values, color) in enumerate(parts):
        if i >= 5 and values.max() < 0.005 * tallest:
            continue  # the lab's phases only when they show
        ax.bar(ranks, values, bottom=bottom, color=color, label=label, width=0.6)
        bottom += values
    ax.set_xticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylabel("ms per step (steady-state mean)")
    ax.set_title(f"{run.stem}: where each rank's step goes ({run.world} ranks)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    save(fig, out_dir, name, written)


def step_times_chart(run, out_dir, name, written):
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = np.arange(run.steps)
    for r in range(run.world):
        ax.plot(steps, run.step_times[r], marker=".", linewidth=1, label=f"rank {r}")
    if run.first_steady > 0:
        ax.axvspan(-0.5, run.first_steady - 0.5, color="0.9", label="warm-up")
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms)")
    times = run.step_times
    ax.set_yscale("log" if times.min() > 0 and times.max() > 20 * max(times.min(), 1e-9) else "linear")
    ax.set_title(f"{run.stem}: step time per rank")
    ax.legend(fontsize=8, ncol=2)
    save(fig, out_dir, name, written)


def throughput_chart(runs, out_dir, written):
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(runs) + 2), 4))
    x = np.arange(len(runs))
    values = [r.samples_per_s for r in runs]
    bars = ax.bar(x, values, color="#4c72b0")
    ax.bar_label(bars, [f"{v:,.0f}" for v in values], fontsize=8)
    ax.set_xticks(x, [r.stem for r in runs], rotation=30, ha="right")
    ax.set_ylabel("samples/s (global batch / slowest rank's step)")
    ax.set_title("throughput")
    save(fig, out_dir, "throughput", written)


def is_bucket_sweep(runs):
    base = runs[0].experiment("bucket_mb", "overlap")
    same = all(r.experiment("bucket_mb", "overlap") == base and r.world == runs[0].world for r in runs)
    settings = {(r.config.get("bucket_mb"), r.config.get("overlap")) for r in runs}
    return same and len(settings) >= 2 and len(settings) == len(runs)


def bucket_sweep_chart(runs, out_dir, written):
    sizes = sorted({r.config["bucket_mb"] for r in runs})
    x = {b: i for i, b in enumerate(sizes)}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for overlap in sorted({r.config["overlap"] for r in runs}, reverse=True):
        group = sorted((r for r in runs if r.config["overlap"] == overlap), key=lambda r: r.config["bucket_mb"])
        xs = [x[r.config["bucket_mb"]] for r in group]
        label = f"overlap {'on' if overlap else 'off'}"
        ax1.plot(xs, [r.step_ms for r in group], marker="o", label=label)
        ax2.plot(xs, [float(r.mean("exposed_comm_ms").mean()) for r in group], marker="o", label=label)
    labels = ["per param" if b == 0 else f"{b:g}" for b in sizes]
    for ax, title in ((ax1, "step time (slowest rank, ms)"), (ax2, "exposed comm (mean over ranks, ms)")):
        ax.set_xticks(range(len(sizes)), labels)
        ax.set_xlabel("bucket cap (MiB)")
        ax.set_title(title)
        ax.legend(fontsize=8)
        ax.set_ylim(bottom=0)
    fig.suptitle(f"bucket size x overlap ({runs[0].world} ranks)")
    save(fig, out_dir, "bucket_sweep", written)


def scaling_kind(runs):
    """'weak' (same per-rank batch), 'strong' (same global batch) or None, for runs differing in world size only."""
    worlds = [r.world for r in runs]
    if len(set(worlds)) != len(runs) or len(runs) < 2:
        return None
    if any(r.experiment("batch") != runs[0].experiment("batch") for r in runs):
        return None
    if len({r.config.get("batch") for r in runs}) == 1:
        return "weak"
    if len({r.global_batch for r in runs}) == 1:
        return "strong"
    return None


def scaling_chart(runs, kind, out_dir, written):
    runs = sorted(runs, key=lambda r: r.world)
    worlds = [r.world for r in runs]
    thr = [r.samples_per_s for r in runs]
    ideal = [thr[0] * w / worlds[0] for w in worlds]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(worlds, ideal, "--", color="0.5", label="ideal (linear from the smallest world)")
    ax.plot(worlds, thr, marker="o", label="measured")
    for w, t, i in zip(worlds, thr, ideal):
        ax.annotate(f"{100 * t / i:.0f}%", (w, t), textcoords="offset points", xytext=(4, -12), fontsize=8)
    ax.set_xticks(worlds)
    ax.set_xlabel("ranks")
    ax.set_ylabel("samples/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{kind} scaling (efficiency vs ideal)")
    ax.legend(fontsize=8)
    save(fig, out_dir, f"{kind}_scaling", written)


def unique_names(runs):
    seen = {}
    names = []
    for r in runs:
        seen[r.stem] = seen.get(r.stem, 0) + 1
        names.append(r.stem if seen[r.stem] == 1 else f"{r.stem}_{seen[r.stem]}")
    return names


def main(argv):
    if len(argv) < 3:
        raise BadInput("usage: charts.py OUT_DIR FILE.h5 [FILE.h5 ...]")
    out_dir, paths = argv[1], argv[2:]
    runs = [Run(p) for p in paths]  # all readable before anything is written
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise BadInput(f"cannot create output folder {out_dir}: {e.strerror}") from None
    if not os.access(out_dir, os.W_OK):
        raise BadInput(f"output folder {out_dir} is not writable")
    written = []
    for run, name in zip(runs, unique_names(runs)):
        breakdown_chart(run, out_dir, f"{name}_breakdown", written)
        step_times_chart(run, out_dir, f"{name}_step_times", written)
    if len(runs) > 1:
        throughput_chart(runs, out_dir, written)
        if is_bucket_sweep(runs):
            bucket_sweep_chart(runs, out_dir, written)
        kind = scaling_kind(runs)
        if kind:
            scaling_chart(runs, kind, out_dir, written)
    for path in written:
        print(path)


if __name__ == "__main__":
    try:
        main(sys.argv)
    except BadInput as e:
        print(f"charts.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    except (KeyError, ValueError) as e:
        print(f"charts.py: error: unexpected run file contents ({e})", file=sys.stderr)
        sys.exit(2)
