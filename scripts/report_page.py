"""The run as one page: a self-contained HTML file (charts embedded as SVG, no script, nothing fetched) from the run
files, the suite's or sweep's summary.json, the blame lines and the charts that scripts/charts.py has just drawn.

Called by charts.py (`--page PAGE.html`), which `ddplab suite`, `sweep`, `train` and `report --html` run. The page
follows the order a reader asks in: the setup, the table, scaling against the ideal, one section per pathology
(its charts and blame), the buckets of one step, the prediction and recommendation, the timeline. What does not
apply reads "n/a" or "—", never 0. Rendered by Jinja2 (Debian's python3-jinja2) from report_page.html.j2 beside
this file, autoescaped.
"""
import base64
import json
import os

import jinja2

from whole_file import write_whole

NA = "—"  # a cell that does not apply (no reference case, no tokens, not predicted)
PERFETTO = "https://ui.perfetto.dev"


def fmt(value, spec=".2f", suffix=""):
    """A number as the tables print it, or NA where the value does not apply (None)."""
    return NA if value is None else f"{value:{spec}}{suffix}"


def chart(drawn, name, caption):
    """One chart that this call drew as an embedded SVG (None when it was not drawn: one an earlier call left in the
    folder is of other files, or of these before they changed)."""
    path = drawn.get(name)
    if path is None:
        return None
    with open(path, "rb") as f:
        data = base64.b64encode(f.read()).decode("ascii")
    return {"name": name, "caption": caption, "uri": f"data:image/svg+xml;base64,{data}"}


def charts_of(drawn, *named):
    return [c for c in (chart(drawn, name, caption) for name, caption in named) if c]


def mean_over_ranks(run, name):
    return float(run.mean(name).mean())


def setup_rows(runs):
    """Machine, CPU and BLAS kernels, GPU, MPI: as the first run file recorded them (the others of one launch ran on
    the same machine; a differing value is listed too); the build and the command line of each run where they
    differ, and when the runs started."""
    def values(key):
        return list(dict.fromkeys(str(r.attrs.get(key, "")) for r in runs if r.attrs.get(key, "") != ""))

    hosts = {}  # of the run with the most ranks: a suite's first case may run on one of them
    for h in max(runs, key=lambda r: len(r.hostnames)).hostnames:
        hosts[h] = hosts.get(h, 0) + 1
    gpus = sorted({g for r in runs for g in r.gpus if g})
    rows = [("status", status_text(runs)),
            ("hosts", ", ".join(f"{h} ({n} rank{'s' if n > 1 else ''})" for h, n in hosts.items())),
            ("cores on rank 0's host", ", ".join(values("host_cores")) or "n/a (not recorded)"),
            ("BLAS", "; ".join(values("blas")) or "n/a"),
            ("BLAS kernels", "; ".join(values("blas_kernels")) or "n/a (not recorded)"),
            ("device", ", ".join(values("device")) or "cpu"),
            ("GPUs", ", ".join(gpus) if gpus else "n/a (CPU run)"),
            ("CUDA", "; ".join(values("cuda")) or "n/a"),
            ("MPI", "; ".join(values("mpi_library")) or "n/a"),
            ("transport", "; ".join(values("transport")) or "n/a (not recorded)"),
            ("HDF5", ", ".join(values("hdf5_version")) or "n/a"),
            ("ddplab", per_run(runs, lambda r: f"{r.attrs.get('ddplab_version', 'n/a')} "
                                               f"({r.attrs.get('git_commit', 'commit not recorded')})")),
            ("started (UTC)", started_text(sorted(str(r.attrs["start_time_utc"]) for r in runs
                                                  if r.attrs.get("start_time_utc", "") != ""))),
            ("command line", folded(per_run(runs, lambda r: str(r.attrs.get("command_line", "n/a"))),
                                    "command lines"))]
    return rows


def per_run(runs, text_of):
    """The runs' one value, or where they differ, each value after the runs that have it: a build or a command line
    that differs is the first thing to know when comparing their times."""
    holders = {}
    for r in runs:
        holders.setdefault(text_of(r), []).append(r.stem)
    if len(holders) == 1:
        return next(iter(holders))
    return [f"{', '.join(names)}: {value}" for value, names in holders.items()]


def folded(value, what):
    """A list of long values behind a summary that says they vary (the template folds it); one value as it is."""
    return value if isinstance(value, str) else {"summary": f"varies: {len(value)} {what}", "lines": value}


def started_text(times):
    """One run's start, or the first and the last of several (ISO 8601 UTC: sorted as text)."""
    if not times:
        return "n/a"
    return times[0] if times[0] == times[-1] else f"{times[0]} to {times[-1]} ({len(times)} runs)"


def status_lines(run):
    """How the run went, as `ddplab report` says it: why it stopped early (or that the file is a snapshot of a run in
    progress) and which steps the file holds, the steps it skipped, how often it clipped."""
    lines = [run.stop_reason] if run.stop_reason else []
    planned, last = int(run.config.get("steps", 0)), run.first_step + run.steps - 1
    if last + 1 < planned:
        lines.append(f"steps {run.first_step}-{last} of {planned} recorded: every figure here is of those")
    summary = run.summary
    if summary.get("skipped_steps", 0) > 0:
        skipped = summary["skipped_steps"]
        lines.append(f"{skipped} step{'s' if skipped > 1 else ''} skipped, the first at step "
                     f"{summary['first_skipped_step']} (--skip-nonfinite: a non-finite loss or gradient, no update)")
    if run.config.get("grad_clip", 0) > 0:
        lines.append(f"clipped to {run.config['grad_clip']:g} in {summary.get('clipped_steps', 0)} of "
                     f"{summary['steps']} steps (--grad-clip)")
    return lines


def status_text(runs):
    """The setup's status row: each run's status lines (named when there are several), or that every run completed."""
    if len(runs) == 1:
        return status_lines(runs[0]) or ["complete"]
    return [f"{r.stem}: {'; '.join(lines)}" for r in runs for lines in [status_lines(r)] if lines] or \
        ["every run complete"]


def config_rows(runs):
    """Every setting of the first run, and for a setting the runs differ in, each run's value."""
    keys = sorted({k for r in runs for k in r.config} - {"out", "force"})
    rows = []
    for k in keys:
        seen = list(dict.fromkeys(json.dumps(r.config.get(k)) for r in runs))
        rows.append((k, seen[0] if len(seen) == 1 else "varies: " + ", ".join(seen)))
    return rows


RUN_HEADERS = ["run", "ws", "gbatch", "step_ms", "samples/s", "useful tok/s", "spread_ms", "data_ms", "comp_ms",
               "optim_ms", "exposed_ms", "hidden%", "final loss", "val loss"]


def loss_text(loss):
    """The summary stores a loss that is not finite as null (JSON has no NaN)."""
    return "not finite" if loss is None else fmt(float(loss), ".4f")


def val_loss_text(summary):
    """The last validation loss (--val-data) and the step after which it was taken; NA without one."""
    step = summary.get("final_val_step")
    return NA if step is None else f"{loss_text(summary.get('final_val_loss'))} (step {step})"


def run_row(run):
    fwd_bwd = mean_over_ranks(run, "forward_ms") + mean_over_ranks(run, "backward_ms")
    tokens = run.useful_tokens_per_s if run.useful_tokens_per_s > 0 else None
    hidden = mean_over_ranks(run, "hidden_fraction")
    peers = run.world > 1  # one rank: no spread across ranks, no all-reduce to expose or hide
    return [run.stem, str(run.world) + ("*" if run.oversubscribed else ""), str(run.global_batch),
            fmt(run.step_ms), fmt(run.samples_per_s, ",.0f"), fmt(tokens, ",.0f"),
            fmt(float(run.summary["mean_spread_ms"]) if peers else None), fmt(mean_over_ranks(run, "data_ms")),
            fmt(fwd_bwd), fmt(mean_over_ranks(run, "optimizer_ms")),
            fmt(mean_over_ranks(run, "exposed_comm_ms") if peers else None),
            fmt(hidden * 100 if peers and mean_over_ranks(run, "comm_ms") > 0 else None, ".0f", "%"),
            loss_text(run.summary["final_loss"]), val_loss_text(run.summary)]


def without_empty_columns(table):
    """A column that applies to no row (tokens/s of MLP runs) is left out rather than filled with dashes."""
    keep = [i for i in range(len(table["headers"])) if any(row[i] != NA for row in table["rows"])]
    return {"headers": [table["headers"][i] for i in keep], "rows": [[row[i] for i in keep] for row in table["rows"]]}


def suite_table(runs, suite):
    """The suite's table: each case's row with its group, and its efficiency and change against the baseline as the
    suite computed them (null where they do not apply). The token suite's cases also compare by useful tokens/s
    against its uniform case (vs_unif), as its terminal table does: samples/s favours the case that packs fewer tokens
    into its samples."""
    uniform = next((c.get("summary", {}).get("useful_tokens_per_s") for c in suite["cases"]
                    if suite.get("suite") == "tokens" and c.get("case") == "uniform"), None)
    # The lab's work beside the step's phases, as the terminal's extra_ms: its extra all-reduce, rank 0's host work
    # and the barrier after it (the token suite runs none of them).
    lab = suite.get("suite") == "lab"
    exposed = RUN_HEADERS.index("exposed_ms")
    rows = []
    for r in runs:
        c = r.suite_case or {}
        eff, vs = c.get("efficiency"), c.get("vs_baseline")
        vs_uniform = r.useful_tokens_per_s / uniform - 1 if uniform else None
        extra = sum(mean_over_ranks(r, name) for name in ("extra_comm_ms", "host_work_ms", "barrier_ms"))
        row = run_row(r)
        row = row[:exposed + 1] + ([fmt(extra)] if lab else []) + row[exposed + 1:]
        rows.append(row[:1] + [c.get("group") or NA] + row[1:5] +
                    [fmt(eff, ".2f"), fmt(None if vs is None else 100 * vs, "+.0f", "%")] + row[5:6] +
                    [fmt(None if vs_uniform is None else 100 * vs_uniform, "+.0f", "%")] + row[6:])
    run_headers = RUN_HEADERS[:exposed + 1] + (["extra_ms"] if lab else []) + RUN_HEADERS[exposed + 1:]
    headers = (run_headers[:1] + ["group"] + run_headers[1:5] + ["efficiency", "vs_base"] + run_headers[5:6] +
               ["vs_unif"] + run_headers[6:])
    return without_empty_columns({"headers": headers, "rows": rows})


def sweep_table(sweep):
    """One row per point, as `ddplab sweep` prints it (predicted and error with --predict)."""
    rows = []
    for p in sweep["points"]:
        ranks = p["summary"]["ranks"]
        mean = {name: sum(float(r.get(name, 0)) for r in ranks) / len(ranks)
                for name in ("backward_ms", "comm_ms", "hidden_comm_ms", "exposed_comm_ms")}
        hidden = None if p["hidden_fraction"] is None else 100 * p["hidden_fraction"]  # null: no comm to hide
        rows.append([fmt(p["bucket_mb"], "g"), p["overlap"], fmt(p["step_ms"]),
                     fmt(float(p["summary"]["samples_per_s"]), ",.0f"), fmt(mean["backward_ms"]), fmt(mean["comm_ms"]),
                     fmt(mean["hidden_comm_ms"]), fmt(mean["exposed_comm_ms"]), fmt(hidden, ".0f", "%"),
                     fmt(p.get("predicted_step_ms")), fmt(p.get("error_pct"), "+.1f", "%"),
                     os.path.basename(p["run_file"])])
    return without_empty_columns({"headers": ["bucket_mb", "overlap", "step_ms", "samples/s", "backward", "comm",
                                              "hidden", "exposed", "hidden%", "predicted", "error", "run file"],
                                  "rows": rows})


def blame_of(runs, reports):
    """Blame lines per run file: the suite's (from its records in memory) or `ddplab report --json`'s."""
    texts = {os.path.realpath(rep["run_file"]): [b["text"] for b in rep.get("blame", [])] for rep in reports or []}
    return {r.path: r.suite_case.get("blame") if r.suite_case else texts.get(os.path.realpath(r.path)) for r in runs}


def case_section(run, drawn, blame):
    return {"name": run.stem, "group": run.group, "world": run.world,
            "blame": blame,
            "charts": charts_of(drawn, (f"{run.stem}_breakdown", "where each rank's step goes"),
                                (f"{run.stem}_step_times", "every step on every rank"))}


def scaling_section(runs, drawn, blame):
    figures = charts_of(drawn, ("weak_scaling", "weak scaling: the same batch per rank"),
                        ("strong_scaling", "strong scaling: the same global batch"))
    lines = [(r.stem, line) for r in runs if r.group in ("weak", "strong") for line in (blame[r.path] or [])]
    return {"charts": figures, "blame": lines}


def prediction_section(sweeps):
    """The sweep's best measured setting, and with --predict the model's error and recommendation."""
    out = []
    for s in sweeps:
        best = s.get("best", {})
        entry = {"link": s.get("link", "n/a"), "best": best, "noise": s.get("noise_pct"),
                 "not_told_apart": s.get("not_told_apart", []), "recommended": s.get("recommended"),
                 "predicted_from": s.get("predicted_from"), "median": s.get("median_abs_error_pct"),
                 "max": s.get("max_abs_error_pct")}
        out.append(entry)
    return out


def gantt_caption(run):
    """The buckets chart's caption, naming what the run's buckets went through, as the chart's title does
    (--zero-stage 1: reduce-scatter and all-gather; one rank: nothing)."""
    words = run.collectives_text()
    if not words:
        return ("forward and backward, the median steady step: both on one row, a tick on the row below where each "
                "bucket became ready (one rank: no bucket is communicated)")
    return (f"forward, backward and each bucket's {words}, the median steady step: forward and backward on one row, "
            f"each bucket's communication on the row below, a tick where the bucket became ready; every rank on one "
            f"clock, from the first rank's start of the step")


def timeline_section(runs, example):
    """The Chrome-trace files beside the run files, or the command that writes one (for the run drawn as the buckets
    of one step, else the straggler, else the first)."""
    traces = []
    for r in runs:
        trace = r.path[:-3] + ".trace.json" if r.path.endswith(".h5") else r.path + ".trace.json"
        if os.path.isfile(trace):
            traces.append(os.path.basename(trace))
    return {"traces": traces, "command": f"ddplab timeline {example}", "perfetto": PERFETTO}


def write_page(path, runs, written, oversubscribed="", suite=None, sweeps=(), reports=None):
    """Renders the page for these runs (charts.Run objects) and the charts this call wrote (their paths) into path,
    whole or not at all. oversubscribed: what the table's note says of its starred runs (charts.oversubscribed_text)."""
    drawn = {os.path.basename(p)[:-len(".svg")]: p for p in written if p.endswith(".svg")}
    blame = blame_of(runs, reports)
    if suite:
        title = f"ddplab suite {suite.get('suite', '')}: {len(runs)} cases on {suite.get('world_size')} ranks"
        table = suite_table(runs, suite)
        sections = [case_section(r, drawn, blame[r.path]) for r in runs
                    if r.group not in ("weak", "strong")]
        scaling = scaling_section(runs, drawn, blame)
    elif sweeps:
        s = sweeps[0]
        title = f"ddplab sweep: bucket size x overlap, {len(s['points'])} points on {s.get('world_size')} ranks"
        table = sweep_table(s)
        sections = []
        scaling = None
    else:
        title = (f"ddplab {runs[0].attrs.get('command', 'train')}: {runs[0].stem}" if len(runs) == 1 else
                 f"ddplab report: {len(runs)} runs")
        table = without_empty_columns({"headers": RUN_HEADERS, "rows": [run_row(r) for r in runs]})
        sections = [case_section(r, drawn, blame[r.path]) for r in runs]
        scaling = scaling_section(runs, drawn, blame) if any(f"{k}_scaling" in drawn for k in ("weak", "strong")) else None
    overview = charts_of(drawn, ("throughput", "throughput per case"), ("loss", "the loss per step (hollow circles: the validation loss, where a run has one)"),
                         ("update", "the learning rate and the gradient norm per step"),
                         ("bucket_sweep", "step time and exposed comm over bucket size"))
    bucket_runs = [r for r in runs if f"{r.stem}_buckets" in drawn]
    gantt = [chart(drawn, f"{r.stem}_buckets", gantt_caption(r)) for r in bucket_runs]
    # The timeline to open: the straggler's (the suite writes it), else the run drawn above, else the first.
    timeline_run = ([r for r in runs if r.stem == "straggler"] + bucket_runs + runs)[0]
    predicted = charts_of(drawn, ("predicted_vs_measured", "predicted against measured step time"))
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.dirname(os.path.abspath(__file__))),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    text = env.get_template("report_page.html.j2").render(
        title=title, setup=setup_rows(runs), config=config_rows(runs), table=table, overview=overview,
        oversubscribed=oversubscribed, scaling=scaling, sections=sections, gantt=gantt,
        sweeps=prediction_section(sweeps), predicted=predicted, timeline=timeline_section(runs, timeline_run.path),
        suite=suite, stopped=[(r.stem, r.stop_reason) for r in runs if r.stop_reason], na=NA)
    write_whole(path, text)  # a full disk leaves neither a half page under its name nor the temporary beside it
    return path
