#!/usr/bin/python3
"""How well `ddplab predict` predicts (docs/PREDICT.md; results in docs/BENCHMARKS.md, "Prediction accuracy"): for
each model, world size and link, one `ddplab sweep --predict` predicts every bucket cap x overlap cell from one run at
the default settings on that link, then measures every cell. Never fitted per cell.

Per (model, np, link) it reports the median and max |error| of the predicted step time against the measured one, and
whether the cell the model recommends measured within 5% of the fastest measured cell (cells whose caps cut the same
buckets are one setting, measured by all their runs: `sweep`'s setting_step_ms). Targets: median <= 5%,
max <= 10%, recommendation within 5%; and the run predicted from, replayed at its own setting, within 5% (the CLI
test cli_predict bounds that at 15%: on two shared cores a live run's replay was seen from -5% to +7%).
Writes OUT/accuracy.md and OUT/accuracy.json, each sweep's folder
(summary.json with predicted_step_ms beside step_ms) and a predicted-against-measured chart per (model, np).

  bench/predict_accuracy.py [--quick] [--estimate] [--out DIR] [--np 2,4] [--links none,10gbe,25gbe,100gbe-ib]
                            [--models mlp,tiny,small] [--bucket-mb 0.5,1,5,25,100] [--steps 30] [--repeats 3]
                            [--min-measure-s 1]
  bench/predict_accuracy.py --rescore DIR

--steps N, --min-measure-s S: each cell runs N steps or more, enough for S seconds of steady steps at the model's
step time on this 2-core machine (STEP_MS below): with 30 steps a `tiny` cell measured 0.3 s, and one setting
measured in several cells of a round spread by up to 21%; with at least 1 s, by up to 11%. That spread, the
measurement's own noise, is the table's last column.

--repeats K: each sweep measures every cell K times in K interleaved rounds and counts its median round
(`sweep --repeats`): identical cells measured once each spread by 5% in a median sweep and up to 15% (a drift
over the sweep's minutes, and 26 steps' own noise), which decides which cell measured fastest. Each round starts
with its own run at the defaults, which predicts that round's cells; a cell's error is the median over the rounds
of its prediction against the same round's measurement (the machine drifted 7-10% between rounds of one sweep,
all cells together, on a quiet machine). The recommendation is round 1's model's: one run's.

--rescore DIR: measure nothing; predict every cell of an earlier run's sweeps (DIR/<model>_np<n>_<link>/) again
from each round's predict_from_r<k>.h5 (older sweeps: predict_from.h5 for every round) with this build's
`ddplab predict`, against the same measured cells (to see what a
change to the model does on old measurements; not a fresh benchmark). Prints the same table, writes nothing.

--quick: np 2, links none and 10gbe, the MLP and tiny (a quarter of the cells). --estimate: print the expected
run time and stop (from step times on a quiet 2-core machine; with other builds running, runs took 1.6-1.9x as
long). Run it on a quiet machine: every other process's cycles are noise in the step times.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The workloads. The transformers run fixed-length sequences (every step the same work, so a cell's step time
# measures its setting, not which lengths it drew) at batches small enough for the full run to fit ~25 minutes on
# 2 cores; the MLP runs at train's defaults.
MODELS = {
    "mlp": [],
    "tiny": ["--model", "tiny", "--batch", "16", "--lengths", "fixed", "--max-len", "128"],
    "small": ["--model", "small", "--batch", "8", "--lengths", "fixed", "--max-len", "64"],
}
# The slowest rank's step (ms) at link none, and the gradient's size (MB), on a quiet 2-core Xeon host
# (np 4 is oversubscribed there: the ranks take turns on the cores): for --estimate and for how many steps a cell
# needs to be measured for --min-measure-s.
STEP_MS = {("mlp", 2): 18, ("mlp", 4): 43, ("tiny", 2): 5.7, ("tiny", 4): 12.3, ("small", 2): 24.5, ("small", 4): 56}
GRADIENT_MB = {"mlp": 12.3, "tiny": 1.7, "small": 7.5}
LINK_GBPS = {"none": 0, "10gbe": 10, "25gbe": 25, "100gbe-ib": 100}
RUN_OVERHEAD_S = 0.4  # per run in a sweep: model set-up, run file


def fail(message, code=2):
    print(f"predict_accuracy.py: error: {message}", file=sys.stderr)
    sys.exit(code)


def step_ms_estimate(model, np_ranks, link):
    gbps = LINK_GBPS.get(link, 0)
    comm_ms = GRADIENT_MB[model] * 8 / gbps * 2 * (np_ranks - 1) / np_ranks if gbps else 0
    return STEP_MS[(model, np_ranks)] + comm_ms


def cell_steps(args, model, np_ranks, link):
    """--steps, or more: enough steady steps to measure the cell for --min-measure-s. A `tiny` cell's 26 steady
    steps last 0.15-0.4 s, and one stall of the host in them moved its mean by 10-20% (cells that cut the same
    buckets, one setting, measured 13.0-17.0 ms in one round)."""
    steady = math.ceil(args.min_measure_s * 1000 / step_ms_estimate(model, np_ranks, link))
    return max(args.steps, args.warmup_steps + steady)


def estimate_s(args, model, np_ranks, link, cells):
    runs = (cells + 1) * args.repeats  # each round: the run predicted from, then every cell
    steps = cell_steps(args, model, np_ranks, link)
    return runs * (steps * step_ms_estimate(model, np_ranks, link) / 1000 + RUN_OVERHEAD_S) + 1


def run_sweep(args, model, np_ranks, link, out_dir):
    cmd = [os.path.join(ROOT, "scripts", "mpirun.sh"), "-np", str(np_ranks), args.ddplab, "sweep", "--predict",
           "--link", link, "--bucket-mb", args.bucket_mb, "--overlap", "on,off",
           "--steps", str(cell_steps(args, model, np_ranks, link)),
           "--warmup-steps", str(args.warmup_steps), "--repeats", str(args.repeats),
           "--out-dir", out_dir, "--force"] + MODELS[model]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        fail(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}", code=1)
    with open(os.path.join(out_dir, "summary.json")) as f:
        return json.load(f)


def same_setting_spread_pct(sweep):
    """The measurement's own noise: among cells that are one setting (caps that cut the same buckets, the same
    overlap), the largest spread of their step times within one round, max / min - 1, in percent (0 when no two
    cells are one setting). No prediction can be closer to every one of them than half of it."""
    groups = {}
    for p in sweep["points"]:
        caps = frozenset([p["bucket_mb"]] + p.get("same_buckets_as", []))
        groups.setdefault((caps, p["overlap"]), []).append(p["repeat_step_ms"])
    spread = 0.0
    for runs in groups.values():
        for measured in zip(*runs):
            spread = max(spread, 100 * (max(measured) / min(measured) - 1))
    return spread


def score(sweep):
    errors = [abs(p["error_pct"]) for p in sweep["points"]]
    rec = sweep["recommended"]
    return {"median_abs_error_pct": statistics.median(errors), "max_abs_error_pct": max(errors),
            "same_setting_spread_pct": same_setting_spread_pct(sweep),
            "recommended": f"{rec['bucket_mb']:g}/{rec['overlap']}",
            "recommended_vs_best_pct": rec["vs_best_measured_pct"],
            "recommended_ok": rec["vs_best_measured_pct"] <= 5.0,
            "own_setting_error_pct": sweep["predicted_from"]["error_pct"], "errors": errors}


def predict_rows(args, run_file, caps, overlaps):
    """`ddplab predict RUN --json`: its rows by (cap, overlap), the recommended row, the own-setting error."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "predict.json")
        cmd = [args.ddplab, "predict", run_file, "--bucket-mb", ",".join(f"{c:g}" for c in caps), "--overlap",
               ",".join(overlaps), "--json", out]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            fail(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}", code=1)
        with open(out) as f:
            predicted = json.load(f)
    rows = predicted["rows"]
    by_cell = {(r["bucket_mb"], "on" if r["overlap"] else "off"): r for r in rows}
    rec = rows[predicted["recommended"][0]["row"]]
    return by_cell, (rec["bucket_mb"], "on" if rec["overlap"] else "off"), predicted["measured"]["error_pct"]


def rescore_sweep(args, sweep_dir):
    """A sweep's summary.json with its predictions (and recommendation) made again by this build's ddplab predict,
    as `sweep --predict` makes them: round k from predict_from_r<k>.h5 (or, in sweeps from before those, every
    round from predict_from.h5), against round k's measurement; the measured step times as they were."""
    with open(os.path.join(sweep_dir, "summary.json")) as f:
        sweep = json.load(f)
    caps = sorted({p["bucket_mb"] for p in sweep["points"]})
    overlaps = sorted({p["overlap"] for p in sweep["points"]})
    rounds = len(sweep["points"][0]["repeat_step_ms"])
    sources = [os.path.join(sweep_dir, f"predict_from_r{k + 1}.h5") for k in range(rounds)]
    if not all(os.path.isfile(f) for f in sources):
        sources = [os.path.join(sweep_dir, "predict_from.h5")] * rounds
    predicted = [predict_rows(args, f, caps, overlaps) for f in sources]
    for p in sweep["points"]:
        cell = (p["bucket_mb"], p["overlap"])
        guesses = [by_cell[cell]["step_ms"] for by_cell, _, _ in predicted]
        p["predicted_step_ms"] = statistics.median_low(guesses)
        p["error_pct"] = statistics.median(100 * (g - m) / m for g, m in zip(guesses, p["repeat_step_ms"]))
    cell = predicted[0][1]
    rec = next(p for p in sweep["points"] if (p["bucket_mb"], p["overlap"]) == cell)
    # Points whose caps cut the same buckets are one setting, ranked by all their runs (sweeps from before
    # `setting_step_ms`: each point by its own).
    setting_ms = lambda p: p.get("setting_step_ms", p["step_ms"])
    best = min(setting_ms(p) for p in sweep["points"])
    sweep["recommended"] = {"bucket_mb": rec["bucket_mb"], "overlap": rec["overlap"],
                            "vs_best_measured_pct": 100 * (setting_ms(rec) / best - 1)}
    sweep["predicted_from"]["error_pct"] = statistics.median(own for _, _, own in predicted)
    return sweep


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ddplab", default=os.path.join(ROOT, "build", "launcher", "ddplab"))
    parser.add_argument("--out", default=os.path.join(ROOT, "runs", "predict_accuracy"))
    parser.add_argument("--np", default="2,4")
    parser.add_argument("--links", default="none,10gbe,25gbe,100gbe-ib")
    parser.add_argument("--models", default="mlp,tiny,small")
    parser.add_argument("--bucket-mb", default="0.5,1,5,25,100")
    parser.add_argument("--steps", type=int, default=30, help="steps per cell, at least (default 30)")
    parser.add_argument("--min-measure-s", type=float, default=1.0,
                        help="more steps where needed to measure each cell's steady steps this long (default 1)")
    parser.add_argument("--warmup-steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="rounds per cell, median counts (default 3)")
    parser.add_argument("--quick", action="store_true", help="np 2, links none,10gbe, models mlp,tiny")
    parser.add_argument("--estimate", action="store_true", help="print the expected run time and stop")
    parser.add_argument("--rescore", metavar="DIR", help="re-predict an earlier run's sweeps; measure nothing")
    args = parser.parse_args()
    if args.quick:
        args.np, args.links, args.models = "2", "none,10gbe", "mlp,tiny"
    try:
        worlds = [int(n) for n in args.np.split(",")]
    except ValueError:
        fail(f"--np {args.np}: expected a list of world sizes")
    if min(worlds) < 2:
        fail(f"--np {args.np}: every world size needs 2 ranks or more (one rank has no comm to predict)")
    links, models = args.links.split(","), args.models.split(",")
    for m in models:
        if m not in MODELS:
            fail(f"unknown model '{m}' (expected {', '.join(MODELS)})")
    for link in links:
        if link not in LINK_GBPS:
            fail(f"unknown link '{link}' (expected {', '.join(LINK_GBPS)})")
    if args.repeats < 1:
        fail(f"--repeats {args.repeats}: expected 1 or more")
    if args.steps <= args.warmup_steps:
        fail("--steps must exceed --warmup-steps")
    cells = 2 * len(args.bucket_mb.split(","))
    plan = [(m, n, link) for m in models for n in worlds for link in links]
    expected = sum(estimate_s(args, m, n, link, cells) for m, n, link in plan)
    if not args.rescore:
        print(f"predict accuracy: {len(plan)} sweeps x {cells} cells x {args.repeats} rounds, {args.steps} steps "
              f"per cell or more (each cell's steady steps >= {args.min_measure_s:g} s); expected "
              f"~{expected / 60:.0f} min on 2 cores", flush=True)
    if args.estimate:
        return

    if args.rescore:
        plan = [(m, n, link) for m, n, link in plan
                if os.path.isfile(os.path.join(args.rescore, f"{m}_np{n}_{link}", "summary.json"))]
        if not plan:
            fail(f"--rescore {args.rescore}: no <model>_np<n>_<link>/summary.json in it")
    else:
        os.makedirs(args.out, exist_ok=True)
    started, rows = time.time(), []
    header = ("| model | np | link | median abs error | max abs error | recommended (cap/overlap) | its measured vs "
              "best | own-setting error | one setting measured, spread |\n|---|---|---|---|---|---|---|---|---|")
    print(header)
    for i, (model, np_ranks, link) in enumerate(plan):
        name = f"{model}_np{np_ranks}_{link}"
        sweep = (rescore_sweep(args, os.path.join(args.rescore, name)) if args.rescore else
                 run_sweep(args, model, np_ranks, link, os.path.join(args.out, name)))
        row = {"model": model, "np": np_ranks, "link": link, **score(sweep)}
        rows.append(row)
        print(f"| {model} | {np_ranks} | {link} | {row['median_abs_error_pct']:.1f}% | {row['max_abs_error_pct']:.1f}% "
              f"| {row['recommended']} | {row['recommended_vs_best_pct']:+.1f}%"
              f"{'' if row['recommended_ok'] else ' (miss)'} | {row['own_setting_error_pct']:+.1f}% "
              f"| {row['same_setting_spread_pct']:.1f}% |", flush=True)
        elapsed = time.time() - started
        print(f"  ({elapsed / 60:.1f} min so far, ~{elapsed / (i + 1) * (len(plan) - i - 1) / 60:.1f} min left)",
              file=sys.stderr, flush=True)

    every = [e for r in rows for e in r["errors"]]
    verdict = (f"all {len(every)} cells: median |error| {statistics.median(every):.1f}% (target <= 5%), max "
               f"{max(every):.1f}% (target <= 10%; {sum(e > 10 for e in every)} cells above); recommendation "
               f"within 5% of the best measured cell in "
               f"{sum(r['recommended_ok'] for r in rows)} of {len(rows)} sweeps; the run predicted from, at its own "
               f"setting, within 5% in {sum(abs(r['own_setting_error_pct']) <= 5 for r in rows)} of {len(rows)}; "
               f"one setting measured in several cells of a round spread by up to "
               f"{max(r['same_setting_spread_pct'] for r in rows):.1f}%; {(time.time() - started) / 60:.1f} min")
    print(verdict)
    if args.rescore:
        return
    table = "\n".join([header] + [
        f"| {r['model']} | {r['np']} | {r['link']} | {r['median_abs_error_pct']:.1f}% | "
        f"{r['max_abs_error_pct']:.1f}% | {r['recommended']} | {r['recommended_vs_best_pct']:+.1f}% | "
        f"{r['own_setting_error_pct']:+.1f}% | {r['same_setting_spread_pct']:.1f}% |"
        for r in rows])
    with open(os.path.join(args.out, "accuracy.md"), "w") as f:
        f.write(f"{table}\n\n{verdict}\n")
    with open(os.path.join(args.out, "accuracy.json"), "w") as f:
        json.dump({"steps": args.steps, "min_measure_s": args.min_measure_s, "repeats": args.repeats,
                   "bucket_mb": args.bucket_mb, "rows": rows,
                   "verdict": verdict}, f, indent=1)
    # One chart per model and world size, a panel per link (scripts/charts.py --sweep), after the table is safe on
    # disk. charts.py runs by its own #! (the Debian python that has matplotlib), not by whichever python runs us.
    for model in models:
        for np_ranks in worlds:
            summaries = [os.path.join(args.out, f"{model}_np{np_ranks}_{link}", "summary.json") for link in links]
            charts = os.path.join(args.out, "charts", f"{model}_np{np_ranks}")
            subprocess.run([os.path.join(ROOT, "scripts", "charts.py"), charts] +
                           [a for s in summaries for a in ("--sweep", s)], check=True, capture_output=True)
    print(f"table: {args.out}/accuracy.md, charts: {args.out}/charts/")


if __name__ == "__main__":
    main()
