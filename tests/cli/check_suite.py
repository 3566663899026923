#!/usr/bin/python3
"""Runs `ddplab suite lab` on a small model and checks its files and that each case shows its pathology.

usage: check_suite.py MPIRUN DDPLAB NP
"""
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np

from checks import check, failures  # tests/cli/checks.py: the assertion every CLI test shares


def steady(f, name):
    first = json.loads(f.attrs["summary"])["first_steady_step"]
    return f["steps"][name][:, first:].mean(axis=1)  # per rank


def main():
    mpirun, ddplab, np_ranks = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "suite")
        cmd = [mpirun, "-np", str(np_ranks), ddplab, "suite", "lab", "--steps", "6", "--warmup-steps", "2",
               "--input-dim", "256", "--hidden", "512", "--classes", "10", "--batch", "8", "--slow-rank", "1",
               "--straggler-ms", "30", "--extra-allreduce-mb", "0.5", "--rank0-work-ms", "15",
               "--data-cost-ms", "1", "--out-dir", out]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        print(proc.stdout[-3000:])
        check(proc.returncode == 0, f"suite exits 0 (got {proc.returncode}: {proc.stderr.strip()[-300:]})")
        if proc.returncode != 0:
            return
        sizes = [1, 2, 4][: {1: 1, 2: 2, 4: 3}[np_ranks]]
        expected = ([f"weak_ws{n}" for n in sizes] + [f"strong_ws{n}" for n in sizes] +
                    ["straggler", "extra_allreduce", "rank0_barrier", "input_threads0", "input_threads2",
                     "input_threads4"] + (["zero_stage1", "pytorch_layout"] if np_ranks > 1 else []))
        files = sorted(os.listdir(out))
        check(files == sorted([c + ".h5" for c in expected] +
                              ["summary.csv", "summary.json", "charts", "charts.log", "report.html",
                               "straggler.trace.json"]),
              f"files {files}")
        trace = json.load(open(os.path.join(out, "straggler.trace.json")))
        check({e["pid"] for e in trace["traceEvents"]} == set(range(1, np_ranks + 1)),
              "the straggler timeline has every rank (pid rank + 1)")
        check(os.path.getsize(os.path.join(out, "charts", "straggler_breakdown.png")) > 0, "charts are drawn")
        drawn = set(os.listdir(os.path.join(out, "charts")))
        for chart in ["throughput", "loss", "weak_scaling", "strong_scaling", f"weak_ws{np_ranks}_buckets"] + (
                ["pytorch_layout_buckets"] if np_ranks > 1 else []):
            check(f"{chart}.png" in drawn and os.path.getsize(os.path.join(out, "charts", f"{chart}.png")) > 1000,
                  f"the suite draws {chart}.png")
        # The results folder copied elsewhere: its summary's paths lead to the original files, so the copies are
        # matched as the files beside the summary (the largest weak case's buckets are the suite's), and files that
        # are no case of it are refused rather than drawn without the suite.
        copy = os.path.join(work, "copied")
        shutil.copytree(out, copy)
        shutil.copy(os.path.join(copy, "straggler.h5"), os.path.join(copy, "renamed.h5"))
        charts_py = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "charts.py")
        redraw = [sys.executable, charts_py, "again", "--suite", "summary.json"]
        drawn = subprocess.run(redraw + [f"weak_ws{np_ranks}.h5", "straggler.h5"], cwd=copy, capture_output=True,
                               text=True, timeout=120)
        check(drawn.returncode == 0 and os.path.join("again", f"weak_ws{np_ranks}_buckets.png") in drawn.stdout,
              f"charts.py --suite in a copy of the folder finds the cases beside the summary ({drawn.stderr[-300:]})")
        refused = subprocess.run(redraw + ["renamed.h5"], cwd=copy, capture_output=True, text=True, timeout=120)
        check(refused.returncode == 2 and refused.stderr.count("\n") == 1 and "none of the run files" in refused.stderr,
              f"charts.py --suite with no case of it: exit 2, one line ({refused.returncode}: "
              f"{refused.stderr.strip()})")
        # Files in a shell glob's (name) order, a file of no case first: the throughput bars follow the suite's group
        # order, that file last (the tick labels are the SVG's text comments, left to right).
        some = ["extra_allreduce", "input_threads0", "strong_ws1", "weak_ws1"] + (["zero_stage1"] if np_ranks > 1
                                                                                  else [])
        globbed = subprocess.run([sys.executable, charts_py, "globbed", "--suite", "summary.json", "renamed.h5",
                                  *[f"{c}.h5" for c in some]], cwd=copy, capture_output=True, text=True, timeout=120)
        svg_path = os.path.join(copy, "globbed", "throughput.svg")
        svg = open(svg_path).read() if os.path.isfile(svg_path) else ""
        ticks = sorted((svg.find(f"<!-- {c} -->"), c) for c in some + ["renamed"] if f"<!-- {c} -->" in svg)
        want = ["weak_ws1", "strong_ws1", "extra_allreduce", "input_threads0"] + some[4:] + ["renamed"]
        check(globbed.returncode == 0 and [c for _, c in ticks] == want and "<!-- not in the suite -->" in svg,
              f"the throughput bars in the suite's group order, a file of no case last ({[c for _, c in ticks]}; "
              f"{globbed.stderr[-200:]})")
        # strong_ws1 trains the global batch on one rank: its losses are the others' up to the summation order, so
        # it shares their line rather than lying hidden under it (matplotlib's SVG keeps each text as a comment).
        loss_svg = open(os.path.join(out, "charts", "loss.svg")).read()
        check("<!-- strong_ws1 -->" not in loss_svg, "the loss chart draws strong_ws1 on the line of the cases it "
              "agrees with to rounding")
        suite_summary = json.load(open(os.path.join(out, "summary.json")))
        cores = suite_summary.get("host_cores")
        usable = len(os.sched_getaffinity(0))
        check(cores == usable, f"summary.json: host_cores {cores} (the CPUs this process may use: {usable})")
        flags = {c["case"]: (c["world_size"], c.get("oversubscribed")) for c in suite_summary["cases"]}
        check(all(flag == (ws > usable) for ws, flag in flags.values()),
              f"a case is oversubscribed exactly when its ranks outnumber the cores ({flags})")
        check(("* oversubscribed" in proc.stdout) == (np_ranks > usable),
              "the table notes oversubscription when ranks outnumber the cores")
        if np_ranks > usable and os.path.exists("/proc/thread-self/schedstat"):
            # The measured cost of the turns goes under the table, and the per-case blame leaves it out.
            check("compute threads waited" in proc.stdout, "the oversubscription line gives the measured wait for a CPU")
            # (A case within the cores keeps its line where it has one.)
            blame_lines = proc.stdout[proc.stdout.find("\nblame:"):].splitlines()
            contended = [line.split()[0] for line in blame_lines if "CPU contention:" in line]
            check(not any(flags.get(case, (0, False))[1] for case in contended),
                  f"no CPU contention line for an oversubscribed case in the blame ({contended})")
        if np_ranks >= 2:
            blamed = {c["case"]: " ".join(c.get("blame", [])) for c in json.load(
                open(os.path.join(out, "summary.json")))["cases"]}
            check("rank 1 sets the pace (straggler input)" in blamed["straggler"], f"blame: {blamed['straggler']}")
            check("rank 0 sets the pace (work before a barrier)" in blamed["rank0_barrier"],
                  f"blame: {blamed['rank0_barrier']}")
            check("input-bound: every rank spends" in blamed["input_threads0"], f"blame: {blamed['input_threads0']}")
        summary = json.load(open(os.path.join(out, "summary.json")))
        check([c["case"] for c in summary["cases"]] == expected, "summary.json lists every case in order")
        # One summary: the suite's (from the records in memory) is the one each run file stores, and its blame is
        # what `ddplab report` finds in the file.
        paths = [os.path.join(out, c["case"] + ".h5") for c in summary["cases"]]
        reports = json.loads(subprocess.run([ddplab, "report", "--json", *paths], capture_output=True, text=True,
                                            timeout=60).stdout or "[]")
        check(len(reports) == len(paths), f"report --json reads every case file ({len(reports)})")
        for case, path, report in zip(summary["cases"], paths, reports):
            with h5py.File(path, "r") as f:
                stored = json.loads(f.attrs["summary"])
            check(case["summary"] == stored == report["summary"],
                  f"{case['case']}: the suite's summary = the stored one = report's")
            if case["world_size"] >= 2:
                check(case.get("blame") == [b["text"] for b in report["blame"]],
                      f"{case['case']}: the suite's blame (from memory) = report's (from the file)")
            else:  # alone, only what the host took from it: the reference every efficiency is measured against
                taken = [b["text"] for b in report["blame"] if b["cause"] in ("CPU contention", "noisy host")]
                check(case.get("blame", []) == taken,
                      f"{case['case']}: a one-rank case's blame is report's CPU contention and noisy host ({taken})")
        check(summary["loss_identical"], "pathologies leave the loss identical")
        page_text = open(os.path.join(out, "report.html")).read()
        check("identical to the baseline" in page_text, "and the page says so")
        notes = json.load(open(os.path.join(out, "summary.json"))).get("notes", [])
        check(any(n.startswith("zero_stage1: ") for n in notes) and all(n.replace("'", "&#39;") in page_text or
                                                                       n in page_text for n in notes),
              f"the legend's notes on cases are in summary.json and on the page ({notes})")
        lines = open(os.path.join(out, "summary.csv")).read().strip().split("\n")
        check(len(lines) == len(expected) + 1, "summary.csv: header + one row per case")
        rows = {row["case"]: row for row in csv.DictReader(lines)}
        check(all((row["efficiency"] != "") == (row["group"] in ("weak", "strong")) for row in rows.values()),
              "summary.csv: efficiency only where a case has a reference (empty, not 0, elsewhere)")
        check(all(row["useful_tokens_per_s"] == "" for row in rows.values()),
              "summary.csv: the MLP cases leave the token columns empty")
        peerless = ("mean_spread_ms", "comm_ms", "hidden_comm_ms", "exposed_comm_ms")
        check(all(all((row[k] == "") == (row["world_size"] == "1") for k in peerless) for row in rows.values()),
              "summary.csv: spread and communication empty at one rank only")
        check(all(row["oversubscribed"] == str(int(c["oversubscribed"])) for row, c in
                  zip(rows.values(), summary["cases"])), "summary.csv and summary.json agree on oversubscription")
        # The table's extra_ms is the CSV's: the lab's work, its extra all-reduces and the barrier waits after it.
        table_lines = proc.stdout[proc.stdout.find("\ncase "):].split("\n\n")[0].splitlines()[2:]
        table = {line.split()[0]: line.split() for line in table_lines}
        for case, row in rows.items():
            with h5py.File(row["run_file"]) as f:
                lab_work = np.mean(sum(steady(f, k) for k in ("extra_comm_ms", "host_work_ms", "barrier_ms")))
            check(abs(float(row["extra_ms"]) - lab_work) <= 1e-5 * lab_work + 1e-9 and  # the CSV's 6 digits
                  # the table's 2 decimals round the full value, which the CSV's 6 digits may put on a tie
                  abs(float(table[case][-2]) - float(row["extra_ms"])) <= 0.005 + 1e-5 * lab_work,
                  f"{case}: extra_ms in the table ({table[case][-2]}) = the CSV's ({row['extra_ms']}) = the run "
                  f"file's extra all-reduce + host work + barrier ({lab_work:.4f})")
        # The page's table has the same column, after exposed_ms as in the terminal's.
        page = open(os.path.join(out, "report.html")).read()
        page_rows = {m[0]: m for m in (re.findall(r"<td[^>]*>([^<]*)</td>", tr)
                                       for tr in re.findall(r'<tr class="case">(.*?)</tr>', page))}
        heads = re.findall(r"<th>([^<]*)</th>", page[page.find("<thead>"):page.find("</thead>")])
        check("extra_ms" in heads and heads.index("extra_ms") == heads.index("exposed_ms") + 1 and
              all(page_rows[case][heads.index("extra_ms")] == table[case][-2] for case in rows),
              f"the page's table gives each case's extra_ms as the terminal's ({heads})")
        by_case = {c["case"]: c for c in summary["cases"]}
        check(abs(by_case["weak_ws1"]["efficiency"] - 1) < 1e-12, "weak_ws1 efficiency is 1 by definition")

        with h5py.File(os.path.join(out, "weak_ws1.h5")) as f:
            check(f.attrs["world_size"] == 1, "weak_ws1 ran on one rank")
        with h5py.File(os.path.join(out, "strong_ws1.h5")) as f:
            check(json.loads(f.attrs["config"])["batch"] == 8 * np_ranks, "strong_ws1 holds the whole global batch")

        if np_ranks >= 2:
            with h5py.File(os.path.join(out, "zero_stage1.h5")) as f, \
                    h5py.File(os.path.join(out, f"weak_ws{np_ranks}.h5")) as base:
                check(json.loads(f.attrs["config"])["zero_stage"] == 1 and
                      json.loads(base.attrs["config"])["zero_stage"] == 0, "zero_stage1 alone shards the update")
                check(np.array_equal(f["steps/loss"][:], base["steps/loss"][:]),
                      "zero_stage1: the baseline's losses, bit for bit")
            with h5py.File(os.path.join(out, "straggler.h5")) as f:
                data, exposed = steady(f, "data_ms"), steady(f, "exposed_comm_ms")
                others = [r for r in range(np_ranks) if r != 1]
                check(data[1] > 25 and all(data[r] < 5 for r in others),
                      f"straggler: rank 1 waits for data ({np.round(data, 1)})")
                check(all(exposed[r] > exposed[1] + 15 for r in others),
                      f"straggler: the others wait in the all-reduce ({np.round(exposed, 1)})")
            with h5py.File(os.path.join(out, "rank0_barrier.h5")) as f:
                work_ms, barrier = steady(f, "host_work_ms"), steady(f, "barrier_ms")
                check(work_ms[0] > 12 and all(work_ms[r] < 1 for r in range(1, np_ranks)),
                      f"rank0_barrier: only rank 0 works ({np.round(work_ms, 1)})")
                # The others wait out rank 0's work, less however late they were themselves: on cores shared
                # by 4 ranks (and ctest -j2) a rank can lose half a step (one waited 7.4 ms of 15.1 under a full
                # ctest -j2), so on average at least half of the work, and each at least a quarter.
                others = [barrier[r] for r in range(1, np_ranks)]
                check(np.mean(others) > 0.5 * work_ms[0] and min(others) > 0.25 * work_ms[0] and barrier[0] < 5,
                      f"rank0_barrier: the others wait at the barrier ({np.round(barrier, 1)})")
            with h5py.File(os.path.join(out, "extra_allreduce.h5")) as f:
                check(np.all(steady(f, "extra_comm_ms") > 0), "extra_allreduce: every rank pays the extra all-reduce")
            # PyTorch's layout cut at PyTorch's caps, every other case at ddplab's (the defaults).
            caps = {}
            for case in expected:
                with h5py.File(os.path.join(out, case + ".h5")) as f:
                    config = json.loads(f.attrs["config"])
                    caps[case] = (config["first_bucket_mb"], config["last_bucket_mb"], config["bucket_rule"])
            odd = {case: c for case, c in caps.items() if c != ((1.0, "auto", "reach") if case == "pytorch_layout"
                                                                  else ("auto", 1.0, "within"))}
            check(not odd, f"pytorch_layout alone cuts PyTorch's layout (first 1 MiB, last auto, reach) ({odd})")
            # The model's answer from the baseline case is what `ddplab predict` says of that file at the same
            # caps and overlaps, row for row and in its recommendation.
            lab = summary.get("prediction", {})
            check(lab.get("run_file") == f"weak_ws{np_ranks}.h5" and len(lab.get("rows", [])) == 10,
                  f"summary.json: the prediction from weak_ws{np_ranks}.h5, 5 caps x 2 overlaps "
                  f"({ {k: v for k, v in lab.items() if k != 'rows'} })")
            if lab.get("rows"):
                cli = os.path.join(work, "predict.json")
                args = lab["command"].split()[2:]  # the suite's own command, past "ddplab predict": it runs as said
                predicted = subprocess.run([ddplab, "predict", *args, "--json", cli],
                                           capture_output=True, text=True, timeout=120)
                cli_rows = json.load(open(cli))["rows"] if predicted.returncode == 0 else []
                want = {(r["bucket_mb"], "on" if r["overlap"] else "off"): r["step_ms"] for r in cli_rows}
                got = {(r["bucket_mb"], r["overlap"]): r["predicted_step_ms"] for r in lab["rows"]}
                buckets = {r["bucket_mb"]: r["buckets"] for r in lab["rows"]}
                # 1.5 MiB of parameters: one bucket per matrix at 0.5 MiB, two at 100 (the closing one at 1 MiB).
                check(buckets[0.5] > buckets[100] > 1, f"the caps cut different buckets ({buckets})")
                check(want.keys() == got.keys() and all(abs(got[k] - want[k]) <= 1e-9 * want[k] for k in want),
                      f"the suite's predicted rows = ddplab predict's ({got} vs {want}; {predicted.stderr[-200:]})")
                best = lab["recommended"]
                check(abs(best["predicted_step_ms"] - min(got.values())) <= best["tolerance_pct"] / 100 *
                      min(got.values()) + 1e-9,
                      f"the recommendation is within the run's noise of the fastest row ({best})")
                page = open(os.path.join(out, "report.html")).read()
                check("recommended by the model" in page and lab["command"] in page,
                      "the page gives the model's recommendation and the command that makes it")
                # The rows beyond the run's measured bucket sizes are marked, as `ddplab predict` marks them.
                prediction_table = page[page.find("recommended by the model"):]
                prediction_table = prediction_table[:prediction_table.find("</table>")]
                marked = {(r["bucket_mb"], "on" if r["overlap"] else "off"): bool(r["extrapolated"]) for r in cli_rows}
                check(marked == {(r["bucket_mb"], r["overlap"]): bool(r["extrapolated"]) for r in lab["rows"]} and
                      any(marked.values()) and
                      len(re.findall(r"<td>[0-9.]+\*</td>", prediction_table)) == sum(marked.values()) and
                      "* extrapolated beyond what was measured: " in page,
                      f"the extrapolated rows are the ones predict marks, starred on the page ({marked})")
        with h5py.File(os.path.join(out, "input_threads0.h5")) as f0, \
                h5py.File(os.path.join(out, "input_threads4.h5")) as f4:
            d0, d4 = steady(f0, "data_ms").max(), steady(f4, "data_ms").max()
            check(d0 > 6 and d4 < d0 / 2, f"input: loader threads hide the input cost ({d0:.1f} -> {d4:.1f} ms)")


main()
print(f"suite checks: {len(failures)} failed")
sys.exit(1 if failures else 0)
