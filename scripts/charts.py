#!/usr/bin/python3
"""Charts of ddplab run files, as PNG and SVG (headless: matplotlib's Agg backend).

usage: /usr/bin/python3 scripts/charts.py OUT_DIR [--suite SUMMARY.json] [--sweep SUMMARY.json ...]
                                          [--page PAGE.html [--report REPORT.json]] [FILE.h5 ...]

Per file:  <stem>_breakdown   where each rank's step goes (data / compute / backward with the all-reduce running
                              alongside it / exposed comm / optimizer, plus the lab's extra all-reduce, host work
                              and barrier wait when present)
           <stem>_step_times  step time of every step on every rank (warm-up shaded)
           <stem>_buckets     one step's backward and each bucket's ready, comm start and comm end, per rank: for
                              a single file, the suite's largest weak-scaling case (and its layout case), or the
                              sweep's best point
Any:       update             the learning rate and the gradient norm (against --grad-clip's cap) per step, for
                              the files whose rate varies (--lr-warmup, --lr-schedule) or that clip (--grad-clip)
Several:   throughput         samples/s per file (useful tokens/s when every file is a sequence run), grouped as
                              the suite groups its cases
           loss               the global-batch loss of every step, one line per file (ones that agree to 6
                              digits share a line; each line its own dash and marker, so close ones stay apart),
                              and the validation loss (--val-data) where a file has one: drawn for a single file
                              too when it has one
           bucket_sweep       step time and exposed comm over bucket size, one line per overlap setting, when the
                              files differ only in bucket_mb/overlap
           weak_scaling,      samples/s and efficiency over world size against the ideal line: from the suite's
           strong_scaling     weak/strong cases, or when the files differ only in world size (and per-rank batch)
--suite names the summary.json of `ddplab suite` that lists these files: their groups and blame. A case's file is
its run_file as written, relative to the summary's folder, or the file of that name beside the summary (the folder
copied or moved); files of which none is a case are refused. The same for --sweep and its points.
A run whose ranks took turns (more ranks x BLAS threads than its host's cores, or ranks sharing one GPU, as `ddplab
report` says) is marked oversubscribed wherever it is drawn: its times measure the machine, not DDP.
--sweep names the summary.json of a `ddplab sweep --predict` (repeatable: one per link, same model and ranks):
           predicted_vs_measured   step time over bucket size, predicted dashed and measured solid, one panel per
                                   link and one colour per overlap setting, the model's recommended point starred
--page writes the run as one self-contained HTML page from these charts (scripts/report_page.py; Debian's
python3-jinja2); --report names the output of `ddplab report --json` for these files, whose blame lines it shows
(a suite's come from its summary.json).
Steady-state figures (per-rank means, the slowest rank's step, samples/s, where the steady state starts) come from
the run file's stored `summary`, the one ddplab computed; only the step-time chart reads the per-step datasets.
Prints the path of every file it writes. Needs Debian's python3-h5py and python3-matplotlib (/usr/bin/python3).
Bad input: one line "charts.py: error: ..." on stderr, exit code 2; an output it cannot write (a full disk): the same
line, exit code 5.
"""
import errno
import io
import json
import os
import signal
import sys
import textwrap
from collections import Counter

import matplotlib

matplotlib.use("Agg")
import h5py  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
import numpy as np  # noqa: E402
from whole_file import write_whole  # noqa: E402 (beside this script)

SCHEMA_VERSION = 3
# Config keys that do not make two runs different experiments.
INCIDENTAL = {"out", "force"}


class BadInput(Exception):
    pass


class WriteFailed(Exception):
    """An output that could not be written (a full disk, a quota, an I/O error): exit code 5, as ddplab's."""


class Run:
    """One run file: its stored summary (ddplab's own steady-state figures, docs/RUN_FILE.md) and, for the step-time
    chart, every step's time on every rank."""

    def __init__(self, path):
        self.path = path
        self.stem = os.path.basename(path)[:-3] if path.endswith(".h5") else os.path.basename(path)  # name_uniquely
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
        self.first_step = int(f.attrs.get("first_step", 0))  # a resumed run's records start at its checkpoint's step
        self.config = json.loads(f.attrs["config"])
        # The setup as recorded (machine, BLAS, MPI, CUDA, the command): the page's first section.
        self.attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()
                      if k not in ("config", "summary")}
        # Why the run stopped early, or that the file is a snapshot of one in progress ("": it completed).
        self.stop_reason = str(self.attrs.get("stop_reason", ""))
        if self.steps == 0:  # no step to draw, and a summary of no rank
            raise BadInput(f"run file {path} holds no completed step" +
                           (f": {self.stop_reason}" if self.stop_reason else ""))
        self.hostnames = [h.decode() if isinstance(h, bytes) else str(h) for h in f["hostnames"][:]]
        self.gpus = [g.decode() if isinstance(g, bytes) else str(g) for g in f["gpus"][:]] if "gpus" in f else []
        self.summary = json.loads(f.attrs["summary"])
        if len(self.summary["ranks"]) != self.world:
            raise BadInput(f"cannot read run file {path}: the summary has {len(self.summary['ranks'])} ranks, "
                           f"the run {self.world}")
        self.first_steady = int(self.summary["first_steady_step"])
        self.global_batch = int(self.summary["global_batch"])
        self.step_ms = float(self.summary["slowest_step_ms"])  # the slowest rank's mean step: the run's (ranks end each step together)
        self.samples_per_s = float(self.summary["samples_per_s"])
        self.useful_tokens_per_s = float(self.summary.get("useful_tokens_per_s", 0))  # 0: no tokens (the MLP)

        def dataset(name, *shape):
            """A dataset of the shape the schema gives it, as float64: a cut one would chart other steps, or fail."""
            if f[name].shape != shape:
                raise BadInput(f"cannot read run file {path}: {name} has shape {list(f[name].shape)}, expected "
                               f"{list(shape)}")
            return f[name][:].astype(float)

        per_step = (self.world, self.steps)
        self.step_times = dataset("steps/step_ms", *per_step)
        # The step the buckets chart draws: the steady step of the median length (the slowest rank's; the lower of
        # the two middle ones), not the last, which one hiccup can make anything but typical. A run stopped within
        # its warm-up has only its last step.
        steady = np.arange(max(0, min(self.first_steady, self.steps - 1)), self.steps)
        order = steady[np.argsort(self.step_times[:, steady].max(axis=0), kind="stable")]
        self.drawn_step = int(order[(len(order) - 1) // 2]) if len(order) else 0
        self.start = dataset("steps/start_ms", *per_step)
        self.phases = {name: dataset(f"steps/{name}", *per_step)
                       for name in ("data_ms", "forward_ms", "backward_ms", "exposed_comm_ms", "optimizer_ms")}
        # The loss on the global batch: each rank's mean weighted by the terms it is a mean over (steps/loss_terms;
        # older files lack it, and their mean over ranks is that where every rank held as many terms), as
        # RunRecord::global_loss computes it for the summary's final_loss.
        loss = dataset("steps/loss", *per_step)
        terms = dataset("steps/loss_terms", *per_step) if "steps/loss_terms" in f else np.zeros(per_step)
        total = terms.sum(axis=0)
        self.loss = np.where(total > 0, (loss * terms).sum(axis=0) / np.where(total > 0, total, 1), loss.mean(axis=0))
        # The step's learning rate and gradient norm (--lr-schedule, --grad-clip; absent in older files: none).
        self.lr = dataset("steps/lr", *per_step)[0] if "steps/lr" in f else None
        self.grad_norm = dataset("steps/grad_norm", *per_step)[0] if "steps/grad_norm" in f else None
        # --val-data: the validation loss after the steps that took one, NaN after the others (absent: none).
        val = dataset("steps/val_loss", *per_step)[0] if "steps/val_loss" in f else None
        self.val_loss = val if val is not None and np.isfinite(val).any() else None
        self.bucket_bytes = dataset("buckets/bytes", len(f["buckets/bytes"])).astype(int)
        per_bucket = (*per_step, len(self.bucket_bytes))
        self.bucket_times = {name: dataset(f"buckets/{name}", *per_bucket)
                             for name in ("ready_ms", "comm_start_ms", "comm_end_ms")}
        # --zero-stage 1: each bucket's all-gather of the updated parameters (absent in older files: none)
        self.sharded = "buckets/gather_end_ms" in f and bool((dataset("buckets/gather_end_ms", *per_bucket) > 0).any())
        if self.sharded:
            for name in ("gather_start_ms", "gather_end_ms"):
                self.bucket_times[name] = dataset(f"buckets/{name}", *per_bucket)
        self.suite_case = None  # this run's case in the suite's summary.json (--suite)
        self.group = None  # the suite's group of this case
        self.took_turns_on = self._took_turns(int(f.attrs.get("host_cores", 0)))
        self.oversubscribed = self.took_turns_on is not None

    def _took_turns(self, host_cores):
        """What the ranks took turns on, so that the times measure the machine, not DDP: "the cores" where rank 0's
        host has fewer than ranks x BLAS threads (0: not recorded), "one GPU" where ranks of one host share one; None
        where they did not. What `ddplab report` and the suite decide (RunRecord::oversubscribed_ranks and
        ranks_sharing_a_gpu)."""
        threads = max(1, int(self.config.get("threads", self.config.get("blas_threads", 1))))  # older files' key
        on_first_host = self.hostnames.count(self.hostnames[0]) if self.hostnames else 0
        if self.attrs.get("device", "cpu") == "cpu" and host_cores > 0 and on_first_host * threads > host_cores:
            return "the cores"
        sharing = Counter((host, gpu) for host, gpu in zip(self.hostnames, self.gpus) if gpu)
        shared = len(self.gpus) == len(self.hostnames) and any(n > 1 for n in sharing.values())
        return "one GPU" if shared else None

    def collectives(self, s):
        """Each bucket's collective in step s, as the ranks recorded it: "reduce-scatter" (--zero-stage 1: an
        all-gather of its parameters followed the update), "all-reduce" (without it, or a bucket too small to shard),
        or None where no rank spent time on it (one rank: no peer to send to)."""
        begin, end = self.bucket_times["comm_start_ms"][:, s], self.bucket_times["comm_end_ms"][:, s]
        gathered = ((self.bucket_times["gather_end_ms"][:, s] > 0).any(axis=0) if self.sharded else
                    np.zeros(len(self.bucket_bytes), bool))
        return [None if not (end[:, k] > begin[:, k]).any() else "reduce-scatter" if gathered[k] else "all-reduce"
                for k in range(len(self.bucket_bytes))]

    def collectives_text(self):
        """What the buckets chart shows of its step's buckets, in words (None: no bucket was communicated)."""
        kinds = set(self.collectives(self.drawn_step))
        words = [w for kind, w in (("reduce-scatter", "reduce-scatter and all-gather"), ("all-reduce", "all-reduce"))
                 if kind in kinds]
        return ", or ".join(words) or None

    def mean(self, name):
        """Steady-state mean per rank, as the summary stores it (0 for a field the file predates; NaN for a mean that
        is not finite, which JSON stores as null)."""
        return np.array([np.nan if rank.get(name, 0.0) is None else float(rank.get(name, 0.0))
                         for rank in self.summary["ranks"]])

    def experiment(self, *ignore):
        """The config without the keys that a sweep varies (and the incidental ones)."""
        return {k: v for k, v in self.config.items() if k not in INCIDENTAL and k not in ignore}


def ranks_text(n):
    return f"{n} rank" if n == 1 else f"{n} ranks"


def oversubscribed_text(runs):
    """What a chart or the page says of its oversubscribed runs: what their ranks took turns on. "" where none was."""
    places = sorted({r.took_turns_on for r in runs if r.oversubscribed})
    if not places:
        return ""
    return f"oversubscribed: the ranks took turns on {' or '.join(places)}: this measures the machine, not DDP"


# The charts over all the files, drawn or not by what the files hold: an earlier call's (the same --out-dir over other
# files) that this call does not draw is removed first, not left to read as these files'. (The page embeds only the
# charts this call draws.)
OVERVIEW_CHARTS = ("throughput", "loss", "update", "bucket_sweep", "predicted_vs_measured", "weak_scaling",
                   "strong_scaling")


def save(fig, out_dir, name, written):
    for ext in ("png", "svg"):
        path = os.path.join(out_dir, f"{name}.{ext}")
        drawn = io.BytesIO()
        fig.savefig(drawn, format=ext, dpi=120, bbox_inches="tight")
        try:
            write_whole(path, drawn.getvalue())
        except OSError as e:
            raise WriteFailed(f"cannot write {path}: {e.strerror}") from None
        written.append(path)
    plt.close(fig)


def size_text(nbytes):
    """Bytes in the largest unit that fits (--bucket-mb is MiB): 7.9 MiB, 512 KiB, 1.5 KiB, 400 B."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            value = nbytes / (1 << shift)
            return (f"{value:.1f}".rstrip("0").rstrip(".") if value < 10 else f"{value:.0f}") + f" {unit}"
    return f"{nbytes} B"


def breakdown_chart(run, out_dir, name, written):
    data, fwd, bwd = run.mean("data_ms"), run.mean("forward_ms"), run.mean("backward_ms")
    hidden = np.minimum(run.mean("hidden_comm_ms"), bwd)  # comm that ran during backward, drawn inside it
    # One rank has no peer: its comm phases are the bookkeeping around collectives of no one, not communication.
    peers = run.world > 1
    hides = peers and bool((hidden > 0).any())
    parts = [("data", data, "#8c6bb1"),
             ("compute (forward + backward" + (", less the hidden part)" if hides else ")"), fwd + bwd - hidden,
              "#4c72b0"),
             ("backward with the all-reduce running alongside (hidden comm)", hidden if hides else None, "#55a868"),
             ("exposed comm", run.mean("exposed_comm_ms") if peers else None, "#c44e52"),
             ("optimizer", run.mean("optimizer_ms"), "#dd8452"),
             ("extra all-reduce", run.mean("extra_comm_ms"), "#937860"),
             ("host work", run.mean("host_work_ms"), "#da8bc3"),
             ("barrier wait", run.mean("barrier_ms"), "#8c8c8c")]
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * run.world + 3), 4))
    ranks = np.arange(run.world)
    bottom = np.zeros(run.world)
    tallest = max(float(run.mean("step_ms").max()), 1e-9)
    for i, (label, values, color) in enumerate(parts):
        if values is None or not (values > 0).any() or (i >= 5 and values.max() < 0.005 * tallest):
            continue  # in the legend only what some rank spent time on; the lab's phases only when they show
        ax.bar(ranks, values, bottom=bottom, color=color, label=label, width=0.6)
        bottom += values
    ax.set_xticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylabel("ms per step (steady-state mean)")
    ax.set_title(f"{run.stem}: where each rank's step goes ({ranks_text(run.world)})"
                 + ("\n" + oversubscribed_text([run]) if run.oversubscribed else ""), fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    save(fig, out_dir, name, written)


def step_times_chart(run, out_dir, name, written):
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = run.first_step + np.arange(run.steps)
    for r in range(run.world):
        ax.plot(steps, run.step_times[r], marker=".", linewidth=1, label=f"rank {r}")
    if run.first_steady > 0:
        ax.axvspan(run.first_step - 0.5, run.first_step + run.first_steady - 0.5, color="0.9", label="warm-up")
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("step time (ms)")
    times = run.step_times
    ax.set_yscale("log" if times.min() > 0 and times.max() > 20 * max(times.min(), 1e-9) else "linear")
    ax.set_title(f"{run.stem}: step time per rank")
    # Outside the axes, as the breakdown's: "best" placement covered the lines, and PNG and SVG placed it apart.
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    save(fig, out_dir, name, written)


GROUP_COLORS = {"weak": "#4c72b0", "strong": "#55a868", "pathology": "#c44e52", "input": "#8172b3",
                "update": "#dd8452", "layout": "#da8bc3", "tokens": "#937860"}
# The lab suite's order of its groups (launcher/suite.cpp), whatever order the files were given in (a shell glob
# sorts them by name); any other group after them, and the files of no case last.
GROUP_ORDER = ["weak", "strong", "pathology", "input", "update", "layout"]


def throughput_chart(runs, out_dir, written):
    """Bars in the suite's group order (weak, strong, pathology, input, update, layout), a gap and a label between
    groups."""
    given = list(dict.fromkeys(r.group for r in runs))
    order = sorted(given, key=lambda g: (g is None, GROUP_ORDER.index(g) if g in GROUP_ORDER else len(GROUP_ORDER),
                                         given.index(g)))
    x, labels, positions, pos = [], [], {}, 0.0
    for g in order:
        members = [r for r in runs if r.group == g]
        positions[g] = (pos, pos + len(members) - 1)
        for r in members:
            x.append((pos, r))
            labels.append(r.stem)
            pos += 1
        pos += 0.6
    # Runs of sequences compare by the tokens they learn from (padding excluded), as the token suite's table ranks
    # them: samples/s would favour the case that packs fewer tokens into its samples.
    tokens = all(r.useful_tokens_per_s > 0 for r in runs)
    rate = [r.useful_tokens_per_s if tokens else r.samples_per_s for _, r in x]
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(runs) + 2), 4.5))
    for (p, r), value in zip(x, rate):
        # Blue where no file is a case; beside the suite's groups, grey for a file of none.
        color = GROUP_COLORS.get(r.group, "#4c72b0") if r.group or order == [None] else "0.6"
        bar = ax.bar(p, value, color=color, hatch="//" if r.oversubscribed else None, edgecolor="white")
        ax.bar_label(bar, [f"{value:,.0f}"], fontsize=7)
    ax.set_xticks([p for p, _ in x], labels, rotation=30, ha="right")
    if order != [None]:
        for g, (lo, hi) in positions.items():
            ax.annotate(g or "not in the suite", ((lo + hi) / 2, 1.0), xycoords=("data", "axes fraction"),
                        xytext=(0, 4), textcoords="offset points", ha="center", fontsize=9, weight="bold")
    if any(r.oversubscribed for r in runs):
        ax.legend(handles=[Patch(facecolor="0.7", hatch="//", edgecolor="white", label=oversubscribed_text(runs))],
                  fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.2))
    ax.set_yscale("log" if max(rate) > 50 * max(min(rate), 1e-9) else "linear")
    ax.set_ylabel("useful tokens/s (padding excluded; slowest rank's step)" if tokens
                  else "samples/s (global batch / slowest rank's step)")
    ax.set_title("throughput", pad=18)
    save(fig, out_dir, "throughput", written)


# Each line of the loss chart its own dash and marker as well as its colour: lines of runs that agree closely (another
# world size's summation order) lie on one another, and the one drawn last would hide the others.
LINE_STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1)), "v"), ((0, (1, 3)), "P")]


def loss_series(run):
    """The run's global-batch loss per step above its validation loss (NaN after the steps that took none)."""
    return np.vstack([run.loss, np.full(run.steps, np.nan) if run.val_loss is None else run.val_loss])


def loss_chart(runs, out_dir, written):
    fig, ax = plt.subplots(figsize=(7, 4))
    # Runs whose losses (and validation losses) agree to 6 digits are one line, named after all of them: the lab's
    # pathologies change timing, not math, and DDP's world sizes of one global batch differ by rounding alone.
    groups = same_series_groups([(r.first_step, loss_series(r), r.stem) for r in runs], 1e-6)
    palette = plt.get_cmap("tab10" if len(groups) <= 10 else "tab20")
    for i, (first_step, (loss, val_loss), names, exact) in enumerate(groups):
        steps = first_step + np.arange(len(loss))
        color, (dashes, marker) = palette(i % palette.N), LINE_STYLES[i % len(LINE_STYLES)]
        ax.plot(steps, loss, linestyle=dashes, marker=marker, markersize=3.5, linewidth=1.2, color=color,
                label=textwrap.fill(group_name(names, exact, most_named=len(names)), 60))
        taken = np.isfinite(val_loss)  # after the steps that validated (--val-data); the same on every rank
        if taken.any():
            ax.plot(steps[taken], val_loss[taken], linestyle=dashes, marker="o", markersize=7, markerfacecolor="none",
                    linewidth=0.8, color=color, label=textwrap.fill(f"{names[0]}: validation loss (--val-data)", 60))
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("loss on the global batch")
    ax.set_title("loss per case" if len(runs) > 1 else "loss per step")
    ax.legend(fontsize=7, ncol=2)
    save(fig, out_dir, "loss", written)


def same_series_groups(series, rtol):
    """(first step, values, names) triples grouped where the values agree to rtol (0: bit for bit): [first step,
    values, names, exact], exact saying whether every member is bit for bit the first's."""
    groups = []
    for first_step, values, name in series:
        for g in groups:
            if g[0] == first_step and g[1].shape == values.shape and np.allclose(g[1], values, rtol=rtol, atol=0,
                                                                                   equal_nan=True):
                g[2].append(name)
                g[3] = g[3] and np.array_equal(g[1], values, equal_nan=True)
                break
        else:
            groups.append([first_step, values, [name], True])
    return groups


def group_name(names, exact, most_named=3):
    if len(names) == 1:
        return names[0]
    return (f"{len(names)} runs" if len(names) > most_named else ", ".join(names)) + (" (identical)" if exact else
                                                                                      " (the same to 6 digits)")


def update_chart(runs, out_dir, written):
    """The learning rate (left axis) and the gradient norm against its clipping cap (right axis), step by step, for
    the runs whose rate varies (--lr-warmup, --lr-schedule) or that clip (--grad-clip); nothing when none does. Runs
    whose series agree share a line: a suite's cases differ in timing, not math (the rates bit for bit; the norms
    of other summation orders, ZeRO-1's or another world size's, to rounding)."""
    rates = same_series_groups([(r.first_step, r.lr, r.stem) for r in runs
                                if r.lr is not None and len(r.lr) > 0 and np.ptp(r.lr) > 0], 0)
    clipped = [r for r in runs if r.config.get("grad_clip", 0) > 0 and r.grad_norm is not None]
    norms = same_series_groups([(r.first_step, r.grad_norm, r.stem) for r in clipped], 1e-6)
    if not rates and not norms:
        return
    fig, ax = plt.subplots(figsize=(7, 4.6))
    norm_ax = (ax.twinx() if rates else ax) if norms else None  # the rate on the left where it varies
    for i, (first_step, values, names, exact) in enumerate(rates):
        ax.plot(first_step + np.arange(len(values)), values, linewidth=1.5, color=plt.get_cmap("tab10")(i % 10),
                label=f"learning rate: {group_name(names, exact)}")
    for i, (first_step, values, names, exact) in enumerate(norms):
        taken = values > 0  # a skipped step takes no norm
        norm_ax.plot((first_step + np.arange(len(values)))[taken], values[taken], linestyle=":", marker=".",
                     linewidth=1, color=plt.get_cmap("Dark2")(i % 8), label=f"gradient norm: {group_name(names, exact)}")
    for cap in sorted({r.config["grad_clip"] for r in clipped}):
        norm_ax.axhline(cap, linestyle="--", linewidth=1, color="0.45", label=f"--grad-clip {cap:g}: above it, clipped")
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    if rates:
        ax.set_ylabel("learning rate")
    handles, labels = ax.get_legend_handles_labels()
    if norm_ax is not None:
        norm_ax.set_ylabel("gradient norm (all-reduced, before clipping)")
        norm_ax.set_ylim(bottom=0)
        if norm_ax is not ax:
            more = norm_ax.get_legend_handles_labels()
            handles, labels = handles + more[0], labels + more[1]
    ax.set_title("the update: " + " and ".join(["learning rate"] * bool(rates) + ["gradient norm"] * bool(norms)) +
                 " per step")
    # Below the axes: two curves on two scales leave no corner of the plot free for it.
    ax.legend(handles, [textwrap.shorten(label, 70) for label in labels], fontsize=7, loc="upper center",
              bbox_to_anchor=(0.5, -0.14), ncol=1, frameon=False)
    fig.tight_layout()
    save(fig, out_dir, "update", written)


def buckets_chart(run, out_dir, name, written):
    """The median steady step (Run.drawn_step), per rank: forward and backward on one row, each bucket's all-reduce on
    the row below it, a tick where the bucket became ready. What Perfetto shows, as a picture. With --zero-stage 1 the
    row below holds each bucket's reduce-scatter, then, hatched, its all-gather after the update, which the row above
    then shows (a bucket too small to shard: its all-reduce). One rank communicates nothing: its row below holds the
    ticks alone."""
    s = run.drawn_step
    nb = len(run.bucket_bytes)
    shades = plt.get_cmap("YlOrRd")

    def colors(k):  # light to dark in ready order, however many buckets: none of the phases' blues and greys
        return shades(0.35 + 0.6 * k / max(nb - 1, 1))
    kinds = run.collectives(s)
    ticked = False
    fig, ax = plt.subplots(figsize=(9, 1.0 + 1.1 * run.world))
    # One origin for every rank, the first rank's start, on the run file's common clock: a collective then ends at
    # one time on every row, and a rank that starts late is drawn late.
    t0 = min(run.start[r, s] for r in range(run.world))
    for r in range(run.world):
        y_compute, y_comm = 2 * r, 2 * r + 1  # rank 0 on top (the axis is inverted)
        fwd0 = run.start[r, s] - t0 + run.phases["data_ms"][r, s]
        bwd0 = fwd0 + run.phases["forward_ms"][r, s]
        ax.broken_barh([(fwd0, run.phases["forward_ms"][r, s])], (y_compute - 0.35, 0.7), color="#8fb0d9")
        ax.broken_barh([(bwd0, run.phases["backward_ms"][r, s])], (y_compute - 0.35, 0.7), color="#4c72b0")
        if run.sharded:
            opt0 = bwd0 + run.phases["backward_ms"][r, s] + run.phases["exposed_comm_ms"][r, s]
            ax.broken_barh([(opt0, run.phases["optimizer_ms"][r, s])], (y_compute - 0.35, 0.7), color="#bbbbbb")
        for k in range(nb):
            if run.sharded and run.bucket_times["gather_end_ms"][r, s, k] > 0:
                g0, g1 = (run.bucket_times[n][r, s, k] - t0 for n in ("gather_start_ms", "gather_end_ms"))
                ax.broken_barh([(g0, g1 - g0)], (y_comm - 0.35, 0.7), facecolor="white", edgecolor=colors(k),
                               hatch="////", linewidth=1)
            ready, begin, end = (run.bucket_times[n][r, s, k] for n in ("ready_ms", "comm_start_ms", "comm_end_ms"))
            if begin <= 0 and end <= 0:
                continue  # never communicated (nothing recorded)
            ready, begin, end = ready - t0, begin - t0, end - t0
            if end > begin:  # one rank records each bucket's collective with nothing in it: no bar
                ax.broken_barh([(begin, end - begin)], (y_comm - 0.35, 0.7), facecolor=colors(k), edgecolor="white",
                               linewidth=0.5)
            ax.plot([ready, ready], [y_comm - 0.45, y_comm + 0.45], color="black", linewidth=1)
            ticked = True
    ax.set_yticks([v for r in range(run.world) for v in (2 * r, 2 * r + 1)],
                  [t for r in range(run.world) for t in (f"rank {r} compute", f"rank {r} comm")])
    ax.invert_yaxis()
    ax.set_xlabel(f"ms since the first rank started step {run.first_step + s}")
    handles = [Patch(color="#8fb0d9", label="forward"), Patch(color="#4c72b0", label="backward")]
    if run.sharded:
        handles.append(Patch(color="#bbbbbb", label="optimizer (update of the owned share)"))
    handles += bucket_legend([k for k in range(nb) if kinds[k]], run.bucket_bytes, colors, kinds)
    if "reduce-scatter" in kinds:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="////",
                             label="its all-gather of the parameters"))
    if ticked:
        handles.append(plt.Line2D([], [], color="black", label="bucket ready (its last gradient final)"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    words = run.collectives_text()
    ax.set_title(f"{run.stem}: " + (f"forward, backward and each bucket's {words}, step {run.first_step + s} (the steady "
                                    f"steps' median; {ranks_text(run.world)})" if words else
                                    f"forward and backward, step {run.first_step + s} ({ranks_text(run.world)}: no bucket "
                                    f"communicated)") + "\n" + bucket_caps_text(run.config), fontsize=10)
    save(fig, out_dir, name, written)


def bucket_caps_text(config):
    """The caps the buckets were cut at, as train's header names them (an older file's missing keys: the defaults
    then)."""
    def cap(key, default):
        value = config.get(key, default)
        return value if value == "auto" else f"{value:g} MiB"
    return (f"buckets: cap {cap('bucket_mb', 25)}, first {cap('first_bucket_mb', 'auto')}, "
            f"last {cap('last_bucket_mb', 1)}, {config.get('bucket_rule', 'within')}")


def bucket_legend(buckets, sizes, colors, kinds, most_listed=10):
    """A legend entry per bucket drawn, named by its collective (kinds[k]); past most_listed, the first and the last,
    and one line for those between."""
    def entry(k):
        return Patch(color=colors(k), label=f"bucket {k} {kinds[k]} ({size_text(sizes[k])})")
    if len(buckets) <= most_listed:
        return [entry(k) for k in buckets]
    between = [sizes[k] for k in buckets[1:-1]]
    return [entry(buckets[0]),
            Patch(color="none", label=f"... {len(between)} more, darker in ready order "
                                      f"({size_text(min(between))} to {size_text(max(between))})"),
            entry(buckets[-1])]


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


LINK_ORDER = ["none", "100gbe-ib", "25gbe", "10gbe"]  # fastest first, as a reader compares them


def read_sweep(path):
    sweep = read_json(path, "sweep summary")
    checked(sweep, SWEEP_SHAPE, f"the sweep summary {path}")
    if "predicted_from" in sweep or any("predicted_step_ms" in p for p in sweep["points"]):
        checked(sweep, PREDICTION_SHAPE, f"the sweep summary {path}")
        rec = sweep["recommended"]
        if not any((p["bucket_mb"], p["overlap"]) == (rec["bucket_mb"], rec["overlap"]) for p in sweep["points"]):
            raise BadInput(f"cannot read the sweep summary {path}: recommended is none of its points")
    return sweep


def predicted_chart(sweeps, out_dir, written):
    """One panel per link: each overlap setting's measured step time (solid) and predicted one (dashed, hollow
    markers where the prediction extrapolates) over bucket size, the model's recommendation starred on its measured
    line, and the run the predictions come from as a black diamond (where its cap is off the grid, the panel's title
    names it and its time)."""
    sweeps = sorted(sweeps, key=lambda s: (LINK_ORDER.index(s["link"]) if s["link"] in LINK_ORDER else 99, s["link"]))
    colors = {"on": "#4c72b0", "off": "#dd8452"}
    fig, axes = plt.subplots(1, len(sweeps), figsize=(4.2 * len(sweeps) + 1, 4.2), squeeze=False)
    diamonds = False
    for ax, sweep in zip(axes[0], sweeps):
        sizes = sorted({p["bucket_mb"] for p in sweep["points"]})
        x = {b: i for i, b in enumerate(sizes)}
        for overlap in ("on", "off"):
            group = sorted((p for p in sweep["points"] if p["overlap"] == overlap), key=lambda p: p["bucket_mb"])
            if not group:
                continue
            xs = [x[p["bucket_mb"]] for p in group]
            ax.plot(xs, [p["step_ms"] for p in group], "-o", color=colors[overlap], markersize=5)
            ax.plot(xs, [p["predicted_step_ms"] for p in group], "--", color=colors[overlap])
            for xi, p in zip(xs, group):
                ax.plot(xi, p["predicted_step_ms"], "s", markersize=5, color=colors[overlap],
                        markerfacecolor="white" if p.get("extrapolated") else colors[overlap])
        source = sweep.get("predicted_from")
        off_grid = ""
        if source and source["bucket_mb"] in x:  # the runs the predictions come from: their noise is theirs
            for run in source.get("rounds", [source]):
                ax.plot(x[source["bucket_mb"]], run["step_ms"], "D", markersize=7, color="black", zorder=4)
            diamonds = True
        elif source:  # a cap this panel has no place for: where its runs lie, in words
            measured = sorted(run["step_ms"] for run in source.get("rounds", [source]))
            off_grid = "\n" + textwrap.fill(
                f"predicted from {len(measured)} runs at {source['bucket_mb']:g} MiB (off the grid), measured "
                f"{measured[0]:.2f}-{measured[-1]:.2f} ms" if len(measured) > 1 else
                f"predicted from a run at {source['bucket_mb']:g} MiB (off the grid), measured {measured[0]:.2f} ms",
                52)
        rec = sweep.get("recommended")
        if rec:  # on its measured line: where the recommendation landed against the other cells
            cell = next(p for p in sweep["points"]
                        if p["bucket_mb"] == rec["bucket_mb"] and p["overlap"] == rec["overlap"])
            ax.plot(x[rec["bucket_mb"]], cell["step_ms"], "*", markersize=16, color="#c44e52", markeredgecolor="black",
                    zorder=5)
        ax.set_xticks(range(len(sizes)), ["per param" if b == 0 else f"{b:g}" for b in sizes])
        ax.set_xlabel("bucket cap (MiB)")
        ax.set_title(f"link {sweep['link']}: |error| median {sweep['median_abs_error_pct']:.1f}%, "
                     f"max {sweep['max_abs_error_pct']:.1f}%{off_grid}", fontsize=9)
        ax.grid(axis="y", color="0.9")
    axes[0][0].set_ylabel("step time, slowest rank (ms)")
    handles = [plt.Line2D([], [], color="0.3", marker="o", markersize=5, label="measured"),
               plt.Line2D([], [], color="0.3", linestyle="--", marker="s", markersize=5, label="predicted"),
               plt.Line2D([], [], color="0.3", linestyle="--", marker="s", markersize=5, markerfacecolor="white",
                          label="predicted, extrapolated"),
               Patch(color=colors["on"], label="overlap on"), Patch(color=colors["off"], label="overlap off"),
               plt.Line2D([], [], linestyle="", marker="*", markersize=14, color="#c44e52", markeredgecolor="black",
                          label="recommended by the model, as measured")]
    if diamonds:
        handles.append(plt.Line2D([], [], linestyle="", marker="D", markersize=7, color="black",
                                  label="measured: the run(s) predicted from"))
    fig.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 0.9))
    first = sweeps[0]
    source = first.get("predicted_from", {})
    rounds = len(source.get("rounds", [])) if source else 0
    setting = f"--bucket-mb {source.get('bucket_mb', 0):g} --overlap {source.get('overlap', '?')}"
    title = f"{first.get('model', '')}, {ranks_text(first['world_size'])}: predicted against measured step time"
    fig.suptitle(f"{title}\n" +
                 (f"each of the {rounds} rounds predicted from its own run at {setting}; lines: the rounds' medians"
                  if rounds > 1 else f"each link's predictions from one run at {setting}"), fontsize=10)
    fig.tight_layout()
    save(fig, out_dir, "predicted_vs_measured", written)


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
    efficiency = [100 * t / i for t, i in zip(thr, ideal)]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(worlds, ideal, "--", color="0.5", label=f"ideal (linear from {ranks_text(worlds[0])})")
    ax1.plot(worlds, thr, marker="o", label="measured")
    ax1.set_ylabel("samples/s")
    ax1.set_ylim(bottom=0)
    ax2.axhline(100, linestyle="--", color="0.5", label="ideal (100%)")
    ax2.plot(worlds, efficiency, marker="o", label="measured")
    for w, e in zip(worlds, efficiency):
        ax2.annotate(f"{e:.0f}%", (w, e), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax2.set_ylabel("efficiency (samples/s / ideal, %)")
    ax2.set_ylim(0, max(110, max(efficiency) + 10))
    crowded = [r for r in runs if r.oversubscribed]
    for ax in (ax1, ax2):
        ax.set_xticks(worlds)
        ax.set_xlabel("ranks")
        if crowded:
            ax.axvspan(min(r.world for r in crowded) - 0.5, max(worlds) + 0.5, color="#f4cccc", alpha=0.5,
                       label="oversubscribed")
        ax.legend(fontsize=8)
    what = "same per-rank batch" if kind == "weak" else "same global batch"
    fig.suptitle(f"{kind} scaling ({what})" + ("\n" + oversubscribed_text(crowded) if crowded else ""), fontsize=10)
    save(fig, out_dir, f"{kind}_scaling", written)


def best_of_sweep(runs, sweeps):
    """The run of the sweep's best setting, whose buckets stand for the sweep's (none without a sweep summary)."""
    for path, sweep in sweeps:
        best = sweep.get("best", {})
        setting = (best.get("bucket_mb"), best.get("overlap"))
        point_of = entries_by_run(runs, sweep["points"], path)
        best_runs = [r for r in runs if point_of[r.path] and
                     (point_of[r.path]["bucket_mb"], point_of[r.path]["overlap"]) == setting]
        if best_runs:
            return best_runs[:1]
    return []


def entries_by_run(runs, entries, summary_path):
    """Each run's entry in a suite's or sweep's summary.json (a case, a point; None where it has none), by run file.
    The summary holds each path as the suite was given it, often relative to the folder it ran in: a path is taken
    as written, then relative to the summary's folder, then as the file of that name beside the summary (a results
    folder looked at from elsewhere, moved or copied)."""
    folder = os.path.dirname(os.path.abspath(summary_path))
    index = {}
    for where in (lambda p: p, lambda p: os.path.join(folder, p), lambda p: os.path.join(folder, os.path.basename(p))):
        for entry in entries:
            index.setdefault(os.path.realpath(where(entry["run_file"])), entry)
    return {r.path: index.get(os.path.realpath(r.path)) for r in runs}


def name_uniquely(runs):
    """Runs of one name (a.h5 and other/a.h5) become a, a_2, ...: each name keys its charts, its page section and its
    table row."""
    taken = set()
    for r in runs:
        name, k = r.stem, 1
        while name in taken:  # a.h5, other/a.h5 and a_2.h5 become a, a_2 and a_2_2
            k += 1
            name = f"{r.stem}_{k}"
        r.stem = name
        taken.add(name)


def read_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise BadInput(f"cannot read the {what} {path}: {e}") from None


# What charts.py and the page read of each JSON input (written by ddplab sweep, suite and report --json), checked
# whole when it is read, so that a malformed file is refused by name rather than met halfway through the drawing. A
# shape is a type or a tuple of them, {key: shape} ("key?": optional), or [shape], a list of such.
NUMBER = (int, float)
SETTING = {"bucket_mb": NUMBER, "overlap": str, "step_ms": NUMBER}
SWEEP_SHAPE = {"points": [{**SETTING, "run_file": str, "hidden_fraction": (*NUMBER, type(None)),
                           "predicted_step_ms?": NUMBER, "error_pct?": NUMBER, "summary": {"samples_per_s": NUMBER, "ranks": [dict]}}],
               "link": str, "world_size": int, "best": SETTING, "noise_pct?": (*NUMBER, type(None)),
               "not_told_apart?": [SETTING]}
# sweep --predict: the model's error over the points, its recommendation and the runs it predicted from.
PREDICTION_SHAPE = {"median_abs_error_pct": NUMBER, "max_abs_error_pct": NUMBER,
                    "recommended": {**SETTING, "predicted_step_ms": NUMBER, "vs_best_measured_pct": NUMBER},
                    "predicted_from": {**SETTING, "run_file": str, "rounds?": [{"step_ms": NUMBER}]}}
SUITE_SHAPE = {"cases": [{"run_file": str, "case?": str, "group?": str, "blame?": [str],
                          "efficiency?": (*NUMBER, type(None)), "vs_baseline?": (*NUMBER, type(None)),
                          "summary?": {"useful_tokens_per_s?": NUMBER}}],
               "suite?": str, "world_size?": int, "loss_identical?": bool}
REPORT_SHAPE = [{"run_file": str, "blame?": [{"text": str}]}]
JSON_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
              bool: "true or false", type(None): "null"}


def checked(value, shape, what):
    """Refuses (BadInput, naming what and where in it) a JSON value that does not have the shape."""
    def mismatch(value, shape, where):
        if isinstance(shape, dict):
            if not isinstance(value, dict):
                return f"{where or 'the file'} is not {JSON_NAMES[dict]}"
            for key, inner in shape.items():
                name = key.rstrip("?")
                inside = f"{where}.{name}" if where else name
                if name in value:
                    wrong = mismatch(value[name], inner, inside)
                    if wrong:
                        return wrong
                elif not key.endswith("?"):
                    return f"{inside} is missing"
            return None
        if isinstance(shape, list):
            if not isinstance(value, list):
                return f"{where or 'the file'} is not {JSON_NAMES[list]}"
            return next(filter(None, (mismatch(item, shape[0], f"{where}[{i}]") for i, item in enumerate(value))),
                        None)
        kinds = shape if isinstance(shape, tuple) else (shape,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = [JSON_NAMES[k] for k in kinds if not (k is int and float in kinds)]  # a number may be whole
            return f"{where or 'the file'} is not {' or '.join(names)}"
        return None

    wrong = mismatch(value, shape, "")
    if wrong:
        raise BadInput(f"cannot read {what}: {wrong}")
    return value


def apply_suite(runs, summary_path):
    """Each run's case of the suite's summary.json (its group, its blame), matched by run file; returns the summary.
    Files of which none is a case are refused: their page would silently lose the suite's groups, scaling and blame."""
    summary = checked(read_json(summary_path, "suite summary"), SUITE_SHAPE, f"the suite summary {summary_path}")
    case_of = entries_by_run(runs, summary["cases"], summary_path)
    if not any(case_of.values()):
        raise BadInput(f"--suite {summary_path}: none of the run files is one of its cases (each case's run_file "
                       f"looked for as written, relative to the summary's folder and beside the summary)")
    for r in runs:
        r.suite_case = case_of[r.path]
        if r.suite_case:
            r.group = r.suite_case.get("group")
    return summary


def check_sweep_files(runs, sweeps):
    """Run files given with --sweep must include its points: else the page would silently lack the best point's
    buckets."""
    if not (runs and sweeps):
        return
    if not any(p for path, sweep in sweeps for p in entries_by_run(runs, sweep["points"], path).values()):
        raise BadInput(f"--sweep {', '.join(path for path, _ in sweeps)}: none of the run files is one of its points "
                       f"(each point's run_file looked for as written, relative to the summary's folder and beside "
                       f"the summary)")


def check_page_path(page, out_dir):
    """The page's folder exists (or is OUT_DIR, made before the charts) and takes files, and the page is no folder:
    checked before any chart is drawn."""
    folder = os.path.dirname(os.path.abspath(page))
    if os.path.isdir(page):
        raise BadInput(f"--page {page} is a folder")
    if folder == os.path.abspath(out_dir) and not os.path.exists(folder):
        return
    if not os.path.isdir(folder):
        raise BadInput(f"--page {page}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise BadInput(f"--page {page}: folder {folder} is not writable")


def main(argv):
    usage = ("usage: charts.py OUT_DIR [--suite SUMMARY.json] [--sweep SUMMARY.json ...] "
             "[--page PAGE.html [--report REPORT.json]] [FILE.h5 ...]")
    args, options, sweep_paths, paths = argv[2:], {}, [], []
    while args:
        if args[0] in ("--suite", "--sweep", "--page", "--report"):
            if len(args) < 2 or args[0] in options:
                raise BadInput(usage)
            if args[0] == "--sweep":
                sweep_paths.append(args[1])
            else:
                options[args[0]] = args[1]
            args = args[2:]
        else:
            paths.append(args.pop(0))
    suite, page = options.get("--suite"), options.get("--page")
    if len(argv) < 2 or not (paths or sweep_paths) or ("--report" in options and not page) or (page and not paths):
        raise BadInput(usage)
    out_dir = argv[1]
    if page:  # beside this script; it needs jinja2, checked before any chart is drawn
        try:
            from report_page import write_page
        except ImportError as e:
            raise BadInput(f"--page needs {e.name} (Debian's python3-jinja2)") from None
        check_page_path(page, out_dir)
    runs = [Run(p) for p in paths]  # all readable before anything is written
    name_uniquely(runs)
    sweeps = [(p, read_sweep(p)) for p in sweep_paths]
    check_sweep_files(runs, sweeps)
    suite_summary = apply_suite(runs, suite) if suite else None
    reports = checked(read_json(options["--report"], "report"), REPORT_SHAPE, f"the report {options['--report']}") \
        if "--report" in options else None
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:  # a full disk is no mistake of the command line
        failed = WriteFailed if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS) else BadInput
        raise failed(f"cannot create output folder {out_dir}: {e.strerror}") from None
    if not os.access(out_dir, os.W_OK):
        raise BadInput(f"output folder {out_dir} is not writable")
    for name in OVERVIEW_CHARTS:
        for ext in ("png", "svg"):
            stale = os.path.join(out_dir, f"{name}.{ext}")
            if os.path.exists(stale):
                os.unlink(stale)
    written = []
    for run in runs:
        breakdown_chart(run, out_dir, f"{run.stem}_breakdown", written)
        step_times_chart(run, out_dir, f"{run.stem}_step_times", written)
    weak = [r for r in runs if r.group == "weak"]
    gantt = [max(weak, key=lambda r: r.world)] if weak else runs if len(runs) == 1 else best_of_sweep(runs, sweeps)
    gantt += [r for r in runs if r.group == "layout"]  # another bucket layout, beside the baseline's
    for run in gantt:
        buckets_chart(run, out_dir, f"{run.stem}_buckets", written)
    update_chart(runs, out_dir, written)
    if len(runs) > 1 or any(r.val_loss is not None for r in runs):
        loss_chart(runs, out_dir, written)
    if len(runs) > 1:
        throughput_chart(runs, out_dir, written)
        if is_bucket_sweep(runs):
            bucket_sweep_chart(runs, out_dir, written)
        for kind in ("weak", "strong"):
            group = [r for r in runs if r.group == kind]
            if len(group) >= 2:
                scaling_chart(group, kind, out_dir, written)
        kind = scaling_kind(runs)
        if kind:
            scaling_chart(runs, kind, out_dir, written)
    predicted = [s for _, s in sweeps if s["points"] and all("predicted_step_ms" in p for p in s["points"])]
    if predicted:
        predicted_chart(predicted, out_dir, written)
    if page:
        try:
            written.append(write_page(page, runs, written, oversubscribed_text(runs), suite_summary,
                                      [s for _, s in sweeps], reports))
        except OSError as e:  # the disk filled up, or the folder went away, while the charts were drawn
            raise WriteFailed(f"cannot write the page {page}: {e.strerror}") from None
    for path in written:
        print(path)


if __name__ == "__main__":
    # A stop unwinds, so that a file being written whole removes its temporary (whole_file.py) instead of leaving it
    # beside the user's files; the stops after the first (ddplab passes on what the terminal also sends) are ignored,
    # so as not to cut that removal short.
    STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def stop(number, frame):
        for s in STOPS:
            signal.signal(s, signal.SIG_IGN)
        sys.exit(128 + number)

    for s in STOPS:
        signal.signal(s, stop)
    try:
        main(sys.argv)
    except (BadInput, WriteFailed) as e:
        print(f"charts.py: error: {e}", file=sys.stderr)
        sys.exit(5 if isinstance(e, WriteFailed) else 2)
    except (KeyError, ValueError) as e:
        print(f"charts.py: error: unexpected run file contents ({e})", file=sys.stderr)
        sys.exit(2)
