#!/usr/bin/python3
"""Runs `ddplab sweep` on a small model: one run file per grid point, a summary naming the best point, and the
overlap-off points with no hidden communication. The results folder's name holds quotes, a space and a `$(...)`:
the charts are drawn from an argument list, not through a shell. Then `sweep --predict --repeats 3` on two points:
each round's first run at the default cap and overlap predicts the round's points, every point's predicted step
time beside its measured one (table, CSV, JSON, chart), each point measured in three rounds and counted by its
median round, its error the median of its rounds'. Then two rounds, the even count's rules: the lower of the two
for the measurement and the prediction (a run that happened), the mean of the two for the errors; their all-reduces
timed by an allreduce_perf calibration (--calibration).

usage: check_sweep.py MPIRUN DDPLAB NP ALLREDUCE_PERF
"""
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile

from checks import check, failures  # tests/cli/checks.py: the assertion every CLI test shares


mpirun, ddplab, np_ranks, allreduce_perf = sys.argv[1:5]
with tempfile.TemporaryDirectory() as work:
    out = os.path.join(work, "it's a \"sweep\" $(touch pwned)")
    cmd = [mpirun, "-np", np_ranks, ddplab, "sweep", "--bucket-mb", "0,0.01,100,25,50", "--overlap", "on,off",
           "--last-bucket-mb", "0", "--steps", "5", "--warmup-steps", "1", "--input-dim", "32", "--hidden", "64",
           "--classes", "10", "--batch", "8", "--link", "10gbe", "--out-dir", out]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    print(proc.stdout[-2000:])
    check(proc.returncode == 0, f"sweep exits 0 ({proc.returncode}: {proc.stderr.strip()[-300:]})")
    if proc.returncode == 0:
        names = sorted(os.listdir(out))
        want = sorted([f"bucket{b}_overlap_{o}.h5" for b in ["0", "0.01", "100", "25", "50"] for o in ["on", "off"]] +
                      ["summary.csv", "summary.json", "charts", "charts.log", "report.html"])
        check(names == want, f"files {names}")
        s = json.load(open(os.path.join(out, "summary.json")))
        check(len(s["points"]) == 10, "10 grid points")
        for p in s["points"]:
            if p["overlap"] == "off":
                check(all(r["hidden_comm_ms"] == 0 for r in p["summary"]["ranks"]), f"{p['bucket_mb']}/off hides nothing")
        # The model's 11 KB of gradients: 100, 25 and 50 MB cut the same buckets, one setting under three names, so
        # their runs are pooled and ranked together.
        by_cell = {(p["bucket_mb"], p["overlap"]): p for p in s["points"]}
        for o in ["on", "off"]:
            a, b, c = by_cell[(100, o)], by_cell[(25, o)], by_cell[(50, o)]
            pooled = sorted(a["repeat_step_ms"] + b["repeat_step_ms"] + c["repeat_step_ms"])
            check(a["same_buckets_as"] == [25, 50] and b["same_buckets_as"] == [100, 50] and
                  c["same_buckets_as"] == [100, 25] and
                  a["setting_step_ms"] == b["setting_step_ms"] == c["setting_step_ms"] == pooled[1],
                  f"100, 25 and 50 MB ({o}) are one setting, its three runs' median: {a.get('setting_step_ms')}")
            check(proc.stdout.count(f"MiB, overlap {o}: the same") == 1,
                  f"the table names that setting once, at its smallest cap ({o})")
            check("same_buckets_as" not in by_cell[(0, o)], f"0 MB ({o}), a bucket per piece, is a setting of its own")
        setting_ms = {k: p.get("setting_step_ms", p["step_ms"]) for k, p in by_cell.items()}
        fastest = min(setting_ms.values())
        check(s["best"]["step_ms"] == fastest and setting_ms[(s["best"]["bucket_mb"], s["best"]["overlap"])] == fastest,
              f"best is the fastest setting: {s['best']}")
        check("25, 100, 50 MiB, overlap on: the same 2 bucket(s), one setting" in proc.stdout,
              "the table says which caps are one setting")
        runs = [m for k, p in by_cell.items() if k[0] in (25, 50, 100) and k[1] == "on" for m in p["repeat_step_ms"]]
        spread = f"{min(runs):.2f}-{max(runs):.2f}, {100 * (max(runs) / min(runs) - 1):.0f}% apart: the machine's noise"
        check(spread in proc.stdout, f"and how far apart that setting's runs measured ({spread})")
        check("best: --bucket-mb" in proc.stdout, "best setting printed")
        # The settings the machine's noise does not tell from the best: those within the widest spread of one
        # setting's pooled runs, each setting once (under its first cap), the best's own setting not among them.
        def setting(key):
            return key[1], tuple(sorted([key[0]] + by_cell[key].get("same_buckets_as", [])))
        pooled = {}
        for key, p in by_cell.items():
            pooled.setdefault(setting(key), []).extend(p["repeat_step_ms"])
        noise = max(max(runs) / min(runs) - 1 for runs in pooled.values())
        best_setting = setting((s["best"]["bucket_mb"], s["best"]["overlap"]))
        expected = {setting(k) for k, ms in setting_ms.items() if setting(k) != best_setting and
                    ms <= fastest * (1 + noise)}
        told = [setting((p["bucket_mb"], p["overlap"])) for p in s["not_told_apart"]]
        check(abs(s["noise_pct"] - 100 * noise) < 1e-9 and sorted(told) == sorted(expected) and
              len(set(told)) == len(told), f"the settings within the {100 * noise:.1f}% noise of the best are listed, "
              f"each once: {told} (expected {sorted(expected)})")
        check(all(f"  --bucket-mb {p['bucket_mb']:g} --overlap {p['overlap']} (" in proc.stdout
                  for p in s["not_told_apart"]), "and printed under the best")
        charts = os.listdir(os.path.join(out, "charts"))
        check("bucket_sweep.png" in charts and os.path.getsize(os.path.join(out, "charts", "bucket_sweep.png")) > 0,
              f"the bucket-sweep chart is drawn ({sorted(charts)[:4]}...)")
        # The folder copied elsewhere: its summary's paths lead to the original files, so the copies are matched as
        # the files beside the summary (the best point's buckets are drawn), and files that are no point of it are
        # refused rather than drawn without the sweep.
        copy = os.path.join(work, "copied")
        shutil.copytree(out, copy)
        best = next(os.path.basename(p["run_file"]) for p in s["points"]
                    if (p["bucket_mb"], p["overlap"]) == (s["best"]["bucket_mb"], s["best"]["overlap"]))
        other = next(os.path.basename(p["run_file"]) for p in s["points"] if os.path.basename(p["run_file"]) != best)
        shutil.copy(os.path.join(copy, best), os.path.join(copy, "renamed.h5"))
        charts_py = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "charts.py")
        redraw = [sys.executable, charts_py, "again", "--sweep", "summary.json"]
        proc = subprocess.run(redraw + [best, other], cwd=copy, capture_output=True, text=True, timeout=120)
        check(proc.returncode == 0 and os.path.join("again", best[:-3] + "_buckets.png") in proc.stdout,
              f"charts.py --sweep in a copy of the folder finds the points beside the summary ({proc.stderr[-300:]})")
        proc = subprocess.run(redraw + ["renamed.h5"], cwd=copy, capture_output=True, text=True, timeout=120)
        check(proc.returncode == 2 and proc.stderr.count("\n") == 1 and "none of the run files" in proc.stderr,
              f"charts.py --sweep with no point of it: exit 2, one line ({proc.returncode}: {proc.stderr.strip()})")
        check(not os.path.exists("pwned") and not os.path.exists(os.path.join(work, "pwned")),
              "nothing in the folder's name was run")
        check(all("predicted_step_ms" not in p for p in s["points"]) and "predicted_from" not in s,
              "without --predict nothing is predicted")
        check(s["repeats"] == 1 and all(p["repeat_step_ms"] == [p["step_ms"]] for p in s["points"]),
              "without --repeats each point is measured once")

    # --predict: two points, each predicted from the first run (one 25 MB bucket, overlap on) before it is
    # measured; their 0.01 MB buckets are smaller than any the first run timed. Each measured in 3 rounds.
    out = os.path.join(work, "predicted")
    proc = subprocess.run([mpirun, "-np", np_ranks, ddplab, "sweep", "--predict", "--repeats", "3",
                           "--bucket-mb", "0.01",
                           "--last-bucket-mb", "0", "--overlap", "on,off", "--steps", "6", "--warmup-steps", "2",
                           "--input-dim", "32", "--hidden", "64", "--classes", "10", "--batch", "8", "--link", "10gbe",
                           "--out-dir", out],
                          capture_output=True, text=True, timeout=300)
    print(proc.stdout[-2500:])
    check(proc.returncode == 0, f"sweep --predict exits 0 ({proc.returncode}: {proc.stderr.strip()[-300:]})")
    if proc.returncode == 0:
        s = json.load(open(os.path.join(out, "summary.json")))
        source = s["predicted_from"]
        check([os.path.basename(r["run_file"]) for r in source["rounds"]] ==
              [f"predict_from_r{k}.h5" for k in [1, 2, 3]] and all(os.path.exists(r["run_file"]) for r in
                                                                   source["rounds"]) and
              source["run_file"] == source["rounds"][0]["run_file"] and source["bucket_mb"] == 25 and
              source["overlap"] == "on", f"each round predicted from its own first run at 25/on: {source}")
        own = sorted(r["error_pct"] for r in source["rounds"])
        check(source["error_pct"] == own[1], f"the own-setting error is the rounds' median: {source}")
        check(s["recommended"]["bucket_mb"] == 0.01, "the recommendation names a point of the sweep")
        check(len(s["points"]) == 2, "2 points")
        names = sorted(n for n in os.listdir(out) if n.startswith("bucket"))
        check(names == sorted(f"bucket0.01_overlap_{o}_r{r}.h5" for o in ["on", "off"] for r in [1, 2, 3]),
              f"a run file per point and round: {names}")
        for p in s["points"]:
            rounds = p["repeat_step_ms"]
            median_round = rounds.index(sorted(rounds)[1]) + 1
            check(len(rounds) == 3 and p["step_ms"] == sorted(rounds)[1] and
                  p["run_file"].endswith(f"_r{median_round}.h5"),
                  f"{p['overlap']}: step_ms {p['step_ms']} is the median of {rounds}, from its run file")
        for p in s["points"]:
            measured, predicted = p["step_ms"], p.get("predicted_step_ms", -1)
            check(measured == p["summary"]["slowest_step_ms"], f"{p['overlap']}: step_ms is the slowest rank's step")
            # Round k predicted from round k's first run, against round k's measurement; the point's error is
            # the median of the rounds', its prediction the rounds' median.
            rounds, guesses = p["repeat_step_ms"], p.get("repeat_predicted_step_ms", [])
            paired = [100 * (g - m) / m for g, m in zip(guesses, rounds)]
            check(len(guesses) == 3 and predicted == sorted(guesses)[1] and
                  all(abs(a - b) < 1e-6 for a, b in zip(paired, p["repeat_error_pct"])) and
                  abs(p["error_pct"] - sorted(paired)[1]) < 1e-6,
                  f"{p['overlap']}: predicted {guesses} beside measured {rounds} ms, error {p.get('error_pct', 0):+.1f}%")
            check(any("outside the measured" in e for e in p["extrapolated"]),
                  f"{p['overlap']}: a 0.01 MB cap from a 25 MB run is marked extrapolated: {p['extrapolated']}")
        errors = sorted(abs(p["error_pct"]) for p in s["points"])
        check(abs(s["max_abs_error_pct"] - errors[-1]) < 1e-9 and
              abs(s["median_abs_error_pct"] - sum(errors) / 2) < 1e-9, "median and max |error| over the points")
        # The recommendation is round 1's model's (what `ddplab predict` on that one run says).
        first = {p["overlap"]: p["repeat_predicted_step_ms"][0] for p in s["points"]}
        fastest = min(first, key=first.get)
        rec = s["recommended"]
        tolerance = rec["tolerance_pct"] / 100
        check(rec["tolerance_pct"] > 0 and rec["predicted_step_ms"] == first[rec["overlap"]] and
              first[rec["overlap"]] <= first[fastest] * (1 + tolerance) and
              (rec["within_noise"] > 0 or rec["overlap"] == fastest) and
              rec["within_noise"] == sum(o != fastest and t <= first[fastest] * (1 + tolerance) + 1e-12
                                         for o, t in first.items()),
              f"the recommendation is round 1's fastest prediction or one within the run's noise of it: {rec}")
        lines = open(os.path.join(out, "summary.csv")).read().splitlines()
        check(lines[0].endswith(",predicted_step_ms,error_pct") and all(len(l.split(",")) == 12 for l in lines),
              "summary.csv has the predicted step and error columns on every line")
        check(" predicted   error" in proc.stdout and "recommended by the model of round 1: --bucket-mb" in proc.stdout and
              "* extrapolated beyond what was measured" in proc.stdout, "the table shows predicted beside measured")
        chart = os.path.join(out, "charts", "predicted_vs_measured.png")
        check(os.path.exists(chart) and os.path.getsize(chart) > 0, "the predicted-against-measured chart is drawn")
        # Its runs at 25 MB lie off the 0.01 MB grid: no diamond, so none in the legend; the panel says where they lie
        # (matplotlib's SVG keeps each line of text as a comment).
        svg_path = chart[:-len(".png")] + ".svg"
        svg = open(svg_path).read() if os.path.isfile(svg_path) else ""
        check("<!-- measured: the run(s) predicted from -->" not in svg and
              "<!-- predicted from 3 runs at 25 MiB (off the grid)," in svg,
              "the chart names the runs predicted from, off its grid, rather than a legend entry for a marker not drawn")
    # Two rounds, their all-reduces timed by an allreduce_perf calibration rather than fitted on the first runs.
    calibration = os.path.join(work, "ring_perf.json")
    perf = subprocess.run([mpirun, "-np", np_ranks, allreduce_perf, "-b", "4K", "-e", "1M", "-f", "16", "-w", "1", "-n", "5", "--impls", "ring", "-J",
                           calibration], capture_output=True, text=True, timeout=120)
    check(perf.returncode == 0, f"allreduce_perf writes a calibration ({perf.stderr.strip()[-300:]})")
    out = os.path.join(work, "two rounds")
    proc = subprocess.run([mpirun, "-np", np_ranks, ddplab, "sweep", "--predict", "--repeats", "2", "--bucket-mb",
                           "0.01", "--last-bucket-mb", "0", "--overlap", "on", "--steps", "5", "--warmup-steps", "1",
                           "--input-dim", "32", "--hidden", "64", "--classes", "10", "--batch", "8", "--out-dir", out,
                           "--calibration", calibration],
                          capture_output=True, text=True, timeout=300)
    check(proc.returncode == 0 and f"all-reduce times from the calibration {calibration}" in proc.stdout,
          "sweep --predict --calibration says the calibration timed the predictions' all-reduces")
    check(proc.returncode == 0, f"sweep --predict --repeats 2 exits 0 ({proc.returncode}: {proc.stderr[-300:]})")
    if proc.returncode == 0:
        s = json.load(open(os.path.join(out, "summary.json")))
        p, source = s["points"][0], s["predicted_from"]
        rounds, guesses, errors = p["repeat_step_ms"], p["repeat_predicted_step_ms"], p["repeat_error_pct"]
        lower = rounds.index(min(rounds)) + 1
        check(len(rounds) == 2 and p["step_ms"] == min(rounds) and p["run_file"].endswith(f"_r{lower}.h5"),
              f"of two rounds the measurement is the lower, a run that happened: {p['step_ms']} of {rounds}")
        check(p["predicted_step_ms"] == min(guesses) and abs(p["error_pct"] - sum(errors) / 2) < 1e-9,
              f"the prediction the lower of {guesses}, the error the mean of {errors}: {p['error_pct']}")
        check(source["calibration"] == calibration, f"summary.json names the calibration: {source['calibration']}")
        own = [r["error_pct"] for r in source["rounds"]]
        check(len(own) == 2 and abs(source["error_pct"] - sum(own) / 2) < 1e-9,
              f"the own-setting error the mean of the rounds' {own}: {source['error_pct']}")
    # One rank has no communication to hide: hidden% is "-" in the table, empty in the CSV and null in the JSON, as
    # the report says it; a 100% there would praise an overlap that never ran.
    out = os.path.join(work, "one rank")
    proc = subprocess.run([ddplab, "sweep", "--bucket-mb", "0.01", "--overlap", "on,off", "--steps", "3",
                           "--warmup-steps", "1", "--input-dim", "32", "--hidden", "64", "--classes", "10", "--batch",
                           "8", "--out-dir", out], capture_output=True, text=True, timeout=120)
    if proc.returncode == 0:
        rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("     0.01 ")]
        points = json.load(open(os.path.join(out, "summary.json")))["points"]
        csv_rows = list(csv.DictReader(open(os.path.join(out, "summary.csv"))))
        check(len(rows) == 2 and all(r[9] == "-" for r in rows) and all(p["hidden_fraction"] is None for p in points)
              and all(r["hidden_fraction"] == "" for r in csv_rows),
              f"one rank: hidden% '-', null, empty ({rows}, {[p['hidden_fraction'] for p in points]})")
    else:
        check(False, f"a one-rank sweep exits 0 ({proc.returncode}: {proc.stderr[-300:]})")
    bad = subprocess.run([mpirun, "-np", np_ranks, ddplab, "sweep", "--overlap", "maybe", "--out-dir",
                          os.path.join(work, "bad")], capture_output=True, text=True, timeout=60)
    check(bad.returncode == 2 and "--overlap takes on and/or off" in bad.stderr and not os.path.exists(
        os.path.join(work, "bad", "summary.json")), "a bad --overlap value is refused with exit code 2")
    bad = subprocess.run([mpirun, "-np", np_ranks, ddplab, "sweep", "--repeats", "0", "--out-dir",
                          os.path.join(work, "bad")], capture_output=True, text=True, timeout=60)
    check(bad.returncode == 2 and "--repeats must be at least 1" in bad.stderr and not os.path.exists(
        os.path.join(work, "bad")), "--repeats 0 is refused with exit code 2, before any run")
    # A folder reused with --force where one output is blocked (a folder where a run file goes): refused before any
    # run, the runs already there untouched.
    reused = os.path.join(work, "reused")
    tiny = ["--steps", "3", "--warmup-steps", "1", "--input-dim", "32", "--hidden", "32", "--classes", "10",
            "--bucket-mb", "1,5", "--overlap", "on", "--out-dir", reused]
    first = subprocess.run([ddplab, "sweep"] + tiny, capture_output=True, text=True, timeout=120)
    if first.returncode == 0:
        kept = open(os.path.join(reused, "bucket1_overlap_on.h5"), "rb").read()
        os.remove(os.path.join(reused, "bucket5_overlap_on.h5"))
        os.mkdir(os.path.join(reused, "bucket5_overlap_on.h5"))
        bad = subprocess.run([ddplab, "sweep"] + tiny + ["--force"], capture_output=True, text=True, timeout=120)
        check(bad.returncode == 2 and "bucket5_overlap_on.h5 is a folder" in bad.stderr and
              open(os.path.join(reused, "bucket1_overlap_on.h5"), "rb").read() == kept,
              f"--force into a folder with a blocked output: exit 2 before any run, nothing replaced "
              f"({bad.returncode}: {bad.stderr.strip()[-200:]})")
    else:
        check(False, f"a small sweep exits 0 ({first.returncode}: {first.stderr[-300:]})")
print(f"sweep checks: {len(failures)} failed")
sys.exit(1 if failures else 0)
